//! The dense micro-kernel on AVX-512 registers: a `6 x 16P` tile (`P` packed `B` panels
//! side by side, `6 P` sixteen-lane accumulators).
//!
//! Zen 4 splits a 512-bit FMA over its two 256-bit pipes, so the FMA peak is the AVX2 one;
//! what the wider registers buy is fewer instructions per FMA. The AVX2 `6 x 16` tile
//! issues two loads of `B` and six broadcasts of `A` for every twelve 8-lane FMAs (six
//! cycles): 1.3 loads and 3.3 instructions per cycle. A `6 x 48` tile issues three loads and
//! six broadcasts for eighteen 16-lane FMAs (eighteen cycles on Zen 4, nine on Zen 5's
//! 512-bit pipes), a `6 x 64` tile (the one used, [`PANELS`]) four loads and six broadcasts
//! for twenty-four. On Zen 4, for the `6 x 48` tile, on the smaller benchmark
//! shape's expert GEMMs (one thread, hot caches) that took 95-105 GFLOP/s to 98-108 (512^3:
//! 107 to 111; the FMA peak is 116); the `gemm` crate's AVX-512 kernels reach 109-114 on
//! the same shapes, but skip no zero rows and write no offset tables.
//!
//! The panels are the AVX2 kernel's (`NR = 16` columns, packed step after step), read `P`
//! at a time, and every output element is the same FMA chain in increasing step order, so
//! the two kernels give the same bits.

#[cfg(target_arch = "x86_64")]
use super::{Tile, MR, NR};
#[cfg(target_arch = "x86_64")]
use crate::kernels::lanes;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Panels per tile: a `6 x 64` tile, twenty-four accumulators (with the four vectors of `B`
/// and the broadcast, 29 of the 32 registers). Against the `6 x 48` tile (three panels) on
/// a Zen 5 core, one thread, hot: 512^3 247 -> 252 GFLOP/s, `128 x 512 x 128` 236 -> 242
/// (eight whole strips rather than ten and a third), `256 x 1024 x 256` 240 -> 244.
/// Partial strips take the three-, two- and one-panel instances.
pub(super) const PANELS: usize = 4;

/// Whether this CPU runs the kernel (AVX-512F).
pub(super) fn available() -> bool {
    crate::kernels::has_avx512f()
}

/// The accumulators of an `R x 16P` tile.
#[cfg(target_arch = "x86_64")]
type Acc<const R: usize, const P: usize> = [[__m512; P]; R];

/// Write (`first`) or add the accumulators to the left `nr` columns of the `R` C rows.
///
/// # Safety
/// As [`kernel`] for `c`. Always inlined into its kernel, so the accumulators stay in
/// registers.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store<const R: usize, const P: usize>(
    acc: &Acc<R, P>,
    c: &[*mut f32; MR],
    cs: usize,
    nr: usize,
    first: bool,
) {
    // SAFETY: the caller's contract bounds every element written; masked loads and stores
    // touch only the `nr` columns.
    unsafe {
        if cs == 1 {
            // Small loop bodies, so that they unroll fully and the accumulators never leave
            // the registers (a loop that indexes them would keep them in memory).
            let mut m = [0xffff; P];
            for (q, m) in m.iter_mut().enumerate() {
                *m = lanes(nr.saturating_sub(q * NR));
            }
            if first {
                for i in 0..R {
                    for q in 0..P {
                        _mm512_mask_storeu_ps(c[i].add(q * NR), m[q], acc[i][q]);
                    }
                }
            } else {
                for i in 0..R {
                    for q in 0..P {
                        let at = c[i].add(q * NR);
                        let v = _mm512_add_ps(_mm512_maskz_loadu_ps(m[q], at), acc[i][q]);
                        _mm512_mask_storeu_ps(at, m[q], v);
                    }
                }
            }
            return;
        }
        // Strided columns: the tile goes through memory first (with unrolled stores, as
        // above), then element by element.
        let mut tile = [[[0.0f32; NR]; P]; R];
        for i in 0..R {
            for q in 0..P {
                _mm512_storeu_ps(tile[i][q].as_mut_ptr(), acc[i][q]);
            }
        }
        for (row, &p) in tile.iter().zip(c) {
            for (j, &x) in row.as_flattened().iter().enumerate().take(nr) {
                let at = p.add(j * cs);
                *at = if first { x } else { *at + x };
            }
        }
    }
}

/// One step `p` of [`kernel`]: `P` vectors of `B`'s row, each of the `R` rows' `A` value
/// broadcast and multiplied into its accumulators.
///
/// # Safety
/// As [`kernel`] for step `p`. Always inlined into its kernel (whose AVX-512F the
/// intrinsics need), so the accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step<const R: usize, const P: usize>(
    acc: &mut Acc<R, P>,
    a: &impl Fn(usize, usize) -> *const f32,
    b: *const f32,
    ps: usize,
    bs: usize,
    p: usize,
) {
    // SAFETY: the caller's contract bounds every pointer offset below.
    unsafe {
        let bp = b.add(p * bs);
        let mut bv = [_mm512_setzero_ps(); P];
        for (q, y) in bv.iter_mut().enumerate() {
            *y = _mm512_loadu_ps(bp.add(q * ps));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = _mm512_set1_ps(*a(i, p));
            for (x, &y) in row.iter_mut().zip(&bv) {
                *x = _mm512_fmadd_ps(ai, y, *x);
            }
        }
    }
}

/// Start fetching the C tile's lines at once (a tile of fewer steps than lines; otherwise
/// [`kernel`] spreads them over its first steps): its stores come after `kc` steps.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_c<const P: usize>(c: &[*mut f32], cs: usize) {
    if cs == 1 {
        for &p in c {
            for q in 0..P {
                // Prefetches never fault.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(q * NR) as *const i8);
            }
        }
    }
}

/// The `R x 16P` micro-kernel: `C[tile] (=|+=) A · B` over the tile's `kc` steps, `A` row
/// `i` of the tile at `a(i, p)` for step `p` (a packed panel, a row read in place, or a
/// column-major `A` read in place), `B` panel `q`'s step `p` at `b + q * ps + p * bs`
/// (packed: `bs = NR`; read in place: `ps = NR` and `bs` the row stride); writes the left
/// `nr` columns of rows `c[..R]`, columns `cs` apart (`first`: overwrite, else accumulate).
/// `pf = (address, lines)`: cache lines to fetch for later (see `Fetch`), one per step
/// rather than all before the tile: a burst of a few dozen fetches that miss to memory
/// fills the core's miss buffers and stalls the tile until they drain (the fetch loop took
/// ~4 % of an MoE step's samples).
///
/// # Safety
/// AVX-512F; every `a(i, p)` (`i < R`, `p < kc`) readable; the `NR` floats at
/// `b + q * ps + p * bs` readable for `q < P`, `p < kc`; the `R x nr` elements
/// `c[i] + j*cs` writable and touched by no other thread. `stream`: write a whole,
/// line-aligned first tile with non-temporal stores (the caller fences them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn kernel<const R: usize, const P: usize>(t: &Tile, a: impl Fn(usize, usize) -> *const f32) {
    let Tile {
        kc,
        b,
        ps,
        bs,
        c,
        cs,
        nr,
        first,
        pf,
        stream,
        ..
    } = *t;
    // SAFETY: the caller's contract bounds every pointer offset below.
    unsafe {
        // A streamed tile (`stream`, written whole: every row's `16 P` floats one aligned
        // run of lines) goes to memory with non-temporal stores and fetches nothing.
        let stream = stream
            && first
            && cs == 1
            && nr == P * NR
            && c[..R].iter().all(|&p| (p as usize).is_multiple_of(64));
        // The C tile's lines are fetched one per step over the first `R * P` steps (not
        // as a burst before the tile: see `pf`); its stores come after `kc` steps.
        let spread_c = cs == 1 && kc >= R * P && !stream;
        if !spread_c && !stream {
            prefetch_c::<P>(&c[..R], cs);
        }
        let mut acc: Acc<R, P> = [[_mm512_setzero_ps(); P]; R];
        // The steps that also issue a fetch, then the plain ones (a loop free of the
        // fetches' tests and address arithmetic).
        let fetching = kc.min(pf.1.max(if spread_c { R * P } else { 0 }));
        for p in 0..fetching {
            if p < pf.1 {
                _mm_prefetch::<_MM_HINT_T1>((pf.0 + p * 64) as *const i8);
            }
            if spread_c && p < R * P {
                // Prefetches never fault.
                let line = c[p / P].wrapping_add((p % P) * NR);
                _mm_prefetch::<_MM_HINT_T0>(line as *const i8);
            }
            step::<R, P>(&mut acc, &a, b, ps, bs, p);
        }
        for p in fetching..kc {
            step::<R, P>(&mut acc, &a, b, ps, bs, p);
        }
        for q in kc..pf.1 {
            _mm_prefetch::<_MM_HINT_T1>((pf.0 + q * 64) as *const i8);
        }
        if stream {
            for (i, row) in acc.iter().enumerate() {
                for (q, &v) in row.iter().enumerate() {
                    _mm512_stream_ps(c[i].add(q * NR), v);
                }
            }
        } else {
            store::<R, P>(&acc, c, cs, nr, first);
        }
    }
}

/// `f::<mr, p>(args)`: the kernel instance of a tile's height (1 to 6) and panels (1 to 3).
#[cfg(target_arch = "x86_64")]
macro_rules! by_shape {
    ($mr:expr, $p:expr, $f:ident($($arg:expr),*)) => {
        match ($mr, $p) {
            (6, 4) => $f::<6, 4>($($arg),*),
            (5, 4) => $f::<5, 4>($($arg),*),
            (4, 4) => $f::<4, 4>($($arg),*),
            (3, 4) => $f::<3, 4>($($arg),*),
            (2, 4) => $f::<2, 4>($($arg),*),
            (1, 4) => $f::<1, 4>($($arg),*),
            (6, 3) => $f::<6, 3>($($arg),*),
            (6, 2) => $f::<6, 2>($($arg),*),
            (6, _) => $f::<6, 1>($($arg),*),
            (5, 3) => $f::<5, 3>($($arg),*),
            (5, 2) => $f::<5, 2>($($arg),*),
            (5, _) => $f::<5, 1>($($arg),*),
            (4, 3) => $f::<4, 3>($($arg),*),
            (4, 2) => $f::<4, 2>($($arg),*),
            (4, _) => $f::<4, 1>($($arg),*),
            (3, 3) => $f::<3, 3>($($arg),*),
            (3, 2) => $f::<3, 2>($($arg),*),
            (3, _) => $f::<3, 1>($($arg),*),
            (2, 3) => $f::<2, 3>($($arg),*),
            (2, 2) => $f::<2, 2>($($arg),*),
            (2, _) => $f::<2, 1>($($arg),*),
            (_, 3) => $f::<1, 3>($($arg),*),
            (_, 2) => $f::<1, 2>($($arg),*),
            (_, _) => $f::<1, 1>($($arg),*),
        }
    };
}

/// [`kernel`] on `A`'s steps `ast` floats apart, each with the tile's rows side by side
/// (step `p`, row `i` at `a[p * ast + i]`): a packed A panel (`ast = MR`) or a column-major
/// `A` read in place (`ast` its column stride).
///
/// # Safety
/// As [`kernel`], with `a[p * ast + i]` readable for `p < kc`, `i < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn packed<const R: usize, const P: usize>(t: &Tile, a: *const f32, ast: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        let a = |i: usize, p: usize| a.add(p * ast + i);
        kernel::<R, P>(t, a)
    }
}

/// [`kernel`] reading A in place (row `i` of the tile: `kc` contiguous floats at `a[i]`),
/// `B`'s steps `bs` floats apart.
///
/// # Safety
/// As [`kernel`], with `kc` floats readable at each `a[i]`, `i < R`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows<const R: usize, const P: usize>(t: &Tile, a: &[*const f32; MR]) {
    let r: [*const f32; R] = std::array::from_fn(|i| a[i]);
    // SAFETY: the caller's contract.
    unsafe {
        let a = |i: usize, p: usize| r[i].add(p);
        kernel::<R, P>(t, a)
    }
}

/// One `mr x nr` tile (`nr <= PANELS * NR`) from `A`'s steps `ast` apart (a packed panel:
/// `MR`; a column-major `A` in place: its column stride); B's panels `ps` apart, its steps
/// `bs` apart.
///
/// # Safety
/// As [`kernel`] with `R = mr` (`1 <= mr <= MR`), `P = nr.div_ceil(NR)`, `a[p * ast + i]`
/// readable for `p < kc`, `i < mr`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile(t: &Tile, a: *const f32, ast: usize) {
    // SAFETY: the caller's contract.
    unsafe { by_shape!(t.mr, t.nr.div_ceil(NR), packed(t, a, ast)) }
}

/// One `mr x nr` tile (`nr <= PANELS * NR`) reading A in place; B's panels `ps` apart,
/// its steps `bs` apart (a packed `B`: `NR`; a row-major one read in place: its row stride,
/// with `ps = NR`).
///
/// # Safety
/// As [`kernel`] with `R = mr` (`1 <= mr <= MR`), `P = nr.div_ceil(NR)`, `kc` floats
/// readable at each `a[i]`, `i < mr`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile_rows(t: &Tile, a: &[*const f32; MR]) {
    // SAFETY: the caller's contract.
    unsafe { by_shape!(t.mr, t.nr.div_ceil(NR), rows(t, a)) }
}
