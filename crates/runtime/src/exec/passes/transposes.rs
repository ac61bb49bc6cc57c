//! Transposes folded into the steps producing their operands, so no pass over memory
//! moves the data again:
//!
//! - A transpose that is a dot's only user (directly, or through collectives over groups of
//!   one — identities that only it reads, which the partitioner leaves on a one-device
//!   mesh) is written by the dot ([`DotPlan::fuse_output_transpose`](crate::kernels::dot::DotPlan::fuse_output_transpose)): one dot step in the
//!   transpose's place, producing the transpose's value; the dot and the collectives
//!   between have no step.
//! - A dot whose only user is an all-reduce whose only user is a transpose (a weight's
//!   gradient summed over the devices, then laid out as the weight) writes the transpose's
//!   layout, the all-reduce sums that, and the transpose aliases the sum.
//! - An all-to-all (not over groups of one) whose only reader is a transpose keeping the
//!   last dim last writes its results in the transpose's layout (`out_perm`: the
//!   in-process backend places each block there directly, whole rows), and the transpose
//!   takes the result over ([`Kind::Move`]): the MoE dispatch's `[G, E, C, M]` ->
//!   `[E, G, C, M]` costs no pass of its own.
//!
//! Exactness: a transpose moves values without computing any; the dot computes each
//! element as before and only writes it elsewhere, and an all-reduce sums elementwise, so
//! summing the transposed layout gives each element the same sum.

use super::identities::trivial_collective;
use crate::exec::ids::{IdVec, StepId};
use crate::exec::lower::{consumers, outputs};
use crate::exec::plan::{op_label, Kind, Plan};
use ir::{CollectiveKind, Op, Program, ValueId};

/// Fold the transposes of the module doc into their producers.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let consumers = consumers(p);
    let is_output = outputs(p);
    let (producer, _) = plan.producers_and_readers();
    let mut gone: IdVec<StepId, bool> = IdVec::filled(false, plan.steps.len());
    let transpose = |v: ValueId| {
        if let Op::Transpose { perm } = &p.instrs[v.index()].op {
            Some(perm.clone())
        } else {
            None
        }
    };
    for d in plan.steps.ids() {
        let s = &plan.steps[d];
        let i = s.value;
        if s.kind.is_collective() {
            fold_into_all_to_all(p, plan, d, &consumers, &is_output, &producer);
            continue;
        }
        if !matches!(s.kind, Kind::Dot(_)) {
            continue;
        }
        // A transpose that is the only user, through trivial collectives.
        let mut v = i;
        let mut between = Vec::new();
        let mut target = None;
        while let ([c], false) = (consumers[v].as_slice(), is_output[v]) {
            if let Some(perm) = transpose(*c) {
                target = Some((*c, perm));
            } else if p.instrs[c.index()].op.is_collective()
                && trivial_collective(p, &p.instrs[c.index()].op)
            {
                between.push(*c);
                v = *c;
                continue;
            }
            break;
        }
        if let Some((c, perm)) = target {
            let Kind::Dot(mut dot) = std::mem::replace(&mut plan.steps[d].kind, Kind::Kernel)
            else {
                unreachable!("matched above")
            };
            dot.fuse_output_transpose(&perm);
            gone[d] = true;
            for b in between {
                if let Some(q) = producer[b] {
                    gone[q] = true;
                }
            }
            // The dot in the transpose's place (none if nothing reads the transpose).
            if let Some(t) = producer[c] {
                let label = format!("{} +transpose %{}", plan.steps[d].label, c.0);
                let reads = std::mem::take(&mut plan.steps[d].reads);
                let ts = &mut plan.steps[t];
                ts.kind = Kind::Dot(dot);
                ts.reads = reads;
                ts.label = label;
                ts.cat = "dot";
            }
            continue;
        }
        // A transpose of an all-reduce of the dot: the dot writes the transposed layout.
        let summed = match (consumers[i].as_slice(), is_output[i]) {
            (&[r], false)
                if matches!(
                    p.instrs[r.index()].op.collective_kind(),
                    Some(CollectiveKind::AllReduce { .. })
                ) =>
            {
                match (consumers[r].as_slice(), is_output[r]) {
                    (&[c], false) => transpose(c).map(|perm| (r, c, perm)),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((r, c, perm)) = summed {
            let s = &mut plan.steps[d];
            let Kind::Dot(dot) = &mut s.kind else {
                unreachable!("matched above")
            };
            dot.fuse_output_transpose(&perm);
            s.label = format!("{} +transpose %{} (before the sum)", s.label, c.0);
            if let Some(t) = producer[c] {
                let ts = &mut plan.steps[t];
                ts.kind = Kind::Alias(r);
                ts.reads = vec![r];
                ts.cat = "alias";
                ts.label = op_label(p, c);
            }
        }
    }
    plan.remove_marked(&gone);
}

/// Fold the transpose reading all-to-all step `d` into it, if it qualifies (module doc).
fn fold_into_all_to_all(
    p: &Program,
    plan: &mut Plan,
    d: StepId,
    consumers: &IdVec<ValueId, Vec<ValueId>>,
    is_output: &IdVec<ValueId, bool>,
    producer: &IdVec<ValueId, Option<StepId>>,
) {
    let i = plan.steps[d].value;
    let op = &p.instrs[i.index()].op;
    if !matches!(op.collective_kind(), Some(CollectiveKind::AllToAll { .. }))
        || is_output[i]
        || trivial_collective(p, op)
    {
        return;
    }
    let &[c] = consumers[i].as_slice() else {
        return;
    };
    let Op::Transpose { perm } = &p.instrs[c.index()].op else {
        return;
    };
    if perm.last() != perm.len().checked_sub(1).as_ref() {
        return;
    }
    let s = &mut plan.steps[d];
    s.kind = Kind::Collective {
        out_perm: Some(perm.clone()),
    };
    s.label = format!("{} +transpose %{}", s.label, c.0);
    // Its transpose (if anything reads it) takes the result over, buffer and all.
    if let Some(t) = producer[c] {
        let ts = &mut plan.steps[t];
        ts.kind = Kind::Move(i);
        ts.reads = vec![i];
        ts.cat = "alias";
    }
}
