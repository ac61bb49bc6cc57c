//! Cotangent contributions that are the chunks of one computation, put back together
//! instead of summed.
//!
//! A program that cuts a tensor into chunks and runs each through the same code (the MoE
//! layer's expert buffers cut along capacity, `nn::moe::MoeLayerOptions::overlap_chunks`)
//! gives the values the chunks share one contribution per chunk. Summed, they would not be
//! what the unchunked program computes: a weight's gradient would be `k` partial dots
//! added, a different order of summation. [`sum`] recognises two forms and returns the
//! unchunked program's computation instead:
//!
//! - **Pads of disjoint ranges** (the cotangent of a tensor whose chunks were sliced):
//!   every contribution pads one dim with zeros around a range, the ranges tile the dim.
//!   Their sum is their concatenation (`x + 0 = x`; the concatenation also keeps a `-0`
//!   that adding `+0` would turn into `+0`, as the unchunked program does).
//! - **Dots over the chunks of a contracted dim** (a weight's gradient): every
//!   contribution is `dot_general(l_j, r_j)` with the same dimension numbers, maybe
//!   followed by the same transpose, and one operand of each is, through copies
//!   (annotations), a slice of ONE tensor along a dim the dot contracts. Then
//!   `sum_j dot(l_j, r_j) = dot(concat_j l_j, concat_j r_j)`, both concatenated along that
//!   contracted dim (and its partner) in the order of the slices: the same products summed
//!   once, over the whole dim. When the chunks are slices of consecutive ranges that cover
//!   the dim and each `l_j`, `r_j` is the chunk of the unchunked operand, this is the
//!   unchunked dot itself, so its result is the unchunked program's bit for bit.
//!
//! Anything else is summed as before (in the order of the contributions).

use ir::{Builder, Op, Value, ValueId};

/// The sum of `contributions` (non-empty), as the unchunked computation where they are
/// chunks of one (see the module doc).
pub(crate) fn sum(b: &Builder, contributions: Vec<Value>) -> Value {
    if contributions.len() > 1 {
        if let Some(v) = pads(b, &contributions).or_else(|| dots(b, &contributions)) {
            return v;
        }
    }
    contributions
        .into_iter()
        .reduce(|acc, c| acc.add(&c))
        .expect("non-empty")
}

/// Pads of disjoint ranges of one dim that tile it: their concatenation.
fn pads(b: &Builder, cs: &[Value]) -> Option<Value> {
    let shape = cs[0].shape();
    let mut parts: Vec<(usize, Value)> = Vec::with_capacity(cs.len());
    let mut dim = None;
    for c in cs {
        let (op, operands) = b.op_of(c.id);
        let Op::Pad { low, high } = op else {
            return None;
        };
        if b.value(operands[1]).splat_value() != Some(0.0) {
            return None;
        }
        let padded: Vec<usize> = (0..low.len())
            .filter(|&d| low[d] != 0 || high[d] != 0)
            .collect();
        let [d] = padded[..] else { return None };
        if *dim.get_or_insert(d) != d {
            return None;
        }
        parts.push((low[d], b.value(operands[0])));
    }
    let d = dim?;
    parts.sort_by_key(|(lo, _)| *lo);
    let mut at = 0;
    for (lo, v) in &parts {
        if *lo != at {
            return None;
        }
        at += v.shape()[d];
    }
    if at != shape[d] {
        return None;
    }
    let vs: Vec<&Value> = parts.iter().map(|(_, v)| v).collect();
    Some(b.concat(&vs, d))
}

/// Dots over the chunks of a contracted dim: one dot of the concatenations.
fn dots(b: &Builder, cs: &[Value]) -> Option<Value> {
    // (transpose, dims, lhs, rhs) of each contribution.
    let mut terms = Vec::with_capacity(cs.len());
    for c in cs {
        let (op, operands) = b.op_of(c.id);
        let (perm, dot) = match op {
            Op::Transpose { perm } => (Some(perm), operands[0]),
            _ => (None, c.id),
        };
        let (Op::DotGeneral(dd), ops) = b.op_of(dot) else {
            return None;
        };
        terms.push((perm, dd, ops[0], ops[1]));
    }
    let (perm, dd) = (&terms[0].0, &terms[0].1);
    if terms.iter().any(|t| &t.0 != perm || &t.1 != dd) {
        return None;
    }
    // The side whose operands are chunks of one tensor along a contracted dim, the
    // position of that dim among the contracted ones, and each term's slice start.
    let chunked = |side: usize, contract: &[usize]| -> Option<(usize, Vec<usize>)> {
        let mut found: Option<(ValueId, usize)> = None;
        let mut starts = Vec::with_capacity(terms.len());
        for t in &terms {
            let v = if side == 0 { t.2 } else { t.3 };
            let (src, d, start) = slice_of(b, v)?;
            if *found.get_or_insert((src, d)) != (src, d) {
                return None;
            }
            starts.push(start);
        }
        let (_, d) = found?;
        let q = contract.iter().position(|&c| c == d)?;
        Some((q, starts))
    };
    let (q, starts) = chunked(0, &dd.lhs_contract).or_else(|| chunked(1, &dd.rhs_contract))?;
    let (ld, rd) = (dd.lhs_contract[q], dd.rhs_contract[q]);
    let mut order: Vec<usize> = (0..terms.len()).collect();
    order.sort_by_key(|&j| starts[j]);
    if order.windows(2).any(|w| starts[w[0]] == starts[w[1]]) {
        return None;
    }
    let ls: Vec<Value> = order.iter().map(|&j| b.value(terms[j].2)).collect();
    let rs: Vec<Value> = order.iter().map(|&j| b.value(terms[j].3)).collect();
    let lcat = b.concat(&ls.iter().collect::<Vec<_>>(), ld);
    let rcat = b.concat(&rs.iter().collect::<Vec<_>>(), rd);
    let dot = lcat.dot_general(&rcat, dd.clone());
    Some(match perm {
        Some(p) => dot.transpose(p),
        None => dot,
    })
}

/// `v` as a slice of another value along one dim, through copies: (the sliced value, the
/// dim, the slice's start there).
fn slice_of(b: &Builder, mut v: ValueId) -> Option<(ValueId, usize, usize)> {
    loop {
        let (op, operands) = b.op_of(v);
        match op {
            Op::Copy => v = operands[0],
            Op::Slice { start, limit } => {
                let full = b.ty(operands[0]).shape;
                let cut: Vec<usize> = (0..start.len())
                    .filter(|&d| start[d] != 0 || limit[d] != full[d])
                    .collect();
                let [d] = cut[..] else { return None };
                return Some((operands[0], d, start[d]));
            }
            _ => return None,
        }
    }
}
