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
//! the rhs, at run time, in one pass over each (`scan::sparse_terms`; a dense operand is
//! told apart first, by samples or, when short, by a whole count). An operand that is **at
//! least 90 % zeros** while the other operand is all finite (so skipping `0 * x` cannot hide
//! a NaN) is multiplied sparsely: each non-zero
//! `a[i,k]` adds `a[i,k] * b[k,:]` to `out[i,:]` (for a sparse rhs, `b[k,j]` adds
//! `b[k,j] * a[:,k]` to `out[:,j]`). Every output element still sums its terms in increasing
//! `k`, with the zero terms left out, so the result equals the dense product to rounding.
//! Both operands are read in place through per-row and per-column offset tables (a
//! `View`; no permuted copy), the sparse one along its contiguous direction, each block of
//! 16 values compared with zero into one bit mask whose set bits alone are visited; the
//! path then reads the list. A caller that already knows an operand's non-zeros (a
//! [`Support`]: their flat positions and values, found by one pass over a buffer) passes it
//! ([`DotCall::known`]), and the lists are built from it without reading the operand: each
//! position is split into batch entry, row and column by multiplies with precomputed
//! reciprocals, then grouped by line (a counting sort that keeps memory order). The
//! executor finds each one-hot buffer's support once per run and shares it between the
//! products that read it. A result whose rows
//! (columns) are contiguous is written once: each one's first term onto zero, those
//! without terms zero-filled. A fused output transpose whose row or column dims do not
//! merge is written through the same kind of table.
//!
//! **Masked** ([`DotCall::run_masked`]): a product used only multiplied by mostly-zero masks
//! and summed is computed only where a mask is non-zero (the executor finds such dots; the
//! function checks at run time that skipping is exact).
//!
//! **Epilogues** ([`DotCall::run_then`]): the executor may hand each batch entry of an f32
//! result to an elementwise group right after its GEMM, while the entry is in cache (the
//! ReLU after an expert's up-projection, the ReLU mask on its gradient).
//!
//! Files by concern: [`plan`] (the normalisation: [`DotPlan`], operand views, the output
//! layout), [`support`] (known non-zeros: [`Support`]), `path` (the pure path choice),
//! `scan` (finding non-zeros), `float` (the float element types and their per-thread
//! scratch), `driver` (a float dot: its path, its operands, its batch), `dense` (the
//! GEMMs), `sparse` (the walks of a mostly-zero side), `masked` (products computed where
//! masks are non-zero) and `sums` (row sums of masked products).

mod dense;
mod driver;
mod float;
mod masked;
mod path;
mod plan;
mod scan;
mod sparse;
mod sums;
mod support;
#[cfg(test)]
mod tests;

pub use super::sgemm::{GemmOptions, Span};
pub use float::GemmFloat;
pub use path::{choose_path, gemm_route, indicator_copies, GemmRoute, PathChoice, PathFacts};
pub use plan::{DotPath, DotPlan, Tables};
pub use sums::masked_row_sums;
pub use support::{Known, Support, Values};

use crate::tensor::Data;
use driver::{dot_float, EpiRun};
use half::bf16;
use ir::DType;
use rayon::prelude::*;

/// No spans to fetch after a batch ([`DotCall::tail`]).
pub const NO_TAIL: [Span; 2] = [(0, 0); 2];

/// Nothing known of either operand's non-zeros ([`DotCall::known`]).
pub const UNKNOWN: [Known<'static>; 2] = [Known::Unknown; 2];

/// One operand of a dot: the shape its plan was made for, and its values (a [`Data`], or an
/// f32 slice for the calls that are f32 only).
#[derive(Debug)]
pub struct Operand<'a, T: ?Sized = Data> {
    pub shape: &'a [usize],
    pub data: &'a T,
}

// (Not derived: a derive would ask `T: Copy`, which `[f32]` is not.)
impl<T: ?Sized> Clone for Operand<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for Operand<'_, T> {}

impl<'a, T: ?Sized> Operand<'a, T> {
    pub fn new(shape: &'a [usize], data: &'a T) -> Self {
        Operand { shape, data }
    }
}

/// One dot-general, all but its result: the plan, both operands, and what the caller adds
/// ([`DotCall::new`] adds nothing). The values computed never depend on the added parts;
/// the masked products ([`DotCall::run_masked`]) read only the plan and the operands.
#[derive(Debug)]
pub struct DotCall<'a, T: ?Sized = Data> {
    pub plan: &'a DotPlan,
    pub lhs: Operand<'a, T>,
    pub rhs: Operand<'a, T>,
    /// Spans fetched into cache while the last GEMM of an f32 batch computes: the operands
    /// of the dot that runs next ([`DotPlan::first_entry_spans`]; the first expert of a
    /// batch otherwise finds its operands in memory, each other expert's are fetched by the
    /// one before it). [`NO_TAIL`] for none.
    pub tail: [Span; 2],
    /// What the caller knows of each operand's non-zeros (`[lhs, rhs]`, [`UNKNOWN`] for
    /// nothing; see [`Support`]): a float operand the product would list term by term is
    /// not scanned again when its support is known.
    pub known: [Known<'a>; 2],
    /// Which GEMM kernels may run (the default: the executor's).
    pub opts: GemmOptions,
}

impl<T: ?Sized> Clone for DotCall<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for DotCall<'_, T> {}

impl<'a, T: ?Sized> DotCall<'a, T> {
    /// The dot of `lhs` and `rhs` as `plan` normalises it: nothing to fetch after it,
    /// nothing known of its operands, the default kernels.
    pub fn new(plan: &'a DotPlan, lhs: Operand<'a, T>, rhs: Operand<'a, T>) -> Self {
        DotCall {
            plan,
            lhs,
            rhs,
            tail: NO_TAIL,
            known: UNKNOWN,
            opts: GemmOptions::default(),
        }
    }

    /// This call on other values of its operands (the same shapes, plan and additions).
    fn on<'b, U: ?Sized>(&self, lhs: &'b U, rhs: &'b U) -> DotCall<'b, U>
    where
        'a: 'b,
    {
        DotCall {
            plan: self.plan,
            lhs: Operand::new(self.lhs.shape, lhs),
            rhs: Operand::new(self.rhs.shape, rhs),
            tail: self.tail,
            known: self.known,
            opts: self.opts,
        }
    }
}

/// Run the dot into `out` (the result dtype); returns the path taken ([`DotCall::run`]
/// with nothing added).
pub fn dot(
    p: &DotPlan,
    lhs_shape: &[usize],
    lhs: &Data,
    rhs_shape: &[usize],
    rhs: &Data,
    out: &mut Data,
) -> DotPath {
    DotCall::new(
        p,
        Operand::new(lhs_shape, lhs),
        Operand::new(rhs_shape, rhs),
    )
    .run(out)
}

impl DotCall<'_> {
    /// Run the dot into `out` (the result dtype); returns the path taken. f32 and f64 run
    /// as they are (only f32 fetches the tail), bf16 widened to f32 and rounded once, i32
    /// in wrapping integer loops.
    pub fn run(&self, out: &mut Data) -> DotPath {
        match (self.lhs.data, self.rhs.data, out) {
            (Data::F32(l), Data::F32(r), Data::F32(o)) => {
                dot_float(&self.on(&l[..], &r[..]), o, None)
            }
            (Data::F64(l), Data::F64(r), Data::F64(o)) => {
                let call = DotCall {
                    tail: NO_TAIL,
                    ..self.on(&l[..], &r[..])
                };
                dot_float(&call, o, None)
            }
            (Data::BF16(l), Data::BF16(r), Data::BF16(o)) => {
                let (l, r) = (widen(l), widen(r));
                let mut acc = vec![0.0f32; o.len()];
                let call = DotCall {
                    tail: NO_TAIL,
                    ..self.on(&l[..], &r[..])
                };
                let path = dot_float(&call, &mut acc, None);
                o.par_iter_mut()
                    .with_min_len(1 << 14)
                    .zip(&acc)
                    .for_each(|(o, &a)| *o = bf16::from_f32(a));
                path
            }
            (Data::I32(l), Data::I32(r), Data::I32(o)) => {
                dot_i32(&self.on(&l[..], &r[..]), o);
                DotPath::Int
            }
            (l, _, o) => panic!("dot_general of {} into {}", l.dtype(), o.dtype()),
        }
    }
}

/// Work done on each batch entry of an f32 result right after its GEMM
/// ([`DotCall::run_then`]).
#[derive(Clone, Copy)]
pub struct Epilogue<'a> {
    /// `f(bb, entry)` with batch entry `bb`'s finished `m x n` values.
    pub f: &'a (dyn Fn(usize, &mut [f32]) + Sync),
    /// The buffers `f` reads: those as long as the result have each entry's part fetched
    /// into cache while the entry's GEMM computes (within the fetch budget).
    pub reads: &'a [&'a [f32]],
}

impl DotCall<'_, [f32]> {
    /// The f32 dot into `out` followed by `epi` on every batch entry of the result (`m x n`
    /// values at `bb * m * n`; the plan must not write transposed). A dense batch split
    /// over the pool runs each entry's epilogue right after its GEMM, while the entry is
    /// still in cache (an elementwise consumer fused into the GEMM's output: no second pass
    /// over memory). Returns the path taken.
    pub fn run_then(&self, out: &mut [f32], epi: &Epilogue) -> DotPath {
        assert!(
            !self.plan.transposed,
            "an epilogue needs the untransposed result"
        );
        // Inputs the epilogue reads elementwise (as long as the result): each entry's part
        // is fetched into cache while the entry's GEMM computes.
        let reads: Vec<usize> = epi
            .reads
            .iter()
            .filter(|x| x.len() == out.len())
            .map(|x| x.as_ptr() as usize)
            .collect();
        dot_float(
            self,
            out,
            Some(EpiRun {
                f: epi.f,
                reads: &reads,
            }),
        )
    }

    /// The f32 dot into `out` where its result is only ever used multiplied by one of
    /// `masks` and summed: computed only where some mask is non-zero, when that is exact
    /// and pays (`masked::dot_masked`). Returns how many values were computed, or `None`
    /// (not applicable: `out` then holds arbitrary values, for the dense product to
    /// overwrite).
    pub fn run_masked(&self, masks: &[&[f32]], out: &mut [f32]) -> Option<usize> {
        masked::dot_masked(self.plan, self.lhs.data, self.rhs.data, masks, out)
    }

    /// The row sums of the f32 dot multiplied by each of `masks` (`sums[t]`, one per row
    /// of the untransposed result), computed where the masks are non-zero, without the
    /// product (`masked::dot_masked_sums`); `sups[t]`, where given, is mask `t`'s
    /// support. Returns how many values were computed, or `None` (not applicable: the
    /// caller computes the dense product and [`masked_row_sums`]).
    pub fn run_masked_sums(
        &self,
        masks: &[&[f32]],
        sups: &[Option<&Support>],
        sums: &mut [&mut [f32]],
    ) -> Option<usize> {
        masked::dot_masked_sums(self.plan, self.lhs.data, self.rhs.data, masks, sups, sums)
    }
}

/// The i32 dot: wrapping integer loops over the operands as the plan reads them.
fn dot_i32(call: &DotCall<[i32]>, out: &mut [i32]) {
    let p = call.plan;
    let (mut lbuf, mut rbuf) = (Vec::new(), Vec::new());
    let l = p.lhs.prepare(call.lhs.shape, call.lhs.data, &mut lbuf);
    let r = p.rhs.prepare(call.rhs.shape, call.rhs.data, &mut rbuf);
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

/// The dtype a dot accumulates in (for documentation and profiles).
pub fn accumulation(dtype: DType) -> DType {
    match dtype {
        DType::BF16 | DType::F32 => DType::F32,
        DType::F64 => DType::F64,
        DType::I32 | DType::Bool => DType::I32,
    }
}
