//! Packing and copies: `A` into row panels and `B` into column panels (checking `B`'s
//! values for finiteness as it copies), the zero and finiteness scans, and the register
//! transposes between row- and column-major lines.

use super::*;

/// Whether the `rows x cols` floats at `b` (row `r` at `b + r * rs`, `cols` a multiple of 8)
/// are all finite: `x * 0` is NaN exactly for a non-finite `x`, folded with `or` (a
/// one-cycle chain), as [`pack_b`] checks the values it copies.
///
/// # Safety
/// The floats are readable; AVX2 (the caller's target).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn rows_finite(b: *const f32, rs: usize, rows: usize, cols: usize) -> bool {
    debug_assert!(cols.is_multiple_of(8));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; each load reads 8 of a row's `cols` floats.
    unsafe {
        use std::arch::x86_64::*;
        let zero = _mm256_setzero_ps();
        let mut nan = zero;
        for r in 0..rows {
            let row = b.add(r * rs);
            for j in (0..cols).step_by(8) {
                nan = _mm256_or_ps(nan, _mm256_mul_ps(_mm256_loadu_ps(row.add(j)), zero));
            }
        }
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    (0..rows).all(|r| {
        // SAFETY: the caller's contract.
        let row = unsafe { std::slice::from_raw_parts(b.add(r * rs), cols) };
        row.iter().all(|x| x.is_finite())
    })
}

/// Whether the `n` contiguous floats at `p` are all zero (`-0.0` included): the first
/// element, then blocks of 64 tested without branches (vectorised), stopping at the first
/// block with a non-zero.
///
/// # Safety
/// `n` floats at `p` are readable.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn all_zero(p: *const f32, n: usize) -> bool {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    // Dense data answers at its first element.
    if s.first().is_some_and(|&x| x != 0.0) {
        return false;
    }
    s.chunks(64)
        .all(|c| c.iter().fold(true, |f, &x| f & (x == 0.0)))
}

/// Transpose between two sets of lines: `dst(j)[i] = src(i)[j]` for `i < lines`,
/// `j < len` (the `lines` source lines `len` floats long become `len` destination lines
/// `lines` floats long). Sixteen source lines by eight floats per pair of register
/// transposes, so each destination line gets sixteen floats (a whole cache line where it
/// is aligned) per store pair. Copies a column-major `A` row-major for the row-sparse path
/// and stores that path's row-major result into a column-major `C`.
///
/// # Safety
/// AVX2; `len` floats readable at each `src(i)`, `lines` writable at each `dst(j)`, the
/// destination lines disjoint.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn transpose_lines(
    lines: usize,
    len: usize,
    src: impl Fn(usize) -> *const f32,
    dst: impl Fn(usize) -> *mut f32,
) {
    let (l16, n8) = (lines / 16 * 16, len / 8 * 8);
    // SAFETY: for the whole body, reads are `src(i) + j`, writes `dst(j) + i`, `i < lines`,
    // `j < len`.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        for i0 in (0..l16).step_by(16) {
            let from: [*const f32; 16] = std::array::from_fn(|r| src(i0 + r));
            for j0 in (0..n8).step_by(8) {
                let load = |h: usize| {
                    avx2::transpose8(std::array::from_fn(|r| {
                        std::arch::x86_64::_mm256_loadu_ps(from[h + r].add(j0))
                    }))
                };
                let (lo, hi) = (load(0), load(8));
                for q in 0..8 {
                    let d = dst(j0 + q).add(i0);
                    std::arch::x86_64::_mm256_storeu_ps(d, lo[q]);
                    std::arch::x86_64::_mm256_storeu_ps(d.add(8), hi[q]);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let (l16, n8) = (0, 0);
        for i in 0..lines {
            let from = src(i);
            for j in (if i < l16 { n8 } else { 0 })..len {
                *dst(j).add(i) = *from.add(j);
            }
        }
    }
}

/// Up to eight evenly spaced steps of `k` (the columns whose density [`sparse::worth`]
/// samples), in `buf`.
pub(super) fn sample_steps(k: usize, buf: &mut [usize; 8]) -> &[usize] {
    let picks = k.min(8);
    for (t, x) in buf.iter_mut().take(picks).enumerate() {
        *x = t * k / picks;
    }
    &buf[..picks]
}

/// Pack rows `rows` and steps `kidx` of A into row panels of `MR`: panel `p`, step `k`,
/// row `i` at `dst[p*MR*kc + k*MR + i]`, rows past the end zero.
///
/// # Safety
/// Every `a[i*rs + k*cs]` for `i` in `rows`, `k` in `kidx` is readable.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn pack_a(rows: &[usize], kidx: &[usize], a: MatRef, dst: &mut [f32]) {
    let MatRef { ptr: a, rs, cs } = a;
    let kc = kidx.len();
    // A run of consecutive steps (the common case) is addressed without the index list.
    let run = kidx[kc - 1] - kidx[0] == kc - 1;
    let k0 = kidx[0];
    for (p, tile) in rows.chunks(MR).enumerate() {
        let panel = &mut dst[p * MR * kc..(p + 1) * MR * kc];
        if tile.len() < MR {
            panel.fill(0.0);
        }
        let out = panel.as_mut_ptr();
        // (Rows past a short tile are never read.)
        let mut src = [a; MR];
        for (q, &i) in tile.iter().enumerate() {
            // SAFETY: row `i` is in `rows`.
            src[q] = unsafe { a.add(i * rs) };
        }
        let nq = tile.len();
        // SAFETY: `kk < kc` and `q < nq <= MR` keep the writes inside `panel`; every read is
        // an element `(i, k)` with `i` in `rows`, `k` in `kidx`.
        unsafe {
            if nq == MR && rs == 1 && tile[MR - 1] - tile[0] == MR - 1 {
                // A column-major A (a transposed activation in a weight gradient): the
                // tile's rows are one contiguous run per step, moved whole (24 bytes), not
                // as six scalar loads; also when steps are left out (the zero rows of an
                // expert buffer as `B`).
                let s0 = src[0];
                if run {
                    for kk in 0..kc {
                        let from = s0.add((k0 + kk) * cs);
                        std::ptr::copy_nonoverlapping(from, out.add(kk * MR), MR);
                    }
                } else {
                    for (kk, &k) in kidx.iter().enumerate() {
                        std::ptr::copy_nonoverlapping(s0.add(k * cs), out.add(kk * MR), MR);
                    }
                }
            } else if run && nq == MR {
                for kk in 0..kc {
                    let off = (k0 + kk) * cs;
                    let o = out.add(kk * MR);
                    for (q, sq) in src.iter().enumerate() {
                        *o.add(q) = *sq.add(off);
                    }
                }
            } else {
                for (kk, &k) in kidx.iter().enumerate() {
                    let o = out.add(kk * MR);
                    for (q, sq) in src.iter().enumerate().take(nq) {
                        *o.add(q) = *sq.add(k * cs);
                    }
                }
            }
        }
    }
}

/// Pack steps `kidx` of an `? x nc` block of B into column panels `W` wide (a multiple of
/// `NR`; a constant, so the offsets below are shifts): panel `p`, step `k`, column `j` at
/// `dst[p*panel_stride(W, kc) + k*W + j]`, columns
/// past `nc` zero. The micro-kernel reads `NR`-wide panels; the row-sparse path
/// ([`sparse`]) reads [`sparse::GROUP`]-wide ones, so that a slice of steps of one group is
/// one compact block in L1 (with `NR`-wide panels a step's columns lie 16 KiB apart, all in
/// one L1 set). Returns whether every packed element is finite (with `check`; `true`
/// unchecked otherwise).
///
/// # Safety
/// Every `b[k*rs + j*cs]` for `k` in `kidx`, `j < nc` is readable; `dst` holds
/// `nc.div_ceil(W) * panel_stride(W, kidx.len())` floats, 32-byte aligned.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn pack_b<const W: usize>(
    kidx: &[usize],
    nc: usize,
    b: MatRef,
    dst: &mut [f32],
    check: bool,
) -> bool {
    let MatRef { ptr: b, rs, cs } = b;
    debug_assert!(W.is_multiple_of(NR));
    let width = W;
    let kc = kidx.len();
    let ps = panel_stride(width, kc);
    // Where an `NR`-wide chunk of columns from `j` starts at step `kk`.
    let at = |j: usize, kk: usize| (j / width) * ps + kk * width + j % width;
    if !nc.is_multiple_of(width) {
        let p = nc / width;
        dst[p * ps..p * ps + width * kc].fill(0.0);
    }
    // `x * 0 == 0` exactly when `x` is finite; folded with `&` so it vectorises.
    let mut finite = true;
    if cs == 1 {
        // Rows contiguous: read each row once, in order (a panel-by-panel walk would jump a
        // whole row ahead per element, across pages, where no prefetcher follows).
        #[cfg(target_arch = "x86_64")]
        {
            // One pass per row: each whole chunk moved as two vectors, its finiteness
            // folded in from the same registers (`x * 0` is NaN exactly for a non-finite
            // `x`, `±0` otherwise, and a NaN's bits survive an `or` with others: a
            // one-cycle chain, where an add chain made the check cost as much as the
            // copy); the remainder as below.
            use std::arch::x86_64::*;
            let whole = nc / NR * NR;
            // SAFETY: AVX2 (this function's target); reads stay inside row `k`'s `nc`
            // floats, writes inside its chunks of `dst`.
            unsafe {
                let zero = _mm256_setzero_ps();
                let mut nan = zero;
                for (kk, &k) in kidx.iter().enumerate() {
                    let row = b.add(k * rs);
                    for j in (0..whole).step_by(NR) {
                        let v0 = _mm256_loadu_ps(row.add(j));
                        let v1 = _mm256_loadu_ps(row.add(j + 8));
                        let d = dst.as_mut_ptr().add(at(j, kk));
                        _mm256_storeu_ps(d, v0);
                        _mm256_storeu_ps(d.add(8), v1);
                        if check {
                            nan = _mm256_or_ps(nan, _mm256_mul_ps(v0, zero));
                            nan = _mm256_or_ps(nan, _mm256_mul_ps(v1, zero));
                        }
                    }
                    if whole < nc {
                        let part = std::slice::from_raw_parts(row.add(whole), nc - whole);
                        if check {
                            finite &= part.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
                        }
                        let at = at(whole, kk);
                        dst[at..at + part.len()].copy_from_slice(part);
                    }
                }
                finite &= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0;
            }
            return finite;
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (kk, &k) in kidx.iter().enumerate() {
            // SAFETY: `nc` contiguous elements of row `k`.
            let src = unsafe { std::slice::from_raw_parts(b.add(k * rs), nc) };
            if check {
                finite &= src.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
            }
            for (q, part) in src.chunks(NR).enumerate() {
                let at = at(q * NR, kk);
                match <&[f32; NR]>::try_from(part) {
                    // A whole chunk: a fixed-size move (inlined; no memcpy call per 64 B).
                    Ok(whole) => {
                        let d: &mut [f32; NR] = (&mut dst[at..at + NR]).try_into().expect("NR");
                        *d = *whole;
                    }
                    Err(_) => dst[at..at + part.len()].copy_from_slice(part),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        return finite;
    }
    for j0 in (0..nc).step_by(NR) {
        let cols = NR.min(nc - j0);
        // Columns strided (a transposed B): sixteen column streams, one step at a time.
        // (Columns past a short chunk are never read.)
        let mut src = [b; NR];
        for (j, s) in src.iter_mut().enumerate().take(cols) {
            // SAFETY: column `j0 + j < nc`.
            *s = unsafe { b.add((j0 + j) * cs) };
        }
        #[cfg(target_arch = "x86_64")]
        if rs == 1 && cols == NR && kidx[kc - 1] - kidx[0] == kc - 1 {
            // Contiguous columns over consecutive steps: 8 x 8 register transposes.
            let k0 = kidx[0];
            let from = src.map(|p| p.wrapping_add(k0));
            // SAFETY: each column holds `kc` readable floats from step `k0`; the chunk's
            // `kc` rows of `NR` floats, `width` apart from `at(j0, 0)`, are inside `dst`.
            finite &= unsafe {
                avx2::pack_columns(kc, &from, dst[at(j0, 0)..].as_mut_ptr(), width, check)
            };
            continue;
        }
        for (kk, &k) in kidx.iter().enumerate() {
            let o = at(j0, kk);
            let o = &mut dst[o..o + cols];
            for (x, s) in o.iter_mut().zip(&src) {
                // SAFETY: element `(k, j)` with `k` in `kidx`, `j < nc`.
                *x = unsafe { *s.add(k * rs) };
            }
            if check {
                finite &= o.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
            }
        }
    }
    finite
}
