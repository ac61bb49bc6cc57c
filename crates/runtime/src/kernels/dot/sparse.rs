//! The sparse paths of a batch entry: each term of the mostly-zero side adds a multiple of
//! a line of the dense operand to a line of the result, in increasing step order: the
//! dense product's FMA chains (per block of `KC` steps, as the micro-kernels run them)
//! with the zero terms left out, so the path a dot takes does not change its bits.

use super::dense::OutPtr;
use super::float::GemmFloat;
use super::plan::DotPlan;
use super::scan::Term;
use crate::kernels::sgemm::KC;

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

/// The lines of a product from the terms of its sparse side, each line built as the dense
/// path builds it: per step block of [`KC`] steps (one block when `split` is off), an FMA
/// chain from zero over the block's terms in increasing step order, the first block's
/// chain the line and each later one's added to it. The dense micro-kernels compute the
/// same chains with the zero terms in them, and a `0 * x` term (`x` finite) leaves a chain
/// unchanged unless it is `-0`, so every path gives the dense product's bits but for the
/// sign of such a zero: which path a dot takes, and so how big a chunk of it is, never
/// changes its values. `add(buf, kk, v, fresh)` adds `v` times the dense operand's line
/// `kk` to `buf` (onto zero with `fresh`); `store(q, line)` writes line `q` of the result.
/// Each line's terms come in increasing `kk`; lines interleaved (a scan that walked the
/// steps outermost) are grouped first, each line's order kept.
#[inline(always)]
fn chains<T: GemmFloat>(
    len: usize,
    terms: &[Term<T>],
    split: bool,
    mut add: impl FnMut(&mut [T], usize, T, bool),
    mut store: impl FnMut(usize, &[T]),
) {
    let grouped;
    let terms = if terms.windows(2).all(|w| w[0].0 <= w[1].0) {
        terms
    } else {
        let mut g = terms.to_vec();
        g.sort_by_key(|t| t.0);
        grouped = g;
        &grouped[..]
    };
    let (mut line, mut part) = (vec![T::ZERO; len], Vec::new());
    let block = |kk: u32| if split { kk as usize / KC } else { 0 };
    let mut i = 0;
    while i < terms.len() {
        let q = terms[i].0;
        let end = i + terms[i..].iter().take_while(|t| t.0 == q).count();
        let mut a = i;
        while a < end {
            let b = a + terms[a..end]
                .iter()
                .take_while(|t| block(t.1) == block(terms[a].1))
                .count();
            if a == i {
                for (n, &(_, kk, v)) in terms[a..b].iter().enumerate() {
                    add(&mut line, kk as usize, v, n == 0);
                }
            } else {
                part.resize(len, T::ZERO);
                for (n, &(_, kk, v)) in terms[a..b].iter().enumerate() {
                    add(&mut part, kk as usize, v, n == 0);
                }
                for (l, &p) in line.iter_mut().zip(&part) {
                    *l = *l + p;
                }
            }
            a = b;
        }
        store(q as usize, &line);
        i = end;
    }
}

/// `buf[t] = v * xs[t] + (fresh ? 0 : buf[t])`, one chain step per element.
#[inline(always)]
fn chain_run<T: GemmFloat>(buf: &mut [T], xs: &[T], v: T, fresh: bool) {
    if fresh {
        for (o, &x) in buf.iter_mut().zip(xs) {
            *o = v.chain(x, T::ZERO);
        }
    } else {
        for (o, &x) in buf.iter_mut().zip(xs) {
            *o = v.chain(x, *o);
        }
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
    let split = p.k > KC;
    if along_unit && out_unit {
        // The dense operand's lines and the result's both contiguous (the one-hot
        // dispatch and combine, their gradients): each term is one slice update.
        let d0 = db + along[0];
        let src = |kk: usize| &dense[d0 + steps[kk]..d0 + steps[kk] + len];
        let mut seen = vec![false; lines];
        chains(
            len,
            terms,
            split,
            |buf, kk, v, fresh| chain_run(buf, src(kk), v, fresh),
            |q, vals| {
                seen[q] = true;
                let at = ob + line(q);
                assert!(at + len <= out.len);
                // SAFETY: bounded by the assert; a run of this task's batch entry, which no
                // other task writes and nothing else borrows.
                unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), len) }
                    .copy_from_slice(vals);
            },
        );
        for q in (0..lines).filter(|&q| !seen[q]) {
            let at = ob + line(q);
            assert!(at + len <= out.len);
            // SAFETY: bounded by the assert; a run of this task's batch entry.
            unsafe { std::slice::from_raw_parts_mut(out.ptr.add(at), len) }.fill(T::ZERO);
        }
        return;
    }
    zero_out(p, out, ob);
    chains(
        len,
        terms,
        split,
        |buf, kk, v, fresh| {
            let s0 = db + steps[kk];
            for (o, &a) in buf.iter_mut().zip(along.iter()) {
                let acc = if fresh { T::ZERO } else { *o };
                *o = v.chain(dense[s0 + a], acc);
            }
        },
        |q, vals| {
            let o0 = ob + line(q);
            for (t, &x) in vals.iter().enumerate() {
                let at = o0 + elem(t);
                assert!(at < out.len);
                // SAFETY: bounded by the assert; an element of this task's batch entry.
                unsafe { *out.ptr.add(at) = x };
            }
        },
    );
}
