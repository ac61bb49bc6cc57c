//! Row-sparse `A` times dense `B` (AVX-512, or AVX2): the expert GEMMs that read a ReLU output.
//!
//! Half of the values of a ReLU's output are exact zeros, and so are half of the values of
//! its masked gradient. Two of an MoE expert's six GEMMs take such an operand as a
//! row-major `A` (the down-projection `relu(h) · Wo` forward, `dh' · Wi^T` backward), and
//! two as a column-major one (the weight gradients `relu(h)^T · dy` and `dh'^T · x`, copied
//! row-major first), where a product `0 · b` adds nothing. This kernel multiplies only the
//! non-zero elements of each row of `A`: a row's non-zeros over a slice of steps are found
//! as the bits of a 64-bit mask (four AVX-512 compares), and the chain walks the set bits
//! (lowest first: `tzcnt`, then `blsr`), broadcasting each value from `A` and multiplying it
//! into eight 16-lane accumulators (128 columns of `C`) against the step's packed row of
//! `B`. The block of `B` that a slice of steps meets (64 steps x 128 columns, 32 KiB) stays
//! in L1 while every row of `A` passes over it. Where `B` is already one such group (row
//! major over consecutive steps: an expert's `Wo`, `dy` and `x`; exactly 128 columns for
//! the sixteen-lane chains, at most 128 and a multiple of 8 for the eight-lane ones), its
//! rows are read in place after a read-only finiteness check, instead of copied into the
//! same layout. Each row's mask is taken
//! before the previous row's chain runs, so its loads of `A` are in flight meanwhile.
//!
//! Numerics: bitwise those of the dense micro-kernel, with one exception. Each output
//! element is still the FMA chain of its products in increasing step order, one `KC` block
//! after the other (block 0 written, later blocks computed apart and added), and a skipped
//! term is `0 · b` with `b` finite (the caller checks `B`'s block as it packs or before it
//! reads it in place, and multiplies a non-finite block densely): such a term is `±0`, and
//! adding `±0` to an f32 chain leaves it unchanged unless the chain is `-0`, which it is
//! only after a product underflowed to `-0` (magnitude below 2^-150): there a later
//! left-out `0 * b` would have turned the dense sum into `+0`, so the one exception is the
//! sign of such a zero. A partial chain is
//! stored as f32 and reloaded between slices of steps, which changes nothing.
//!
//! Measured here (one thread, `m = 128`, `k = 512`, `n = 128` with half of `A` zero, hot
//! caches, minimum of 2000 calls): 107 us against 158 us for the dense micro-kernel
//! (1.48x). Lists of `(step, value)` built with `vcompressps` before each chain took 123 us
//! (the compression 13 % of the samples, and each row's first loads of `A` stalled the
//! chain); building every row's mask of a slice in one pass first, 111 us; slices of 32
//! steps 141 us (a row's accumulators reloaded twice as often) and of 128 steps 153 us (the
//! block of `B` no longer in L1). The chain is bound by loads (one 64-byte row chunk of `B`
//! per FMA, ~9.5 cycles per non-zero against the 8 of its FMAs), so the kernel wins by
//! doing half the work, not by running faster.
//!
//! **AVX2** (CPUs without AVX-512, such as AMD Zen 3): the same blocks, masks (eight-lane
//! compares and `movemask`) and walk, but a row's chain covers its group's 128 columns in
//! two passes of 64 (eight 8-lane accumulators and the broadcast value fit the sixteen
//! registers; sixteen accumulators would spill). Same bits. Measured on a Zen 3 core (one
//! thread, hot, minimum of 1000-3000 calls, `A` half zeros): `128 x 128 x 512` 152-158 us
//! against 195-220 for the dense kernel; `A` read transposed (copied row-major) 156-167
//! against 212-220; the result stored transposed 174-190 against 203-248. The chain runs at
//! ~5-5.7 cycles per non-zero and pass against the 4.5 its loads allow. Tried and slower:
//! every row's mask of a slice first, then each 64-column pass over all rows (196-199 us:
//! the masks' pass brought all rows' slices into L1 over `B`), and groups packed 64
//! columns wide (161-164 us: each row's mask, prefetches and call overhead twice).

/// Steps of one slice: its block of `B` (`SLICE x 128` floats, 32 KiB) stays in L1.
pub(super) const SLICE: usize = 64;
/// Rows ahead whose slice of `A` is prefetched.
const AHEAD: usize = 8;
/// Columns of `C` per pass over a row's non-zeros: eight 16-lane accumulators.
pub(super) const GROUP: usize = 128;
/// `A` is multiplied sparsely when at most this share of a sample of its rows is non-zero
/// (dense GEMMs win above it: a non-zero costs a broadcast and its packed row's loads on
/// top of the FMAs).
const MAX_DENSITY: f64 = 0.6;

thread_local! {
    /// Blocks this thread has multiplied on the row-sparse path (tests check that the path
    /// runs; tests share a process, so each reads its own thread's).
    pub(super) static THREAD_BLOCKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this CPU runs the kernel: AVX2 and FMA for the eight-lane chains (the
/// sixteen-lane ones run where the dense kernel takes its AVX-512 tiles), and BMI1 for the
/// chain's `tzcnt` and `blsr`.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("bmi1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Bit `t` set for each non-zero (NaN included) of the `len <= 64` floats at `a` (the
/// one-hot products' mask scans, `sgemm::nonzero_bits64`): the sixteen-lane scan where the
/// CPU has AVX-512, the eight-lane one otherwise (the same bits).
///
/// # Safety
/// [`available`]; `len` floats readable at `a`.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn nonzero_bits(a: *const f32, len: usize) -> u64 {
    // SAFETY: the caller's contract; AVX-512F checked for the wide scan.
    unsafe {
        if crate::kernels::has_avx512f() {
            avx512::nonzero_bits(a, len)
        } else {
            avx2::nonzero_bits(a, len)
        }
    }
}

/// Whether up to eight evenly spaced rows of `rows` (row `i`'s `k` contiguous floats at
/// `a(i)`, the first 256 of each read) are sparse enough for [`block`] to beat the dense
/// kernel. A dense `A` is told apart by its first sampled row (a few cache lines).
///
/// # Safety
/// `k` floats are readable at `a(i)` for every `i` in `rows`.
pub unsafe fn worth(rows: &[usize], k: usize, a: impl Fn(usize) -> *const f32) -> bool {
    if rows.is_empty() || k == 0 {
        return false;
    }
    let (picks, len) = (rows.len().min(8), k.min(256));
    let mut nonzero = 0usize;
    for t in 0..picks {
        let i = rows[t * rows.len() / picks];
        // SAFETY: the caller's contract (`len <= k`).
        let row = unsafe { std::slice::from_raw_parts(a(i), len) };
        nonzero += row.iter().fold(0usize, |n, &x| n + usize::from(x != 0.0));
        if t == 0 && nonzero as f64 > 0.9 * len as f64 {
            return false;
        }
    }
    (nonzero as f64) <= MAX_DENSITY * (picks * len) as f64
}

/// One `KC` block of a row-sparse product, as [`block`] multiplies it: `C[i, 0..nc] (=|+=)
/// A[i, steps] · B[steps, 0..nc]` for each row `i` of `rows`, `A`'s row `i` at `a(i)` (`kc`
/// contiguous floats: the block's steps), `B` finite, packed by `pack_b` in panels `GROUP`
/// columns wide (`b[g*GROUP*kc + kk*GROUP + j]`, zero past `nc`; `bs = GROUP`), or read in
/// place when it is one group whose rows are contiguous (`nc <= GROUP`, a multiple of 8;
/// step `kk`'s row at `b + kk*bs`; with the sixteen-lane chains `nc = bs = GROUP`), `C`'s
/// row `i` at `c(i)` (`nc` contiguous floats). `first`: write the block's sums; otherwise
/// add them to `C`. `wide`: the sixteen-lane chains (where the dense kernel takes AVX-512
/// tiles; both give the same bits), else the eight-lane ones.
pub struct Block<'a, A, C> {
    pub rows: &'a [usize],
    pub kc: usize,
    pub nc: usize,
    pub a: A,
    pub b: *const f32,
    pub bs: usize,
    pub c: C,
    pub first: bool,
    pub wide: bool,
}

/// Multiply one block (see [`Block`]). Without `first`, the sums are formed apart in `tmp`
/// (`rows.len() * nc` floats), then added: the dense kernel's order. `fetch` is called once
/// per row and slice.
///
/// # Safety
/// [`available`]; the pointers address what [`Block`] says, and no other thread touches the
/// rows of `C`; `B` read in place with `bs = GROUP` where the sixteen-lane chains run
/// (`wide`, only where the CPU has AVX-512F).
pub unsafe fn block<A, C>(blk: Block<'_, A, C>, tmp: &mut [f32], mut fetch: impl FnMut())
where
    A: Fn(usize) -> *const f32,
    C: Fn(usize) -> *mut f32,
{
    let Block {
        rows,
        kc,
        nc,
        a,
        b: pb,
        bs,
        c,
        first,
        wide,
    } = blk;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; `tmp` holds a row of `nc` floats per row of `rows`.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        assert!(first || tmp.len() >= rows.len() * nc);
        THREAD_BLOCKS.with(|b| b.set(b.get() + 1));
        let tp = tmp.as_mut_ptr();
        let bits_of = |p: *const f32, len: usize| {
            if wide {
                avx512::nonzero_bits(p, len)
            } else {
                avx2::nonzero_bits(p, len)
            }
        };
        let dst = |r: usize, i: usize| if first { c(i) } else { tp.add(r * nc) };
        let slices = kc.div_ceil(SLICE);
        for g0 in (0..nc).step_by(GROUP) {
            let cols = GROUP.min(nc - g0);
            // (Read in place, `B` is one group: `g0` is 0.)
            let base = pb.add(g0 * kc);
            for s in 0..slices {
                let s0 = s * SLICE;
                let len = SLICE.min(kc - s0);
                // Each row's bits are found one row ahead, so their loads are in flight
                // while the previous row's chain runs.
                let mut next = rows.first().map_or(0, |&i| bits_of(a(i).add(s0), len));
                for (r, &i) in rows.iter().enumerate() {
                    fetch();
                    // The same slice of a row a few rows on: its first touch misses the
                    // caches (the rows are read a slice at a time, 2 KiB or more apart,
                    // streams the hardware prefetchers do not follow).
                    // (Past the last row, the next slice's first rows.)
                    let (ahead, at) = match rows.get(r + AHEAD) {
                        Some(&i) => (Some(i), s0),
                        None => (rows.get(r + AHEAD - rows.len()).copied(), s0 + SLICE),
                    };
                    if let (Some(i), true) = (ahead, at < kc) {
                        let p = a(i).add(at);
                        for line in (0..SLICE.min(kc - at)).step_by(16) {
                            _mm_prefetch::<_MM_HINT_T0>(p.add(line).cast());
                        }
                    }
                    let row = a(i).add(s0);
                    let bits = next;
                    if let Some(&i) = rows.get(r + 1) {
                        next = bits_of(a(i).add(s0), len);
                    }
                    let (b, c) = (base.add(s0 * bs), dst(r, i).add(g0));
                    if wide {
                        debug_assert_eq!(bs, GROUP, "the wide chains read rows GROUP apart");
                        avx512::chain(row, bits, b, c, cols, s > 0);
                    } else {
                        // Eight-lane chains in passes of `avx2::HALF` columns (a pass over
                        // the whole group would need more registers than AVX2 has).
                        for h in (0..cols).step_by(avx2::HALF) {
                            let w = (cols - h).min(avx2::HALF);
                            avx2::chain(row, bits, b.add(h), bs, c.add(h), w, s > 0);
                        }
                    }
                }
            }
        }
        if !first {
            for (r, &i) in rows.iter().enumerate() {
                let out = c(i);
                for j in 0..nc {
                    *out.add(j) += *tp.add(r * nc + j);
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, kc, nc, a, pb, bs, c, first, wide, tmp, &mut fetch);
        unreachable!("sparse::available() is false off x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::GROUP;
    use crate::kernels::lanes;
    use std::arch::x86_64::*;

    /// Bit `t` set for each non-zero of the `len <= 64` floats at `a` (NaN counts as
    /// non-zero: unordered not-equal).
    ///
    /// # Safety
    /// AVX-512F; `len` floats readable at `a`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn nonzero_bits(a: *const f32, len: usize) -> u64 {
        debug_assert!(len <= 64);
        // SAFETY: masked loads read only the `len` floats; a whole slice's four loads
        // read its 64.
        unsafe {
            if len == 64 {
                // A whole slice (all but a block's last): four plain loads, no lane masks.
                let z = _mm512_setzero_ps();
                let m: [u64; 4] = std::array::from_fn(|q| {
                    let v = _mm512_loadu_ps(a.add(16 * q));
                    u64::from(_mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, z))
                });
                return m[0] | m[1] << 16 | m[2] << 32 | m[3] << 48;
            }
            let mut bits = 0u64;
            for t in (0..len).step_by(16) {
                let v = _mm512_maskz_loadu_ps(lanes(len - t), a.add(t));
                let m = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, _mm512_setzero_ps());
                bits |= u64::from(m) << t;
            }
            bits
        }
    }

    /// Chain the products of the non-zeros of a row's slice (`a`: its floats, `bits`: which
    /// are non-zero, in increasing step order) with the packed rows of `B` (the group's
    /// step `t` at `b + t * GROUP`) into the `cols <= GROUP` floats at `c` (`resume`: the
    /// chain continues from `c`'s values, stored by the previous slice). The non-zeros are
    /// walked by their bits (lowest set bit, then clear it), so no list is written.
    ///
    /// # Safety
    /// As [`super::block`]; every set bit's float readable at `a`.
    #[target_feature(enable = "avx512f,bmi1")]
    pub(super) unsafe fn chain(
        a: *const f32,
        bits: u64,
        b: *const f32,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        debug_assert!(cols <= GROUP);
        // SAFETY: the caller's contract.
        unsafe {
            by_count!(
                cols.div_ceil(16),
                [8, 7, 6, 5, 4, 3, 2],
                chain_q(a, bits, b, c, cols, resume)
            )
        }
    }

    /// [`chain`] with `Q` 16-column accumulators.
    ///
    /// # Safety
    /// As [`chain`]; `cols` in `16 * (Q - 1) + 1 ..= 16 * Q`.
    #[target_feature(enable = "avx512f,bmi1")]
    #[inline]
    unsafe fn chain_q<const Q: usize>(
        a: *const f32,
        mut bits: u64,
        b: *const f32,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        // SAFETY: the caller's contract; masked loads and stores touch only `cols` floats of
        // `c`, loads of `B` stay inside the group's rows (packed: zero-padded past `nc`).
        unsafe {
            let mask = |q: usize| lanes(cols.saturating_sub(16 * q));
            let mut acc = [_mm512_setzero_ps(); Q];
            if resume {
                for (q, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(mask(q), c.add(16 * q));
                }
            }
            while bits != 0 {
                let t = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let v = _mm512_set1_ps(*a.add(t));
                let row = b.add(t * GROUP);
                for (q, x) in acc.iter_mut().enumerate() {
                    // Unaligned loads: `B` read in place sits wherever its caller put it.
                    *x = _mm512_fmadd_ps(v, _mm512_loadu_ps(row.add(16 * q)), *x);
                }
            }
            for (q, x) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add(16 * q), mask(q), *x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Columns of one pass over a row's non-zeros: eight 8-lane accumulators (with the
    /// broadcast value, nine of the sixteen registers; a whole group's sixteen would spill).
    pub(super) const HALF: usize = 64;

    /// Bit `t` set for each non-zero of the `len <= 64` floats at `a` (NaN counts as
    /// non-zero: unordered not-equal).
    ///
    /// # Safety
    /// AVX2; `len` floats readable at `a`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn nonzero_bits(a: *const f32, len: usize) -> u64 {
        debug_assert!(len <= 64);
        // SAFETY: full loads read inside the `len` floats; the tail is read one by one.
        unsafe {
            let mut bits = 0u64;
            let full = len / 8 * 8;
            for t in (0..full).step_by(8) {
                let v = _mm256_loadu_ps(a.add(t));
                let m = _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps());
                bits |= u64::from(_mm256_movemask_ps(m) as u8) << t;
            }
            for t in full..len {
                let x = *a.add(t);
                bits |= u64::from(x != 0.0 || x.is_nan()) << t;
            }
            bits
        }
    }

    /// The AVX2 form of the AVX-512 `chain` over one pass of `cols <= HALF` columns (`b`,
    /// `c`: the pass's first column; step `t`'s row of `B` at `b + t * bs`): the row's
    /// non-zeros (`bits`) into eight-lane accumulators. Each output element is the same FMA
    /// chain in the same step order, so the bits are those of the sixteen-lane kernel and of
    /// the dense one.
    ///
    /// # Safety
    /// As [`super::block`]; every set bit's float readable at `a`.
    #[target_feature(enable = "avx2,fma,bmi1")]
    pub(super) unsafe fn chain(
        a: *const f32,
        bits: u64,
        b: *const f32,
        bs: usize,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        debug_assert!(cols <= HALF);
        // SAFETY: the caller's contract.
        unsafe {
            by_count!(
                cols.div_ceil(8),
                [8, 7, 6, 5, 4, 3, 2],
                chain_q(a, bits, b, bs, c, cols, resume)
            )
        }
    }

    /// Lane mask (all ones in a lane's sign bit) of the first `n` of 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn lanes8(n: usize) -> __m256i {
        let n = n.min(8) as i32;
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    /// [`chain`] over one pass with `Q` 8-column accumulators (`b`, `c`: the pass's first
    /// column).
    ///
    /// # Safety
    /// As [`chain`]; `cols` in `8 * (Q - 1) + 1 ..= 8 * Q`.
    #[target_feature(enable = "avx2,fma,bmi1")]
    #[inline]
    unsafe fn chain_q<const Q: usize>(
        a: *const f32,
        mut bits: u64,
        b: *const f32,
        bs: usize,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        // SAFETY: the caller's contract; masked loads and stores touch only `cols` floats of
        // `c`, loads of `B` stay inside the group's rows (packed: zero-padded past `nc`; in
        // place: `nc` a multiple of 8, so `8 * Q` floats of a row are inside it).
        unsafe {
            let mask = |q: usize| lanes8(cols.saturating_sub(8 * q));
            let mut acc = [_mm256_setzero_ps(); Q];
            if resume {
                for (q, x) in acc.iter_mut().enumerate() {
                    *x = if 8 * q + 8 <= cols {
                        _mm256_loadu_ps(c.add(8 * q))
                    } else {
                        _mm256_maskload_ps(c.add(8 * q), mask(q))
                    };
                }
            }
            while bits != 0 {
                let t = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let v = _mm256_broadcast_ss(&*a.add(t));
                let row = b.add(t * bs);
                for (q, x) in acc.iter_mut().enumerate() {
                    *x = _mm256_fmadd_ps(v, _mm256_loadu_ps(row.add(8 * q)), *x);
                }
            }
            for (q, x) in acc.iter().enumerate() {
                if 8 * q + 8 <= cols {
                    _mm256_storeu_ps(c.add(8 * q), *x);
                } else {
                    _mm256_maskstore_ps(c.add(8 * q), mask(q), *x);
                }
            }
        }
    }
}
