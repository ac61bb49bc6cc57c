//! `dot_general` as batched GEMMs.
//!
//! **Normalisation** ([`DotPlan::new`], done once when the executor prepares a program):
//! every dot is `out[b] = lhs[b] · rhs[b]` with `lhs[b]` an `M x K` matrix (rows = lhs free
//! dims, cols = contracting dims in `lhs_contract` order), `rhs[b]` a `K x N` matrix and
//! `out` the row-major `[B, M, N]` result (batch dims, lhs free, rhs free: the op's result
//! order). When an operand's row dims and col dims each merge into a single stride, the
//! GEMM reads it in place through row/col strides (a transposed operand is just swapped
//! strides); otherwise it is first copied to `[batch, X, Y]` order, where the group holding
//! its innermost dim stays innermost so the copy moves contiguous runs. Batch dims never need
//! merging: each batch entry has its own offset.
//!
//! **Kernels**: f32 runs on our AVX2/FMA micro-kernel GEMM ([`super::sgemm`]: packing reads any
//! strides, a transposed result is computed as `B^T A^T`, and all-zero rows of the expert
//! buffer are skipped exactly); f64, and f32 on CPUs without AVX2/FMA, run on `gemm` 0.19
//! (AVX-512 with the `x86-v4` feature). bf16 operands are widened to f32, multiplied with f32
//! accumulation and rounded once to bf16. i32 uses wrapping integer loops. With a batch of at
//! least `2 x` the pool's threads, the batch is split over the rayon pool with one
//! single-threaded GEMM per entry (experts in parallel measured faster than splitting each
//! GEMM); otherwise each GEMM is split over the pool (f32: the larger of M and N in whole
//! tiles; `gemm`: `Parallelism::Rayon(0)`, which nests into the current pool).
//!
//! **Sparse path** (the one-hot dispatch/combine einsums of MoE): for a float dot with at
//! least 16 flops per operand element, the executor lists the non-zeros of the lhs, then
//! the rhs, at run time, in one pass over each ([`sparse_terms`]; a dense operand is told
//! apart first, by samples or, when short, by a whole count). An operand that is **at least 90 % zeros** while the other operand is all
//! finite (so skipping `0 * x` cannot hide a NaN) is multiplied sparsely: each non-zero
//! `a[i,k]` adds `a[i,k] * b[k,:]` to `out[i,:]` (for a sparse rhs, `b[k,j]` adds
//! `b[k,j] * a[:,k]` to `out[:,j]`). Every output element still sums its terms in increasing
//! `k`, with the zero terms left out, so the result equals the dense product to rounding.
//! Both operands are read in place through per-row and per-column offset tables (a
//! `View`; no permuted copy), the sparse one along its contiguous direction, each block of
//! 16 values compared with zero into one bit mask whose set bits alone are visited; the
//! path then reads the list. A caller that already knows an operand's non-zeros (a
//! [`Support`]: their flat positions and values, found by one pass over a buffer) passes it
//! ([`dot_known`]), and the lists are built from it without reading the operand: each
//! position is split into batch entry, row and column by multiplies with precomputed
//! reciprocals, then grouped by line (a counting sort that keeps memory order). The
//! executor finds each one-hot buffer's support once per run and shares it between the
//! products that read it. A result whose rows
//! (columns) are contiguous is written once: each one's first term onto zero, those
//! without terms zero-filled. A fused output transpose whose row or column dims do not
//! merge is written through the same kind of table.
//!
//! **Masked** ([`dot_masked`]): a product used only multiplied by mostly-zero masks and
//! summed is computed only where a mask is non-zero (the executor finds such dots; the
//! function checks at run time that skipping is exact).
//!
//! **Epilogues** ([`dot_then`]): the executor may hand each batch entry of an f32 result to
//! an elementwise group right after its GEMM, while the entry is in cache (the ReLU after an
//! expert's up-projection, the ReLU mask on its gradient).

use super::layout::gather_copy;
use super::sgemm;
use super::with_avx2;
use crate::tensor::Data;
use half::bf16;
use ir::{DType, DotDims};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::{Add, Mul};

/// How one operand is read as a batch of matrices.
#[derive(Clone, Debug, PartialEq)]
struct Side {
    /// `Some(perm)`: copy the operand to this dim order (contiguous) first.
    perm: Option<Vec<usize>>,
    /// Shape of the operand as read (after the copy, if any).
    shape: Vec<usize>,
    batch_off: Vec<usize>,
    /// Row and column strides of each batch matrix.
    rs: usize,
    cs: usize,
    /// The operand read in place, every row and column at its own offset: the sparse
    /// paths read it so, without the copy the GEMM needs.
    view: View,
}

/// Element `(b, i, j)` of a batch of matrices at `batch_off[b] + rows[i] + cols[j]`.
#[derive(Clone, Debug, PartialEq)]
struct View {
    batch_off: Vec<usize>,
    rows: Vec<usize>,
    cols: Vec<usize>,
    /// Rows (columns) one element apart: `rows[i] = rows[0] + i`.
    rows_unit: bool,
    cols_unit: bool,
    /// Per dim of the operand of size above one, outermost first: its stride, the stride's
    /// 64-bit reciprocal, its group (0 batch, 1 rows, 2 columns) and its weight in that
    /// group's index ([`View::locate`]).
    inverse: Vec<(u64, u64, u8, usize)>,
}

impl View {
    fn new(shape: &[usize], batch: &[usize], rows: &[usize], cols: &[usize]) -> View {
        let st = super::strides(shape);
        let unit = |t: &[usize]| t.iter().enumerate().all(|(i, &o)| o == t[0] + i);
        let (r, c) = (offsets(shape, &st, rows), offsets(shape, &st, cols));
        // A group's index is row-major over its dims in the order listed.
        let mut inverse: Vec<(u64, u64, u8, usize)> = st
            .iter()
            .map(|&t| {
                let t = t.max(1) as u64;
                (t, (u64::MAX / t).wrapping_add(1), 3, 0)
            })
            .collect();
        for (g, list) in [batch, rows, cols].into_iter().enumerate() {
            let mut w = 1;
            for &d in list.iter().rev() {
                inverse[d].2 = g as u8;
                inverse[d].3 = w;
                w *= shape[d];
            }
        }
        let inverse = inverse
            .into_iter()
            .zip(shape)
            .filter(|&(_, &n)| n > 1)
            .map(|(d, _)| d)
            .collect();
        View {
            batch_off: offsets(shape, &st, batch),
            rows_unit: unit(&r),
            cols_unit: unit(&c),
            rows: r,
            cols: c,
            inverse,
        }
    }

    /// The batch entry, row and column of the element at flat position `at` (the inverse of
    /// `batch_off[b] + rows[i] + cols[j]`; `at` below 2^32). Each dim's index is the
    /// quotient by its stride of what the outer dims leave, taken by one multiply with a
    /// precomputed 64-bit reciprocal (exact for 32-bit dividends and divisors: Lemire,
    /// Kaser and Kurz, "Faster remainder by direct computation", 2019).
    #[inline]
    fn locate(&self, at: usize) -> [usize; 3] {
        let mut g = [0usize; 4];
        let mut rem = at as u64;
        for &(st, magic, group, w) in &self.inverse {
            let q = if st == 1 {
                rem
            } else {
                ((u128::from(magic) * u128::from(rem)) >> 64) as u64
            };
            rem -= q * st;
            g[usize::from(group)] += q as usize * w;
        }
        [g[0], g[1], g[2]]
    }
}

/// The flat positions of a buffer's non-zeros (anything but `+0` and `-0`; NaN counts), in
/// increasing order: found once by one pass over the buffer ([`Support::of`]) and shared by
/// every sparse product that reads the buffer (or a buffer with the same non-zeros, such as
/// the `0/1` mask `x != 0` of a combine weight `x`), each listing its terms from it
/// ([`terms_from_support`]) instead of scanning the buffer again.
#[derive(Debug, Clone, PartialEq)]
pub struct Support {
    pos: Vec<u32>,
    /// The scanned buffer's value at each position.
    vals: Vec<f64>,
    /// The scanned buffer's length.
    of_len: usize,
}

impl Support {
    /// The support of `x` when at most a tenth of it is non-zero (and it has under 2^32
    /// elements); `None` for a denser buffer (told apart by samples first, as the sparse
    /// path does).
    pub fn of<T: GemmFloat>(x: &[T]) -> Option<Support> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        if x.len() > u32::MAX as usize || sampled_dense(x) {
            return None;
        }
        let limit = x.len() / 10;
        let (found, over) = (AtomicUsize::new(0), AtomicBool::new(false));
        let chunk = |(c, xs): (usize, &[T])| {
            let (mut pos, mut vals) = (Vec::new(), Vec::new());
            if over.load(Ordering::Relaxed) {
                return (pos, vals);
            }
            let base = c * SUPPORT_CHUNK;
            with_avx2(
                #[inline(always)]
                || {
                    for_nonzero(xs, |t, v| {
                        pos.push((base + t) as u32);
                        vals.push(v.to_f64());
                    })
                },
            );
            if found.fetch_add(pos.len(), Ordering::Relaxed) + pos.len() > limit {
                over.store(true, Ordering::Relaxed);
            }
            (pos, vals)
        };
        let parts: Vec<(Vec<u32>, Vec<f64>)> = if x.len() >= SUPPORT_PAR_LEN {
            x.par_chunks(SUPPORT_CHUNK).enumerate().map(chunk).collect()
        } else {
            x.chunks(SUPPORT_CHUNK).enumerate().map(chunk).collect()
        };
        (!over.into_inner()).then(|| {
            let (pos, vals): (Vec<Vec<u32>>, Vec<Vec<f64>>) = parts.into_iter().unzip();
            Support {
                pos: pos.concat(),
                vals: vals.concat(),
                of_len: x.len(),
            }
        })
    }

    /// The f32 buffer it was found on, again: its values at its positions, zeros
    /// elsewhere (an f32 value round-trips through the f64 kept exactly).
    pub fn dense(&self) -> Vec<f32> {
        self.dense_as()
    }

    /// [`Support::dense`] in the buffer's own float type.
    fn dense_as<T: GemmFloat>(&self) -> Vec<T> {
        let mut x = vec![T::ZERO; self.of_len];
        for (&q, &v) in self.pos.iter().zip(&self.vals) {
            x[q as usize] = T::from_f64(v);
        }
        x
    }

    /// Whether every value of the buffer it was found on is finite (its zeros are).
    fn all_finite(&self) -> bool {
        self.vals.iter().all(|v| v.is_finite())
    }

    /// Whether it was found on a buffer of `len` elements.
    fn fits(&self, len: usize) -> bool {
        self.of_len == len
    }

    /// How many non-zeros.
    pub fn len(&self) -> usize {
        self.pos.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }
}

/// Elements per part of [`Support::of`]'s pass (a multiple of 64: whole bit-mask blocks).
const SUPPORT_CHUNK: usize = 1 << 14;

/// Buffers at least this long are scanned in parallel parts by [`Support::of`] (a 64K-float
/// mask takes ~5 us on one thread; split, a device task could wait for a part taken by a
/// thread busy with another device's kernel).
const SUPPORT_PAR_LEN: usize = 1 << 20;

/// [`sparse_terms`]'s lists from a known support of `x` (read through `view`; an lhs when
/// `lhs`): each batch entry's terms grouped by line, each line's in increasing step (the
/// order the sparse path adds them in), with their values as `vals` says. Where the steps'
/// offsets increase with the step, memory order already has each line's terms in step
/// order, and a stable counting sort by line is enough; otherwise the terms are sorted.
/// A long support (one device holding the whole layer) is located in parallel parts, and
/// its batch entries sorted in parallel.
fn terms_from_support<T: GemmFloat>(
    x: &[T],
    view: &View,
    sup: &Support,
    vals: Values,
    lhs: bool,
) -> Vec<Vec<Term<T>>> {
    let b = view.batch_off.len();
    let (lines, steps) = if lhs {
        (view.rows.len(), &view.cols)
    } else {
        (view.cols.len(), &view.rows)
    };
    let locate = |(&at, &v): (&u32, &f64)| {
        let at = at as usize;
        let [bb, i, j] = view.locate(at);
        let (q, kk) = if lhs { (i, j) } else { (j, i) };
        let v = match vals {
            Values::Scanned => T::from_f64(v),
            Values::Ones => T::ONE,
            Values::Read => x[at],
        };
        (bb, (q as u32, kk as u32, v))
    };
    let parallel = sup.pos.len() >= SUPPORT_PAR_MIN;
    let located: Vec<(usize, Term<T>)> = if parallel {
        sup.pos
            .par_chunks(SUPPORT_PAR_MIN / 2)
            .zip(sup.vals.par_chunks(SUPPORT_PAR_MIN / 2))
            .flat_map_iter(|(p, v)| p.iter().zip(v).map(locate).collect::<Vec<_>>())
            .collect()
    } else {
        sup.pos.iter().zip(&sup.vals).map(locate).collect()
    };
    let in_order = steps.windows(2).all(|w| w[0] < w[1]);
    // One batch entry's terms (in memory order) grouped by line, each line's by step.
    let group = |part: &[(usize, Term<T>)]| -> Vec<Term<T>> {
        if !(in_order && lines <= 4 * part.len() + 4096) {
            let mut list: Vec<Term<T>> = part.iter().map(|t| t.1).collect();
            list.sort_unstable_by_key(|t| (t.0, t.1));
            return list;
        }
        let mut start = vec![0usize; lines + 1];
        for t in part {
            start[t.1 .0 as usize + 1] += 1;
        }
        for q in 1..=lines {
            start[q] += start[q - 1];
        }
        let mut list: Vec<Term<T>> = vec![(0, 0, T::ZERO); part.len()];
        for t in part {
            let at = &mut start[t.1 .0 as usize];
            list[*at] = t.1;
            *at += 1;
        }
        list
    };
    // The batch entries' parts: contiguous when the batch dims are outermost (the usual
    // case), else gathered.
    let mut parts: Vec<std::ops::Range<usize>> = vec![0..0; b];
    let contiguous = located.windows(2).all(|w| w[0].0 <= w[1].0);
    if contiguous {
        let mut at = 0;
        for (bb, part) in parts.iter_mut().enumerate() {
            let end = at + located[at..].iter().take_while(|t| t.0 == bb).count();
            *part = at..end;
            at = end;
        }
        if parallel {
            parts.into_par_iter().map(|r| group(&located[r])).collect()
        } else {
            parts.into_iter().map(|r| group(&located[r])).collect()
        }
    } else {
        let mut split: Vec<Vec<(usize, Term<T>)>> = vec![Vec::new(); b];
        for t in located {
            split[t.0].push(t);
        }
        split.iter().map(|part| group(part)).collect()
    }
}

/// Supports at least this long are located and sorted in parallel parts.
const SUPPORT_PAR_MIN: usize = 4096;

/// What the caller already knows of an operand's non-zeros (see [`Support`]).
#[derive(Clone, Copy, Debug)]
pub enum Known<'a> {
    /// Nothing: the product lists the non-zeros itself when a sparse path may pay.
    Unknown,
    /// More than a tenth non-zero.
    Dense,
    /// Exactly these non-zeros, with their values as `Values` says.
    Sparse(&'a Support, Values),
}

/// Where an operand's values at its known non-zeros come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// The support's: it was found on this very buffer.
    Scanned,
    /// All one: the operand is `convert(x != 0)` of the buffer the support was found on.
    Ones,
    /// Read from the operand at each position.
    Read,
}

/// Where each batch matrix of the result is written: `out[batch_off[b] + row(i) + col(j)]`,
/// `row(i) = i*rs` or `row_off[i]`, `col(j) = j*cs` or `col_off[j]`: a table when the row
/// (column) dims of a fused transpose do not merge into one stride.
#[derive(Clone, Debug, PartialEq)]
struct OutLayout {
    batch_off: Vec<usize>,
    rs: usize,
    cs: usize,
    row_off: Option<Vec<usize>>,
    col_off: Option<Vec<usize>>,
}

impl OutLayout {
    /// Offset of row `i` inside a batch matrix.
    #[inline]
    fn row(&self, i: usize) -> usize {
        match &self.row_off {
            Some(t) => t[i],
            None => i * self.rs,
        }
    }

    /// Offset of column `j` inside a batch matrix.
    #[inline]
    fn col(&self, j: usize) -> usize {
        match &self.col_off {
            Some(t) => t[j],
            None => j * self.cs,
        }
    }

    /// The largest offset of a `m x n` batch matrix's element (`m, n >= 1`).
    fn last(&self, m: usize, n: usize) -> usize {
        let cmax = match &self.col_off {
            Some(t) => t.iter().copied().max().unwrap_or(0),
            None => (n - 1) * self.cs,
        };
        let rmax = match &self.row_off {
            Some(t) => t.iter().copied().max().unwrap_or(0),
            None => (m - 1) * self.rs,
        };
        rmax + cmax
    }
}

/// A dot-general normalised to `[B, M, K] x [B, K, N] -> [B, M, N]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DotPlan {
    pub b: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    lhs: Side,
    rhs: Side,
    /// The result dims (batch, lhs free, rhs free) and how they are written.
    out_shape: Vec<usize>,
    groups: [usize; 3],
    out: OutLayout,
    transposed: bool,
    /// The result is written with non-temporal stores where the kernel can
    /// ([`DotPlan::stream_output`]).
    stream_out: bool,
    /// `indicator[0]` (`[1]`): the lhs (rhs) operand given is `x`, and the product reads
    /// `convert(x != 0)` in its place ([`DotPlan::read_indicator`]).
    indicator: [bool; 2],
}

/// The single stride of `dims` read row-major, if they merge (size-1 dims ignored).
fn merged_stride(shape: &[usize], st: &[usize], dims: &[usize]) -> Option<usize> {
    let live: Vec<usize> = dims.iter().copied().filter(|&d| shape[d] != 1).collect();
    if live.is_empty() {
        return Some(1);
    }
    for w in live.windows(2) {
        if st[w[0]] != st[w[1]] * shape[w[1]] {
            return None;
        }
    }
    Some(st[*live.last().unwrap()])
}

fn offsets(shape: &[usize], st: &[usize], dims: &[usize]) -> Vec<usize> {
    let sizes: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let mut out = Vec::new();
    super::odometer(&sizes, |i| {
        out.push(i.iter().zip(dims).map(|(a, &d)| a * st[d]).sum())
    });
    out
}

impl Side {
    /// `rows` and `cols` are the dims forming matrix rows and columns, in order.
    fn new(shape: &[usize], batch: &[usize], rows: &[usize], cols: &[usize]) -> Side {
        let st = super::strides(shape);
        let view = View::new(shape, batch, rows, cols);
        if let (Some(rs), Some(cs)) = (
            merged_stride(shape, &st, rows),
            merged_stride(shape, &st, cols),
        ) {
            return Side {
                perm: None,
                shape: shape.to_vec(),
                batch_off: offsets(shape, &st, batch),
                rs,
                cs,
                view,
            };
        }
        // Copy to [batch, X, Y], keeping the innermost non-trivial dim innermost.
        let inner = (0..shape.len()).rev().find(|&d| shape[d] != 1);
        let rows_last = inner.is_some_and(|d| rows.contains(&d));
        let mut perm: Vec<usize> = batch.to_vec();
        if rows_last {
            perm.extend_from_slice(cols);
            perm.extend_from_slice(rows);
        } else {
            perm.extend_from_slice(rows);
            perm.extend_from_slice(cols);
        }
        let pshape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let pst = super::strides(&pshape);
        let nb = batch.len();
        let (rdims, cdims): (Vec<usize>, Vec<usize>) = if rows_last {
            (
                (nb + cols.len()..perm.len()).collect(),
                (nb..nb + cols.len()).collect(),
            )
        } else {
            (
                (nb..nb + rows.len()).collect(),
                (nb + rows.len()..perm.len()).collect(),
            )
        };
        let rs = merged_stride(&pshape, &pst, &rdims).expect("contiguous after the copy");
        let cs = merged_stride(&pshape, &pst, &cdims).expect("contiguous after the copy");
        Side {
            batch_off: offsets(&pshape, &pst, &(0..nb).collect::<Vec<_>>()),
            perm: Some(perm),
            shape: pshape,
            rs,
            cs,
            view,
        }
    }

    /// The operand as read: itself, or its permuted copy.
    fn prepare<'a, T: Copy + Send + Sync + Default>(
        &self,
        orig_shape: &[usize],
        x: &'a [T],
        buf: &'a mut Vec<T>,
    ) -> &'a [T] {
        match &self.perm {
            None => x,
            Some(perm) => {
                let st = super::strides(orig_shape);
                let sst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
                // Every element is written by the copy: a reused buffer of the right
                // length needs no clearing.
                if buf.len() != x.len() {
                    buf.clear();
                    buf.resize(x.len(), T::default());
                }
                gather_copy(x, 0, &sst, &self.shape, buf);
                buf
            }
        }
    }
}

impl DotPlan {
    /// Normalise a dot of `lhs` x `rhs` shapes with these dimension numbers.
    pub fn new(lhs: &[usize], rhs: &[usize], dd: &DotDims) -> DotPlan {
        let lf = dd.lhs_free(lhs.len());
        let rf = dd.rhs_free(rhs.len());
        let prod = |s: &[usize], ds: &[usize]| ds.iter().map(|&d| s[d]).product::<usize>();
        let (b, m, n) = (prod(lhs, &dd.lhs_batch), prod(lhs, &lf), prod(rhs, &rf));
        let mut out_shape: Vec<usize> = dd.lhs_batch.iter().map(|&d| lhs[d]).collect();
        out_shape.extend(lf.iter().map(|&d| lhs[d]));
        out_shape.extend(rf.iter().map(|&d| rhs[d]));
        DotPlan {
            b,
            m,
            n,
            k: prod(lhs, &dd.lhs_contract),
            lhs: Side::new(lhs, &dd.lhs_batch, &lf, &dd.lhs_contract),
            rhs: Side::new(rhs, &dd.rhs_batch, &dd.rhs_contract, &rf),
            out_shape,
            groups: [dd.lhs_batch.len(), lf.len(), rf.len()],
            out: OutLayout {
                batch_off: (0..b).map(|i| i * m * n).collect(),
                rs: n,
                cs: 1,
                row_off: None,
                col_off: None,
            },
            transposed: false,
            stream_out: false,
            indicator: [false; 2],
        }
    }

    /// Read the operand of side `side` (0: lhs, 1: rhs) as its indicator: the caller passes
    /// `x`, the product multiplies `convert(x != 0)` (`1` where `x` is non-zero or NaN, `0`
    /// where it is `±0`). A sparse path over that side takes its non-zeros with the value
    /// `1` and reads nothing more; any other path multiplies a 0/1 copy. This is the MoE
    /// dispatch mask, `convert(combine != 0)`, read by the dispatch and its gradient:
    /// neither writes nor reads a mask of its own.
    pub fn read_indicator(&mut self, side: usize) {
        self.indicator[side] = true;
    }

    /// Which operands are read as indicators ([`DotPlan::read_indicator`]).
    pub fn indicators(&self) -> [bool; 2] {
        self.indicator
    }

    /// Write the result with non-temporal stores where the dense micro-kernel can (whole
    /// aligned lines; the values are the same): for a result that nothing reads before it
    /// has left the caches anyway (a gradient the step outputs). An ordinary store first
    /// reads each line from memory, only to overwrite it.
    pub fn stream_output(&mut self) {
        self.stream_out = true;
    }

    /// Write the result directly in the layout of `transpose(result, perm)` (result dim
    /// `perm[j]` becomes dim `j`): rows and columns at one stride each where their dims
    /// merge there, else each at its own offset.
    pub fn fuse_output_transpose(&mut self, perm: &[usize]) {
        let tshape: Vec<usize> = perm.iter().map(|&p| self.out_shape[p]).collect();
        let tst = super::strides(&tshape);
        // Stride of each result dim in the transposed buffer.
        let mut st = vec![0usize; perm.len()];
        for (j, &p) in perm.iter().enumerate() {
            st[p] = tst[j];
        }
        let [nb, nl, _] = self.groups;
        let all: Vec<usize> = (0..perm.len()).collect();
        let (bd, rest) = all.split_at(nb);
        let (ld, rd) = rest.split_at(nl);
        let (rs, row_off) = match merged_stride(&self.out_shape, &st, ld) {
            Some(rs) => (rs, None),
            None => (0, Some(offsets(&self.out_shape, &st, ld))),
        };
        let (cs, col_off) = match merged_stride(&self.out_shape, &st, rd) {
            Some(cs) => (cs, None),
            None => (0, Some(offsets(&self.out_shape, &st, rd))),
        };
        self.out = OutLayout {
            batch_off: offsets(&self.out_shape, &st, bd),
            rs,
            cs,
            row_off,
            col_off,
        };
        self.transposed = true;
    }

    /// Whether the result is written transposed (a fused `transpose`).
    pub fn writes_transposed(&self) -> bool {
        self.transposed
    }

    /// Dense FLOPs (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * self.b as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Whether an operand of `len` elements is worth listing for a sparse path: at least 16
    /// flops per element, and a product not too small for a list to pay.
    pub fn sparse_worth(&self, len: usize) -> bool {
        self.flops() >= 16.0 * len as f64 && self.m * self.n * self.k >= 1 << 15
    }

    /// Which operands `(lhs, rhs)` a dot that took `path` read through a permuted copy:
    /// only the dense GEMM copies an operand whose strides do not merge; the sparse paths
    /// read both in place through their offset tables.
    pub fn copies(&self, path: DotPath) -> (bool, bool) {
        match path {
            DotPath::Dense => (self.lhs.perm.is_some(), self.rhs.perm.is_some()),
            _ => (false, false),
        }
    }

    /// Which operands `(lhs, rhs)` read as indicators ([`DotPlan::read_indicator`]) a dot
    /// that took `path` multiplies as a 0/1 copy: every path but the sparse walk over that
    /// side reads it densely.
    pub fn indicator_copies(&self, path: DotPath) -> (bool, bool) {
        let [l, r] = self.indicator;
        (
            l && path != DotPath::SparseLhs,
            r && path != DotPath::SparseRhs,
        )
    }

    /// The `(address, floats)` spans of batch entry 0 of the operands `l` and `r` as this
    /// plan's GEMM reads them in place (`(0, 0)` for a side that is copied first, is not one
    /// compact block, or is not inside its slice, e.g. empty): what a GEMM running just
    /// before this one can fetch for it.
    pub fn first_entry_spans(&self, l: &[f32], r: &[f32]) -> [(usize, usize); 2] {
        let (m, n, k) = (self.m, self.n, self.k);
        let span = |side: &Side, x: &[f32], rows: usize, cols: usize| match side.batch_off.first() {
            Some(&base) if side.perm.is_none() => {
                compact_span(x, base, side.rs, side.cs, rows, cols)
                    .map_or((0, 0), |(p, len)| (p as usize, len))
            }
            _ => (0, 0),
        };
        [span(&self.lhs, l, m, k), span(&self.rhs, r, k, n)]
    }
}

/// The start and element count of the `rows x cols` block at `base` of `x` with strides
/// `rs`/`cs`, when the block is compact (its span at most twice its elements: worth fetching
/// whole) and inside `x`.
fn compact_span<T>(
    x: &[T],
    base: usize,
    rs: usize,
    cs: usize,
    rows: usize,
    cols: usize,
) -> Option<(*const T, usize)> {
    if rows * cols == 0 {
        return None;
    }
    let len = (rows - 1) * rs + (cols - 1) * cs + 1;
    (len <= 2 * rows * cols && base + len <= x.len()).then(|| (x[base..].as_ptr(), len))
}

/// Which path a dot took (for profiles and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotPath {
    Dense,
    SparseLhs,
    SparseRhs,
    Int,
    Empty,
}

/// Element types the float paths run on.
pub trait GemmFloat:
    Copy + Send + Sync + Default + PartialEq + Add<Output = Self> + Mul<Output = Self> + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// Exactly, as f64 (and back: exact for a value that came from this type).
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// Bit `t` set for each non-zero (NaN included) of the `run.len() <= 64` values.
    fn nonzero_bits64(run: &[Self]) -> u64 {
        fold_nonzero_bits(run)
    }
    /// Run `f` with this thread's two reusable buffers for permuted operand copies (fresh
    /// ones if the thread is already inside a dot, e.g. one that rayon stole while waiting).
    /// Reuse matters: a fresh 32 MiB buffer costs 8192 page faults on every call.
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R;
    /// Run `f` with this thread's reusable `n`-element result tile (a GEMM whose result is
    /// placed through offset tables multiplies into it first); fresh if already in use.
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

thread_local! {
    static SCRATCH_F32: RefCell<(Vec<f32>, Vec<f32>)> = RefCell::default();
    static SCRATCH_F64: RefCell<(Vec<f64>, Vec<f64>)> = RefCell::default();
    static TILE_F32: RefCell<Vec<f32>> = RefCell::default();
    static TILE_F64: RefCell<Vec<f64>> = RefCell::default();
}

fn tile<T: Copy + Default, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    n: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < n {
                buf.resize(n, T::default());
            }
            f(&mut buf[..n])
        }
        Err(_) => f(&mut vec![T::default(); n]),
    })
}

fn scratch<T, R>(
    key: &'static std::thread::LocalKey<RefCell<(Vec<T>, Vec<T>)>>,
    f: impl FnOnce(&mut Vec<T>, &mut Vec<T>) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let (a, b) = &mut *bufs;
            f(a, b)
        }
        Err(_) => f(&mut Vec::new(), &mut Vec::new()),
    })
}

impl GemmFloat for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    /// AVX2 compares and movemasks where the CPU has them (a scalar fold compiles to one
    /// compare per value).
    fn nonzero_bits64(run: &[f32]) -> u64 {
        super::sgemm::nonzero_bits64(run).unwrap_or_else(|| fold_nonzero_bits(run))
    }
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> R) -> R {
        scratch(&SCRATCH_F32, f)
    }
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        tile(&TILE_F32, n, f)
    }
}

impl GemmFloat for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<f64>, &mut Vec<f64>) -> R) -> R {
        scratch(&SCRATCH_F64, f)
    }
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [f64]) -> R) -> R {
        tile(&TILE_F64, n, f)
    }
}

/// One non-zero of a sparse operand as its path adds it: the result's row (lhs) or column
/// (rhs) it goes to, its step `kk`, and its value.
type Term<T> = (u32, u32, T);

/// The non-zeros of every batch entry of `x` read through `view` (an lhs when `lhs`, else
/// an rhs walked as its transpose), each entry's in the order the sparse path adds them
/// (each row's or column's terms in increasing `kk`), when at most 10 % of `x` is non-zero;
/// else `None`. A dense operand (every expert GEMM is a candidate) is told apart by 4096
/// samples in evenly spaced runs (over a fifth non-zero). One pass over `x`: the sparse
/// path then reads the lists, not `x`. The answer only decides speed: every path gives the
/// same values.
fn sparse_terms<T: GemmFloat>(x: &[T], view: &View, lhs: bool) -> Option<Vec<Vec<Term<T>>>> {
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
    let lists: Vec<Vec<Term<T>>> = if x.len() >= super::PAR_MIN && b >= 2 {
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
fn sampled_dense<T: GemmFloat>(x: &[T]) -> bool {
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
fn max_abs_finite(x: &[f32]) -> Option<f32> {
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
    let m = if x.len() >= super::PAR_MIN {
        x.par_chunks(1 << 14).map(block).reduce(|| 0, u32::max)
    } else {
        block(x)
    };
    (m <= f32::MAX.to_bits()).then_some(f32::from_bits(m))
}

/// Whether every value is finite: folded over blocks without an early exit per element, so
/// it vectorises (`x * 0` is zero exactly for finite `x`).
fn chunk_finite<T: GemmFloat>(x: &[T]) -> bool {
    with_avx2(
        #[inline(always)]
        || {
            x.chunks(256)
                .all(|c| c.iter().fold(true, |f, &v| f & (v * T::ZERO == T::ZERO)))
        },
    )
}

fn all_finite<T: GemmFloat>(x: &[T]) -> bool {
    if x.len() >= super::PAR_MIN {
        x.par_chunks(1 << 14).all(chunk_finite)
    } else {
        chunk_finite(x)
    }
}

/// The result buffer shared by batch tasks; each batch entry writes a disjoint set of
/// elements (the output layout is a bijection of `(b, i, j)`).
#[derive(Clone, Copy)]
struct OutPtr<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: `OutPtr` is only used to write disjoint elements from different tasks (see
// `dot_float`), and `T: Send`.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as above; shared references never read through the pointer.
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// What a GEMM fetches into cache while it computes: the operands of `next`, the batch entry
/// its thread multiplies next, and `epi`, the `(address, floats)` spans the epilogue that runs
/// right after it reads (the coded ReLU whose zero signs the ReLU gradient reads, which comes
/// from the forward and is cold), and `out`, the `(address, floats)` span the next entry's
/// result is written to (a store into a line not in cache waits for the line first).
#[derive(Clone, Copy)]
struct Ahead<'a> {
    next: Option<usize>,
    epi: &'a [(usize, usize)],
    out: (usize, usize),
    /// Without a `next` entry: the spans of the GEMM that runs after this batch (the next
    /// dot's first entry), fetched instead.
    tail: &'a [(usize, usize); 2],
}

/// One dense GEMM into batch entry `ob` of the result.
#[allow(clippy::too_many_arguments)]
fn gemm_one<T: GemmFloat>(
    p: &DotPlan,
    l: &[T],
    lb: usize,
    r: &[T],
    rb: usize,
    out: OutPtr<T>,
    ob: usize,
    par: gemm::Parallelism,
    ahead: Ahead,
) {
    let (rows, cols) = (p.out.row_off.as_deref(), p.out.col_off.as_deref());
    let is_f32 = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let one_table = is_f32 && sgemm::available() && (rows.is_none() || cols.is_none());
    if (rows.is_none() && cols.is_none()) || one_table {
        // Plain strides, or rows (columns) at their own offsets and the other at one stride
        // (a fused output transpose whose row dims do not merge: an expert's input gradient
        // written as [G, E, C, M]): the micro-kernel stores each tile row at its offset.
        if rows.is_some() || cols.is_some() {
            assert!(ob + p.out.last(p.m, p.n) < out.len);
        }
        return gemm_strided(
            p,
            l,
            lb,
            r,
            rb,
            out,
            ob,
            (p.out.rs, rows),
            (p.out.cs, cols),
            par,
            ahead,
            p.stream_out,
        );
    }
    // Rows and columns both at their own offsets (or no micro-kernel): multiply into a
    // row-major scratch, then place it.
    // The tile is reused per thread (every element is written by the GEMM: `k > 0` here).
    let (m, n) = (p.m, p.n);
    T::with_tile(m * n, |tmp| {
        let tp = OutPtr {
            ptr: tmp.as_mut_ptr(),
            len: tmp.len(),
        };
        // (Into the scratch tile, read back at once: never streamed.)
        gemm_strided(
            p,
            l,
            lb,
            r,
            rb,
            tp,
            0,
            (n, None),
            (1, None),
            par,
            ahead,
            false,
        );
        assert!(ob + p.out.last(m, n) < out.len);
        for i in 0..m {
            let o = ob + p.out.row(i);
            for j in 0..n {
                // SAFETY: bounded by the assert above; this batch entry's elements only.
                unsafe { *out.ptr.add(o + p.out.col(j)) = tmp[i * n + j] };
            }
        }
    })
}

/// One dense GEMM `out[ob + row(i) + col(j)] = (l · r)[i, j]`, `row(i)` = `i*ors` or
/// `rows[i]`, `col(j)` = `j*ocs` or `cols[j]` (tables only on the f32 micro-kernel path, one
/// at most; the caller has bounded them inside `out`). `next`: the batch entry this thread
/// multiplies next, whose operands the micro-kernel fetches while it computes this one.
/// `stream`: write with non-temporal stores where the kernel can (`sgemm::MatMut::stream`).
#[allow(clippy::too_many_arguments)]
fn gemm_strided<T: GemmFloat>(
    p: &DotPlan,
    l: &[T],
    lb: usize,
    r: &[T],
    rb: usize,
    out: OutPtr<T>,
    ob: usize,
    (ors, rows): (usize, Option<&[usize]>),
    (ocs, cols): (usize, Option<&[usize]>),
    par: gemm::Parallelism,
    ahead: Ahead,
    stream: bool,
) {
    let (m, n, k) = (p.m, p.n, p.k);
    let (lrs, lcs, rrs, rcs) = (p.lhs.rs, p.lhs.cs, p.rhs.rs, p.rhs.cs);
    if rows.is_none() && cols.is_none() {
        assert!(ob + (m - 1) * ors + (n - 1) * ocs < out.len);
    }
    assert!(rows.is_none_or(|t| t.len() == m) && cols.is_none_or(|t| t.len() == n));
    assert!(lb + (m - 1) * lrs + (k - 1) * lcs < l.len());
    assert!(rb + (k - 1) * rrs + (n - 1) * rcs < r.len());
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && sgemm::available() {
        let threads = match par {
            gemm::Parallelism::None => 1,
            _ => rayon::current_num_threads().max(1),
        };
        // Split the larger of M and N into one part per pool thread (whole tiles); every
        // element's arithmetic is the same however it is split.
        let (split_m, len, unit) = if m >= n {
            (true, m, sgemm::MR)
        } else {
            (false, n, sgemm::tile_width())
        };
        let step = len.div_ceil(threads).div_ceil(unit) * unit;
        let part = |lo: usize, ahead: &[(*const f32, usize)]| {
            let o = out; // the whole `OutPtr` (Sync), not its raw field
            let hi = len.min(lo + step);
            let (i0, j0, mm, nn) = if split_m {
                (lo, 0, hi - lo, n)
            } else {
                (0, lo, m, hi - lo)
            };
            // SAFETY: f32 is `T` (checked above), so the casts only rename the type; the
            // asserts above (and the caller's, for a table) bound the whole `m x k`, `k x n`
            // and `m x n` ranges, of which this part reads rows `i0..i0+mm` of the lhs,
            // columns `j0..j0+nn` of the rhs and writes that block of the output (tables
            // sliced from its first row / column), disjoint from every other part's and
            // batch entry's (the output layout is a bijection); `sgemm::available()` was
            // checked.
            unsafe {
                sgemm::sgemm_ahead(
                    mm,
                    nn,
                    k,
                    sgemm::MatRef {
                        ptr: l.as_ptr().add(lb + i0 * lrs).cast(),
                        rs: lrs,
                        cs: lcs,
                    },
                    sgemm::MatRef {
                        ptr: r.as_ptr().add(rb + j0 * rcs).cast(),
                        rs: rrs,
                        cs: rcs,
                    },
                    {
                        // This part's block: a table is taken from its first row/column,
                        // the strided dim offsets the base pointer.
                        let (base, trows) = match rows {
                            Some(t) => (ob + j0 * ocs, t[i0..].as_ptr()),
                            None => (ob + i0 * ors, std::ptr::null()),
                        };
                        let (base, tcols) = match cols {
                            Some(t) => (base, t[j0..].as_ptr()),
                            None if rows.is_some() => (base, std::ptr::null()),
                            None => (base + j0 * ocs, std::ptr::null()),
                        };
                        sgemm::MatMut {
                            ptr: o.ptr.add(base).cast(),
                            rs: ors,
                            cs: ocs,
                            rows: trows,
                            cols: tcols,
                            stream,
                        }
                    },
                    ahead,
                )
            }
        };
        if step >= len {
            // One call: it fetches the next entry's operands where each is one compact
            // span (a strided view over a larger buffer would fetch what it never reads).
            let span = |x: &[T], base: usize, rs: usize, cs: usize, rows: usize, cols: usize| {
                compact_span(x, base, rs, cs, rows, cols).map(|(p, len)| (p.cast::<f32>(), len))
            };
            // An absent span is empty, which the fetcher skips (no allocation per GEMM).
            let none = (std::ptr::null(), 0);
            let next = ahead
                .next
                .map_or(ahead.tail.map(|(a, len)| (a as *const f32, len)), |bb| {
                    [
                        span(l, p.lhs.batch_off[bb], lrs, lcs, m, k).unwrap_or(none),
                        span(r, p.rhs.batch_off[bb], rrs, rcs, k, n).unwrap_or(none),
                    ]
                });
            let out_next = (ahead.out.0 as *const f32, ahead.out.1);
            if ahead.epi.is_empty() {
                // The next entry's result too when it fits the fetch budget.
                let all = [next[0], next[1], out_next];
                part(0, if sgemm::fetch_fits(&all) { &all } else { &next });
            } else {
                // The epilogue's spans too (read right after this GEMM) when everything fits
                // the fetch budget, else only the next entry's operands (over it, nothing is
                // fetched); the next entry's result when that fits as well.
                let mut all: Vec<(*const f32, usize)> = ahead
                    .epi
                    .iter()
                    .map(|&(a, len)| (a as *const f32, len))
                    .collect();
                all.extend_from_slice(&next);
                if !sgemm::fetch_fits(&all) {
                    all = next.to_vec();
                }
                all.push(out_next);
                if !sgemm::fetch_fits(&all) {
                    all.pop();
                }
                part(0, &all);
            }
        } else {
            (0..len)
                .step_by(step)
                .collect::<Vec<_>>()
                .into_par_iter()
                .for_each(|lo| part(lo, &[]));
        }
        return;
    }
    assert!(
        rows.is_none() && cols.is_none(),
        "output tables need the micro-kernel"
    );
    // SAFETY: the asserts above bound every element the GEMM reads (`m x k` from `l` at
    // `lb` with strides `lrs`/`lcs`, `k x n` from `r` at `rb`) and writes (`m x n` of the
    // output at `ob` with strides `ors`/`ocs`, inside the exclusively borrowed result
    // buffer); no other task writes these elements (distinct batch entries map to disjoint
    // elements); `read_dst = false`, so the output is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.ptr.add(ob),
            ocs as isize,
            ors as isize,
            false,
            l.as_ptr().add(lb),
            lcs as isize,
            lrs as isize,
            r.as_ptr().add(rb),
            rcs as isize,
            rrs as isize,
            T::ZERO,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
}

/// Accumulate `v * x` into element `(i, j)`-addressed storage through the raw output.
#[inline(always)]
fn axpy_out<T: GemmFloat>(out: OutPtr<T>, at: usize, v: T) {
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
fn add_run<T: GemmFloat>(out: OutPtr<T>, at: usize, xs: &[T], v: T, first: bool) {
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
fn zero_out<T: GemmFloat>(p: &DotPlan, out: OutPtr<T>, ob: usize) {
    let (m, n) = (p.m, p.n);
    assert!(ob + p.out.last(m, n) < out.len);
    // SAFETY (every branch): bounded by the assert above; this batch entry's elements only
    // (a row or column slice of it is disjoint from every other entry's).
    if p.out.rs == 1 && p.out.row_off.is_none() {
        // Columns are the contiguous runs (a transposed result).
        for j in 0..n {
            let o = ob + p.out.col(j);
            unsafe { std::slice::from_raw_parts_mut(out.ptr.add(o), m) }.fill(T::ZERO);
        }
    } else if p.out.cs == 1 && p.out.col_off.is_none() {
        // Rows are the contiguous runs.
        for i in 0..m {
            let o = ob + p.out.row(i);
            unsafe { std::slice::from_raw_parts_mut(out.ptr.add(o), n) }.fill(T::ZERO);
        }
    } else {
        for i in 0..m {
            for j in 0..n {
                unsafe { *out.ptr.add(ob + p.out.row(i) + p.out.col(j)) = T::ZERO };
            }
        }
    }
}

/// Bit `t` set for each non-zero (NaN included) of the `run.len() <= 64` values, folded
/// value by value.
#[inline(always)]
fn fold_nonzero_bits<T: GemmFloat>(run: &[T]) -> u64 {
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
fn for_nonzero<T: GemmFloat>(run: &[T], mut f: impl FnMut(usize, T)) {
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
fn nonzeros<T: GemmFloat>(
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

/// Add the terms into `lines` contiguous runs of the result, `len` long, run `q` at
/// `start(q)`: term `(q, kk, v)` adds `v * src(kk)` to run `q`. A run's first term is
/// written onto zero and runs without terms are zero-filled, so the result is written once,
/// not zeroed first.
#[inline(always)]
fn place_runs<'a, T: GemmFloat>(
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
fn sparse_entry<T: GemmFloat>(
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

/// A per-batch-entry epilogue: `epi(bb, entry)` with entry `bb`'s finished `m x n` result.
pub type Epilogue<'a, T> = &'a (dyn Fn(usize, &mut [T]) + Sync);

#[allow(clippy::too_many_arguments)]
fn dot_float<T: GemmFloat>(
    p: &DotPlan,
    lhs_shape: &[usize],
    l: &[T],
    rhs_shape: &[usize],
    r: &[T],
    out: &mut [T],
    epi: Option<Epilogue<T>>,
    epi_in: &[usize],
    tail: &[(usize, usize); 2],
    known: [Known; 2],
) -> DotPath {
    let (b, m, n, k) = (p.b, p.m, p.n, p.k);
    // Entries the GEMM loop did not hand to the epilogue get it afterwards, in parallel.
    let after = |out: &mut [T]| {
        if let Some(epi) = epi {
            out.par_chunks_mut((m * n).max(1))
                .enumerate()
                .for_each(|(bb, x)| epi(bb, x));
        }
    };
    if b * m * n == 0 {
        return DotPath::Empty;
    }
    if k == 0 {
        out.fill(T::ZERO);
        after(out);
        return DotPath::Empty;
    }
    let sparse_worth = |len: usize| p.sparse_worth(len);
    // An operand given by its support alone (an empty slice: its buffer released, the
    // executor's `frees_sparse`): its length from its shape, its terms from the support,
    // its finiteness from the support's values, and its values rebuilt from the support
    // where the path reads it densely.
    let (llen, rlen): (usize, usize) = (lhs_shape.iter().product(), rhs_shape.iter().product());
    let absent = [l.len() != llen, r.len() != rlen];
    let support_of = |side: usize| match known[side] {
        Known::Sparse(sup, _) if sup.fits([llen, rlen][side]) => sup,
        _ => panic!("an operand given by its support alone comes with that support"),
    };
    let finite = |side: usize, x: &[T]| {
        if absent[side] {
            support_of(side).all_finite()
        } else {
            all_finite(x)
        }
    };
    // A sparse side costs a pass over the other operand's row (column) per non-zero: when
    // both sides are mostly zeros (an expert buffer with few tokens against a one-hot mask),
    // walk the one with fewer terms in all (4.4 ms against 0.14 ms on a training step's
    // dispatch gradient when the emptier expert buffer was walked).
    // An indicator side's terms are its operand's non-zeros (the same positions: NaN is
    // non-zero to both), each with the value 1.
    let ind = p.indicator;
    let terms = |x: &[T], len: usize, view: &View, lhs: bool, known: Known| {
        let ind = ind[usize::from(!lhs)];
        if !sparse_worth(len) {
            return None;
        }
        match known {
            Known::Dense => None,
            // A support of another buffer's length (a caller's mistake) is not trusted.
            Known::Sparse(sup, vals) if sup.fits(len) => {
                let vals = if ind { Values::Ones } else { vals };
                Some(terms_from_support(x, view, sup, vals, lhs))
            }
            // An absent operand is not scanned (the dense path rebuilds it, or says why not).
            Known::Unknown | Known::Sparse(..) if x.len() != len => None,
            Known::Unknown | Known::Sparse(..) => {
                let mut t = sparse_terms(x, view, lhs)?;
                if ind {
                    t.iter_mut().flatten().for_each(|t| t.2 = T::ONE);
                }
                Some(t)
            }
        }
    };
    let lt = terms(l, llen, &p.lhs.view, true, known[0]);
    let rt = terms(r, rlen, &p.rhs.view, false, known[1]);
    let count = |t: &Vec<Vec<Term<T>>>| t.iter().map(Vec::len).sum::<usize>();
    let (ln, rn) = (lt.as_ref().map(count), rt.as_ref().map(count));
    let rhs_first = match (ln, rn) {
        (Some(a), Some(b)) => (b as f64) * (m as f64) < (a as f64) * (n as f64),
        (None, Some(_)) => true,
        _ => false,
    };
    // A sparse side is taken when it is sparse and the other side finite (it leaves out
    // `0 * x` terms): the preferred side first, then the other.
    // (An indicator is finite.)
    let takes = |p: DotPath| match p {
        DotPath::SparseLhs => ln.is_some() && (ind[1] || finite(1, r)),
        _ => rn.is_some() && (ind[0] || finite(0, l)),
    };
    let order = if rhs_first {
        [DotPath::SparseRhs, DotPath::SparseLhs]
    } else {
        [DotPath::SparseLhs, DotPath::SparseRhs]
    };
    let path = order
        .into_iter()
        .find(|&p| takes(p))
        .unwrap_or(DotPath::Dense);
    // An indicator side that the path reads densely: its 0/1 copy.
    let copy = |x: &[T]| -> Vec<T> {
        x.par_iter()
            .with_min_len(1 << 14)
            .map(|&v| if v != T::ZERO { T::ONE } else { T::ZERO })
            .collect()
    };
    // A side given by its support and read densely by this path (the other side walked,
    // or the dense GEMM): rebuilt.
    let lrebuilt = (absent[0] && path != DotPath::SparseLhs).then(|| support_of(0).dense_as());
    let rrebuilt = (absent[1] && path != DotPath::SparseRhs).then(|| support_of(1).dense_as());
    let (l, r) = (
        lrebuilt.as_deref().unwrap_or(l),
        rrebuilt.as_deref().unwrap_or(r),
    );
    let (lcopy, rcopy) = p.indicator_copies(path);
    let lc = lcopy.then(|| copy(l));
    let rc = rcopy.then(|| copy(r));
    let (l, r) = (lc.as_deref().unwrap_or(l), rc.as_deref().unwrap_or(r));
    // The GEMM reads permuted copies where strides do not merge; the sparse paths read the
    // operands in place.
    let done = match path {
        DotPath::SparseLhs => dense_or_sparse(p, path, l, r, out, epi, epi_in, tail, lt.as_deref()),
        DotPath::SparseRhs => dense_or_sparse(p, path, l, r, out, epi, epi_in, tail, rt.as_deref()),
        _ => T::with_scratch(|lbuf, rbuf| {
            let l = p.lhs.prepare(lhs_shape, l, lbuf);
            let r = p.rhs.prepare(rhs_shape, r, rbuf);
            dense_or_sparse(p, path, l, r, out, epi, epi_in, tail, None)
        }),
    };
    if !done {
        after(out);
    }
    path
}

/// Run the batch of GEMMs (or sparse products) on prepared operands. Returns whether the
/// epilogue ran (each entry's right after its GEMM: a dense batch split over the pool).
#[allow(clippy::too_many_arguments)]
fn dense_or_sparse<T: GemmFloat>(
    p: &DotPlan,
    path: DotPath,
    l: &[T],
    r: &[T],
    out: &mut [T],
    epi: Option<Epilogue<T>>,
    epi_in: &[usize],
    tail: &[(usize, usize); 2],
    terms: Option<&[Vec<Term<T>>]>,
) -> bool {
    let b = p.b;
    let threads = rayon::current_num_threads().max(1);
    let optr = OutPtr {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let one = |bb: usize, par: gemm::Parallelism, next: Option<usize>| match path {
        DotPath::SparseLhs => with_avx2(
            #[inline(always)]
            || sparse_entry(p, true, &terms.expect("the lhs's terms")[bb], r, optr, bb),
        ),
        DotPath::SparseRhs => with_avx2(
            #[inline(always)]
            || sparse_entry(p, false, &terms.expect("the rhs's terms")[bb], l, optr, bb),
        ),
        DotPath::Dense | DotPath::Int | DotPath::Empty => {
            let (lb, rb, ob) = (
                p.lhs.batch_off[bb],
                p.rhs.batch_off[bb],
                p.out.batch_off[bb],
            );
            // The next entry's result when it is one compact block.
            let out = next
                .filter(|_| !p.transposed && p.out.row_off.is_none() && p.out.col_off.is_none())
                .map_or((0, 0), |nb| {
                    let at = optr.ptr as usize + size_of::<T>() * p.out.batch_off[nb];
                    (at, p.m * p.n)
                });
            gemm_one(
                p,
                l,
                lb,
                r,
                rb,
                optr,
                ob,
                par,
                Ahead {
                    next,
                    epi: &[],
                    out,
                    tail,
                },
            )
        }
    };
    let sparse = path != DotPath::Dense;
    if let (Some(epi), false) = (epi, sparse || b < 2 * threads || p.transposed) {
        let mn = p.m * p.n;
        let base = out.as_ptr() as usize;
        out.par_chunks_mut(mn).enumerate().for_each(|(bb, x)| {
            // The untransposed result: entry `bb` is exactly this chunk.
            debug_assert_eq!(p.out.batch_off[bb], bb * mn);
            let (lb, rb) = (p.lhs.batch_off[bb], p.rhs.batch_off[bb]);
            let o = OutPtr {
                ptr: x.as_mut_ptr(),
                len: x.len(),
            };
            let next = (bb + 1 < b).then_some(bb + 1);
            let spans: Vec<(usize, usize)> =
                epi_in.iter().map(|&a| (a + 4 * bb * mn, mn)).collect();
            let out = next.map_or((0, 0), |nb| (base + size_of::<T>() * nb * mn, mn));
            let ahead = Ahead {
                next,
                epi: &spans,
                out,
                tail,
            };
            gemm_one(p, l, lb, r, rb, o, 0, gemm::Parallelism::None, ahead);
            epi(bb, x);
        });
        return true;
    }
    if b >= 2 * threads || (sparse && b >= 2) {
        (0..b)
            .into_par_iter()
            .for_each(|bb| one(bb, gemm::Parallelism::None, (bb + 1 < b).then_some(bb + 1)));
    } else {
        // One pool thread (a device thread, or an MPI rank's share): gemm's serial path,
        // which skips the threading set-up its rayon path pays even for one thread.
        let par = if threads == 1 {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(0)
        };
        for bb in 0..b {
            one(bb, par, (bb + 1 < b).then_some(bb + 1));
        }
    }
    false
}

fn dot_i32(
    p: &DotPlan,
    lhs_shape: &[usize],
    l: &[i32],
    rhs_shape: &[usize],
    r: &[i32],
    out: &mut [i32],
) {
    let (mut lbuf, mut rbuf) = (Vec::new(), Vec::new());
    let l = p.lhs.prepare(lhs_shape, l, &mut lbuf);
    let r = p.rhs.prepare(rhs_shape, r, &mut rbuf);
    let (m, n, k) = (p.m, p.n, p.k);
    let (lrs, lcs, rrs, rcs) = (p.lhs.rs, p.lhs.cs, p.rhs.rs, p.rhs.cs);
    for bb in 0..p.b {
        let (lb, rb) = (p.lhs.batch_off[bb], p.rhs.batch_off[bb]);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i32;
                for kk in 0..k {
                    acc = acc.wrapping_add(
                        l[lb + i * lrs + kk * lcs].wrapping_mul(r[rb + kk * rrs + j * rcs]),
                    );
                }
                out[p.out.batch_off[bb] + p.out.row(i) + p.out.col(j)] = acc;
            }
        }
    }
}

fn widen(x: &[bf16]) -> Vec<f32> {
    x.par_iter()
        .with_min_len(1 << 14)
        .map(|v| v.to_f32())
        .collect()
}

/// Run the dot into `out` (the result dtype); returns the path taken.
pub fn dot(
    p: &DotPlan,
    lhs_shape: &[usize],
    lhs: &Data,
    rhs_shape: &[usize],
    rhs: &Data,
    out: &mut Data,
) -> DotPath {
    dot_known(p, lhs_shape, lhs, rhs_shape, rhs, out, &NO_TAIL, UNKNOWN)
}

/// No spans to fetch after a batch (see [`dot_known`]).
pub const NO_TAIL: [(usize, usize); 2] = [(0, 0); 2];

/// Nothing known of either operand's non-zeros.
pub const UNKNOWN: [Known<'static>; 2] = [Known::Unknown; 2];

/// [`dot`], fetching `tail` (`(address, floats)` spans, see
/// [`DotPlan::first_entry_spans`]: the operands of the dot that runs next) into cache while
/// the last GEMM of the batch computes (the first expert of a batch otherwise finds its
/// operands in memory; each other expert's are fetched by the one before it), with what the
/// caller knows of each operand's non-zeros (`[lhs, rhs]`, [`UNKNOWN`] for nothing; see
/// [`Support`]): a float operand the product would list term by term is not scanned again
/// when its support is known. The values computed are the same either way.
#[allow(clippy::too_many_arguments)]
pub fn dot_known(
    p: &DotPlan,
    lhs_shape: &[usize],
    lhs: &Data,
    rhs_shape: &[usize],
    rhs: &Data,
    out: &mut Data,
    tail: &[(usize, usize); 2],
    known: [Known; 2],
) -> DotPath {
    match (lhs, rhs, out) {
        (Data::F32(l), Data::F32(r), Data::F32(o)) => {
            dot_float(p, lhs_shape, l, rhs_shape, r, o, None, &[], tail, known)
        }
        (Data::F64(l), Data::F64(r), Data::F64(o)) => {
            dot_float(p, lhs_shape, l, rhs_shape, r, o, None, &[], &NO_TAIL, known)
        }
        (Data::BF16(l), Data::BF16(r), Data::BF16(o)) => {
            let (l, r) = (widen(l), widen(r));
            let mut acc = vec![0.0f32; o.len()];
            let path = dot_float(
                p,
                lhs_shape,
                &l,
                rhs_shape,
                &r,
                &mut acc,
                None,
                &[],
                &NO_TAIL,
                known,
            );
            o.par_iter_mut()
                .with_min_len(1 << 14)
                .zip(&acc)
                .for_each(|(o, &a)| *o = bf16::from_f32(a));
            path
        }
        (Data::I32(l), Data::I32(r), Data::I32(o)) => {
            dot_i32(p, lhs_shape, l, rhs_shape, r, o);
            DotPath::Int
        }
        (l, _, o) => panic!("dot_general of {} into {}", l.dtype(), o.dtype()),
    }
}

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
pub fn dot_masked(
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
                // SAFETY (both branches): every write is element `(bb, i, j)` of this entry,
                // bounded by the assert above; no other task writes it.
                if rows_contiguous {
                    // The row zeroed, then the masks' non-zeros computed (once per mask that
                    // has one there: the same value).
                    unsafe { std::slice::from_raw_parts_mut(optr.ptr.add(o0), n) }.fill(0.0);
                    for x in masks {
                        for_nonzero(&x[o0..o0 + n], |j, _| {
                            computed += 1;
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
pub fn dot_masked_sums(
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

/// The sums of [`dot_masked_sums`] from a computed dense product `prod` (the untransposed
/// result): every term, in order, as the separate multiply and reduce compute them (long
/// rows by [`row_sum_certified`] where that settles the result).
pub fn masked_row_sums(n: usize, prod: &[f32], mask: &[f32], sums: &mut [f32]) {
    assert_eq!(prod.len(), mask.len());
    assert_eq!(prod.len(), sums.len() * n);
    if n == 0 {
        sums.fill(0.0);
        return;
    }
    sums.par_iter_mut()
        .zip(prod.par_chunks(n).zip(mask.par_chunks(n)))
        .for_each(|(s, (x, w))| {
            *s = if n >= CERTIFIED_MIN {
                row_sum_certified(x, w)
            } else {
                None
            }
            .unwrap_or_else(|| row_sum_in_order(x, w));
        });
}

/// The fewest terms for which a row's sum of products is first tried in lanes
/// ([`row_sum_certified`]): an in-order f64 chain costs an add's latency per term (the
/// MoE layer's loss, 64K terms: 35 us hot on a Zen 5 core), the lanes a fraction of that.
const CERTIFIED_MIN: usize = 1024;

/// `sum_j (x[j] * w[j]) as f64` in increasing `j` from `+0`, rounded once to f32: the
/// reference's sum of an f32 product.
fn row_sum_in_order(x: &[f32], w: &[f32]) -> f32 {
    x.iter()
        .zip(w)
        .fold(0.0f64, |acc, (&x, &w)| acc + (x * w) as f64) as f32
}

/// [`row_sum_in_order`]'s result, when it can be proven from a sum in sixteen f64 lanes;
/// `None` otherwise (a non-finite term, or a sum too close to a rounding boundary of f32).
///
/// The terms `t_j` (the f32 products, exact in f64) are summed in lanes, and `sum |t_j|`
/// beside them. A sum of `n` f64 terms evaluated along a tree of height `h` lands within
/// `gamma(h) sum |t_j|` of the exact sum (`u = 2^-53`, `gamma(h) = h u / (1 - h u)`;
/// Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2), so the in-order chain
/// (height `n - 1`) lies within the sum of the two sums' bounds of the lanes' sum (the
/// interval below). Rounding to f32 is monotonic: when both ends of that interval
/// round to the same f32 (the same bits, so `-0` and `+0` differ), the chain rounds to it
/// too. Otherwise the caller runs the chain.
fn row_sum_certified(x: &[f32], w: &[f32]) -> Option<f32> {
    with_avx2(
        #[inline(always)]
        || {
            const L: usize = 16;
            let (mut sum, mut abs) = ([0.0f64; L], [0.0f64; L]);
            let (xc, wc) = (x.chunks_exact(L), w.chunks_exact(L));
            let (xr, wr) = (xc.remainder(), wc.remainder());
            for (a, b) in xc.zip(wc) {
                for q in 0..L {
                    let t = (a[q] * b[q]) as f64;
                    sum[q] += t;
                    abs[q] += t.abs();
                }
            }
            for (q, (&a, &b)) in xr.iter().zip(wr).enumerate() {
                let t = (a * b) as f64;
                sum[q] += t;
                abs[q] += t.abs();
            }
            let s: f64 = sum.iter().sum();
            let a: f64 = abs.iter().sum();
            // Finite f32 products cannot overflow an f64 sum, so `a` is finite exactly when
            // every term is.
            if !a.is_finite() {
                return None;
            }
            let u = f64::EPSILON / 2.0;
            // The chain's error is at most `gamma(n - 1) A`, the lanes' (each lane's run of
            // at most `n / 16 + 1` terms, then the sixteen lanes) `gamma(h) A` with
            // `h = n / 16 + 17`, where `A = sum |t_j|` and `gamma(k) = k u / (1 - k u)`,
            // under `1.01 k u` here (`n` far below 2^40). `a` is `A` summed the lanes' way,
            // so `A <= a (1 + 2 h u)`. Then slack for the two additions below.
            let (n, h) = (x.len() as f64, (x.len() / L + L + 1) as f64);
            let e = 1.01 * (n + h) * u * a * (1.0 + 2.0 * h * u) + 4.0 * u * s.abs();
            let (lo, hi) = ((s - e) as f32, (s + e) as f32);
            (lo.to_bits() == hi.to_bits()).then_some(lo)
        },
    )
}

/// Whether the masked product applies (see [`dot_masked`]): a non-empty product, `masks`
/// masks each `sparse` (mask `t`: of the result's length and not dense by sampling, or
/// known sparse by its support), finite operands and no overflow possible in any value
/// (so every skipped value is finite).
fn masked_applies(
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
fn masked_walk<F>(p: &DotPlan, l: &[f32], r: &[f32], masks: &[&[f32]], entry: F) -> Option<usize>
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
    if b >= 2 && b * m * n >= super::PAR_MIN {
        (0..b).into_par_iter().for_each(one);
    } else {
        (0..b).for_each(one);
    }
    let seen = seen.into_inner();
    (seen <= budget).then_some(seen)
}

/// `sum a[i] * b[i]` over eight lanes of partial sums (vectorised), then the lanes in order.
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    with_avx2(
        #[inline(always)]
        || dot8_impl(a, b),
    )
}

#[inline(always)]
fn dot8_impl(a: &[f32], b: &[f32]) -> f32 {
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

/// An f32 [`dot`] followed by `epi` on every batch entry of the result (`m x n` values at
/// `bb * m * n`; the plan must not write transposed). A dense batch split over the pool
/// runs each entry's epilogue right after its GEMM, while the entry is still in cache (an
/// elementwise consumer fused into the GEMM's output: no second pass over memory).
/// `epi_in`: the buffers the epilogue reads; those as long as the result have each entry's
/// part fetched into cache while the entry's GEMM computes (within the fetch budget).
/// `tail`: as in [`dot_known`].
#[allow(clippy::too_many_arguments)]
pub fn dot_then(
    p: &DotPlan,
    lhs_shape: &[usize],
    lhs: &[f32],
    rhs_shape: &[usize],
    rhs: &[f32],
    out: &mut [f32],
    epi: Epilogue<f32>,
    epi_in: &[&[f32]],
    tail: &[(usize, usize); 2],
) -> DotPath {
    assert!(!p.transposed, "an epilogue needs the untransposed result");
    // Inputs the epilogue reads elementwise (as long as the result): each entry's part is
    // fetched into cache while the entry's GEMM computes.
    let spans: Vec<usize> = epi_in
        .iter()
        .filter(|x| x.len() == out.len())
        .map(|x| x.as_ptr() as usize)
        .collect();
    dot_float(
        p,
        lhs_shape,
        lhs,
        rhs_shape,
        rhs,
        out,
        Some(epi),
        &spans,
        tail,
        UNKNOWN,
    )
}

/// The dtype a dot accumulates in (for documentation and profiles).
pub fn accumulation(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F32 => DType::F32,
        DType::F64 => DType::F64,
        DType::I32 | DType::Bool => DType::I32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::DotDims;

    /// A xorshift64 stream from `seed` (test data).
    fn xorshift(mut st: u64) -> impl FnMut() -> u64 {
        move || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            st
        }
    }

    /// Long rows' sums of products (the loss) come out bitwise as the in-order f64 chain
    /// gives them: random rows of mixed signs and magnitudes, rows whose sum cancels to
    /// zero or near a rounding boundary, where the lanes' sum differs from the chain's (the
    /// certificate must refuse it), and non-finite terms.
    #[test]
    fn long_row_sums_equal_the_in_order_chain() {
        let mut state = 0x9e37_79b9u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let check = |x: &[f32], w: &[f32], what: &str| {
            let want = row_sum_in_order(x, w);
            let mut got = [0.0f32];
            masked_row_sums(x.len(), x, w, &mut got);
            assert!(
                got[0].to_bits() == want.to_bits() || (got[0].is_nan() && want.is_nan()),
                "{what}: {} against the chain's {want}",
                got[0]
            );
        };
        let mut settled = 0;
        for (case, n) in [1024usize, 1025, 4000, 65536, 70001].iter().enumerate() {
            for scale in [1.0f32, 1e-20, 1e20] {
                let x: Vec<f32> = (0..*n)
                    .map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * scale)
                    .collect();
                let w: Vec<f32> = (0..*n).map(|_| (next() % 3) as f32 * 0.5).collect();
                check(&x, &w, &format!("case {case} scale {scale}"));
                settled += usize::from(row_sum_certified(&x, &w).is_some());
                // The same terms and their negations: the sum cancels to (near) zero.
                let xx: Vec<f32> = x.iter().chain(x.iter()).copied().collect();
                let mut ww = w.clone();
                ww.extend(w.iter().map(|v| -v));
                check(&xx, &ww, &format!("case {case} scale {scale} cancelling"));
            }
        }
        // The certificate is a worst-case bound, so rows whose sum cancels deeply are left to
        // the chain; most random rows settle.
        assert!(
            settled >= 10,
            "the lanes settled only {settled} of 15 random rows"
        );
        // 2^60, then 1, then -2^60 in the same lane: the chain loses the 1 (f64 has 53
        // bits), a lane sum keeps it. The certificate must not take the lanes' 1.
        let mut x = vec![0.0f32; 2048];
        let w = vec![1.0f32; 2048];
        x[0] = 2f32.powi(60);
        x[1] = 1.0;
        x[16] = -(2f32.powi(60));
        assert_eq!(row_sum_in_order(&x, &w), 0.0);
        assert_eq!(row_sum_certified(&x, &w), None);
        check(&x, &w, "absorbed term");
        // Non-finite terms: the chain decides.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.25f32; 2048];
            x[777] = bad;
            assert_eq!(row_sum_certified(&x, &w), None);
            check(&x, &w, &format!("{bad} term"));
        }
        // Zeros only: `+0`, as the chain from `+0` gives (`-0` terms included).
        let z: Vec<f32> = (0..2048)
            .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 })
            .collect();
        check(&z, &w, "zeros");
    }

    /// The bit-mask walk visits exactly the non-zeros (NaN included, `-0` not), in order,
    /// across block boundaries and a short last block.
    #[test]
    fn for_nonzero_visits_every_non_zero_in_order() {
        for len in [0usize, 1, 15, 16, 17, 40, 128] {
            let x: Vec<f32> = (0..len)
                .map(|i| match i % 7 {
                    0 => 1.5,
                    3 => f32::NAN,
                    5 => -0.0,
                    _ => 0.0,
                })
                .collect();
            let mut seen = Vec::new();
            for_nonzero(&x, |t, v| seen.push((t, v.to_bits())));
            let want: Vec<(usize, u32)> = x
                .iter()
                .enumerate()
                .filter(|(_, v)| **v != 0.0 || v.is_nan())
                .map(|(t, v)| (t, v.to_bits()))
                .collect();
            assert_eq!(seen, want, "len {len}");
        }
    }

    /// Short operands are judged by a whole count (a fifth non-zero is dense), long ones by
    /// samples; a sparse short operand still gets its term lists.
    #[test]
    fn short_operands_are_told_dense_or_sparse() {
        let dense: Vec<f32> = (0..2048).map(|i| (i % 3) as f32).collect();
        let sparse: Vec<f32> = (0..2048).map(|i| f32::from(i % 50 == 0)).collect();
        assert!(sampled_dense(&dense));
        assert!(!sampled_dense(&sparse));
        let long: Vec<f32> = (0..1 << 17).map(|i| (i % 3) as f32).collect();
        assert!(sampled_dense(&long));
        let view = View::new(&[32, 64], &[], &[0], &[1]);
        let terms = sparse_terms(&sparse, &view, true).expect("a sparse operand");
        assert_eq!(terms[0].len(), sparse.iter().filter(|v| **v != 0.0).count());
        assert!(sparse_terms(&dense, &view, true).is_none());
    }

    /// The spans a dot running before a batched dot fetches for it: batch entry 0 of each
    /// operand read in place, nothing for a side that is copied to another order first, and
    /// the results are the same with and without them.
    #[test]
    fn first_entry_spans_are_entry_zero_of_in_place_operands() {
        let (b, m, k, n) = (4usize, 6usize, 8usize, 5usize);
        let l: Vec<f32> = (0..b * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let r: Vec<f32> = (0..b * k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        let dims = |lb: usize, rb: usize, rc: usize| DotDims {
            lhs_batch: vec![lb],
            rhs_batch: vec![rb],
            lhs_contract: vec![2],
            rhs_contract: vec![rc],
        };
        let p = DotPlan::new(&[b, m, k], &[b, k, n], &dims(0, 0, 1));
        let spans = p.first_entry_spans(&l, &r);
        assert_eq!(spans[0], (l.as_ptr() as usize, m * k));
        assert_eq!(spans[1], (r.as_ptr() as usize, k * n));
        // The rhs as [k, b, n] with the batch in the middle: entry 0 is k runs of n, b*n
        // apart, spread over (k-1)*b*n + n = 145 floats for 40 read (over twice as many):
        // not fetched. The lhs is unchanged; an empty operand gives no span.
        let q = DotPlan::new(&[b, m, k], &[k, b, n], &dims(0, 1, 0));
        assert!((k - 1) * b * n + n > 2 * k * n);
        let got = q.first_entry_spans(&l, &r);
        assert_eq!(got, [(l.as_ptr() as usize, m * k), (0, 0)]);
        assert_eq!(p.first_entry_spans(&l, &[])[1], (0, 0));
        // The values do not depend on the spans fetched.
        let mut with = Data::F32(vec![0.0; b * m * n]);
        let mut without = Data::F32(vec![0.0; b * m * n]);
        let (ld, rd) = (Data::F32(l.clone()), Data::F32(r.clone()));
        dot_known(
            &p,
            &[b, m, k],
            &ld,
            &[b, k, n],
            &rd,
            &mut with,
            &spans,
            UNKNOWN,
        );
        dot(&p, &[b, m, k], &ld, &[b, k, n], &rd, &mut without);
        assert_eq!(with, without);
    }

    /// Both operands mostly zeros (an expert buffer with few tokens against a one-hot
    /// mask): the side with fewer terms in all is walked, and the values are the dense
    /// product's.
    #[test]
    fn when_both_sides_are_sparse_the_cheaper_walk_is_taken() {
        let (m, k, n) = (64usize, 1024usize, 256usize);
        let mut s = 12345u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        // lhs: 5 % non-zero; rhs: one non-zero per column (a one-hot).
        let mut l = vec![0.0f32; m * k];
        for x in l.iter_mut() {
            if next() % 20 == 0 {
                *x = (next() % 1000) as f32 / 500.0 - 1.0;
            }
        }
        let mut r = vec![0.0f32; k * n];
        for j in 0..n {
            r[(next() as usize % k) * n + j] = 1.0;
        }
        let dims = DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
        };
        let plan = DotPlan::new(&[m, k], &[k, n], &dims);
        let mut out = Data::F32(vec![0.0; m * n]);
        let path = dot(
            &plan,
            &[m, k],
            &Data::F32(l.clone()),
            &[k, n],
            &Data::F32(r.clone()),
            &mut out,
        );
        assert_eq!(path, DotPath::SparseRhs);
        let Data::F32(got) = out else { unreachable!() };
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| l[i * k + p] as f64 * r[p * n + j] as f64)
                    .sum();
                assert_eq!(got[i * n + j] as f64, want, "({i}, {j})");
            }
        }
        // The same operands swapped (the transposed product): now the lhs is the cheap side.
        let plan = DotPlan::new(&[n, k], &[k, m], &dims);
        let rt: Vec<f32> = (0..n * k).map(|q| r[(q % k) * n + q / k]).collect();
        let lt: Vec<f32> = (0..k * m).map(|q| l[(q % m) * k + q / m]).collect();
        let mut out = Data::F32(vec![0.0; n * m]);
        let path = dot(
            &plan,
            &[n, k],
            &Data::F32(rt),
            &[k, m],
            &Data::F32(lt),
            &mut out,
        );
        assert_eq!(path, DotPath::SparseLhs);
    }

    /// A one-hot-like `[4, 8, 6, 4]` tensor (a few values per row of its last two dims,
    /// `-0` and NaN among them), from a seed.
    fn one_hot_like(seed: u64) -> Vec<f32> {
        let mut next = xorshift(seed | 1);
        let mut x = vec![0.0f32; 4 * 8 * 6 * 4];
        for row in 0..32 {
            for _ in 0..2 {
                let at = row * 24 + (next() % 24) as usize;
                x[at] = match next() % 16 {
                    0 => -0.0,
                    1 => f32::NAN,
                    r => r as f32 * 0.37 - 2.0,
                };
            }
        }
        x
    }

    /// A support's terms equal the scan's, line by line, in every reading of the operand:
    /// batch dim outermost or not, rows and columns in or out of memory order (steps whose
    /// offsets do not increase take the sort), with the values scanned, read or all one.
    #[test]
    fn terms_from_a_support_are_the_scans() {
        let shape = [4usize, 8, 6, 4];
        // (batch, rows, cols) dims.
        let readings: [(&[usize], &[usize], &[usize]); 5] = [
            (&[0], &[1], &[2, 3]),
            (&[0], &[2, 3], &[1]),
            (&[2], &[0, 1], &[3]),
            (&[], &[3, 1], &[2, 0]),
            (&[1, 0], &[3], &[2]),
        ];
        // Each line's terms in step order; lines in increasing order.
        let by_line = |lists: Vec<Vec<Term<f32>>>| -> Vec<Vec<(u32, u32, u32)>> {
            lists
                .into_iter()
                .map(|l| {
                    let mut l: Vec<(u32, u32, u32)> =
                        l.into_iter().map(|(q, k, v)| (q, k, v.to_bits())).collect();
                    l.sort_by_key(|t| t.0);
                    l
                })
                .collect()
        };
        for seed in 1..6 {
            let x = one_hot_like(seed);
            let sup = Support::of(&x).expect("a sparse tensor");
            assert_eq!(
                sup.len(),
                x.iter().filter(|v| **v != 0.0 || v.is_nan()).count()
            );
            let ones: Vec<f32> = x.iter().map(|&v| f32::from(u8::from(v != 0.0))).collect();
            for (batch, rows, cols) in readings {
                let view = View::new(&shape, batch, rows, cols);
                for lhs in [true, false] {
                    let scan = by_line(sparse_terms(&x, &view, lhs).expect("sparse"));
                    for vals in [Values::Scanned, Values::Read] {
                        let known = by_line(terms_from_support(&x, &view, &sup, vals, lhs));
                        assert_eq!(known, scan, "{batch:?} {rows:?} {cols:?} lhs {lhs}");
                    }
                    let scan = by_line(sparse_terms(&ones, &view, lhs).expect("sparse"));
                    let known = by_line(terms_from_support(&ones, &view, &sup, Values::Ones, lhs));
                    assert_eq!(known, scan, "ones: {batch:?} {rows:?} {cols:?} lhs {lhs}");
                }
            }
        }
        // A dense tensor has no support; a long one is located in parallel parts.
        assert!(Support::of(&vec![1.0f32; 8192]).is_none());
        let long: Vec<f32> = (0..1 << 17)
            .map(|i| f32::from(u8::from(i % 13 == 0)))
            .collect();
        let sup = Support::of(&long).expect("sparse");
        assert!(sup.len() >= SUPPORT_PAR_MIN);
        let view = View::new(&[32, 64, 64], &[0], &[1], &[2]);
        for lhs in [true, false] {
            let scan = by_line(sparse_terms(&long, &view, lhs).expect("sparse"));
            let known = by_line(terms_from_support(&long, &view, &sup, Values::Scanned, lhs));
            assert_eq!(known, scan, "long, lhs {lhs}");
        }
    }

    /// A product given its operands' supports gives the bits of one that scans them: the
    /// MoE one-hot products (dispatch, combine, their gradients), both sides known.
    #[test]
    fn products_with_known_supports_give_the_scans_bits() {
        let (g, s, e, c, m) = (2usize, 64, 8, 4, 64);
        let mut next = xorshift(99u64);
        let mut comb = vec![0.0f32; g * s * e * c];
        for row in 0..g * s {
            for _ in 0..2 {
                comb[row * e * c + (next() % (e * c) as u64) as usize] =
                    (next() % 1000) as f32 / 999.0;
            }
        }
        let mut dense = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let gsec = vec![g, s, e, c];
        let cases: Vec<(Vec<usize>, Vec<usize>, DotDims, bool)> = vec![
            // dispatch GSEC,GSM->GECM; combine GSEC,EGCM->GSM (sparse lhs)
            (
                gsec.clone(),
                vec![g, s, m],
                DotDims::new(vec![0], vec![0], vec![1], vec![1]),
                true,
            ),
            (
                gsec.clone(),
                vec![e, g, c, m],
                DotDims::new(vec![0], vec![1], vec![2, 3], vec![0, 2]),
                true,
            ),
            // their gradients (sparse rhs)
            (
                vec![g, e, c, m],
                gsec.clone(),
                DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3]),
                false,
            ),
            (
                vec![g, s, m],
                gsec.clone(),
                DotDims::new(vec![0], vec![0], vec![1], vec![1]),
                false,
            ),
        ];
        let sup = Support::of(&comb).expect("sparse");
        for (ls, rs, dims, lhs_sparse) in cases {
            let plan = DotPlan::new(&ls, &rs, &dims);
            let (l, r) = if lhs_sparse {
                (comb.clone(), dense(rs.iter().product()))
            } else {
                (dense(ls.iter().product()), comb.clone())
            };
            let n: usize = plan.b * plan.m * plan.n;
            let run = |known: [Known; 2]| {
                let mut out = Data::F32(vec![f32::NAN; n]);
                let (ld, rd) = (Data::F32(l.clone()), Data::F32(r.clone()));
                let path = dot_known(&plan, &ls, &ld, &rs, &rd, &mut out, &NO_TAIL, known);
                let Data::F32(o) = out else { unreachable!() };
                (path, o.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
            };
            let (want_path, want) = run(UNKNOWN);
            let k = Known::Sparse(&sup, Values::Scanned);
            let known = if lhs_sparse {
                [k, Known::Dense]
            } else {
                [Known::Dense, k]
            };
            let (path, got) = run(known);
            assert_ne!(want_path, DotPath::Dense, "{dims:?}");
            assert_eq!(path, want_path, "{dims:?}");
            assert!(got == want, "{dims:?}: other bits with the support known");
        }
    }

    /// A product reading an operand as an indicator gives the bits of the same product
    /// given the 0/1 mask itself, on every path: the sparse walk of the indicator side
    /// (support unknown, or known with its scan's values, which must not be used), the
    /// walk of the other side (the indicator then read densely), and the dense GEMM (the
    /// weights dense, or the support said dense). `-0` and NaN are among the weights.
    #[test]
    fn indicator_reads_give_the_masks_bits() {
        let (g, s, e, c, m) = (2usize, 64, 8, 4, 32);
        let mut next = xorshift(7u64);
        let mut weight = |next: &mut dyn FnMut() -> u64| match next() % 40 {
            0 => -0.0,
            1 => f32::NAN,
            v => v as f32 / 39.0 - 0.5,
        };
        let rows = g * s;
        let sparse = |next: &mut dyn FnMut() -> u64,
                      w: &mut dyn FnMut(&mut dyn FnMut() -> u64) -> f32| {
            let mut x = vec![0.0f32; rows * e * c];
            for row in 0..rows {
                for _ in 0..2 {
                    let at = row * e * c + (next() % (e * c) as u64) as usize;
                    x[at] = w(next);
                }
            }
            x
        };
        let comb = sparse(&mut next, &mut weight);
        let full: Vec<f32> = (0..rows * e * c).map(|_| weight(&mut next)).collect();
        // A dense operand with a few zero rows... and a sparse one (few tokens in the
        // expert buffer: the walk over it is the cheaper one).
        let dense: Vec<f32> = (0..g * e * c * m)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let mut few = vec![0.0f32; g * e * c * m];
        for v in few.iter_mut().step_by(97) {
            *v = 0.5;
        }
        let dims = DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3]);
        // The dispatch gradient GECM,GSEC->GMS: the indicator on the rhs.
        let (ls, rs) = (vec![g, e, c, m], vec![g, s, e, c]);
        let mut plan = DotPlan::new(&ls, &rs, &dims);
        let given = plan.clone();
        plan.read_indicator(1);
        assert_eq!(plan.indicators(), [false, true]);
        let n = plan.b * plan.m * plan.n;
        let run = |plan: &DotPlan, l: &[f32], r: &[f32], known: [Known; 2]| {
            let mut out = Data::F32(vec![f32::NAN; n]);
            let (ld, rd) = (Data::F32(l.to_vec()), Data::F32(r.to_vec()));
            let path = dot_known(plan, &ls, &ld, &rs, &rd, &mut out, &NO_TAIL, known);
            let Data::F32(o) = out else { unreachable!() };
            (path, o.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
        };
        let indicator = |x: &[f32]| -> Vec<f32> {
            x.iter()
                .map(|&v| if v != 0.0 { 1.0 } else { 0.0 })
                .collect()
        };
        let sup = Support::of(&comb).expect("sparse");
        // (The support known to the indicator read, and to the read of the mask itself.)
        let (scanned, ones) = (
            Known::Sparse(&sup, Values::Scanned),
            Known::Sparse(&sup, Values::Ones),
        );
        // (lhs, the indicator's `x`, what is known of the rhs, the path.)
        type Case<'a> = (&'a [f32], &'a [f32], [Known<'a>; 2], DotPath);
        let cases: [Case; 5] = [
            (&dense, &comb, [UNKNOWN[1]; 2], DotPath::SparseRhs),
            (&dense, &comb, [scanned, ones], DotPath::SparseRhs),
            (&few, &comb, [Known::Dense; 2], DotPath::SparseLhs),
            (&dense, &comb, [Known::Dense; 2], DotPath::Dense),
            (&dense, &full, [UNKNOWN[1]; 2], DotPath::Dense),
        ];
        for (i, (l, x, [known, mask_known], path)) in cases.into_iter().enumerate() {
            let (want_path, want) = run(&given, l, &indicator(x), [UNKNOWN[0], mask_known]);
            let (got_path, got) = run(&plan, l, x, [UNKNOWN[0], known]);
            assert_eq!(got_path, path, "case {i}");
            assert_eq!(want_path, path, "case {i}");
            assert!(got == want, "case {i}: other bits than the mask's");
        }
    }

    /// Masked dot sums that walk the masks' supports give the bits of the walk over the
    /// masks (one support known, the other scanned; NaN and `-0` in a mask; rows without
    /// non-zeros), and a support of the wrong length is not trusted.
    #[test]
    fn masked_sums_from_supports_give_the_scans_bits() {
        let (b, m, n, k) = (4usize, 64, 32, 48);
        let mut next = xorshift(3u64);
        let mut unit = move || (next() % 2_000_001) as f32 / 1_000_000.0 - 1.0;
        let l: Vec<f32> = (0..b * m * k).map(|_| unit()).collect();
        let r: Vec<f32> = (0..b * k * n).map(|_| unit()).collect();
        let mut masks = vec![vec![0.0f32; b * m * n]; 2];
        for (t, mask) in masks.iter_mut().enumerate() {
            for row in (0..b * m).filter(|row| row % 7 != t) {
                let at = row * n + ((unit() + 1.0) * 15.9) as usize;
                mask[at] = unit();
            }
        }
        masks[0][5 * n + 3] = f32::NAN;
        masks[1][9 * n + 1] = -0.0;
        let plan = DotPlan::new(
            &[b, m, k],
            &[b, k, n],
            &DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
        );
        let views: Vec<&[f32]> = masks.iter().map(Vec::as_slice).collect();
        let run = |sups: &[Option<&Support>]| {
            let mut outs = vec![vec![0.0f32; b * m]; 2];
            let mut sums: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            let c = dot_masked_sums(&plan, &l, &r, &views, sups, &mut sums).expect("applies");
            let bits: Vec<Vec<u32>> = outs
                .iter()
                .map(|o| o.iter().map(|v| v.to_bits()).collect())
                .collect();
            (c, bits)
        };
        let want = run(&[None, None]);
        let sup0 = Support::of(&masks[0]).expect("sparse");
        let sup1 = Support::of(&masks[1]).expect("sparse");
        assert_eq!(run(&[Some(&sup0), None]), want);
        assert_eq!(run(&[Some(&sup0), Some(&sup1)]), want);
        assert_ne!(
            want.1[0],
            run(&[Some(&sup1), None]).1[0],
            "the support is walked"
        );
        let short = Support::of(&masks[0][..b * m * n / 2]).expect("sparse");
        assert_eq!(run(&[Some(&short), None]), want);
    }
}
