//! The normalisation of a dot-general ([`DotPlan::new`], once per program): batched
//! `[B, M, K] x [B, K, N]` matrices, each operand read in place through merged strides or
//! copied to a merging order first ([`Side`]), read through per-row and per-column offset
//! tables by the sparse paths ([`View`]), and the result written through strides or
//! offset tables ([`OutLayout`]: a fused output transpose).

use super::path::indicator_copies;
use crate::kernels::layout::gather_copy;
use crate::kernels::sgemm::Span;

use ir::DotDims;

/// How one operand is read as a batch of matrices.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Side {
    /// `Some(perm)`: copy the operand to this dim order (contiguous) first.
    pub(super) perm: Option<Vec<usize>>,
    /// Shape of the operand as read (after the copy, if any).
    pub(super) shape: Vec<usize>,
    pub(super) batch_off: Vec<usize>,
    /// Row and column strides of each batch matrix.
    pub(super) rs: usize,
    pub(super) cs: usize,
    /// The operand read in place, every row and column at its own offset: the sparse
    /// paths read it so, without the copy the GEMM needs.
    pub(super) view: View,
}

/// Element `(b, i, j)` of a batch of matrices at `batch_off[b] + rows[i] + cols[j]`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct View {
    pub(super) batch_off: Vec<usize>,
    pub(super) rows: Vec<usize>,
    pub(super) cols: Vec<usize>,
    /// Rows (columns) one element apart: `rows[i] = rows[0] + i`.
    pub(super) rows_unit: bool,
    pub(super) cols_unit: bool,
    /// Per dim of the operand of size above one, outermost first: its stride, the stride's
    /// 64-bit reciprocal, its group (0 batch, 1 rows, 2 columns) and its weight in that
    /// group's index ([`View::locate`]).
    pub(super) inverse: Vec<(u64, u64, u8, usize)>,
}

impl View {
    #[cfg(test)]
    pub(super) fn new(shape: &[usize], batch: &[usize], rows: &[usize], cols: &[usize]) -> View {
        View::with(shape, [batch, rows, cols], Tables::Built)
    }

    /// [`View::new`] of `[batch, rows, cols]`, its tables as `tables` says.
    fn with(shape: &[usize], [batch, rows, cols]: [&[usize]; 3], tables: Tables) -> View {
        let st = crate::kernels::strides(shape);
        let unit = |t: &[usize]| t.iter().enumerate().all(|(i, &o)| o == t[0] + i);
        let (r, c) = (
            table(tables, shape, &st, rows),
            table(tables, shape, &st, cols),
        );
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
            batch_off: table(tables, shape, &st, batch),
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
    pub(super) fn locate(&self, at: usize) -> [usize; 3] {
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

/// Where each batch matrix of the result is written: `out[batch_off[b] + row(i) + col(j)]`,
/// `row(i) = i*rs` or `row_off[i]`, `col(j) = j*cs` or `col_off[j]`: a table when the row
/// (column) dims of a fused transpose do not merge into one stride.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct OutLayout {
    pub(super) batch_off: Vec<usize>,
    pub(super) rs: usize,
    pub(super) cs: usize,
    pub(super) row_off: Option<Vec<usize>>,
    pub(super) col_off: Option<Vec<usize>>,
}

impl OutLayout {
    /// Offset of row `i` inside a batch matrix.
    #[inline]
    pub(super) fn row(&self, i: usize) -> usize {
        match &self.row_off {
            Some(t) => t[i],
            None => i * self.rs,
        }
    }

    /// Offset of column `j` inside a batch matrix.
    #[inline]
    pub(super) fn col(&self, j: usize) -> usize {
        match &self.col_off {
            Some(t) => t[j],
            None => j * self.cs,
        }
    }

    /// The largest offset of a `m x n` batch matrix's element (`m, n >= 1`).
    pub(super) fn last(&self, m: usize, n: usize) -> usize {
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
    pub(super) lhs: Side,
    pub(super) rhs: Side,
    /// The result dims (batch, lhs free, rhs free) and how they are written.
    pub(super) out_shape: Vec<usize>,
    pub(super) groups: [usize; 3],
    pub(super) out: OutLayout,
    pub(super) transposed: bool,
    /// The result is written with non-temporal stores where the kernel can
    /// ([`DotPlan::stream_output`]).
    pub(super) stream_out: bool,
    /// `indicator[0]` (`[1]`): the lhs (rhs) operand given is `x`, and the product reads
    /// `convert(x != 0)` in its place ([`DotPlan::read_indicator`]).
    pub(super) indicator: [bool; 2],
    /// Whether the offset tables are built ([`Tables`]).
    pub(super) tables: Tables,
}

/// The single stride of `dims` read row-major, if they merge (size-1 dims ignored).
pub(super) fn merged_stride(shape: &[usize], st: &[usize], dims: &[usize]) -> Option<usize> {
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

/// Whether a [`DotPlan`] builds the offset tables its kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tables {
    /// Every table: a plan the kernels run.
    Built,
    /// None (their size follows the operands' dims): a plan whose shapes, paths and
    /// layout decisions are those of [`Tables::Built`], for planning a run without running
    /// it; the kernels cannot run it.
    ShapesOnly,
}

/// [`offsets`] where `tables` builds them, else empty.
fn table(tables: Tables, shape: &[usize], st: &[usize], dims: &[usize]) -> Vec<usize> {
    match tables {
        Tables::Built => offsets(shape, st, dims),
        Tables::ShapesOnly => Vec::new(),
    }
}

pub(super) fn offsets(shape: &[usize], st: &[usize], dims: &[usize]) -> Vec<usize> {
    let sizes: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let mut out = Vec::new();
    crate::kernels::odometer(&sizes, |i| {
        out.push(i.iter().zip(dims).map(|(a, &d)| a * st[d]).sum())
    });
    out
}

impl Side {
    /// `rows` and `cols` are the dims forming matrix rows and columns, in order.
    fn new(shape: &[usize], [batch, rows, cols]: [&[usize]; 3], tables: Tables) -> Side {
        let st = crate::kernels::strides(shape);
        let view = View::with(shape, [batch, rows, cols], tables);
        if let (Some(rs), Some(cs)) = (
            merged_stride(shape, &st, rows),
            merged_stride(shape, &st, cols),
        ) {
            return Side {
                perm: None,
                shape: shape.to_vec(),
                batch_off: table(tables, shape, &st, batch),
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
        let pst = crate::kernels::strides(&pshape);
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
            batch_off: table(tables, &pshape, &pst, &(0..nb).collect::<Vec<_>>()),
            perm: Some(perm),
            shape: pshape,
            rs,
            cs,
            view,
        }
    }

    /// The operand as read: itself, or its permuted copy.
    pub(super) fn prepare<'a, T: Copy + Send + Sync + Default>(
        &self,
        orig_shape: &[usize],
        x: &'a [T],
        buf: &'a mut Vec<T>,
    ) -> &'a [T] {
        match &self.perm {
            None => x,
            Some(perm) => {
                let st = crate::kernels::strides(orig_shape);
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
        DotPlan::with_tables(lhs, rhs, dd, Tables::Built)
    }

    /// [`DotPlan::new`], building its offset tables only where `tables` says (a plan
    /// without them has the same shapes and decisions, and cannot run).
    pub fn with_tables(lhs: &[usize], rhs: &[usize], dd: &DotDims, tables: Tables) -> DotPlan {
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
            lhs: Side::new(lhs, [&dd.lhs_batch, &lf, &dd.lhs_contract], tables),
            rhs: Side::new(rhs, [&dd.rhs_batch, &dd.rhs_contract, &rf], tables),
            out_shape,
            groups: [dd.lhs_batch.len(), lf.len(), rf.len()],
            out: OutLayout {
                batch_off: match tables {
                    Tables::Built => (0..b).map(|i| i * m * n).collect(),
                    Tables::ShapesOnly => Vec::new(),
                },
                rs: n,
                cs: 1,
                row_off: None,
                col_off: None,
            },
            transposed: false,
            stream_out: false,
            indicator: [false; 2],
            tables,
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
        let tst = crate::kernels::strides(&tshape);
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
            None => (0, Some(table(self.tables, &self.out_shape, &st, ld))),
        };
        let (cs, col_off) = match merged_stride(&self.out_shape, &st, rd) {
            Some(cs) => (cs, None),
            None => (0, Some(table(self.tables, &self.out_shape, &st, rd))),
        };
        self.out = OutLayout {
            batch_off: table(self.tables, &self.out_shape, &st, bd),
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
        let [l, r] = indicator_copies(self.indicator, path);
        (l, r)
    }

    /// The `(address, floats)` spans of batch entry 0 of the operands `l` and `r` as this
    /// plan's GEMM reads them in place (`(0, 0)` for a side that is copied first, is not one
    /// compact block, or is not inside its slice, e.g. empty): what a GEMM running just
    /// before this one can fetch for it.
    pub fn first_entry_spans(&self, l: &[f32], r: &[f32]) -> [Span; 2] {
        let (m, n, k) = (self.m, self.n, self.k);
        let span = |side: &Side, x: &[f32], rows: usize, cols: usize| match side.batch_off.first() {
            Some(&base) if side.perm.is_none() => {
                compact_span(x, base, side.rs, side.cs, rows, cols).unwrap_or_default()
            }
            _ => (0, 0),
        };
        [span(&self.lhs, l, m, k), span(&self.rhs, r, k, n)]
    }
}

/// The span (start address, element count) of the `rows x cols` block at `base` of `x`
/// with strides `rs`/`cs`, when the block is compact (its span at most twice its elements:
/// worth fetching whole) and inside `x`.
pub(super) fn compact_span<T>(
    x: &[T],
    base: usize,
    rs: usize,
    cs: usize,
    rows: usize,
    cols: usize,
) -> Option<Span> {
    if rows * cols == 0 {
        return None;
    }
    let len = (rows - 1) * rs + (cols - 1) * cs + 1;
    (len <= 2 * rows * cols && base + len <= x.len()).then(|| (x[base..].as_ptr() as usize, len))
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
