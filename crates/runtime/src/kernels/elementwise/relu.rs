//! The ReLU's one-pass kernels: the coded ReLU ([`Node::ReluCode`]) and its decode, the
//! ReLU epilogue `max(x, +0)` over the in-place input, and the ReLU's derivative applied
//! to a gradient ([`ReluGrad`]), each one loop over the range instead of the
//! interpreter's passes per chunk (the same operations on every element: the same values).

use super::interp::splat_of;
use super::lanes::{LaneMut, Store};
use super::{Fused, Node, CHUNK};
use crate::kernels::reduce::{fmax32, sel32};
use crate::tensor::Data;
use ir::{BinaryOp, CompareOp, DType};

/// [`Node::ReluCode`] of one value: `max(x, 0)`, but `-0` where `x < 0`.
#[inline(always)]
pub(super) fn relu_code(x: f32) -> f32 {
    sel32(x < 0.0, -0.0, fmax32(x, 0.0))
}

/// [`Node::ReluDecode`] of one value: `-1` where `x` is `-0` (a negative pre-activation),
/// else `x`.
#[inline(always)]
pub(super) fn relu_decode(x: f32) -> f32 {
    sel32(x.to_bits() == 0x8000_0000, -1.0, x)
}

/// A group with a one-pass kernel of its own, the ReLU's derivative applied to a gradient:
/// `g * select(d > c1, t, select(d == c2, u, v))` (the product in either order: it commutes),
/// `g` and `d` f32 inputs, `d` read as is or through [`Node::ReluDecode`] (a coded ReLU), `c1, c2, t, u,
/// v` f32 splats. The interpreter runs it as seven passes over each chunk; this is one, with
/// the same operations on every element (the same values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ReluGrad {
    /// The input holding `g`.
    pub(super) g: usize,
    /// The input holding `d`, and whether it is read through a decode.
    pub(super) d: usize,
    pub(super) coded: bool,
    pub(super) c1: f32,
    pub(super) c2: f32,
    pub(super) t: f32,
    pub(super) u: f32,
    pub(super) v: f32,
}

/// `o[i] = f(x[i])` with `x` the values `pre` when given, else `o`'s own (in place).
#[inline(always)]
pub(super) fn map_in_place(o: &mut [f32], pre: Option<&[f32]>, f: impl Fn(f32) -> f32) {
    match pre {
        Some(x) => o.iter_mut().zip(x).for_each(|(d, &v)| *d = f(v)),
        None => o.iter_mut().for_each(|d| *d = f(*d)),
    }
}

/// The forms of a ReLU epilogue with a one-pass kernel ([`relu_in_place_of`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Relu {
    /// `max(x, +0)`.
    InputFirst,
    /// `max(+0, x)`.
    ZeroFirst,
    /// The coded ReLU of `x` ([`Node::ReluCode`]).
    Coded,
}

/// Whether the group is a ReLU of the f32 in-place input `x` alone, `max(x, +0)` (either
/// operand order) or coded: one pass over the output, where the chunk evaluator takes
/// several (about 10 us against 2 for 64K values on a Zen 5 core).
pub(super) fn relu_in_place_of(f: &Fused, inplace: Option<usize>) -> Option<Relu> {
    let k = inplace?;
    let input = |n: &Node| *n == Node::Input(k);
    match f.nodes.as_slice() {
        [(a, DType::F32), (Node::ReluCode(0), DType::F32)] if input(a) => Some(Relu::Coded),
        [(a, DType::F32), (b, DType::F32), (Node::Binary(BinaryOp::Max, x, y), DType::F32)] => {
            let zero = |n: &Node| matches!(n, Node::Splat(z) if z.to_bits() == 0);
            let input_at = if input(a) && zero(b) {
                0
            } else if zero(a) && input(b) {
                1
            } else {
                return None;
            };
            match (*x, *y) {
                (0, 1) | (1, 0) if *x == input_at => Some(Relu::InputFirst),
                (0, 1) | (1, 0) => Some(Relu::ZeroFirst),
                _ => None,
            }
        }
        _ => None,
    }
}

pub(super) fn relu_grad_of(f: &Fused) -> Option<ReluGrad> {
    let node = |j: usize| &f.nodes[j];
    let splat = |j: usize| splat_of(f, j).map(|s| s.0);
    let f32_input = |j: usize| match node(j) {
        (Node::Input(k), DType::F32) => Some(*k),
        _ => None,
    };
    let (Node::Binary(BinaryOp::Mul, x, y), DType::F32) = node(f.nodes.len() - 1) else {
        return None;
    };
    let (g, sel) = match (f32_input(*x), f32_input(*y)) {
        (Some(g), _) => (g, *y),
        (None, Some(g)) => (g, *x),
        _ => return None,
    };
    let (Node::Select(p1, a1, b1), DType::F32) = node(sel) else {
        return None;
    };
    let (Node::Select(p2, a2, b2), DType::F32) = node(*b1) else {
        return None;
    };
    let (Node::Compare(CompareOp::Gt, d1, k1), DType::Bool) = node(*p1) else {
        return None;
    };
    let (Node::Compare(CompareOp::Eq, d2, k2), DType::Bool) = node(*p2) else {
        return None;
    };
    if d1 != d2 {
        return None;
    }
    let (d, coded) = match node(*d1) {
        (Node::ReluDecode(m), DType::F32) => (f32_input(*m)?, true),
        _ => (f32_input(*d1)?, false),
    };
    Some(ReluGrad {
        g,
        d,
        coded,
        c1: splat(*k1)?,
        c2: splat(*k2)?,
        t: splat(*a1)?,
        u: splat(*a2)?,
        v: splat(*b2)?,
    })
}

/// [`ReluGrad`] over one range: `g` from `gs` (or `o` itself when `None`), `d` from `ds`.
#[inline(always)]
pub(super) fn relu_grad(r: &ReluGrad, ds: &[f32], gs: Option<&[f32]>, o: &mut [f32]) {
    let n = o.len();
    let ds = &ds[..n];
    let factor = |x: f32| {
        let d = if r.coded { relu_decode(x) } else { x };
        sel32(d > r.c1, r.t, sel32(d == r.c2, r.u, r.v))
    };
    match gs {
        Some(gs) => {
            let gs = &gs[..n];
            for i in 0..n {
                o[i] = gs[i] * factor(ds[i]);
            }
        }
        None => {
            for i in 0..n {
                o[i] *= factor(ds[i]);
            }
        }
    }
}

/// Run `f` over `start..start + out.len()` with its one-pass kernel when it has one (an
/// f32 output, inputs stored as f32). Returns whether it ran. The group is matched on each
/// call, as `plan` is: a few node lookups (most groups fail at the root) against at least
/// one chunk of elements.
pub(super) fn run_special<T: Store>(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [T],
    inplace: Option<usize>,
    pre: Option<&[f32]>,
) -> bool {
    if !T::DIRECT || out.len() < CHUNK {
        return false;
    }
    if let Some(form) = relu_in_place_of(f, inplace) {
        let LaneMut::F(o) = T::direct(out) else {
            return false;
        };
        // One loop per form, so that each vectorises without a per-element branch; the
        // node's own operand order (`fmax32` is symmetric but for which NaN it keeps).
        crate::kernels::with_avx2(
            #[inline(always)]
            || match form {
                Relu::InputFirst => map_in_place(o, pre, |v| fmax32(v, 0.0)),
                Relu::ZeroFirst => map_in_place(o, pre, |v| fmax32(0.0, v)),
                Relu::Coded => map_in_place(o, pre, relu_code),
            },
        );
        return true;
    }
    let Some(r) = relu_grad_of(f) else {
        return false;
    };
    let LaneMut::F(o) = T::direct(out) else {
        return false;
    };
    // `d` must be read from its input (the in-place one's is ignored), stored as f32.
    let range = start..start + o.len();
    let (false, Data::F32(ds)) = (Some(r.d) == inplace, inputs[r.d]) else {
        return false;
    };
    let gs = if Some(r.g) == inplace {
        pre
    } else {
        match inputs[r.g] {
            Data::F32(g) => Some(&g[range.clone()]),
            _ => return false,
        }
    };
    crate::kernels::with_avx2(
        #[inline(always)]
        || relu_grad(&r, &ds[range], gs, o),
    );
    true
}
