//! Products computed only where masks are non-zero (SDDMM): a dot used only multiplied by
//! mostly-zero masks and summed, when a run-time check shows that skipping is exact; the
//! products, or directly their row sums.

use super::dense::OutPtr;
use super::plan::DotPlan;
use super::scan::{for_nonzero, max_abs_finite, sampled_dense};
use super::support::Support;
use crate::kernels::with_avx2;
use rayon::prelude::*;

/// An f32 [`dot`] whose result is only ever used multiplied by one of `masks` (each the
/// result's shape, read elementwise) and then summed: the result is computed only where
/// some mask is non-zero, and is `+0` elsewhere (SDDMM), when that is exact and pays: the
/// masks' non-zeros at most a tenth of their elements (counted by the walk itself, which
/// gives up past that), both operands finite and `K * max|lhs| * max|rhs|` (twice, for
/// rounding) inside f32, so every skipped value is finite and its product with a zero mask
/// element is a zero, which a sum (starting at `+0`) does not see. The values computed
/// equal the dense product to rounding (eight partial sums in increasing `k`). This is the
/// MoE combine weights' gradient: a dense `[G, S, M] x [E, G, C, M]` product of which the
/// gating masks keep one or two `(e, c)` per token. Returns how many values were computed
/// (`None`: not applicable; `out` then holds arbitrary values, for the dense product to
/// overwrite).
pub(super) fn dot_masked(
    p: &DotPlan,
    l: &[f32],
    r: &[f32],
    masks: &[&[f32]],
    out: &mut [f32],
) -> Option<usize> {
    let len = out.len();
    let sparse = |t: usize| masks[t].len() == len && !sampled_dense(masks[t]);
    if !masked_applies(p, l, r, masks.len(), sparse) {
        return None;
    }
    let (m, n) = (p.m, p.n);
    let whole = OutPtr {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let rows_contiguous = p.out.cs == 1 && p.out.col_off.is_none();
    masked_walk(
        p,
        l,
        r,
        masks,
        #[inline(always)]
        |bb, value, tick| {
            let optr = whole; // the whole `OutPtr` (Sync), not its raw field
            let ob = p.out.batch_off[bb];
            assert!(ob + p.out.last(m, n) < optr.len);
            let mut computed = 0;
            for i in 0..m {
                let o0 = ob + p.out.row(i);
                // Every write below is element `(bb, i, j)` of this entry, bounded by the
                // assert above; no other task writes it.
                if rows_contiguous {
                    // The row zeroed, then the masks' non-zeros computed (once per mask that
                    // has one there: the same value).
                    // SAFETY: row `i` of this entry, `n` contiguous elements.
                    unsafe { std::slice::from_raw_parts_mut(optr.ptr.add(o0), n) }.fill(0.0);
                    for x in masks {
                        for_nonzero(&x[o0..o0 + n], |j, _| {
                            computed += 1;
                            // SAFETY: element `(bb, i, j)`, `j < n`.
                            unsafe { *optr.ptr.add(o0 + j) = value(i, j) }
                        });
                    }
                } else {
                    for j in 0..n {
                        let at = o0 + p.out.col(j);
                        let v = if masks.iter().all(|x| x[at] == 0.0) {
                            0.0
                        } else {
                            computed += 1;
                            value(i, j)
                        };
                        // SAFETY: element `(bb, i, j)`.
                        unsafe { *optr.ptr.add(at) = v };
                    }
                }
                if !tick(std::mem::take(&mut computed)) {
                    return;
                }
            }
        },
    )
}

/// [`dot_masked`] for a product that is only summed over its columns after each
/// multiply: `sums[t][bb*m + i]` = the f64 sum over `j` (increasing) of the f32 products
/// `value(bb, i, j) * masks[t][bb, i, j]`, rounded once to f32 — the reduction of
/// `dot * masks[t]` over the result's column dims, exactly as the separate multiply and
/// reduce compute it, without writing the product or the multiplied values. The masks'
/// zeros are left out: their terms are zeros (the values are finite, by the same run-time
/// check as [`dot_masked`]), which an f64 sum starting at `+0` does not see. The plan must
/// write the untransposed result. Returns how many values were computed, or `None`
/// (not applicable; the caller computes the dense product and [`masked_row_sums`]).
/// `sups[t]`, where given, is mask `t`'s support: its rows' non-zeros are read from it, in
/// the same order, instead of scanning the mask (trusted only when found on a buffer of the
/// mask's length).
pub(super) fn dot_masked_sums(
    p: &DotPlan,
    l: &[f32],
    r: &[f32],
    masks: &[&[f32]],
    sups: &[Option<&Support>],
    sums: &mut [&mut [f32]],
) -> Option<usize> {
    let (b, m, n) = (p.b, p.m, p.n);
    let len = b * m * n;
    assert!(!p.transposed, "row sums need the untransposed result");
    assert_eq!(masks.len(), sums.len());
    assert_eq!(masks.len(), sups.len());
    // A mask's support stands for its scan only when found on a buffer of the result's
    // length (the untransposed result is row-major `[b, m, n]`, as the masks are read); an
    // empty mask is given by its support alone (its buffer released: the executor's
    // `frees_sparse`). A mask with a support is sparse (a support is found only on a
    // buffer at most a tenth non-zero), so it is not sampled.
    let sups: Vec<Option<&Support>> = sups
        .iter()
        .zip(masks)
        .map(|(s, x)| s.filter(|s| s.fits(len) && (x.is_empty() || x.len() == len)))
        .collect();
    let sparse = |t: usize| {
        let x = masks[t];
        sups[t].is_some() || (!x.is_empty() && x.len() == len && !sampled_dense(x))
    };
    if !masked_applies(p, l, r, masks.len(), sparse) || sums.iter().any(|s| s.len() != b * m) {
        return None;
    }
    // Each batch entry's sums (`masks.len()` runs of `m`), placed after the walk.
    let parts: std::sync::Mutex<Vec<(usize, Vec<f32>)>> = Default::default();
    let computed = masked_walk(
        p,
        l,
        r,
        masks,
        #[inline(always)]
        |bb, value, tick| {
            let mut part = vec![0.0f32; masks.len() * m];
            // Each support's next position (its first in this entry).
            let mut next: Vec<usize> = sups
                .iter()
                .map(|s| s.map_or(0, |s| s.pos.partition_point(|&q| (q as usize) < bb * m * n)))
                .collect();
            for i in 0..m {
                let o0 = bb * m * n + i * n;
                let mut computed = 0;
                for (t, x) in masks.iter().enumerate() {
                    let mut acc = 0.0f64;
                    if let Some(sup) = sups[t] {
                        // The row's non-zeros from the support, in increasing column.
                        let at = &mut next[t];
                        while *at < sup.pos.len() && (sup.pos[*at] as usize) < o0 + n {
                            let (j, w) = (sup.pos[*at] as usize - o0, sup.vals[*at] as f32);
                            computed += 1;
                            acc += (value(i, j) * w) as f64;
                            *at += 1;
                        }
                    } else {
                        for_nonzero(&x[o0..o0 + n], |j, w| {
                            computed += 1;
                            acc += (value(i, j) * w) as f64;
                        });
                    }
                    part[t * m + i] = acc as f32;
                }
                if !tick(computed) {
                    return;
                }
            }
            parts.lock().expect("no panics while held").push((bb, part));
        },
    )?;
    for (bb, part) in parts.into_inner().expect("no panics while held") {
        for (t, s) in sums.iter_mut().enumerate() {
            s[bb * m..(bb + 1) * m].copy_from_slice(&part[t * m..(t + 1) * m]);
        }
    }
    Some(computed)
}

/// Whether the masked product applies (see [`dot_masked`]): a non-empty product, `masks`
/// masks each `sparse` (mask `t`: of the result's length and not dense by sampling, or
/// known sparse by its support), finite operands and no overflow possible in any value
/// (so every skipped value is finite).
pub(super) fn masked_applies(
    p: &DotPlan,
    l: &[f32],
    r: &[f32],
    masks: usize,
    sparse: impl Fn(usize) -> bool,
) -> bool {
    p.b * p.m * p.n * p.k != 0 && masks > 0 && (0..masks).all(sparse) && {
        let (Some(ml), Some(mr)) = (max_abs_finite(l), max_abs_finite(r)) else {
            return false;
        };
        (2.0 * p.k as f64 * ml as f64 * mr as f64) < f32::MAX as f64
    }
}

/// Run `entry(bb, value, tick)` for every batch entry (in parallel when large):
/// `value(i, j)` computes element `(bb, i, j)` of the product (eight partial sums in
/// increasing `k`), `tick(c)` counts `c` computed values and says whether to go on. The
/// walk gives up (`None`) once the count passes a tenth of the masks' elements, so a
/// dense mask costs at most about a tenth of its product; else it returns the count.
pub(super) fn masked_walk<F>(
    p: &DotPlan,
    l: &[f32],
    r: &[f32],
    masks: &[&[f32]],
    entry: F,
) -> Option<usize>
where
    F: Fn(usize, &dyn Fn(usize, usize) -> f32, &dyn Fn(usize) -> bool) + Sync,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (b, m, n, k) = (p.b, p.m, p.n, p.k);
    let budget = masks.len() * b * m * n / 10;
    let seen = AtomicUsize::new(0);
    let tick = |c: usize| seen.fetch_add(c, Ordering::Relaxed) + c <= budget;
    let (lv, rv) = (&p.lhs.view, &p.rhs.view);
    let contiguous = lv.cols_unit && rv.rows_unit;
    let one = |bb: usize| {
        if seen.load(Ordering::Relaxed) > budget {
            return;
        }
        let (lb, rb) = (lv.batch_off[bb], rv.batch_off[bb]);
        let value = |i: usize, j: usize| {
            let (l0, r0) = (lb + lv.rows[i], rb + rv.cols[j]);
            if contiguous {
                let a = &l[l0 + lv.cols[0]..l0 + lv.cols[0] + k];
                let c = &r[r0 + rv.rows[0]..r0 + rv.rows[0] + k];
                dot8(a, c)
            } else {
                (0..k).fold(0.0, |acc, kk| {
                    acc + l[l0 + lv.cols[kk]] * r[r0 + rv.rows[kk]]
                })
            }
        };
        with_avx2(
            #[inline(always)]
            || entry(bb, &value, &tick),
        );
    };
    if b >= 2 && b * m * n >= crate::kernels::PAR_MIN {
        (0..b).into_par_iter().for_each(one);
    } else {
        (0..b).for_each(one);
    }
    let seen = seen.into_inner();
    (seen <= budget).then_some(seen)
}

/// `sum a[i] * b[i]` over eight lanes of partial sums (vectorised), then the lanes in order.
pub(super) fn dot8(a: &[f32], b: &[f32]) -> f32 {
    with_avx2(
        #[inline(always)]
        || dot8_impl(a, b),
    )
}

#[inline(always)]
pub(super) fn dot8_impl(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for q in 0..8 {
            acc[q] += x[q] * y[q];
        }
    }
    acc.iter().sum::<f32>() + tail
}
