//! The sparse paths of a batch entry: each term of the mostly-zero side adds a multiple of
//! a line of the dense operand to a line of the result, in increasing step order (the
//! dense product's sums with the zero terms left out).

use super::dense::OutPtr;
use super::float::GemmFloat;
use super::plan::DotPlan;
use super::scan::Term;

/// Accumulate `v * x` into element `(i, j)`-addressed storage through the raw output.
#[inline(always)]
pub(super) fn axpy_out<T: GemmFloat>(out: OutPtr<T>, at: usize, v: T) {
    debug_assert!(at < out.len);
    // SAFETY: `at` is inside the result buffer (checked by the caller's bounds assert) and
    // only the task owning this batch entry touches it.
    unsafe {
        let o = out.ptr.add(at);
        *o = *o + v;
    }
}

/// `out[at + t] += v * xs[t]` over a contiguous run of the result (a row or column of the
/// calling task's batch entry); with `first`, the run's first term, added to the zero a
/// product's sum starts from (`0 + v * x`: a `-0` term gives `+0`, as there) instead of
/// to what the run holds.
#[inline(always)]
pub(super) fn add_run<T: GemmFloat>(out: OutPtr<T>, at: usize, xs: &[T], v: T, first: bool) {
    assert!(at + xs.len() <= out.len);
    // SAFETY: bounded by the assert; the run belongs to this task's batch entry, which no
    // other task writes and nothing else borrows.
    let run = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), xs.len()) };
    if first {
        for (o, &x) in run.iter_mut().zip(xs) {
            *o = T::ZERO + v * x;
        }
    } else {
        for (o, &x) in run.iter_mut().zip(xs) {
            *o = *o + v * x;
        }
    }
}

#[inline(always)]
pub(super) fn zero_out<T: GemmFloat>(p: &DotPlan, out: OutPtr<T>, ob: usize) {
    let (m, n) = (p.m, p.n);
    assert!(ob + p.out.last(m, n) < out.len);
    // Every write below is bounded by the assert above, and only this batch entry's
    // elements (a row or column slice of it is disjoint from every other entry's).
    if p.out.rs == 1 && p.out.row_off.is_none() {
        // Columns are the contiguous runs (a transposed result).
        for j in 0..n {
            let o = ob + p.out.col(j);
            // SAFETY: column `j` of this entry, `m` contiguous elements.
            unsafe { std::slice::from_raw_parts_mut(out.ptr.add(o), m) }.fill(T::ZERO);
        }
    } else if p.out.cs == 1 && p.out.col_off.is_none() {
        // Rows are the contiguous runs.
        for i in 0..m {
            let o = ob + p.out.row(i);
            // SAFETY: row `i` of this entry, `n` contiguous elements.
            unsafe { std::slice::from_raw_parts_mut(out.ptr.add(o), n) }.fill(T::ZERO);
        }
    } else {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: element `(i, j)` of this entry.
                unsafe { *out.ptr.add(ob + p.out.row(i) + p.out.col(j)) = T::ZERO };
            }
        }
    }
}

/// Add the terms into `lines` contiguous runs of the result, `len` long, run `q` at
/// `start(q)`: term `(q, kk, v)` adds `v * src(kk)` to run `q`. A run's first term is
/// written onto zero and runs without terms are zero-filled, so the result is written once,
/// not zeroed first.
#[inline(always)]
pub(super) fn place_runs<'a, T: GemmFloat>(
    out: OutPtr<T>,
    (lines, len): (usize, usize),
    start: impl Fn(usize) -> usize,
    src: impl Fn(usize) -> &'a [T],
    terms: &[Term<T>],
) {
    let mut seen = vec![false; lines];
    for &(q, kk, v) in terms {
        let q = q as usize;
        let first = !std::mem::replace(&mut seen[q], true);
        add_run(out, start(q), src(kk as usize), v, first);
    }
    for q in (0..lines).filter(|&q| !seen[q]) {
        let at = start(q);
        assert!(at + len <= out.len);
        // SAFETY: bounded by the assert; a run of this task's batch entry.
        unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), len) }.fill(T::ZERO);
    }
}

/// Batch entry `bb` of a product with a mostly-zero side given by its `terms` (see
/// [`sparse_terms`]): each term `(q, kk, v)` adds `v` times line `kk` of the `dense`
/// operand to line `q` of the result. For a sparse lhs (`lhs`) the lines are rows: `l[i, kk]`
/// adds `l[i, kk] * r[kk, :]` to `out[i, :]`; for a sparse rhs, columns: `r[kk, j]` adds
/// `l[:, kk] * r[kk, j]` to `out[:, j]`. The dense operand is read in place (its view).
#[inline(always)]
pub(super) fn sparse_entry<T: GemmFloat>(
    p: &DotPlan,
    lhs: bool,
    terms: &[Term<T>],
    dense: &[T],
    out: OutPtr<T>,
    bb: usize,
) {
    let (m, n) = (p.m, p.n);
    let dv = if lhs { &p.rhs.view } else { &p.lhs.view };
    // The dense operand's lines (one per step) and the offsets along them; the result's.
    let (lines, len) = if lhs { (m, n) } else { (n, m) };
    let (steps, along, along_unit) = if lhs {
        (&dv.rows, &dv.cols, dv.cols_unit)
    } else {
        (&dv.cols, &dv.rows, dv.rows_unit)
    };
    let line = |q: usize| if lhs { p.out.row(q) } else { p.out.col(q) };
    let elem = |t: usize| if lhs { p.out.col(t) } else { p.out.row(t) };
    let out_unit = if lhs {
        p.out.cs == 1 && p.out.col_off.is_none()
    } else {
        p.out.rs == 1 && p.out.row_off.is_none()
    };
    let (db, ob) = (dv.batch_off[bb], p.out.batch_off[bb]);
    if along_unit && out_unit {
        // The dense operand's lines and the result's both contiguous (the one-hot
        // dispatch and combine, their gradients): each term is one slice update.
        let d0 = db + along[0];
        let src = |kk: usize| &dense[d0 + steps[kk]..d0 + steps[kk] + len];
        place_runs(out, (lines, len), |q| ob + line(q), src, terms);
        return;
    }
    zero_out(p, out, ob);
    for &(q, kk, v) in terms {
        let (o0, s0) = (ob + line(q as usize), db + steps[kk as usize]);
        for (t, &a) in along.iter().enumerate() {
            axpy_out(out, o0 + elem(t), v * dense[s0 + a]);
        }
    }
}
