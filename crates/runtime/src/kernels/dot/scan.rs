//! Finding non-zeros: a sparse side's term lists by one pass over the operand (each block
//! of 64 values compared with zero into one bit mask), the sampled test that tells a dense
//! operand apart first, and the finiteness scans the sparse and masked paths need.

use super::float::GemmFloat;
use super::plan::View;
use crate::kernels::with_avx2;
use rayon::prelude::*;

/// One non-zero of a sparse operand as its path adds it: the result's row (lhs) or column
/// (rhs) it goes to, its step `kk`, and its value.
pub(super) type Term<T> = (u32, u32, T);

/// The non-zeros of every batch entry of `x` read through `view` (an lhs when `lhs`, else
/// an rhs walked as its transpose), each entry's in the order the sparse path adds them
/// (each row's or column's terms in increasing `kk`), when at most 10 % of `x` is non-zero;
/// else `None`. A dense operand (every expert GEMM is a candidate) is told apart by 4096
/// samples in evenly spaced runs (over a fifth non-zero). One pass over `x`: the sparse
/// path then reads the lists, not `x`. The answer only decides speed: every path gives the
/// same values.
pub(super) fn sparse_terms<T: GemmFloat>(
    x: &[T],
    view: &View,
    lhs: bool,
) -> Option<Vec<Vec<Term<T>>>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    if sampled_dense(x) {
        return None;
    }
    let limit = x.len() / 10;
    let (found, over) = (AtomicUsize::new(0), AtomicBool::new(false));
    let (rows, cols) = (
        (&view.rows[..], view.rows_unit),
        (&view.cols[..], view.cols_unit),
    );
    let (outer, inner) = if lhs { (rows, cols) } else { (cols, rows) };
    let entry = |bb: usize| {
        let mut terms: Vec<Term<T>> = Vec::new();
        if over.load(Ordering::Relaxed) {
            return terms;
        }
        with_avx2(
            #[inline(always)]
            || {
                nonzeros(x, view.batch_off[bb], outer, inner, |i, kk, v| {
                    terms.push((i as u32, kk as u32, v))
                })
            },
        );
        if found.fetch_add(terms.len(), Ordering::Relaxed) + terms.len() > limit {
            over.store(true, Ordering::Relaxed);
        }
        terms
    };
    let b = view.batch_off.len();
    let lists: Vec<Vec<Term<T>>> = if x.len() >= crate::kernels::PAR_MIN && b >= 2 {
        (0..b).into_par_iter().map(entry).collect()
    } else {
        (0..b).map(entry).collect()
    };
    (!over.into_inner()).then_some(lists)
}

/// Whether 64 evenly spaced runs of 64 elements (a few cache lines each) are over a fifth
/// non-zero (a dense operand, told apart without reading it all); a short `x` (at most
/// 4096 elements) is counted whole. Short operands count too: the gating GEMMs' gradient
/// (`[4,128,32]`, dense) was otherwise listed term by term before being found dense, which
/// doubled their time (126 against 59 us hot for the GEMM alone).
pub(super) fn sampled_dense<T: GemmFloat>(x: &[T]) -> bool {
    const RUNS: usize = 64;
    const RUN: usize = 64;
    // Counted on AVX2 registers where the CPU has them: on a dense operand the sample is
    // all the scan does, ~1 % of a 128 x 128 x 512 product's time on the baseline's
    // four-lane compares.
    with_avx2(
        #[inline(always)]
        || {
            let count =
                |xs: &[T]| xs.iter().fold(0u32, |n, &v| n + u32::from(v != T::ZERO)) as usize;
            if x.len() <= RUNS * RUN {
                return 5 * count(x) > x.len();
            }
            let step = x.len() / RUNS;
            let hits: usize = (0..RUNS).map(|i| count(&x[i * step..i * step + RUN])).sum();
            hits > RUNS * RUN / 5
        },
    )
}

/// The largest `|x|`, or `None` when some value is not finite: one pass, vectorised.
pub(super) fn max_abs_finite(x: &[f32]) -> Option<f32> {
    // The bits of `|x|` order as integers the way the values do (non-negative floats), and
    // exceed `f32::MAX`'s bits exactly for infinities and NaN: one integer max, vectorised.
    let block = |c: &[f32]| {
        with_avx2(
            #[inline(always)]
            || {
                c.iter()
                    .fold(0u32, |m, &v| m.max(v.to_bits() & 0x7fff_ffff))
            },
        )
    };
    let m = if x.len() >= crate::kernels::PAR_MIN {
        x.par_chunks(1 << 14).map(block).reduce(|| 0, u32::max)
    } else {
        block(x)
    };
    (m <= f32::MAX.to_bits()).then_some(f32::from_bits(m))
}

/// Whether every value is finite: folded over blocks without an early exit per element, so
/// it vectorises (`x * 0` is zero exactly for finite `x`).
pub(super) fn chunk_finite<T: GemmFloat>(x: &[T]) -> bool {
    with_avx2(
        #[inline(always)]
        || {
            x.chunks(256)
                .all(|c| c.iter().fold(true, |f, &v| f & (v * T::ZERO == T::ZERO)))
        },
    )
}

pub(super) fn all_finite<T: GemmFloat>(x: &[T]) -> bool {
    if x.len() >= crate::kernels::PAR_MIN {
        x.par_chunks(1 << 14).all(chunk_finite)
    } else {
        chunk_finite(x)
    }
}

/// Bit `t` set for each non-zero (NaN included) of the `run.len() <= 64` values, folded
/// value by value.
#[inline(always)]
pub(super) fn fold_nonzero_bits<T: GemmFloat>(run: &[T]) -> u64 {
    run.iter()
        .enumerate()
        .fold(0u64, |bits, (t, &v)| bits | (u64::from(v != T::ZERO) << t))
}

/// Call `f(t, v)` for every non-zero `v = run[t]`, in order. Each block of 64 values is
/// compared with zero at once into one bit mask ([`GemmFloat::nonzero_bits64`]) and only
/// its set bits are visited, so a one-hot operand costs little more than a read: a branch
/// per element of every block holding a non-zero took half of a dispatch einsum's time
/// (25-35 of 50-70 us per device in the small MoE layer). f32 masks are taken by AVX2
/// compares and movemasks (a fold over 16 values compiled to scalar compares): the small
/// layer's step at 8 devices, in-process A/B, 0.8 % faster on one thread, 0.3 % on two.
#[inline(always)]
pub(super) fn for_nonzero<T: GemmFloat>(run: &[T], mut f: impl FnMut(usize, T)) {
    for (c, block) in run.chunks(64).enumerate() {
        let mut bits = T::nonzero_bits64(block);
        while bits != 0 {
            let q = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            f(c * 64 + q, block[q]);
        }
    }
}

/// Call `f(i, kk, v)` for every non-zero `v` at `xb + rows[i] + cols[kk]` (`rows_unit`,
/// `cols_unit`: whether consecutive rows, columns are adjacent), walking the contiguous
/// direction. Either order visits the terms of each `i` in increasing `kk`.
#[inline(always)]
pub(super) fn nonzeros<T: GemmFloat>(
    x: &[T],
    xb: usize,
    (rows, rows_unit): (&[usize], bool),
    (cols, cols_unit): (&[usize], bool),
    mut f: impl FnMut(usize, usize, T),
) {
    let (m, k) = (rows.len(), cols.len());
    if m == 0 || k == 0 {
        return;
    }
    if cols_unit {
        for (i, &ro) in rows.iter().enumerate() {
            let at = xb + ro + cols[0];
            for_nonzero(&x[at..at + k], |kk, v| f(i, kk, v));
        }
    } else if rows_unit {
        for (kk, &co) in cols.iter().enumerate() {
            let at = xb + co + rows[0];
            for_nonzero(&x[at..at + m], |i, v| f(i, kk, v));
        }
    } else {
        for (i, &ro) in rows.iter().enumerate() {
            for (kk, &co) in cols.iter().enumerate() {
                let v = x[xb + ro + co];
                if v != T::ZERO {
                    f(i, kk, v);
                }
            }
        }
    }
}
