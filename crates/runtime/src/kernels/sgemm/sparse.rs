//! Row-sparse `A` times dense `B` (AVX-512): the expert GEMMs that read a ReLU output.
//!
//! Half of the values of a ReLU's output are exact zeros, and so are half of the values of
//! its masked gradient. Two of an MoE expert's six GEMMs take such an operand as a
//! row-major `A` (the down-projection `relu(h) · Wo` forward, `dh' · Wi^T` backward), and
//! two as a column-major one (the weight gradients `relu(h)^T · dy` and `dh'^T · x`, copied
//! row-major first), where a product `0 · b` adds nothing. This kernel multiplies only the non-zero elements of each
//! row of `A`: a row's non-zeros over a slice of steps are compressed to (step, value)
//! lists with AVX-512 `vcompressps`, and each value is multiplied into eight 16-lane
//! accumulators (128 columns of `C`) against the step's packed row of `B`. The block of `B`
//! that a slice of steps meets (64 steps x 128 columns, 32 KiB) stays in L1 while every
//! row of `A` passes over it.
//!
//! Numerics: bitwise those of the dense micro-kernel, with one exception. Each output element is still the
//! FMA chain of its products in increasing step order, one `KC` block after the other
//! (block 0 written, later blocks computed apart and added), and a skipped term is `0 · b`
//! with `b` finite (the caller packs `B` with its finiteness check and multiplies a
//! non-finite block densely): such a term is `±0`, and adding `±0` to an f32 chain leaves
//! it unchanged unless the chain is `-0`, which it is only after a product underflowed to
//! `-0` (magnitude below 2^-150): there a later left-out `0 * b` would have turned the
//! dense sum into `+0`, so the one exception is the sign of such a zero. A partial chain is
//! stored as f32 and reloaded between slices of steps, which changes nothing.
//!
//! Measured here (one thread, `m = 128`, `k = 512`, `n = 128` with half of `A` zero;
//! criterion `relu_sgemm_*`, hot caches): 134 us against 175 us for the dense micro-kernel
//! (1.30x), 144 against 171 us in a noisier sitting (1.19x); cycling through 32
//! experts' cold operands 176 against 195 us; 1.35x with a quarter of `A` non-zero and 1.6x
//! with a tenth. The kernel is bound by loads (one 64-byte row chunk of `B` per FMA) where
//! the dense one is bound by FMAs, so it wins by doing half the work, not by running faster.

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

/// Whether this CPU runs the kernel (AVX-512F, and POPCNT for the compression's counts).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::kernels::has_avx512f() && std::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

/// One `KC` block: `C[i, 0..nc] (=|+=) A[i, steps] · B[steps, 0..nc]` for each row `i` of
/// `rows`, `A`'s row `i` at `a(i)` (`kc` contiguous floats: the block's steps), `B` packed
/// by `pack_b` in panels `GROUP` columns wide (`pb[g*GROUP*kc + kk*GROUP + j]`, zero past
/// `nc`, finite), `C`'s row `i` at `c(i)` (`nc` contiguous floats). `first`: write the
/// block's sums; otherwise add them to `C` (the sums are formed apart in `tmp`,
/// `rows.len() * nc` floats, then added: the dense kernel's order). `fetch` is called once per row and slice.
///
/// # Safety
/// [`available`]; the pointers address what is said above, `pb` is 64-byte aligned, and no
/// other thread touches the rows of `C`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn block(
    rows: &[usize],
    kc: usize,
    nc: usize,
    a: impl Fn(usize) -> *const f32,
    pb: *const f32,
    c: impl Fn(usize) -> *mut f32,
    first: bool,
    tmp: &mut [f32],
    mut fetch: impl FnMut(),
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; `tmp` holds a row of `nc` floats per row of `rows`.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        assert!(first || tmp.len() >= rows.len() * nc);
        THREAD_BLOCKS.with(|b| b.set(b.get() + 1));
        let tp = tmp.as_mut_ptr();
        let dst = |r: usize, i: usize| if first { c(i) } else { tp.add(r * nc) };
        let slices = kc.div_ceil(SLICE);
        let mut idx = [0u32; SLICE + 16];
        let mut val = [0f32; SLICE + 16];
        let mut start = [0u32; 2];
        for g0 in (0..nc).step_by(GROUP) {
            let cols = GROUP.min(nc - g0);
            let base = pb.add(g0 * kc);
            for s in 0..slices {
                let s0 = s * SLICE;
                let len = SLICE.min(kc - s0);
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
                    avx512::compress(a(i).add(s0), len, &mut idx, &mut val, &mut start);
                    let nz = start[1] as usize;
                    avx512::chain(
                        &idx[..nz],
                        &val[..nz],
                        base.add(s0 * GROUP),
                        dst(r, i).add(g0),
                        cols,
                        s > 0,
                    );
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
        let _ = (rows, kc, nc, a, pb, c, first, tmp, &mut fetch);
        unreachable!("sparse::available() is false off x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{GROUP, SLICE};
    use crate::kernels::lanes;
    use std::arch::x86_64::*;

    /// The non-zeros of the `kc` floats at `a` as packed-row offsets `kk * GROUP` and values,
    /// and in `start[s]` where slice `s` (steps `s * SLICE..`) begins (`start[slices]`: the
    /// count).
    ///
    /// The count of each chunk's non-zeros is a `popcnt` (without the target feature,
    /// `count_ones` is a dozen dependent bit operations, and every later store's address
    /// waits for it: the compression took ~15 % of a row-sparse GEMM's samples).
    ///
    /// # Safety
    /// AVX-512F and POPCNT; `kc` floats readable at `a`; `idx` and `val` hold `kc + 16`,
    /// `start` holds `kc.div_ceil(SLICE) + 1`.
    #[target_feature(enable = "avx512f,popcnt")]
    pub(super) unsafe fn compress(
        a: *const f32,
        kc: usize,
        idx: &mut [u32],
        val: &mut [f32],
        start: &mut [u32],
    ) {
        debug_assert!(idx.len() >= kc + 16 && val.len() >= kc + 16);
        debug_assert!(start.len() > kc.div_ceil(SLICE));
        // SAFETY: masked loads read only the `kc` floats; each store writes 16 lanes at an
        // offset below `kc`, inside the `kc + 16` of `idx` and `val`.
        unsafe {
            let mut n = 0;
            let mut off = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(GROUP as i32),
            );
            let step = _mm512_set1_epi32(16 * GROUP as i32);
            for t in (0..kc).step_by(16) {
                if t % SLICE == 0 {
                    start[t / SLICE] = n as u32;
                }
                let v = _mm512_maskz_loadu_ps(lanes(kc - t), a.add(t));
                // NaN counts as non-zero (unordered not-equal).
                let m = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, _mm512_setzero_ps());
                _mm512_storeu_ps(val.as_mut_ptr().add(n), _mm512_maskz_compress_ps(m, v));
                _mm512_storeu_si512(
                    idx.as_mut_ptr().add(n).cast(),
                    _mm512_maskz_compress_epi32(m, off),
                );
                n += m.count_ones() as usize;
                off = _mm512_add_epi32(off, step);
            }
            start[kc.div_ceil(SLICE)] = n as u32;
        }
    }

    /// Chain the products of the non-zeros (`idx`: packed-row offsets, `val`) with the
    /// packed rows of `B` (the group's step `k` at `b + k * GROUP`) into the
    /// `cols <= GROUP` floats at `c` (`resume`: the chain continues from `c`'s values,
    /// stored by the previous slice).
    ///
    /// # Safety
    /// As [`super::block`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn chain(
        idx: &[u32],
        val: &[f32],
        b: *const f32,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        debug_assert!(cols <= GROUP && idx.len() == val.len());
        // SAFETY: the caller's contract.
        unsafe {
            match cols.div_ceil(16) {
                8 => chain_q::<8>(idx, val, b, c, cols, resume),
                7 => chain_q::<7>(idx, val, b, c, cols, resume),
                6 => chain_q::<6>(idx, val, b, c, cols, resume),
                5 => chain_q::<5>(idx, val, b, c, cols, resume),
                4 => chain_q::<4>(idx, val, b, c, cols, resume),
                3 => chain_q::<3>(idx, val, b, c, cols, resume),
                2 => chain_q::<2>(idx, val, b, c, cols, resume),
                _ => chain_q::<1>(idx, val, b, c, cols, resume),
            }
        }
    }

    /// [`chain`] with `Q` 16-column accumulators.
    ///
    /// # Safety
    /// As [`chain`]; `cols` in `16 * (Q - 1) + 1 ..= 16 * Q`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn chain_q<const Q: usize>(
        idx: &[u32],
        val: &[f32],
        b: *const f32,
        c: *mut f32,
        cols: usize,
        resume: bool,
    ) {
        // SAFETY: the caller's contract; masked loads and stores touch only `cols` floats of
        // `c`, packed loads stay inside the group's rows (zero-padded past `nc`).
        unsafe {
            let mask = |q: usize| lanes(cols.saturating_sub(16 * q));
            let mut acc = [_mm512_setzero_ps(); Q];
            if resume {
                for (q, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(mask(q), c.add(16 * q));
                }
            }
            for (&o, &v) in idx.iter().zip(val) {
                let v = _mm512_set1_ps(v);
                let row = b.add(o as usize);
                for (q, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(v, _mm512_load_ps(row.add(16 * q)), *x);
                }
            }
            for (q, x) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(c.add(16 * q), mask(q), *x);
            }
        }
    }
}
