//! Overlap ([`ExecOptions::overlap`](crate::exec::ExecOptions::overlap)): every
//! all-to-all step becomes a [`Kind::Start`], which hands its operand to the communicator
//! and returns, and a [`Kind::Wait`], which produces its value; the steps between run while
//! it is in flight. Each start moves up to just after the last of: the step producing its
//! operand, any step reading that operand (so an operand that died at the collective still
//! dies at its start and moves into it, never copied), and the previous collective (a
//! blocking one or a start). Each wait moves down to just before the first step that reads the
//! value (or to the end). With the MoE layer cut into chunks along capacity
//! (`nn::moe::MoeLayerOptions::overlap_chunks`), chunk `i + 1`'s all-to-all is then in
//! flight during chunk `i`'s experts, in the forward pass and in the backward one.
//!
//! Collectives keep the order the earlier passes gave them (a start never passes another
//! start or a blocking collective; large ones are in program order), so every rank starts
//! them in one order, a function of the program; waits are in the order of first use, the
//! same on every rank too.
//!
//! Exactness: only when a collective's data moves changes, never what any step computes:
//! the start moves the operand's values as the blocking step would, the wait's results are
//! the collective's, and every step still runs after the steps producing what it reads
//! (the collective's value exists from its wait on). Memory: the operand (moved in or
//! copied) is live from start to wait, the results from the wait on
//! ([`Executable::memory_plan`](crate::exec::Executable::memory_plan) walks the same).

use crate::exec::ids::IdVec;
use crate::exec::plan::{Kind, Plan, Step};
use ir::{CollectiveKind, Program, ValueId};
use std::collections::HashMap;

/// Split the all-to-alls and move their halves (see the module doc).
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let a2a = |s: &Step| {
        matches!(s.kind, Kind::Collective { .. })
            && matches!(
                p.instrs[s.value.index()].op.collective_kind(),
                Some(CollectiveKind::AllToAll { .. })
            )
    };
    let issues = |s: &Step| {
        matches!(
            s.kind,
            Kind::Collective { .. } | Kind::OracleCollective | Kind::Start { .. }
        )
    };
    let steps = std::mem::take(&mut plan.steps).into_vec();
    let mut out: Vec<Step> = Vec::with_capacity(steps.len() + steps.len() / 8);
    // Waits not yet placed, by the value they produce.
    let mut waits: HashMap<ValueId, Step> = HashMap::new();
    for s in steps {
        for r in &s.reads {
            if let Some(w) = waits.remove(r) {
                out.push(w);
            }
        }
        if !a2a(&s) {
            out.push(s);
            continue;
        }
        let operand = s.reads[0];
        let Kind::Collective { out_perm } = s.kind else {
            unreachable!("a2a() matched a collective")
        };
        let wait = Step::new(s.value, Kind::Wait, Vec::new(), s.cat, s.label.clone());
        let start = Step {
            kind: Kind::Start { out_perm },
            ..s
        };
        // Up past every step that neither makes nor reads the operand nor issues a
        // collective.
        let mut at = out.len();
        while at > 0 {
            let t = &out[at - 1];
            if issues(t) || t.outputs().any(|v| v == operand) || t.reads.contains(&operand) {
                break;
            }
            at -= 1;
        }
        out.insert(at, start);
        waits.insert(wait.value, wait);
    }
    // Collectives nothing reads (outputs): waited for at the end, in program order.
    let mut rest: Vec<Step> = waits.into_values().collect();
    rest.sort_by_key(|w| w.value);
    out.extend(rest);
    plan.steps = IdVec::from_vec(out);
}
