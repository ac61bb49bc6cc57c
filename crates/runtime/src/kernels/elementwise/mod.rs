//! Fused elementwise evaluation.
//!
//! A [`Fused`] group is a small expression DAG (`nodes`, operands before users, the root
//! last) over one flat element index: elementwise ops (unary, binary, compare, select,
//! convert), leaves that read an external buffer elementwise ([`Node::Input`]) or through a
//! broadcast index map ([`Node::Broadcast`]), and generated leaves ([`Node::Splat`],
//! [`Node::Iota`]). The executor builds groups from chains of elementwise ops, reshapes and
//! copies (identities here) of one element count: every intermediate of the chain stays in
//! an L1-sized scratch chunk ([`CHUNK`] elements) and only the root is written to memory.
//! The output is split into tasks on the rayon pool when large. Inputs whose values are
//! their own lane (all but bf16) are read in place, and a computed root is written straight
//! into the output, so a chunk costs no copies; on CPUs with AVX2 the whole evaluation is
//! compiled a second time for AVX2 (eight lanes per instruction, the same operations in the
//! same order: identical values) and chosen at run time. Splat constants that are operands of
//! f32 binaries, compares and selects are read as registers (no lane loads), and an f32
//! binary root whose other operand is the in-place input (a GEMM epilogue's `dot * x`,
//! `max(dot, 0)`) computes straight from the output chunk, without copying it to scratch.
//! Two groups have one-pass kernels of their own: the ReLU epilogue `max(x, +0)` (or its
//! coded form) over the in-place input (about 10 us against 2 for 64K values on a Zen 5
//! core), and the ReLU's derivative applied to a gradient
//! (`g * select(d > 0, 1, select(d == 0, 0.5, 0))`, the expert's backward epilogue), which the
//! interpreter would run as seven passes per chunk (27-38 us against 9 us for 64K elements).
//!
//! Scratch types: f32 and bf16 values live in `f32` lanes (bf16 values are exact in f32),
//! f64 in `f64`, i32 in `i32`, bool in `bool`. Rounding follows the reference exactly:
//! f32 `+ - * /`, `rem`, `sqrt`, `floor`, `abs`, `neg`, `sign`, `max`, `min` and compares
//! are native (equal to the f64-then-round result); f32 `exp` is the shared f32 rule
//! ([`crate::kernels::vmath`]); other f32 functions are computed in f64 and rounded once;
//! every bf16 op is computed in f64 and rounded to bf16 once.
//!
//! This file holds the group's types and the drivers (tasks over the pool, ranges); the
//! parts, by concern:
//! - [`arith`]: the unary and binary rules (f64 reference rules, f32 chunk loops, i32);
//! - [`select`]: compares, selects and converts;
//! - [`lanes`]: scratch lanes, inputs read in place, and stores into the output;
//! - [`leaves`]: the leaves' chunks (loads, broadcast walks, splats, iotas);
//! - [`interp`]: the chunk interpreter (each node's plan, then the nodes over a chunk);
//! - [`relu`]: the one-pass ReLU kernels and the coded ReLU.

mod arith;
mod interp;
mod lanes;
mod leaves;
mod relu;
mod select;
#[cfg(test)]
mod tests;

pub use arith::{binary_f64, unary_f64};

use super::PAR_MIN;
use crate::tensor::Data;
use interp::run_range_impl;
use ir::{BinaryOp, CompareOp, DType, UnaryOp};
use lanes::Store;
use rayon::prelude::*;
use relu::run_special;

/// Elements per scratch chunk.
pub const CHUNK: usize = 1024;

/// One node of a fused group; operands are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// Element `i` of external input `k`.
    Input(usize),
    /// A constant (converted to the node's dtype).
    Splat(f64),
    /// `(i / stride) % size`.
    Iota {
        stride: usize,
        size: usize,
    },
    /// External input `input` read through a broadcast: element `i` of the collapsed
    /// `shape` reads `sum idx[d] * st[d]`.
    Broadcast {
        input: usize,
        shape: Vec<usize>,
        st: Vec<usize>,
    },
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Compare(CompareOp, usize, usize),
    Select(usize, usize, usize),
    Convert(usize),
    /// f32: `max(x, 0)`, but `-0` where `x < 0` (a ReLU whose zeros keep whether the input
    /// was zero or negative; see the executor's coded ReLUs).
    ReluCode(usize),
    /// f32: `-1` where `x` is `-0`, else `x`: the pre-activation of a [`Node::ReluCode`] as
    /// every compare with zero sees it.
    ReluDecode(usize),
}

/// A fused elementwise group producing `len` elements; the root is the last node.
#[derive(Clone, Debug, PartialEq)]
pub struct Fused {
    pub len: usize,
    pub nodes: Vec<(Node, DType)>,
    pub n_inputs: usize,
}

impl Fused {
    /// Short description for profiles: the op names of the group.
    pub fn ops(&self) -> usize {
        self.nodes
            .iter()
            .filter(|(n, _)| {
                !matches!(
                    n,
                    Node::Input(_) | Node::Splat(_) | Node::Iota { .. } | Node::Broadcast { .. }
                )
            })
            .count()
    }
}

/// Collapse a broadcast map: drop size-1 dims, merge dims contiguous in the operand (or
/// both repeated).
pub fn collapse_broadcast(shape: &[usize], st: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut sh: Vec<usize> = Vec::new();
    let mut ss: Vec<usize> = Vec::new();
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let (Some(n), Some(s)) = (sh.last_mut(), ss.last_mut()) {
            if *s == st[d] * shape[d] {
                *n *= shape[d];
                *s = st[d];
                continue;
            }
        }
        sh.push(shape[d]);
        ss.push(st[d]);
    }
    (sh, ss)
}

/// Evaluate elements `start..start + out.len()` into `out`. Input `inplace` (read only as
/// `Node::Input`) comes from `pre` (its values over the same range) or, without one, from
/// `out` itself.
fn run_range<T: Store>(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [T],
    inplace: Option<usize>,
    pre: Option<&[f32]>,
) {
    if run_special(f, inputs, start, out, inplace, pre) {
        return;
    }
    // Compiled a second time for AVX2 (the per-chunk loops, all inlined, work on eight lanes
    // at a time): the same operations in the same order, so the same values.
    super::with_avx2(
        #[inline(always)]
        || run_range_impl(f, inputs, start, out, inplace, pre),
    )
}

fn drive<T: Store>(f: &Fused, inputs: &[&Data], out: &mut [T], inplace: Option<usize>) {
    let n = out.len();
    if n < PAR_MIN {
        run_range(f, inputs, 0, out, inplace, None);
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let task = (n / (threads * 4)).div_ceil(CHUNK).max(4) * CHUNK;
    out.par_chunks_mut(task)
        .enumerate()
        .for_each(|(c, part)| run_range(f, inputs, c * task, part, inplace, None));
}

/// Evaluate elements `start..start + out.len()` of an f32 group, serially, on this thread
/// (one batch entry of a GEMM's epilogue): input `slot` (an f32 value read only as
/// `Node::Input`) is taken from `slot_vals` over the same range, or from `out` itself when
/// `None` (in place); `inputs[slot]` is ignored.
pub fn run_fused_part(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [f32],
    slot: usize,
    slot_vals: Option<&[f32]>,
) {
    debug_assert!(start + out.len() <= f.len);
    debug_assert!(slot_vals.is_none_or(|x| x.len() == out.len()));
    run_range(f, inputs, start, out, Some(slot), slot_vals)
}

/// Evaluate the group into `out` (the root's dtype, `f.len` elements).
pub fn run_fused(f: &Fused, inputs: &[&Data], out: &mut Data) {
    run_fused_inplace(f, inputs, out, None)
}

/// [`run_fused`] where `out` already holds input `inplace` (which must be read only through
/// `Node::Input`, i.e. elementwise); `inputs[inplace]` is then ignored.
pub fn run_fused_inplace(f: &Fused, inputs: &[&Data], out: &mut Data, inplace: Option<usize>) {
    debug_assert_eq!(out.len(), f.len);
    debug_assert_eq!(inputs.len(), f.n_inputs);
    if f.len == 0 {
        return;
    }
    match out {
        Data::F32(o) => drive(f, inputs, o, inplace),
        Data::F64(o) => drive(f, inputs, o, inplace),
        Data::BF16(o) => drive(f, inputs, o, inplace),
        Data::I32(o) => drive(f, inputs, o, inplace),
        Data::Bool(o) => drive(f, inputs, o, inplace),
    }
}
