//! Dot epilogues: an f32 dot and an f32 elementwise group reading it (in place) become one
//! [`Kind::DotFused`] step: each batch entry of the product (an expert) goes through the
//! group right after its GEMM, while in cache, instead of in a second pass over memory
//! (the ReLU after an expert's up-projection, the ReLU mask on its gradient). The merged
//! step takes the dot's place when every other input of the group exists by then
//! (required when the dot's result is also read elsewhere), else the group's: at the
//! group's place the group's other inputs may die there and the unfused group would
//! write in place over one, so the dot's place keeps the peak from growing.
//!
//! Exactness: the dot computes the same products, and the group evaluates the same nodes
//! on each element, only sooner; nothing reads the dot's result in between.

use super::f32_value;
use crate::exec::ids::{IdVec, StepId};
use crate::exec::plan::{is_output, Kind, Plan, Step};
use ir::Program;

/// Merge each qualifying dot with the first group reading it that qualifies.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let (producer, readers) = plan.producers_and_readers();
    let mut gone: IdVec<StepId, bool> = IdVec::filled(false, plan.steps.len());
    let steps = &mut plan.steps;
    for d in steps.ids() {
        let Kind::Dot(dp) = &steps[d].kind else {
            continue;
        };
        let dv = steps[d].value;
        if gone[d] || dp.writes_transposed() || !steps[d].reads.iter().all(|&v| f32_value(p, v)) {
            continue;
        }
        let rs = &readers[dv];
        let keep = rs.len() > 1 || is_output(p, dv);
        let Some((j, slot, early)) = rs.iter().find_map(|&j| {
            let Kind::Fused {
                f,
                inputs,
                inplace_ok,
            } = &steps[j].kind
            else {
                return None;
            };
            let slot = inputs.iter().position(|&v| v == dv)?;
            let others_ready = inputs
                .iter()
                .all(|&v| v == dv || producer[v].is_some_and(|q| q < d));
            (!gone[j]
                && f32_value(p, steps[j].value)
                && f.len == p.instrs[dv.index()].ty.num_elements()
                && inplace_ok[slot]
                && (others_ready || !keep))
                .then_some((j, slot, others_ready))
        }) else {
            continue;
        };
        let Kind::Fused { f, inputs, .. } = std::mem::replace(&mut steps[j].kind, Kind::Kernel)
        else {
            unreachable!("matched above")
        };
        let Kind::Dot(dp) = std::mem::replace(&mut steps[d].kind, Kind::Kernel) else {
            unreachable!("matched above")
        };
        let mut reads = steps[d].reads.clone();
        reads.extend(inputs.iter().copied().filter(|&v| v != dv));
        let label = format!("{} +{}", steps[d].label, steps[j].label);
        let mut merged = Step::new(
            steps[j].value,
            Kind::DotFused {
                plan: dp,
                dot: dv,
                f,
                inputs,
                slot,
                keep,
            },
            reads,
            "dot",
            label,
        );
        merged.also = keep.then_some(dv);
        let (at, drop) = if early { (d, j) } else { (j, d) };
        steps[at] = merged;
        gone[drop] = true;
    }
    plan.remove_marked(&gone);
}
