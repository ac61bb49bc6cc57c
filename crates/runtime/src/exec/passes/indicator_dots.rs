//! Indicator reads: a fused group `v = convert(x != 0)` (f32 or f64, `x` of its dtype and
//! shape) whose every reader is a plain dot is dropped; the dots read `x` in its place, as
//! an indicator ([`DotPlan::read_indicator`](crate::kernels::dot::DotPlan::read_indicator)).
//! A sparse path over that side walks `x`'s non-zeros (the support shared with `x`'s other
//! readers) with the value 1; another path multiplies a 0/1 copy. The MoE dispatch mask is
//! then neither computed nor written (256 KiB per device and step in the small benchmark
//! layer), nor kept alive until the backward pass: the dispatch and its gradient read the
//! combine weights instead.
//!
//! Exactness: the indicator is `1` where `x` is non-zero (NaN included: it compares
//! unequal to zero) and `0` where it is `±0`, in the dot's dtype; the dot reads exactly
//! those values, from `x`'s support or a 0/1 copy, in the order it read `v`.

use crate::exec::ids::{IdVec, StepId};
use crate::exec::plan::{is_output, Kind, Plan, Step};
use crate::kernels::elementwise::Node;
use ir::{CompareOp, DType, Program, ValueId};

/// Drop the indicator groups of the module doc; their dots read `x` as an indicator.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let (_, readers) = plan.producers_and_readers();
    let mut gone: IdVec<StepId, bool> = IdVec::filled(false, plan.steps.len());
    let steps = &mut plan.steps;
    for si in steps.ids() {
        let (s, v) = (&steps[si], steps[si].value);
        let Some(x) = indicator_of(p, s) else {
            continue;
        };
        let same_type = p.instrs[x.index()].ty.dtype == p.instrs[v.index()].ty.dtype;
        if s.also.is_some() || is_output(p, v) || !same_type {
            continue;
        }
        let rs = &readers[v];
        if rs.is_empty() || !rs.iter().all(|&r| matches!(steps[r].kind, Kind::Dot(_))) {
            continue;
        }
        for &r in rs {
            let st = &mut steps[r];
            let Kind::Dot(dp) = &mut st.kind else {
                unreachable!("checked above")
            };
            for side in 0..2 {
                if st.reads[side] == v {
                    st.reads[side] = x;
                    dp.read_indicator(side);
                }
            }
        }
        gone[si] = true;
    }
    plan.remove_marked(&gone);
}

/// `x` where step `s` is a fused group of one input `x` that computes exactly the indicator
/// `convert(x != 0)` (or `0 != x`) to a float of `x`'s shape, from a float `x`: `1` where
/// `x` is non-zero (NaN included: it compares unequal to zero), `0` where it is `±0`.
pub(crate) fn indicator_of(p: &Program, s: &Step) -> Option<ValueId> {
    let Kind::Fused { f, inputs, .. } = &s.kind else {
        return None;
    };
    let [x] = inputs[..] else {
        return None;
    };
    let float = |t: DType| matches!(t, DType::F32 | DType::F64);
    let zero = |n: usize| matches!(f.nodes.get(n), Some((Node::Splat(z), _)) if *z == 0.0);
    let input = |n: usize| matches!(f.nodes.get(n), Some((Node::Input(0), _)));
    let indicator = match f.nodes.last() {
        Some(&(Node::Convert(c), t)) if float(t) => matches!(
            f.nodes.get(c),
            Some(&(Node::Compare(CompareOp::Ne, a, b), _))
                if (input(a) && zero(b)) || (zero(a) && input(b))
        ),
        _ => false,
    };
    let (tx, ty) = (&p.instrs[x.index()].ty, &p.instrs[s.value.index()].ty);
    (indicator && float(tx.dtype) && tx.shape == ty.shape).then_some(x)
}
