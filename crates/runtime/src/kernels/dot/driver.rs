//! A float dot end to end: the path (a sparse walk of either side, or the dense GEMMs:
//! [`super::path::choose_path`]), the operands as that path reads them (permuted copies,
//! indicator copies, operands rebuilt from their supports), then the batch over the pool
//! with its epilogue.

use super::dense::{gemm_one, Ahead, Entry, Gemm, OutPtr};
use super::float::GemmFloat;
use super::path::{choose_path, PathFacts};
use super::plan::{DotPath, View};
use super::scan::{all_finite, sparse_terms, Term};
use super::sparse::sparse_entry;
use super::support::{terms_from_support, Known, Values};
use super::DotCall;
use crate::kernels::with_avx2_fma;
use rayon::prelude::*;

/// A per-batch-entry epilogue as the batch runs it: `f(bb, entry)` with entry `bb`'s
/// finished `m x n` result, and the addresses of the buffers `f` reads elementwise (each
/// entry's part is fetched into cache while the entry's GEMM computes).
#[derive(Clone, Copy)]
pub(super) struct EpiRun<'a, T> {
    pub(super) f: &'a (dyn Fn(usize, &mut [T]) + Sync),
    pub(super) reads: &'a [usize],
}

/// Run a float dot into `out`, with `epi` on every batch entry of the result; returns the
/// path taken.
pub(super) fn dot_float<T: GemmFloat>(
    call: &DotCall<[T]>,
    out: &mut [T],
    epi: Option<EpiRun<T>>,
) -> DotPath {
    let DotCall {
        plan: p,
        lhs,
        rhs,
        known,
        ..
    } = *call;
    let (l, r) = (lhs.data, rhs.data);
    let (b, m, n, k) = (p.b, p.m, p.n, p.k);
    // Entries the GEMM loop did not hand to the epilogue get it afterwards, in parallel.
    let after = |out: &mut [T]| {
        if let Some(epi) = epi {
            out.par_chunks_mut((m * n).max(1))
                .enumerate()
                .for_each(|(bb, x)| (epi.f)(bb, x));
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
    let (llen, rlen): (usize, usize) = (lhs.shape.iter().product(), rhs.shape.iter().product());
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
    // both sides are mostly zeros, the path walks the one with fewer terms in all.
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
    let facts = PathFacts {
        m,
        n,
        terms: [lt.as_ref().map(count), rt.as_ref().map(count)],
        indicator: ind,
        absent,
    };
    let choice = choose_path(&facts, |side| match side {
        0 => finite(0, l),
        _ => finite(1, r),
    });
    let path = choice.path;
    // An indicator side that the path reads densely: its 0/1 copy.
    let copy = |x: &[T]| -> Vec<T> {
        x.par_iter()
            .with_min_len(1 << 14)
            .map(|&v| if v != T::ZERO { T::ONE } else { T::ZERO })
            .collect()
    };
    // A side given by its support and read densely by this path (the other side walked,
    // or the dense GEMM): rebuilt.
    let lrebuilt = choice.rebuild[0].then(|| support_of(0).dense_as());
    let rrebuilt = choice.rebuild[1].then(|| support_of(1).dense_as());
    let (l, r) = (
        lrebuilt.as_deref().unwrap_or(l),
        rrebuilt.as_deref().unwrap_or(r),
    );
    let [lcopy, rcopy] = choice.indicator_copy;
    let lc = lcopy.then(|| copy(l));
    let rc = rcopy.then(|| copy(r));
    let (l, r) = (lc.as_deref().unwrap_or(l), rc.as_deref().unwrap_or(r));
    // The GEMM reads permuted copies where strides do not merge; the sparse paths read the
    // operands in place.
    let done = match path {
        DotPath::SparseLhs | DotPath::SparseRhs => {
            let terms = if path == DotPath::SparseLhs {
                lt.as_deref()
            } else {
                rt.as_deref()
            };
            let batch = Batch {
                call,
                path,
                l,
                r,
                epi,
                terms,
            };
            run_batch(&batch, out)
        }
        _ => T::with_scratch(|lbuf, rbuf| {
            let batch = Batch {
                call,
                path,
                l: p.lhs.prepare(lhs.shape, l, lbuf),
                r: p.rhs.prepare(rhs.shape, r, rbuf),
                epi,
                terms: None,
            };
            run_batch(&batch, out)
        }),
    };
    if !done {
        after(out);
    }
    path
}

/// A batch of GEMMs (or sparse products) on prepared operands, as [`run_batch`] runs it.
struct Batch<'a, T> {
    call: &'a DotCall<'a, [T]>,
    path: DotPath,
    /// The operands as the path reads them (permuted, rebuilt, 0/1 copies).
    l: &'a [T],
    r: &'a [T],
    epi: Option<EpiRun<'a, T>>,
    /// The sparse side's terms per batch entry, on a sparse path.
    terms: Option<&'a [Vec<Term<T>>]>,
}

/// Run the batch into `out`. Returns whether the epilogue ran (each entry's right after
/// its GEMM: a dense batch split over the pool).
fn run_batch<T: GemmFloat>(batch: &Batch<T>, out: &mut [T]) -> bool {
    let Batch {
        call,
        path,
        l,
        r,
        epi,
        terms,
    } = *batch;
    let (p, tail, opts) = (call.plan, &call.tail, call.opts);
    let b = p.b;
    let threads = rayon::current_num_threads().max(1);
    let optr = OutPtr {
        ptr: out.as_mut_ptr(),
        len: out.len(),
    };
    let gemm_with = |par: gemm::Parallelism| Gemm {
        plan: p,
        l,
        r,
        par,
        opts,
    };
    let one = |bb: usize, par: gemm::Parallelism, next: Option<usize>| match path {
        DotPath::SparseLhs => with_avx2_fma(
            #[inline(always)]
            || sparse_entry(p, true, &terms.expect("the lhs's terms")[bb], r, optr, bb),
        ),
        DotPath::SparseRhs => with_avx2_fma(
            #[inline(always)]
            || sparse_entry(p, false, &terms.expect("the rhs's terms")[bb], l, optr, bb),
        ),
        DotPath::Dense | DotPath::Int | DotPath::Empty => {
            let at = Entry {
                l: p.lhs.batch_off[bb],
                r: p.rhs.batch_off[bb],
                out: p.out.batch_off[bb],
            };
            // The next entry's result when it is one compact block.
            let out = next
                .filter(|_| !p.transposed && p.out.row_off.is_none() && p.out.col_off.is_none())
                .map_or((0, 0), |nb| {
                    let at = optr.ptr as usize + size_of::<T>() * p.out.batch_off[nb];
                    (at, p.m * p.n)
                });
            let ahead = Ahead {
                next,
                epi: &[],
                out,
                tail,
            };
            gemm_one(&gemm_with(par), at, optr, ahead)
        }
    };
    let sparse = path != DotPath::Dense;
    if let (Some(epi), false) = (epi, sparse || b < 2 * threads || p.transposed) {
        let mn = p.m * p.n;
        let base = out.as_ptr() as usize;
        out.par_chunks_mut(mn).enumerate().for_each(|(bb, x)| {
            // The untransposed result: entry `bb` is exactly this chunk.
            debug_assert_eq!(p.out.batch_off[bb], bb * mn);
            let at = Entry {
                l: p.lhs.batch_off[bb],
                r: p.rhs.batch_off[bb],
                out: 0,
            };
            let o = OutPtr {
                ptr: x.as_mut_ptr(),
                len: x.len(),
            };
            let next = (bb + 1 < b).then_some(bb + 1);
            let spans: Vec<(usize, usize)> =
                epi.reads.iter().map(|&a| (a + 4 * bb * mn, mn)).collect();
            let out = next.map_or((0, 0), |nb| (base + size_of::<T>() * nb * mn, mn));
            let ahead = Ahead {
                next,
                epi: &spans,
                out,
                tail,
            };
            gemm_one(&gemm_with(gemm::Parallelism::None), at, o, ahead);
            (epi.f)(bb, x);
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
