//! Masked dots: an f32 dot whose every use is `dot * mask` (a group of that one multiply,
//! `mask` f32 of the dot's shape and computed before the dot) summed by reductions and
//! nothing else becomes a [`Kind::MaskedDot`]: computed only where some mask is non-zero
//! (the MoE combine weights' gradient, whose masks are one-hot).
//!
//! Exactness: where every mask is zero the product's value cannot matter to a sum: the
//! kernel checks at run time that every skipped value is finite (operands finite and
//! `K * max|lhs| * max|rhs|` inside f32), so its product with a zero mask element is a
//! zero, which a sum starting at `+0` does not see; else the dot is computed densely
//! ([`dot_masked`](crate::kernels::dot::dot_masked)). The values computed are the dot's
//! (to the rounding the project allows f32 dot products, as the dense path).

use super::f32_value;
use crate::exec::ids::StepId;
use crate::exec::plan::{is_output, Kind, Plan};
use crate::kernels::elementwise::Node;
use ir::{BinaryOp, Op, Program, ReduceOp, ValueId};

/// Mark the dots of the module doc as masked dots reading their masks too.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let (producer, readers) = plan.producers_and_readers();
    let steps = &mut plan.steps;
    for d in steps.ids() {
        let Kind::Dot(_) = &steps[d].kind else {
            continue;
        };
        let dv = steps[d].value;
        if !f32_value(p, dv) || is_output(p, dv) || !steps[d].reads.iter().all(|&v| f32_value(p, v))
        {
            continue;
        }
        let rs = &readers[dv];
        // The mask of each reader that is `dv * mask`, summed and nothing else.
        let mask_of = |j: StepId| -> Option<ValueId> {
            let Kind::Fused { f, inputs, .. } = &steps[j].kind else {
                return None;
            };
            let [(Node::Input(a), _), (Node::Input(b), _), (Node::Binary(BinaryOp::Mul, x, y), _)] =
                f.nodes.as_slice()
            else {
                return None;
            };
            let other = match (inputs[*a] == dv, inputs[*b] == dv) {
                (true, false) => *b,
                (false, true) => *a,
                _ => return None,
            };
            let (mask, gv) = (inputs[other], steps[j].value);
            let reads_both = (*x == 0 && *y == 1) || (*x == 1 && *y == 0);
            let summed = !is_output(p, gv)
                && !readers[gv].is_empty()
                && readers[gv].iter().all(|&u| {
                    matches!(steps[u].kind, Kind::Kernel)
                        && matches!(
                            p.instrs[steps[u].value.index()].op,
                            Op::Reduce {
                                op: ReduceOp::Sum,
                                ..
                            }
                        )
                });
            (reads_both
                && f32_value(p, mask)
                && f32_value(p, gv)
                && f.len == p.instrs[dv.index()].ty.num_elements()
                && p.instrs[mask.index()].ty.num_elements() == f.len
                && producer[mask].is_some_and(|q| q < d)
                && summed)
                .then_some(mask)
        };
        let masks: Option<Vec<ValueId>> = rs.iter().map(|&j| mask_of(j)).collect();
        let Some(mut masks) = masks.filter(|m| !m.is_empty()) else {
            continue;
        };
        masks.sort_unstable();
        masks.dedup();
        let Kind::Dot(plan) = std::mem::replace(&mut steps[d].kind, Kind::Kernel) else {
            unreachable!("matched above")
        };
        steps[d].reads.extend(masks.iter().copied());
        steps[d].kind = Kind::MaskedDot { plan, masks };
    }
}
