//! One product, end to end: the result's layout (a transposed result computed as
//! `B^T A^T`, or row-major first and then transposed), the rows of `A` and the steps that
//! take part (all-zero ones left out exactly), the path (dense, row-sparse, row-sparse on
//! a row-major copy of `A`), then the blocked loop nest over per-thread scratch.

use super::blocked::{blocked, Bufs, Job, Steps};
use super::fetch::Fetch;
use super::pack::{all_zero, sample_steps, transpose_lines};
use super::route::{self, APath, Facts, Layout, TableOf, Taking};
use super::*;
use std::cell::RefCell;

/// A 64-byte aligned scratch buffer of f32, grown on demand and reused per thread.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) buf: Vec<f32>,
}

impl Scratch {
    /// An aligned slice of at least `n` elements.
    pub(super) fn get(&mut self, n: usize) -> &mut [f32] {
        if self.buf.len() < n + 16 {
            self.buf = vec![0.0; n + 16];
        }
        let off = self.buf.as_ptr().align_offset(64).min(15);
        &mut self.buf[off..off + n]
    }
}

thread_local! {
    /// Packed `A`, packed `B`, and the row-sparse path's partial sums.
    static PACK: RefCell<(Scratch, Scratch, Scratch)> = RefCell::new(Default::default());
    /// A column-major `A` copied row-major for the row-sparse path ([`transpose_lines`]).
    static ROWS: RefCell<Scratch> = RefCell::new(Default::default());
    /// The row-major result of a row-sparse product that is stored transposed.
    static RESULT: RefCell<Scratch> = RefCell::new(Default::default());
}

/// The facts [`route`] decides a product's path on (see [`route::Facts`]).
fn facts(g: &Sgemm) -> Facts {
    Facts {
        m: g.m,
        n: g.n,
        k: g.k,
        a: (g.a.rs, g.a.cs),
        c: (g.c.rs, g.c.cs),
        c_table: g.c.table.map(|t| match t {
            Table::Rows(_) => TableOf::Rows,
            Table::Cols(_) => TableOf::Cols,
        }),
        opts: g.opts,
        sparse_hw: sparse::available(),
        wide_hw: wide::available(),
    }
}

/// Compute the product `g` (see [`Sgemm`]).
///
/// # Safety
/// As [`Sgemm::run`].
pub(super) unsafe fn product(g: &Sgemm) {
    let Sgemm {
        m,
        n,
        k,
        a,
        b,
        c,
        ahead,
        opts,
    } = *g;
    if m == 0 || n == 0 {
        return;
    }
    let f = facts(g);
    let sparse_cols = || {
        // SAFETY: the caller's contract (`worth` reads `m` floats of sampled columns of A).
        unsafe { sparse::worth(sample_steps(k, &mut [0; 8]), m, |p| a.ptr.add(p * a.cs)) }
    };
    match route::layout(&f, sparse_cols) {
        Layout::ThroughRowMajor => {
            // Computed row-major on the row-sparse path, then stored transposed by 8x8
            // register transposes.
            return RESULT.with(|cell| {
                let mut buf = cell.borrow_mut();
                let tmp = buf.get(m * n);
                let rows = Sgemm {
                    c: MatMut::strided(tmp.as_mut_ptr(), n, 1),
                    ..*g
                };
                // SAFETY: the caller's contract for `a` and `b`; `tmp` holds the `m x n`
                // result.
                unsafe {
                    product(&rows);
                    let s = tmp.as_ptr();
                    transpose_lines(m, n, |i| s.add(i * n), |j| c.ptr.add(j * c.cs));
                }
            });
        }
        Layout::Swapped => {
            // `C^T = B^T A^T`: its rows are contiguous (or at their own offsets), so the
            // micro-kernel stores whole vectors (the same products, in the same order).
            let t = |x: MatRef| MatRef {
                ptr: x.ptr,
                rs: x.cs,
                cs: x.rs,
            };
            let swapped = Sgemm {
                m: n,
                n: m,
                a: t(b),
                b: t(a),
                c: MatMut {
                    ptr: c.ptr,
                    rs: c.cs,
                    cs: c.rs,
                    table: c.cols().map(Table::Rows),
                    stream: c.stream,
                },
                ..*g
            };
            // SAFETY: the same elements, addressed with swapped strides.
            return unsafe { product(&swapped) };
        }
        Layout::Direct => {}
    }
    // SAFETY: for the whole body, every offset below is `i*rs + j*cs` with `i`, `j` inside the
    // operand's shape, which the caller's contract makes addressable.
    unsafe {
        // Rows of A that take part, and those that are all zeros. Zeros are only looked for
        // along contiguous runs (rows of a row-major A, rows of a row-major B, columns of a
        // column-major A), where a scan that stops at the first non-zero costs a few loads;
        // a strided scan would miss the cache once per element.
        // A tiny GEMM (an attention head's scores, say) skips nothing and fetches nothing
        // ahead: its operands are in cache, and the scans cost as much as the products.
        let tiny = m * n * k < TINY;
        let (mut live, mut dead) = (Vec::with_capacity(m), Vec::new());
        for i in 0..m {
            let row = a.ptr.add(i * a.rs);
            if !tiny && a.cs == 1 && all_zero(row, k) {
                dead.push(i);
            } else {
                live.push(i);
            }
        }
        // Steps `k` that take part: a zero row of B is left out when the column of A it
        // meets is finite (over the live rows; dead rows are zeros), and a column of A that
        // is zero over the live rows when the row of B it meets is finite. Both tests are
        // exact per step, so the rule is the same for `A B` and for `B^T A^T`: the steps,
        // and with them the `KC` blocks whose sums are added, are the same whichever way a
        // product is computed (the row-sparse path computes a transposed result as `A B`,
        // the dense one as `B^T A^T`; a coarser "all of A finite" test for a row-major A
        // once kept a step on one side that the other left out, moving the block
        // boundaries and the rounding).
        let mut ks = Vec::with_capacity(k);
        for p in 0..k {
            let brow = b.ptr.add(p * b.rs);
            let acol = a.ptr.add(p * a.cs);
            let b_zero = || b.cs == 1 && all_zero(brow, n);
            let b_finite = || (0..n).all(|j| (*brow.add(j * b.cs)).is_finite());
            let a_zero = || a.rs == 1 && live.iter().all(|&i| *acol.add(i) == 0.0);
            let a_finite = || live.iter().all(|&i| (*acol.add(i * a.rs)).is_finite());
            let skip = !tiny && ((b_zero() && a_finite()) || (a_zero() && b_finite()));
            if !skip {
                ks.push(p);
            }
        }
        for &i in &dead {
            for j in 0..n {
                *c.row(i).add(j * c.cs) = 0.0;
            }
        }
        if ks.is_empty() {
            for &i in &live {
                for j in 0..n {
                    *c.row(i).add(j * c.cs) = 0.0;
                }
            }
            return;
        }
        // A row-major A whose rows are mostly zeros (a ReLU output, its masked gradient)
        // is multiplied by its non-zeros only, where the GEMM is large enough to pay for
        // finding the non-zeros (see `sparse`). A column-major A that is mostly zeros (a
        // ReLU output read transposed: the gradient of an expert's down-projection weights,
        // `h^T dy`) is copied row-major, its steps `ks` side by side, and takes the same
        // path; its density is sampled down its columns.
        let taking = Taking {
            live: live.len(),
            steps: ks.len(),
            steps_run: ks[ks.len() - 1] - ks[0] == ks.len() - 1,
        };
        let path = route::a_path(
            &f,
            &taking,
            || sparse::worth(&live, ks.len(), |i| a.ptr.add(i * a.rs + ks[0])),
            || sparse::worth(&ks, m, |p| a.ptr.add(p * a.cs)),
        );
        let wide = opts.wide_tiles();
        // The blocked loop on `a` (a row-major copy of it with `compact_a`), the row-sparse
        // path taken or not.
        let run = |a: MatRef, sparse_a: bool, compact_a: bool| {
            PACK.with(|cell| {
                let mut bufs = cell.borrow_mut();
                let (sa, sb, st) = &mut *bufs;
                let pa = sa.get(MC.div_ceil(MR) * MR * KC);
                let pb = sb.get(NC.div_ceil(NR) * panel_stride(NR, KC));
                let tmp = if sparse_a && ks.len() > KC {
                    st.get(live.len() * n.min(NC))
                } else {
                    st.get(0)
                };
                // A few lines of the spans ahead per micro-tile (or sparse row and slice),
                // spread over the whole call.
                let tiles = if sparse_a {
                    n.div_ceil(sparse::GROUP) * live.len() * ks.len().div_ceil(sparse::SLICE)
                } else {
                    n.div_ceil(opts.tile_width()) * live.len().div_ceil(MR) * ks.len().div_ceil(KC)
                };
                let mut fetch = Fetch::new(if tiny { &[] } else { ahead }, tiles);
                let job = Job {
                    n,
                    steps: Steps { ks: &ks, compact_a },
                    live: &live,
                    dead: &dead,
                    a,
                    b,
                    c,
                    sparse_a,
                    wide,
                };
                blocked(&job, Bufs { pa, pb, tmp }, &mut fetch);
            })
        };
        if path == APath::RowSparseCopied {
            ROWS.with(|cell| {
                let mut rows = cell.borrow_mut();
                let kk = ks.len();
                let at = rows.get(m * kk).as_mut_ptr();
                transpose_lines(kk, m, |t| a.ptr.add(ks[t] * a.cs), |i| at.add(i * kk));
                let copy = MatRef {
                    ptr: at,
                    rs: kk,
                    cs: 1,
                };
                run(copy, true, true);
            });
        } else {
            run(a, path == APath::RowSparse, false);
        }
        // Non-temporal stores are weakly ordered: fenced before anything else (another
        // thread, after the batch's join) reads the result.
        #[cfg(target_arch = "x86_64")]
        if c.stream {
            std::arch::x86_64::_mm_sfence();
        }
    }
}
