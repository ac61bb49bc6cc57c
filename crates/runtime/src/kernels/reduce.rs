//! Reductions along dims: `reduce` (sum/max/min), `cumsum`, `argmax`.
//!
//! `reduce` collapses the operand's dims into alternating runs of kept and reduced dims and
//! walks the input once in row-major order: a kept innermost run accumulates whole rows into
//! the output (vectorisable), a reduced innermost run folds each row to one value (eight
//! rows at once when they are kept rows with their own outputs: eight add chains that
//! overlap, each still in its row's order). For every
//! output element the terms are therefore added in row-major order of the reduced dims, the
//! reference's order. Float sums accumulate in f64 and round once (bit-identical to the
//! reference); i32 sums wrap; max/min propagate NaN and order `-0 < +0`. Operations whose
//! result does not depend on the order (f32 max/min: exact in any order; i32 wrapping sums,
//! max, min) fold each contiguous row in vector lanes instead (f32 through integer order
//! keys beside a NaN flag), and otherwise f32 max/min fold in f32. `argmax` of contiguous
//! rows takes the row's maximum, then its first match. When the outermost run is kept (or
//! the rows are many), the work is split over the rayon pool; the loops run in their AVX2
//! build ([`super::with_avx2`]).

use super::{with_avx2, PAR_MIN};
use crate::tensor::{f64_to_bf16, Data};
use half::bf16;
use ir::ReduceOp;
use rayon::prelude::*;

/// `a > b ? a : b`, NaN-propagating, `max(-0, +0) = +0` (the reference's rule).
#[inline]
pub fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`, NaN-propagating, `min(-0, +0) = -0`.
#[inline]
pub fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// `c ? a : b` without a branch (vectorisable).
#[inline]
pub fn sel32(c: bool, a: f32, b: f32) -> f32 {
    let m = (c as u32).wrapping_neg();
    f32::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
}

/// f32 versions of [`fmax`] / [`fmin`] (same results on f32 values), branch-free.
#[inline]
pub fn fmax32(a: f32, b: f32) -> f32 {
    let take_a = (a > b) | ((a == b) & b.is_sign_negative());
    sel32(a.is_nan() | b.is_nan(), f32::NAN, sel32(take_a, a, b))
}

#[inline]
pub fn fmin32(a: f32, b: f32) -> f32 {
    let take_a = (a < b) | ((a == b) & a.is_sign_negative());
    sel32(a.is_nan() | b.is_nan(), f32::NAN, sel32(take_a, a, b))
}

/// Runs of the collapsed operand: `(size, reduced)`, outermost first.
fn runs(shape: &[usize], dims: &[usize]) -> Vec<(usize, bool)> {
    let mut out: Vec<(usize, bool)> = Vec::new();
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let red = dims.contains(&d);
        match out.last_mut() {
            Some((m, r)) if *r == red => *m *= n,
            _ => out.push((n, red)),
        }
    }
    out
}

/// [`reduce_block`] compiled for AVX2 when the CPU has it (the same operations in the same
/// order, on wider lanes).
fn reduce_block_fast<I: Copy, A: Copy>(
    src: &[I],
    runs: &[(usize, bool)],
    acc: &mut [A],
    add: &(impl Fn(A, I) -> A + Sync),
) {
    with_avx2(
        #[inline(always)]
        || reduce_block(src, runs, acc, add),
    )
}

/// Accumulate the block `src` (row-major over `runs`) into `acc` (row-major over the kept
/// runs) with `add`, sequentially.
#[inline(always)]
fn reduce_block<I: Copy, A: Copy>(
    src: &[I],
    runs: &[(usize, bool)],
    acc: &mut [A],
    add: &(impl Fn(A, I) -> A + Sync),
) {
    if runs.is_empty() {
        acc[0] = add(acc[0], src[0]);
        return;
    }
    let r = runs.len();
    let (n, last_red) = runs[r - 1];
    // Output strides of the outer runs (0 for reduced ones).
    let mut ost = vec![0usize; r];
    let mut s = if last_red { 1 } else { n };
    for d in (0..r - 1).rev() {
        if !runs[d].1 {
            ost[d] = s;
            s *= runs[d].0;
        }
    }
    let outer: Vec<usize> = runs[..r - 1].iter().map(|x| x.0).collect();
    let rows: usize = outer.iter().product();
    if last_red && r == 2 && !runs[0].1 {
        // Kept rows, each folded to its own output (`acc[row]`): LANES rows at once, one
        // add chain per row with its terms in order (the same values), the chains
        // overlapping instead of each add waiting on the previous one.
        let mut row = 0;
        while row + LANES <= rows {
            let xs = &src[row * n..(row + LANES) * n];
            let mut a: [A; LANES] = std::array::from_fn(|q| acc[row + q]);
            for t in 0..n {
                for q in 0..LANES {
                    a[q] = add(a[q], xs[q * n + t]);
                }
            }
            acc[row..row + LANES].copy_from_slice(&a);
            row += LANES;
        }
        for (a, x) in acc[row..rows].iter_mut().zip(src[row * n..].chunks(n)) {
            *a = x.iter().fold(*a, |a, &v| add(a, v));
        }
        return;
    }
    let mut idx = vec![0usize; r - 1];
    let mut o = 0usize;
    for row in 0..rows {
        let x = &src[row * n..(row + 1) * n];
        if last_red {
            let mut a = acc[o];
            for &v in x {
                a = add(a, v);
            }
            acc[o] = a;
        } else {
            for (a, &v) in acc[o..o + n].iter_mut().zip(x) {
                *a = add(*a, v);
            }
        }
        // Advance the outer odometer.
        let mut d = idx.len();
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            o += ost[d];
            if idx[d] < outer[d] {
                break;
            }
            o -= ost[d] * outer[d];
            idx[d] = 0;
        }
    }
}

/// Rows a reduced innermost run folds at once ([`reduce_block`]).
const LANES: usize = 8;

/// The row length when the reduction folds contiguous rows, each to its own output (runs
/// `[kept rows, reduced n]` or a single reduced run).
fn row_fold(runs: &[(usize, bool)]) -> Option<usize> {
    match runs {
        [(n, true)] | [(_, false), (n, true)] => Some(*n),
        _ => None,
    }
}

/// The order key of an f32: `key(a) < key(b)` exactly when `a` is below `b` with `-0 < +0`
/// (for non-NaN values), so integer max/min of keys is the reference's f32 max/min.
#[inline]
fn key(x: f32) -> i32 {
    let b = x.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// The inverse of [`key`].
#[inline]
fn unkey(k: i32) -> f32 {
    f32::from_bits((k ^ (((k >> 31) as u32) >> 1) as i32) as u32)
}

/// Max (or min) of `x` and `init` with the reference's rules: integer max/min of order keys
/// in [`LANES`] interleaved lanes (vectorised) with a NaN flag beside them. Max and min do
/// not depend on the order, so this equals the reference's sequential fold.
#[inline(always)]
fn extreme(x: &[f32], init: f32, max: bool) -> f32 {
    let pick = |a: i32, b: i32| if max { a.max(b) } else { a.min(b) };
    let mut lanes = [key(init); LANES];
    let mut nan = [false; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for q in 0..LANES {
            lanes[q] = pick(lanes[q], key(c[q]));
            nan[q] |= c[q].is_nan();
        }
    }
    let mut r = lanes[0];
    let mut any_nan = init.is_nan();
    for q in 0..LANES {
        r = pick(r, lanes[q]);
        any_nan |= nan[q];
    }
    for &v in it.remainder() {
        r = pick(r, key(v));
        any_nan |= v.is_nan();
    }
    if any_nan {
        f32::NAN
    } else {
        unkey(r)
    }
}

/// `init` folded with every element of `x` by `f`, an associative and commutative i32
/// operation (wrapping add, max, min), in [`LANES`] interleaved lanes (vectorised).
#[inline(always)]
fn fold_i32(x: &[i32], init: i32, f: impl Fn(i32, i32) -> i32 + Copy) -> i32 {
    let mut it = x.chunks_exact(LANES);
    let mut lanes: [i32; LANES] = match it.next() {
        Some(c) => std::array::from_fn(|q| c[q]),
        None => return it.remainder().iter().fold(init, |a, &v| f(a, v)),
    };
    for c in &mut it {
        for q in 0..LANES {
            lanes[q] = f(lanes[q], c[q]);
        }
    }
    let r = lanes.iter().fold(init, |a, &v| f(a, v));
    it.remainder().iter().fold(r, |a, &v| f(a, v))
}

/// [`argmax_row`] on sixteen-lane AVX-512 registers (the gating's rows of one value per
/// expert: ~35 ns a row of 32 on the eight-lane fold and scan, a few on these).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::kernels::lanes;
    use std::arch::x86_64::*;

    /// The index of the first maximum of `x` (the first NaN when there is one; 0 for an
    /// empty row): the maximum over sixteen lanes (lanes past the end read as -inf), then
    /// the first lane equal to it (`==` finds -0 and +0 alike, as the reference's `>` scan
    /// does).
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn argmax_row(x: &[f32]) -> usize {
        let n = x.len();
        let p = x.as_ptr();
        // SAFETY: every load is masked to the lanes inside `x`.
        unsafe {
            let low = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut mx = low;
            let mut nan = false;
            for t in (0..n).step_by(16) {
                let v = _mm512_mask_loadu_ps(low, lanes(n - t), p.add(t));
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v) != 0;
                mx = _mm512_max_ps(mx, v);
            }
            let m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
            for t in (0..n).step_by(16) {
                let v = _mm512_mask_loadu_ps(low, lanes(n - t), p.add(t));
                let hit = if nan {
                    _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v)
                } else {
                    _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, m)
                } & lanes(n - t);
                if hit != 0 {
                    return t + hit.trailing_zeros() as usize;
                }
            }
            0
        }
    }
}

/// The index of the first maximum of a non-empty row (the first NaN when there is one):
/// [`extreme`], then the first position equal to it (`==` finds -0 and +0 alike, as the
/// reference's `>` scan does), eight lanes per test.
#[inline(always)]
fn argmax_row(x: &[f32]) -> usize {
    let m = extreme(x, f32::NEG_INFINITY, true);
    let hit = |v: f32| if m.is_nan() { v.is_nan() } else { v == m };
    let mut it = x.chunks_exact(LANES);
    for (c, xs) in (&mut it).enumerate() {
        let mut mask = 0u32;
        for (q, &v) in xs.iter().enumerate() {
            mask |= (hit(v) as u32) << q;
        }
        if mask != 0 {
            return c * LANES + mask.trailing_zeros() as usize;
        }
    }
    let base = x.len() - it.remainder().len();
    it.remainder()
        .iter()
        .position(|&v| hit(v))
        .map_or(0, |p| base + p)
}

/// Apply `each(row, out)` to every contiguous row of `n` values of `src` and its output,
/// split over the pool when the input is large. Each chunk of rows runs in the AVX2 build
/// ([`with_avx2`]; callers mark `each` `#[inline(always)]` so it is compiled into it).
fn for_rows<T: Sync, O: Send>(
    src: &[T],
    n: usize,
    out: &mut [O],
    each: impl Fn(&[T], &mut O) + Sync,
) {
    if n == 0 {
        return;
    }
    let rows = |src: &[T], out: &mut [O]| {
        with_avx2(
            #[inline(always)]
            || {
                for (o, x) in out.iter_mut().zip(src.chunks_exact(n)) {
                    each(x, o);
                }
            },
        )
    };
    if src.len() >= PAR_MIN && out.len() >= 2 {
        let threads = rayon::current_num_threads().max(1);
        let per = out.len().div_ceil(threads * 4).max(1);
        out.par_chunks_mut(per)
            .zip(src.par_chunks(per * n))
            .for_each(|(o, x)| rows(x, o));
    } else {
        rows(src, out);
    }
}

fn reduce_acc<I: Copy + Sync, A: Copy + Send>(
    src: &[I],
    runs: &[(usize, bool)],
    acc: &mut [A],
    add: impl Fn(A, I) -> A + Sync,
) {
    if src.is_empty() {
        return;
    }
    match runs.first() {
        Some(&(p, false)) if src.len() >= PAR_MIN && p >= 2 && runs.len() > 1 => {
            let in_per = src.len() / p;
            let out_per = acc.len() / p;
            let threads = rayon::current_num_threads().max(1);
            let k = p.div_ceil(threads * 4).max(1);
            acc.par_chunks_mut(out_per * k)
                .enumerate()
                .for_each(|(c, a)| {
                    let rows = a.len() / out_per;
                    let mut sub = runs.to_vec();
                    sub[0].0 = rows;
                    let s = &src[c * k * in_per..(c * k + rows) * in_per];
                    reduce_block_fast(s, &sub, a, &add);
                });
        }
        _ => reduce_block_fast(src, runs, acc, &add),
    }
}

/// `reduce(x, op, dims)` of an operand of `shape` into `out`.
pub fn reduce(x: &Data, shape: &[usize], op: ReduceOp, dims: &[usize], out: &mut Data) {
    let runs = runs(shape, dims);
    let n_out = out.len();
    let init = op.identity();
    // One instance per op, so the inner loops carry no per-element dispatch.
    macro_rules! by_op {
        ($src:expr, $acc:expr, |$x:ident: $t:ty| $widen:expr) => {
            match op {
                ReduceOp::Sum => reduce_acc($src, &runs, $acc, |a: f64, $x: $t| a + $widen),
                ReduceOp::Max => reduce_acc($src, &runs, $acc, |a: f64, $x: $t| fmax(a, $widen)),
                ReduceOp::Min => reduce_acc($src, &runs, $acc, |a: f64, $x: $t| fmin(a, $widen)),
            }
        };
    }
    match (x, out) {
        (Data::F32(v), Data::F32(o)) if op != ReduceOp::Sum => {
            // Max and min are exact in f32 whatever the order (the widening to f64 is
            // exact and the NaN and signed-zero rules do not depend on it): branch-free
            // f32 lanes, no f64 round trip.
            o.fill(init as f32);
            match (op, row_fold(&runs)) {
                (ReduceOp::Max, Some(n)) => for_rows(
                    v,
                    n,
                    o,
                    #[inline(always)]
                    |x, o| *o = extreme(x, *o, true),
                ),
                (ReduceOp::Min, Some(n)) => for_rows(
                    v,
                    n,
                    o,
                    #[inline(always)]
                    |x, o| *o = extreme(x, *o, false),
                ),
                (ReduceOp::Max, None) => reduce_acc(v, &runs, o, fmax32),
                _ => reduce_acc(v, &runs, o, fmin32),
            }
        }
        (Data::F32(v), Data::F32(o)) => {
            let mut acc = vec![init; n_out];
            by_op!(v, &mut acc, |x: f32| x as f64);
            o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a as f32);
        }
        (Data::BF16(v), Data::BF16(o)) => {
            let mut acc = vec![init; n_out];
            by_op!(v, &mut acc, |x: bf16| x.to_f64());
            o.iter_mut()
                .zip(&acc)
                .for_each(|(o, &a)| *o = f64_to_bf16(a));
        }
        (Data::F64(v), Data::F64(o)) => {
            o.fill(init);
            by_op!(v, o, |x: f64| x);
        }
        (Data::I32(v), Data::I32(o)) => {
            o.fill(match op {
                ReduceOp::Sum => 0,
                ReduceOp::Max => i32::MIN,
                ReduceOp::Min => i32::MAX,
            });
            // One closure per op: no per-element dispatch in the inner loops. Wrapping
            // sums, max and min of integers do not depend on the order: contiguous rows
            // fold in vector lanes.
            if let Some(n) = row_fold(&runs) {
                match op {
                    ReduceOp::Sum => for_rows(
                        v,
                        n,
                        o,
                        #[inline(always)]
                        |x, o| *o = fold_i32(x, *o, i32::wrapping_add),
                    ),
                    ReduceOp::Max => for_rows(
                        v,
                        n,
                        o,
                        #[inline(always)]
                        |x, o| *o = fold_i32(x, *o, std::cmp::max),
                    ),
                    ReduceOp::Min => for_rows(
                        v,
                        n,
                        o,
                        #[inline(always)]
                        |x, o| *o = fold_i32(x, *o, std::cmp::min),
                    ),
                }
                return;
            }
            match op {
                ReduceOp::Sum => reduce_acc(v, &runs, o, |a: i32, x: i32| a.wrapping_add(x)),
                ReduceOp::Max => reduce_acc(v, &runs, o, |a: i32, x: i32| a.max(x)),
                ReduceOp::Min => reduce_acc(v, &runs, o, |a: i32, x: i32| a.min(x)),
            }
        }
        (x, o) => panic!("reduce of {} into {}", x.dtype(), o.dtype()),
    }
}

/// `(outer, n, inner)` of a dim.
fn split_dim(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    (outer, shape[dim], inner)
}

/// Prefix sums along `dim` (see the reference for `exclusive` / `reverse`).
pub fn cumsum(
    x: &Data,
    shape: &[usize],
    dim: usize,
    exclusive: bool,
    reverse: bool,
    out: &mut Data,
) {
    let (outer, n, inner) = split_dim(shape, dim);
    /// The scan in the accumulation type `A`: from `zero`, `add` each value, `fin` each
    /// prefix back.
    fn run<T: Copy, A: Copy, S, F>(
        x: &[T],
        o: &mut [T],
        (outer, n, inner): (usize, usize, usize),
        (exclusive, reverse): (bool, bool),
        (zero, add, fin): (A, S, F),
    ) where
        S: Fn(A, T) -> A,
        F: Fn(A) -> T,
    {
        let mut acc = vec![zero; inner];
        for b in 0..outer {
            acc.fill(zero);
            for step in 0..n {
                let j = if reverse { n - 1 - step } else { step };
                let base = (b * n + j) * inner;
                for i in 0..inner {
                    let v = x[base + i];
                    if exclusive {
                        o[base + i] = fin(acc[i]);
                        acc[i] = add(acc[i], v);
                    } else {
                        acc[i] = add(acc[i], v);
                        o[base + i] = fin(acc[i]);
                    }
                }
            }
        }
    }
    let dims = (outer, n, inner);
    let dir = (exclusive, reverse);
    match (x, out) {
        (Data::F32(v), Data::F32(o)) => {
            let rule = (0.0f64, |a: f64, x: f32| a + x as f64, |a: f64| a as f32);
            run(v, o, dims, dir, rule)
        }
        (Data::F64(v), Data::F64(o)) => {
            let rule = (0.0f64, |a: f64, x: f64| a + x, |a: f64| a);
            run(v, o, dims, dir, rule)
        }
        (Data::BF16(v), Data::BF16(o)) => {
            let rule = (0.0f64, |a: f64, x: bf16| a + x.to_f64(), f64_to_bf16);
            run(v, o, dims, dir, rule)
        }
        (Data::I32(v), Data::I32(o)) => {
            let rule = (0i32, |a: i32, x: i32| a.wrapping_add(x), |a: i32| a);
            run(v, o, dims, dir, rule)
        }
        (x, o) => panic!("cumsum of {} into {}", x.dtype(), o.dtype()),
    }
}

/// i32 index of the largest element along `dim`: ties to the lowest index, the first NaN
/// wins, an empty dim gives 0.
pub fn argmax(x: &Data, shape: &[usize], dim: usize, out: &mut Data) {
    let (outer, n, inner) = split_dim(shape, dim);
    let Data::I32(o) = out else {
        panic!("argmax writes i32")
    };
    /// One outer block: `x` holds `n x inner` values, `o` its `inner` results.
    fn block<T: Copy + PartialOrd>(
        x: &[T],
        o: &mut [i32],
        n: usize,
        is_nan: &impl Fn(T) -> bool,
        best: &mut Vec<T>,
    ) {
        let inner = o.len();
        if inner == 1 {
            // A contiguous row: the first maximum (the first NaN, if any).
            let (mut bi, mut bv) = (0usize, x[0]);
            if !is_nan(bv) {
                for (j, &v) in x.iter().enumerate().skip(1) {
                    if is_nan(v) {
                        bi = j;
                        break;
                    }
                    if v > bv {
                        (bi, bv) = (j, v);
                    }
                }
            }
            o[0] = bi as i32;
            return;
        }
        best.clear();
        best.extend_from_slice(&x[..inner]);
        o.fill(0);
        for j in 1..n {
            let row = &x[j * inner..(j + 1) * inner];
            for i in 0..inner {
                let (v, bv) = (row[i], best[i]);
                if !is_nan(bv) && (is_nan(v) || v > bv) {
                    best[i] = v;
                    o[i] = j as i32;
                }
            }
        }
    }
    fn run<T: Copy + PartialOrd + Send + Sync>(
        x: &[T],
        o: &mut [i32],
        (outer, n, inner): (usize, usize, usize),
        is_nan: impl Fn(T) -> bool + Sync,
    ) {
        if n == 0 || inner == 0 {
            o.fill(0);
            return;
        }
        // Outer blocks are independent: split them over the pool when large.
        let per = (PAR_MIN / (n * inner)).max(1);
        let blocks = |first: usize, part: &mut [i32]| {
            let mut best = Vec::new();
            for (t, ob) in part.chunks_mut(inner).enumerate() {
                let b = first + t;
                block(
                    &x[b * n * inner..(b + 1) * n * inner],
                    ob,
                    n,
                    &is_nan,
                    &mut best,
                );
            }
        };
        if outer * n * inner < PAR_MIN || outer < 2 {
            blocks(0, o);
        } else {
            o.par_chunks_mut(inner * per)
                .enumerate()
                .for_each(|(c, part)| blocks(c * per, part));
        }
    }
    let dims = (outer, n, inner);
    match x {
        Data::F32(v) if inner == 1 && n > 0 => {
            // Contiguous rows: the row's maximum (vectorised), then its first position
            // (the first NaN when the maximum is NaN; `==` finds -0 and +0 alike, as the
            // reference's `>` scan does).
            #[cfg(target_arch = "x86_64")]
            if crate::kernels::has_avx512f() {
                for_rows(
                    v,
                    n,
                    o,
                    // SAFETY: AVX-512F checked above.
                    #[inline(always)]
                    |row, o| *o = unsafe { avx512::argmax_row(row) } as i32,
                );
                return;
            }
            for_rows(
                v,
                n,
                o,
                #[inline(always)]
                |row, o| *o = argmax_row(row) as i32,
            );
        }
        Data::F32(v) => run(v, o, dims, f32::is_nan),
        Data::F64(v) => run(v, o, dims, f64::is_nan),
        Data::BF16(v) => run(v, o, dims, |a: bf16| a.is_nan()),
        Data::I32(v) => run(v, o, dims, |_| false),
        Data::Bool(v) => run(v, o, dims, |_| false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's rule: the first index whose value is greater than every earlier one
    /// (a NaN wins at once and stays).
    fn first_max(x: &[f32]) -> usize {
        let (mut bi, mut bv) = (0, x[0]);
        for (j, &v) in x.iter().enumerate().skip(1) {
            if bv.is_nan() {
                break;
            }
            if v.is_nan() || v > bv {
                (bi, bv) = (j, v);
            }
        }
        bi
    }

    /// Both row kernels give the reference's index: lengths around the lane counts, ties
    /// (several copies of the maximum, -0 beside +0), NaN first, in the middle and last,
    /// infinities, rows of -inf only.
    #[test]
    fn argmax_rows_follow_the_reference() {
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for n in [1usize, 2, 7, 8, 15, 16, 17, 31, 32, 33, 40, 64, 70] {
            let base: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
            rows.push(base.clone());
            let mut zeros = vec![-1.0f32; n];
            zeros[n / 2] = -0.0;
            zeros[n - 1] = 0.0;
            rows.push(zeros);
            rows.push(vec![f32::NEG_INFINITY; n]);
            for at in [0, n / 2, n - 1] {
                let mut r = base.clone();
                r[at] = f32::NAN;
                rows.push(r);
                let mut r = base.clone();
                r[at] = f32::INFINITY;
                rows.push(r);
            }
        }
        for r in &rows {
            let want = first_max(r);
            assert_eq!(with_avx2(|| argmax_row(r)), want, "{r:?}");
            #[cfg(target_arch = "x86_64")]
            if crate::kernels::has_avx512f() {
                // SAFETY: AVX-512F checked.
                assert_eq!(unsafe { avx512::argmax_row(r) }, want, "{r:?}");
            }
        }
    }
}
