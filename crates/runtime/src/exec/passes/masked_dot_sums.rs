//! Summed masked dots: a [`Kind::MaskedDot`] whose every `dot * mask` is read only by one
//! sum over the product's column dims (the trailing dims, untransposed: `[G, S, E, C]`
//! summed over `E, C` in the MoE combine weights' gradient), at most two of them, becomes
//! a [`Kind::MaskedDotSums`]: the multiply groups and the reductions go, and the sums
//! come straight from the masked-in values, without writing the product or the
//! multiplied values and reading them back.
//!
//! Exactness: each sum is the f64 sum, in increasing column order from `+0`, of the f32
//! products `dot * mask`, rounded once to f32: what the multiply and the reduction
//! computed. The masks' zeros are left out, their terms being zeros under the masked dot's
//! run-time check ([`dot_masked_sums`](crate::kernels::dot::dot_masked_sums)); where the
//! check fails, the dense product is summed term by term
//! ([`masked_row_sums`](crate::kernels::dot::masked_row_sums)).

use crate::exec::ids::{IdVec, StepId};
use crate::exec::plan::{Kind, Plan};
use ir::{Op, Program, ReduceOp, ValueId};

/// Turn the masked dots of the module doc into steps computing their sums.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let (_, readers) = plan.producers_and_readers();
    let mut dropped: IdVec<StepId, bool> = IdVec::filled(false, plan.steps.len());
    let steps = &mut plan.steps;
    for d in steps.ids() {
        let Kind::MaskedDot { plan: dp, .. } = &steps[d].kind else {
            continue;
        };
        if dp.writes_transposed() {
            continue;
        }
        let dv = steps[d].value;
        let shape = &p.instrs[dv.index()].ty.shape;
        let (bm, n) = (dp.b * dp.m, dp.n);
        // The (mask, reduction step, group step) of each reader of the dot.
        let term = |j: StepId| -> Option<(ValueId, StepId, StepId)> {
            let Kind::Fused { inputs, .. } = &steps[j].kind else {
                return None;
            };
            let mask = inputs.iter().copied().find(|&v| v != dv)?;
            let gv = steps[j].value;
            let [u] = readers[gv].as_slice() else {
                return None;
            };
            let Op::Reduce {
                op: ReduceOp::Sum,
                dims,
            } = &p.instrs[steps[*u].value.index()].op
            else {
                return None;
            };
            let r0 = shape.len().checked_sub(dims.len())?;
            let suffix = dims.iter().enumerate().all(|(q, &dd)| dd == r0 + q);
            let cols: usize = shape[r0..].iter().product();
            let rows: usize = shape[..r0].iter().product();
            (matches!(steps[*u].kind, Kind::Kernel) && suffix && cols == n && rows == bm)
                .then_some((mask, *u, j))
        };
        let terms: Option<Vec<(ValueId, StepId, StepId)>> =
            readers[dv].iter().map(|&j| term(j)).collect();
        let Some(terms) = terms.filter(|t| (1..=2).contains(&t.len())) else {
            continue;
        };
        let Kind::MaskedDot { plan: dp, .. } = std::mem::replace(&mut steps[d].kind, Kind::Kernel)
        else {
            unreachable!("matched above")
        };
        let outs: Vec<ValueId> = terms.iter().map(|&(_, u, _)| steps[u].value).collect();
        for &(_, u, j) in &terms {
            dropped[u] = true;
            dropped[j] = true;
        }
        let s = &mut steps[d];
        s.reads.truncate(2);
        s.reads.extend(terms.iter().map(|&(mask, _, _)| mask));
        s.value = outs[0];
        s.also = outs.get(1).copied();
        let sums: Vec<String> = outs.iter().map(|u| format!("%{}", u.0)).collect();
        s.label = format!("{} +sums {}", s.label, sums.join(","));
        s.kind = Kind::MaskedDotSums {
            plan: dp,
            dot: dv,
            terms: terms
                .iter()
                .zip(&outs)
                .map(|(&(mask, _, _), &u)| (mask, u))
                .collect(),
        };
    }
    plan.remove_marked(&dropped);
}
