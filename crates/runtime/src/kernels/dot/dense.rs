//! The dense GEMMs of a batch entry: on the f32 micro-kernel ([`crate::kernels::sgemm`],
//! split over the pool by whole tiles, fetching what runs next), or on the `gemm` crate;
//! a result with both row and column offset tables goes through a scratch tile.

use super::float::GemmFloat;
use super::path::gemm_route;
use super::plan::{compact_span, DotPlan};
use crate::kernels::sgemm::{self, GemmOptions, MatMut, MatRef, Sgemm, Span, Table};
use rayon::prelude::*;

/// The result buffer shared by batch tasks; each batch entry writes a disjoint set of
/// elements (the output layout is a bijection of `(b, i, j)`).
#[derive(Clone, Copy)]
pub(super) struct OutPtr<T> {
    pub(super) ptr: *mut T,
    pub(super) len: usize,
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
pub(super) struct Ahead<'a> {
    pub(super) next: Option<usize>,
    pub(super) epi: &'a [Span],
    pub(super) out: Span,
    /// Without a `next` entry: the spans of the GEMM that runs after this batch (the next
    /// dot's first entry), fetched instead.
    pub(super) tail: &'a [Span; 2],
}

/// The dense GEMMs of one batch, as [`gemm_one`] runs each entry's: the plan, the operands
/// as the GEMM reads them, the pool split, and the kernels allowed.
#[derive(Clone, Copy)]
pub(super) struct Gemm<'a, T> {
    pub(super) plan: &'a DotPlan,
    pub(super) l: &'a [T],
    pub(super) r: &'a [T],
    pub(super) par: gemm::Parallelism,
    pub(super) opts: GemmOptions,
}

/// Where one batch entry's matrices start: in the lhs, the rhs and the result.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) l: usize,
    pub(super) r: usize,
    pub(super) out: usize,
}

/// Where a GEMM writes its `m x n` result: element `(i, j)` at `ptr + row(i) + col(j)`,
/// `row(i)` = `i * rs` or `rows[i]`, `col(j)` = `j * cs` or `cols[j]` (tables only on the
/// f32 micro-kernel, one at most, bounded inside the buffer by the caller); `stream`:
/// with non-temporal stores where the kernel can (`sgemm::MatMut::stream`).
#[derive(Clone, Copy)]
struct OutMat<'a, T> {
    ptr: OutPtr<T>,
    /// Offset of the entry's element `(0, 0)`.
    at: usize,
    rs: usize,
    cs: usize,
    rows: Option<&'a [usize]>,
    cols: Option<&'a [usize]>,
    stream: bool,
}

/// One dense GEMM into batch entry `at` of the result, on the kernel [`gemm_route`] picks:
/// through the result's strides and at most one offset table, or into a scratch tile placed
/// through the tables afterwards.
pub(super) fn gemm_one<T: GemmFloat>(g: &Gemm<T>, at: Entry, out: OutPtr<T>, ahead: Ahead) {
    let p = g.plan;
    let (rows, cols) = (p.out.row_off.as_deref(), p.out.col_off.as_deref());
    let is_f32 = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let tables = [rows.is_some(), cols.is_some()];
    let route = gemm_route(is_f32, sgemm::available(), g.opts.wide_tiles(), tables);
    if !route.via_tile {
        // Plain strides, or rows (columns) at their own offsets and the other at one stride
        // (a fused output transpose whose row dims do not merge: an expert's input gradient
        // written as [G, E, C, M]): the micro-kernel stores each tile row at its offset.
        if rows.is_some() || cols.is_some() {
            assert!(at.out + p.out.last(p.m, p.n) < out.len);
        }
        let o = OutMat {
            ptr: out,
            at: at.out,
            rs: p.out.rs,
            cs: p.out.cs,
            rows,
            cols,
            stream: p.stream_out,
        };
        return gemm_strided(g, at, &o, ahead, route.micro);
    }
    // Rows and columns both at their own offsets (or no micro-kernel): multiply into a
    // row-major scratch, then place it.
    // The tile is reused per thread (every element is written by the GEMM: `k > 0` here).
    let (m, n) = (p.m, p.n);
    T::with_tile(m * n, |tmp| {
        // (Into the scratch tile, read back at once: never streamed.)
        let o = OutMat {
            ptr: OutPtr {
                ptr: tmp.as_mut_ptr(),
                len: tmp.len(),
            },
            at: 0,
            rs: n,
            cs: 1,
            rows: None,
            cols: None,
            stream: false,
        };
        gemm_strided(g, at, &o, ahead, route.micro);
        let ob = at.out;
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

/// One dense GEMM `out[row(i) + col(j)] = (l · r)[i, j]` of the operands' batch entry at
/// `at` (see [`OutMat`]), on the f32 micro-kernel (`micro`: `T` is f32 and the CPU runs
/// it), else on the `gemm` crate.
/// `ahead.next`: the batch entry this thread multiplies next, whose operands the
/// micro-kernel fetches while it computes this one.
fn gemm_strided<T: GemmFloat>(g: &Gemm<T>, at: Entry, o: &OutMat<T>, ahead: Ahead, micro: bool) {
    let Gemm {
        plan: p,
        l,
        r,
        par,
        opts,
    } = *g;
    let OutMat {
        ptr: out,
        at: ob,
        rs: ors,
        cs: ocs,
        rows,
        cols,
        stream,
    } = *o;
    let (lb, rb) = (at.l, at.r);
    let (m, n, k) = (p.m, p.n, p.k);
    let (lrs, lcs, rrs, rcs) = (p.lhs.rs, p.lhs.cs, p.rhs.rs, p.rhs.cs);
    if rows.is_none() && cols.is_none() {
        assert!(ob + (m - 1) * ors + (n - 1) * ocs < out.len);
    }
    assert!(rows.is_none_or(|t| t.len() == m) && cols.is_none_or(|t| t.len() == n));
    assert!(lb + (m - 1) * lrs + (k - 1) * lcs < l.len());
    assert!(rb + (k - 1) * rrs + (n - 1) * rcs < r.len());
    if micro {
        let threads = match par {
            gemm::Parallelism::None => 1,
            _ => rayon::current_num_threads().max(1),
        };
        // Split the larger of M and N into one part per pool thread (whole tiles); every
        // element's arithmetic is the same however it is split.
        let (split_m, len, unit) = if m >= n {
            (true, m, sgemm::MR)
        } else {
            (false, n, opts.tile_width())
        };
        let step = len.div_ceil(threads).div_ceil(unit) * unit;
        debug_assert!(rows.is_none() || cols.is_none(), "one table at most");
        let part = |lo: usize, ahead: &[Span]| {
            let o = out; // the whole `OutPtr` (Sync), not its raw field
            let hi = len.min(lo + step);
            let (i0, j0, mm, nn) = if split_m {
                (lo, 0, hi - lo, n)
            } else {
                (0, lo, m, hi - lo)
            };
            // This part's block: a table is taken from its first row/column, the strided
            // dim offsets the base pointer.
            let (base, table) = match (rows, cols) {
                (Some(t), _) => (ob + j0 * ocs, Some(Table::Rows(t[i0..].as_ptr()))),
                (None, Some(t)) => (ob + i0 * ors, Some(Table::Cols(t[j0..].as_ptr()))),
                (None, None) => (ob + i0 * ors + j0 * ocs, None),
            };
            // SAFETY: f32 is `T` (`micro` says so), so the casts only rename the type; the
            // asserts above (and the caller's, for a table) bound the whole `m x k`, `k x n`
            // and `m x n` ranges, of which this part reads rows `i0..i0+mm` of the lhs,
            // columns `j0..j0+nn` of the rhs and writes that block of the output (tables
            // sliced from its first row / column), disjoint from every other part's and
            // batch entry's (the output layout is a bijection); `micro` says that
            // `sgemm::available()` holds.
            unsafe {
                let a = MatRef::strided(l.as_ptr().add(lb + i0 * lrs).cast(), lrs, lcs);
                let b = MatRef::strided(r.as_ptr().add(rb + j0 * rcs).cast(), rrs, rcs);
                let c = MatMut {
                    table,
                    stream,
                    ..MatMut::strided(o.ptr.add(base).cast(), ors, ocs)
                };
                Sgemm {
                    ahead,
                    opts,
                    ..Sgemm::new(mm, nn, k, a, b, c)
                }
                .run()
            }
        };
        if step >= len {
            // One call: it fetches the next entry's operands where each is one compact
            // span (a strided view over a larger buffer would fetch what it never reads);
            // an absent span is empty, which the fetcher skips (no allocation per GEMM).
            let span = |x: &[T], base: usize, rs: usize, cs: usize, rows: usize, cols: usize| {
                compact_span(x, base, rs, cs, rows, cols).unwrap_or_default()
            };
            let next: [Span; 2] = ahead.next.map_or(*ahead.tail, |bb| {
                [
                    span(l, p.lhs.batch_off[bb], lrs, lcs, m, k),
                    span(r, p.rhs.batch_off[bb], rrs, rcs, k, n),
                ]
            });
            if ahead.epi.is_empty() {
                // The next entry's result too when it fits the fetch budget.
                let all = [next[0], next[1], ahead.out];
                part(0, if sgemm::fetch_fits(&all) { &all } else { &next });
            } else {
                // The epilogue's spans too (read right after this GEMM) when everything fits
                // the fetch budget, else only the next entry's operands (over it, nothing is
                // fetched); the next entry's result when that fits as well.
                let mut all: Vec<Span> = ahead.epi.to_vec();
                all.extend_from_slice(&next);
                if !sgemm::fetch_fits(&all) {
                    all = next.to_vec();
                }
                all.push(ahead.out);
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
