//! The AVX2 micro-kernels: the `6 x 16` tile (twelve eight-lane accumulators) on a packed
//! `A` panel or on `A` rows read in place, the 8x8 register transpose, and the packing of
//! sixteen contiguous columns of `B` by transposes.

use super::{Tile, MR, NR};
use std::arch::x86_64::*;

/// The accumulators of an `R`-row tile: two 8-lane vectors per row.
type Acc<const R: usize> = [[__m256; 2]; R];

/// Start fetching the C tile's lines: its stores come after `kc` steps.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn prefetch_c(c: &[*mut f32], cs: usize) {
    if cs == 1 {
        for &p in c {
            // Prefetches never fault; these are the tile row's first and last lines.
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(NR - 1) as *const i8);
        }
    }
}

/// Write (`first`) or add the accumulators to the left `nr` columns of the `R` C rows.
///
/// # Safety
/// As [`kernel`] for `c`.
/// Always inlined into its (AVX2) kernel, so the accumulators stay in registers.
#[inline(always)]
unsafe fn store<const R: usize>(
    acc: &Acc<R>,
    c: &[*mut f32; MR],
    cs: usize,
    nr: usize,
    first: bool,
) {
    // SAFETY: the caller's contract bounds every element written.
    unsafe {
        if nr == NR && cs == 1 {
            for (row, &p) in acc.iter().zip(c) {
                if first {
                    _mm256_storeu_ps(p, row[0]);
                    _mm256_storeu_ps(p.add(8), row[1]);
                } else {
                    _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), row[0]));
                    let q = p.add(8);
                    _mm256_storeu_ps(q, _mm256_add_ps(_mm256_loadu_ps(q), row[1]));
                }
            }
            return;
        }
        let mut tile = [0.0f32; NR];
        for (row, &p) in acc.iter().zip(c) {
            _mm256_storeu_ps(tile.as_mut_ptr(), row[0]);
            _mm256_storeu_ps(tile.as_mut_ptr().add(8), row[1]);
            for (j, &v) in tile.iter().enumerate().take(nr) {
                let q = p.add(j * cs);
                *q = if first { v } else { *q + v };
            }
        }
    }
}

/// The `R x NR` micro-kernel: `C[tile] (=|+=) Apanel · Bpanel` over the tile's `kc`
/// packed steps (A panel rows `MR` apart per step, of which the first `R` are used), writing
/// the left `nr` columns of rows `c[..R]`, columns `cs` apart (`first`: overwrite, else
/// accumulate).
///
/// # Safety
/// AVX2 and FMA are available; `a` holds `kc * MR` and `b` `kc * NR` readable floats
/// (`b` 32-byte aligned); the `R x nr` elements `c[i] + j*cs` are writable and touched
/// by no other thread.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize>(t: &Tile, a: *const f32) {
    let Tile {
        kc,
        b,
        c,
        cs,
        nr,
        first,
        ..
    } = *t;
    // SAFETY: the caller's contract bounds every pointer offset below.
    unsafe {
        prefetch_c(&c[..R], cs);
        let mut acc: Acc<R> = [[_mm256_setzero_ps(); 2]; R];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..kc {
            let b0 = _mm256_load_ps(bp);
            let b1 = _mm256_load_ps(bp.add(8));
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm256_broadcast_ss(&*ap.add(i));
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        store::<R>(&acc, c, cs, nr, first);
    }
}

/// [`kernel`] reading A in place: row `i` of the tile is `kc` contiguous floats at
/// `a[i]`.
///
/// # Safety
/// As [`kernel`], with `kc` floats readable at each `a[i]`, `i < R`.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_rows<const R: usize>(t: &Tile, a: &[*const f32; MR]) {
    let Tile {
        kc,
        b,
        c,
        cs,
        nr,
        first,
        ..
    } = *t;
    // SAFETY: the caller's contract bounds every pointer offset below.
    unsafe {
        prefetch_c(&c[..R], cs);
        let rows: [*const f32; R] = std::array::from_fn(|i| a[i]);
        let mut acc: Acc<R> = [[_mm256_setzero_ps(); 2]; R];
        let mut bp = b;
        for p in 0..kc {
            let b0 = _mm256_load_ps(bp);
            let b1 = _mm256_load_ps(bp.add(8));
            for (row, ar) in acc.iter_mut().zip(rows) {
                let ai = _mm256_broadcast_ss(&*ar.add(p));
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
            bp = bp.add(NR);
        }
        store::<R>(&acc, c, cs, nr, first);
    }
}

/// One `mr x nr` tile from a packed A panel: [`kernel`] with exactly `mr` rows
/// (a partial tile computes only its own rows).
///
/// # Safety
/// As [`kernel`] with `R = mr` (`1 <= mr <= MR`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(t: &Tile, a: *const f32) {
    // SAFETY: the caller's contract, with `R == mr`.
    unsafe { by_count!(t.mr, [6, 5, 4, 3, 2], kernel(t, a)) }
}

/// One `mr x nr` tile reading A in place: [`kernel_rows`] with exactly `mr` rows.
///
/// # Safety
/// As [`kernel_rows`] with `R = mr` (`1 <= mr <= MR`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile_rows(t: &Tile, a: &[*const f32; MR]) {
    // SAFETY: the caller's contract, with `R == mr`.
    unsafe { by_count!(t.mr, [6, 5, 4, 3, 2], kernel_rows(t, a)) }
}

/// Transpose eight rows of eight floats (row `i` of the result is column `i`).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Pack `kc` steps of sixteen contiguous columns (`col[j]` holds `kc` floats) into a B
/// panel (`dst[k*NR + j]`); returns whether every value is finite (with `check`;
/// `true` unchecked otherwise).
///
/// # Safety
/// `kc` floats readable at each `col[j]`; `NR` floats writable at `dst + k * ld` for
/// every `k < kc` (32-byte aligned when `kc >= 8`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_columns(
    kc: usize,
    col: &[*const f32; NR],
    dst: *mut f32,
    ld: usize,
    check: bool,
) -> bool {
    // `x * 0` is NaN exactly for a non-finite `x`, `±0` otherwise, and a NaN's bits
    // survive an `or` with others.
    let mut nan = _mm256_setzero_ps();
    let zero = _mm256_setzero_ps();
    let mut kk = 0;
    // SAFETY: every read is `col[j] + kk + t` with `kk + t < kc`, every write is
    // `dst + k * ld + j` with `k < kc`, `j < NR`.
    unsafe {
        while kk + 8 <= kc {
            for half in 0..2 {
                let rows: [__m256; 8] =
                    std::array::from_fn(|j| _mm256_loadu_ps(col[half * 8 + j].add(kk)));
                if check {
                    for &r in &rows {
                        nan = _mm256_or_ps(nan, _mm256_mul_ps(r, zero));
                    }
                }
                for (t, v) in transpose8(rows).into_iter().enumerate() {
                    _mm256_store_ps(dst.add((kk + t) * ld + half * 8), v);
                }
            }
            kk += 8;
        }
        let mut finite = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0;
        for k in kk..kc {
            for (j, c) in col.iter().enumerate() {
                let x = *c.add(k);
                finite &= x * 0.0 == 0.0;
                *dst.add(k * ld + j) = x;
            }
        }
        finite
    }
}
