//! The typed plan the executor runs: [`Plan`], its [`Step`]s and their [`Kind`]s, its
//! text form ([`Display`](std::fmt::Display)) and its invariants ([`Plan::verify`]).
//!
//! Lowering ([`super::lower`]) makes a plan from a program; each rewrite of
//! [`super::passes`] edits it in place; liveness ([`super::liveness`]) reads the final plan
//! once, after the last rewrite.

use super::ids::{IdVec, StepId};
use crate::kernels::dot::DotPlan;
use crate::kernels::elementwise::Fused;
use ir::{Program, ValueId};
use std::fmt;
use thiserror::Error;

pub(crate) use crate::comm::SMALL_COLLECTIVE;

/// What a step computes and how.
#[derive(Debug)]
pub(crate) enum Kind {
    Param(String),
    PartitionId,
    /// `inputs` are the external values of the group, in `Node::Input` order (the step's
    /// reads); `inplace_ok[k]`: input `k` is read only elementwise (may be overwritten).
    Fused {
        f: Fused,
        inputs: Vec<ValueId>,
        inplace_ok: Vec<bool>,
    },
    /// Shares the buffer of this value.
    Alias(ValueId),
    /// The value of another, whose only reader this is, taken over buffer and all (a
    /// transpose whose layout the all-to-all producing its operand wrote).
    Move(ValueId),
    Dot(Box<DotPlan>),
    /// An f32 dot used only multiplied by one of the f32 values `masks` (its shape) and then
    /// summed: computed where a mask is non-zero, when that is exact
    /// ([`dot_masked`](crate::kernels::dot::dot_masked)), else as [`Kind::Dot`].
    MaskedDot {
        plan: Box<DotPlan>,
        masks: Vec<ValueId>,
    },
    /// A [`Kind::MaskedDot`] (value `dot`, never materialised) whose products with each mask
    /// are read only by one sum over the product's column dims: computes those sums
    /// directly, `terms` = (mask, the reduction's value), at most two (this step's value and
    /// its `also`) — [`dot_masked_sums`](crate::kernels::dot::dot_masked_sums), or the dense
    /// product and [`masked_row_sums`](crate::kernels::dot::masked_row_sums).
    MaskedDotSums {
        plan: Box<DotPlan>,
        dot: ValueId,
        terms: Vec<(ValueId, ValueId)>,
    },
    /// An f32 dot (value `dot`) whose batch entries go, each right after its GEMM, through
    /// the f32 fused group `f` that reads it as input `slot`: the group's result is this
    /// step's value. With `keep`, the dot's result is materialised too (other steps read
    /// it); without, the group runs in place over it.
    DotFused {
        plan: Box<DotPlan>,
        dot: ValueId,
        f: Fused,
        inputs: Vec<ValueId>,
        slot: usize,
        keep: bool,
    },
    /// One instruction on its native kernel (`super::kernel`).
    Kernel,
    /// One instruction computed by the reference interpreter (the reference mode).
    Oracle,
    /// The f32 sum of every element of `a * b` (two f32 values of one shape), the multiply
    /// group and the reduction that was its only reader in one pass (`masked_row_sums`
    /// over one row): the step reads `a` and `b`.
    SumProduct,
    /// A collective between segments; with `out_perm`, each device's result is written
    /// transposed by it (an all-to-all whose only reader is a transpose, which takes the
    /// result over: [`Kind::Move`]).
    Collective {
        out_perm: Option<Vec<usize>>,
    },
    /// A collective between segments computed by the reference interpreter (the reference
    /// mode).
    OracleCollective,
    /// The first half of a [`Kind::Collective`] split by the `overlap` pass: hands the
    /// operand to the [`Communicator`](crate::comm::Communicator) and returns; the
    /// collective's value does not exist yet (the step produces nothing).
    Start {
        out_perm: Option<Vec<usize>>,
    },
    /// The second half: waits for the collective its [`Kind::Start`] began and produces its
    /// value. Reads nothing.
    Wait,
}

impl Kind {
    /// Whether the step runs between segments, over every device at once.
    pub(crate) fn is_collective(&self) -> bool {
        matches!(
            self,
            Kind::Collective { .. } | Kind::OracleCollective | Kind::Start { .. } | Kind::Wait
        )
    }

    /// The kind's name in the plan's text.
    fn name(&self) -> &'static str {
        match self {
            Kind::Param(_) => "param",
            Kind::PartitionId => "partition_id",
            Kind::Fused { .. } => "fused",
            Kind::Alias(_) => "alias",
            Kind::Move(_) => "move",
            Kind::Dot(_) => "dot",
            Kind::MaskedDot { .. } => "masked_dot",
            Kind::MaskedDotSums { .. } => "masked_dot_sums",
            Kind::DotFused { .. } => "dot_fused",
            Kind::Kernel => "kernel",
            Kind::Oracle => "oracle",
            Kind::SumProduct => "sum_product",
            Kind::Collective { .. } => "collective",
            Kind::OracleCollective => "oracle_collective",
            Kind::Start { .. } => "start",
            Kind::Wait => "wait",
        }
    }
}

/// One step of a plan: it produces `value` (and `also`) from `reads`.
#[derive(Debug)]
pub(crate) struct Step {
    /// The instruction whose value this step produces.
    pub(crate) value: ValueId,
    /// A second value it produces (a dot materialised by [`Kind::DotFused`], a second sum of
    /// [`Kind::MaskedDotSums`]).
    pub(crate) also: Option<ValueId>,
    pub(crate) kind: Kind,
    /// Values read.
    pub(crate) reads: Vec<ValueId>,
    /// The name of the step in profiles.
    pub(crate) label: String,
    /// The category of the step in profiles.
    pub(crate) cat: &'static str,
}

impl Step {
    /// A step producing `value` from `reads`.
    pub(crate) fn new(
        value: ValueId,
        kind: Kind,
        reads: Vec<ValueId>,
        cat: &'static str,
        label: String,
    ) -> Step {
        Step {
            value,
            also: None,
            kind,
            reads,
            label,
            cat,
        }
    }

    /// The values the step produces: `value`, then `also` (nothing for a
    /// [`Kind::Start`], whose value its wait produces).
    pub(crate) fn outputs(&self) -> impl Iterator<Item = ValueId> {
        let starts = matches!(self.kind, Kind::Start { .. });
        std::iter::once(self.value)
            .filter(move |_| !starts)
            .chain(self.also)
    }
}

/// A program's steps, in the order every device runs them.
pub struct Plan {
    pub(crate) steps: IdVec<StepId, Step>,
    /// The number of values of the program.
    pub(crate) values: usize,
}

/// A broken invariant of a plan, naming the step where it shows.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("step {step} ({label}): {problem}")]
pub struct PlanError {
    pub step: StepId,
    pub label: String,
    pub problem: PlanProblem,
}

/// What is wrong with a plan step.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanProblem {
    #[error("{value} is produced a second time (first by step {first})")]
    ProducedTwice { value: ValueId, first: StepId },
    #[error("reads {value}, which no earlier step produces")]
    ReadBeforeProduced { value: ValueId },
    #[error("{value} is not a value of the program")]
    NoSuchValue { value: ValueId },
    #[error("its reads do not match its kind: {0}")]
    Reads(&'static str),
    #[error("moves {value}, which step {other} also reads")]
    MovedValueShared { value: ValueId, other: StepId },
    #[error("large collective {value} comes after the large collective {later}, which follows it in the program")]
    CollectiveOrder { value: ValueId, later: ValueId },
    #[error("runs {value} as a collective, which its instruction is not")]
    NotACollective { value: ValueId },
    #[error("reads {value}, whose buffer step {released} released")]
    ReadAfterRelease { value: ValueId, released: StepId },
    #[error("releases the buffer of program output {value}")]
    OutputReleased { value: ValueId },
    #[error("waits for {value}, which no earlier step started (or another waited for)")]
    WaitWithoutStart { value: ValueId },
    #[error("starts {value}, which no later step waits for")]
    NeverWaited { value: ValueId },
}

impl Plan {
    /// An empty plan for a program of `values` values.
    pub(crate) fn new(values: usize) -> Plan {
        Plan {
            steps: IdVec::new(),
            values,
        }
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether the plan has no step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The value step `si` produces (its first), if there is such a step.
    pub fn value_of(&self, si: StepId) -> Option<ValueId> {
        self.steps.get(si).map(|s| s.value)
    }

    /// The step producing each value as its `value` (not its `also`), and the steps reading
    /// each value (in order, each once): what the rewrites match on.
    pub(crate) fn producers_and_readers(
        &self,
    ) -> (IdVec<ValueId, Option<StepId>>, IdVec<ValueId, Vec<StepId>>) {
        let mut producer = IdVec::filled(None, self.values);
        let mut readers: IdVec<ValueId, Vec<StepId>> = IdVec::filled(Vec::new(), self.values);
        for (si, s) in self.steps.iter_enumerated() {
            producer[s.value] = Some(si);
            for &r in &s.reads {
                let rs = &mut readers[r];
                if rs.last() != Some(&si) {
                    rs.push(si);
                }
            }
        }
        (producer, readers)
    }

    /// Remove the steps marked in `marked` (one flag per step), keeping the order of the rest.
    pub(crate) fn remove_marked(&mut self, marked: &IdVec<StepId, bool>) {
        let mut flags = marked.iter();
        self.steps
            .retain(|_| !flags.next().copied().unwrap_or(false));
    }

    /// The error `problem` at step `si`.
    pub(crate) fn error(&self, si: StepId, problem: PlanProblem) -> PlanError {
        PlanError {
            step: si,
            label: self.steps[si].label.clone(),
            problem,
        }
    }

    /// Check the plan's invariants against its program `p`: every value is produced by one
    /// step, before every step that reads it; each kind reads what it uses (a fused group
    /// its inputs, an alias or a move its source, which nothing else reads after a move);
    /// the collectives are the program's and only small ones moved (the large collectives
    /// keep program order; small ones may wait for a later round. Every rank computes the
    /// order from the program alone, so all issue their collectives in one order).
    pub fn verify(&self, p: &Program) -> Result<(), PlanError> {
        let n = p.instrs.len();
        let mut made: IdVec<ValueId, Option<StepId>> = IdVec::filled(None, n);
        let fail = |si: StepId, problem: PlanProblem| self.error(si, problem);
        // The largest program index of a large collective so far.
        let mut last_large: Option<ValueId> = None;
        // Collectives started and not yet waited for, with their start steps.
        let mut in_flight: Vec<(ValueId, StepId)> = Vec::new();
        for (si, s) in self.steps.iter_enumerated() {
            for v in s.reads.iter().copied().chain(s.outputs()) {
                if v.index() >= n {
                    return Err(fail(si, PlanProblem::NoSuchValue { value: v }));
                }
            }
            for &r in &s.reads {
                if made[r].is_none() {
                    return Err(fail(si, PlanProblem::ReadBeforeProduced { value: r }));
                }
            }
            for v in s.outputs() {
                if let Some(first) = made[v] {
                    let problem = PlanProblem::ProducedTwice { value: v, first };
                    return Err(fail(si, problem));
                }
                made[v] = Some(si);
            }
            if let Some(problem) = reads_problem(s) {
                return Err(fail(si, problem));
            }
            match s.kind {
                Kind::Start { .. } => in_flight.push((s.value, si)),
                Kind::Wait => match in_flight.iter().position(|&(v, _)| v == s.value) {
                    Some(at) => {
                        in_flight.remove(at);
                    }
                    None => {
                        let problem = PlanProblem::WaitWithoutStart { value: s.value };
                        return Err(fail(si, problem));
                    }
                },
                _ => {}
            }
            if s.kind.is_collective() {
                let op = &p.instrs[s.value.index()].op;
                if !op.is_collective() {
                    return Err(fail(si, PlanProblem::NotACollective { value: s.value }));
                }
                let large = |v: ValueId| p.instrs[v.index()].ty.num_elements() >= SMALL_COLLECTIVE;
                // Small collectives may wait past large ones (a small all-reduce of another
                // one's result waits a round); large ones keep program order.
                if s.reads.first().is_some_and(|&r| large(r)) {
                    if let Some(later) = last_large.filter(|&l| l > s.value) {
                        let problem = PlanProblem::CollectiveOrder {
                            value: s.value,
                            later,
                        };
                        return Err(fail(si, problem));
                    }
                    last_large = Some(s.value);
                }
            }
        }
        if let Some(&(value, si)) = in_flight.first() {
            return Err(fail(si, PlanProblem::NeverWaited { value }));
        }
        // A moved value has no other reader.
        let (_, readers) = self.producers_and_readers();
        for (si, s) in self.steps.iter_enumerated() {
            if let Kind::Move(src) = s.kind {
                if let Some(&other) = readers[src].iter().find(|&&r| r != si) {
                    let problem = PlanProblem::MovedValueShared { value: src, other };
                    return Err(fail(si, problem));
                }
            }
        }
        Ok(())
    }
}

/// How a step's reads disagree with its kind, if they do.
fn reads_problem(s: &Step) -> Option<PlanProblem> {
    let bad = |what| Some(PlanProblem::Reads(what));
    match &s.kind {
        Kind::Param(_) | Kind::PartitionId if !s.reads.is_empty() => bad("a source reads nothing"),
        Kind::Fused {
            f,
            inputs,
            inplace_ok,
        } => {
            if *inputs != s.reads {
                bad("a group reads its inputs")
            } else if inplace_ok.len() != inputs.len() || f.n_inputs != inputs.len() {
                bad("a group has one in-place flag per input")
            } else {
                None
            }
        }
        Kind::Alias(src) | Kind::Move(src) if s.reads != [*src] => bad("an alias reads its source"),
        Kind::Dot(_) | Kind::SumProduct if s.reads.len() != 2 => bad("a product reads two values"),
        Kind::MaskedDot { masks, .. } if s.reads.get(2..) != Some(&masks[..]) => {
            bad("a masked dot reads its operands, then its masks")
        }
        Kind::MaskedDotSums { terms, .. } => {
            let masks: Vec<ValueId> = terms.iter().map(|&(m, _)| m).collect();
            let outs: Vec<ValueId> = terms.iter().map(|&(_, u)| u).collect();
            if s.reads.get(2..) != Some(&masks[..]) {
                bad("summed masked dots read their operands, then their masks")
            } else if outs != s.outputs().collect::<Vec<_>>() {
                bad("summed masked dots produce their sums")
            } else {
                None
            }
        }
        Kind::DotFused {
            dot, inputs, keep, ..
        } => {
            let others: Vec<ValueId> = inputs.iter().copied().filter(|v| v != dot).collect();
            if s.reads.get(2..) != Some(&others[..]) {
                bad("a dot with an epilogue reads its operands, then the group's others")
            } else if s.also != keep.then_some(*dot) {
                bad("a kept dot is the step's second value")
            } else {
                None
            }
        }
        Kind::Collective { .. } | Kind::OracleCollective | Kind::Start { .. }
            if s.reads.len() != 1 =>
        {
            bad("a collective reads its operand")
        }
        Kind::Wait if !s.reads.is_empty() => bad("a wait reads nothing"),
        Kind::Param(_)
        | Kind::PartitionId
        | Kind::Alias(_)
        | Kind::Move(_)
        | Kind::Dot(_)
        | Kind::MaskedDot { .. }
        | Kind::Kernel
        | Kind::Oracle
        | Kind::SumProduct
        | Kind::Collective { .. }
        | Kind::OracleCollective
        | Kind::Start { .. }
        | Kind::Wait => None,
    }
}

impl fmt::Display for Plan {
    /// One line per step: `s7 %12 = dot(%3, %9) B=1 M=8 N=4 K=16 | dot_general %12`, the
    /// outputs, the kind and its reads, what the kind adds, and the step's profile label.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (si, s) in self.steps.iter_enumerated() {
            let outs: Vec<String> = s.outputs().map(|v| v.to_string()).collect();
            let reads: Vec<String> = s.reads.iter().map(|v| v.to_string()).collect();
            write!(
                f,
                "{si} {} = {}({})",
                outs.join(", "),
                s.kind.name(),
                reads.join(", ")
            )?;
            let dims = |d: &DotPlan| {
                let mut x = format!(" B={} M={} N={} K={}", d.b, d.m, d.n, d.k);
                if d.writes_transposed() {
                    x.push_str(" transposed");
                }
                for (side, on) in ["lhs", "rhs"].iter().zip(d.indicators()) {
                    if on {
                        x.push_str(&format!(" {side}=indicator"));
                    }
                }
                x
            };
            match &s.kind {
                Kind::Param(name) => write!(f, " {name:?}")?,
                Kind::Fused { f: g, .. } => write!(f, " nodes={}", g.nodes.len())?,
                Kind::Dot(d) => write!(f, "{}", dims(d))?,
                Kind::MaskedDot { plan, .. } => write!(f, "{}", dims(plan))?,
                Kind::MaskedDotSums { plan, dot, .. } => write!(f, "{} dot={dot}", dims(plan))?,
                Kind::DotFused {
                    plan, dot, f: g, ..
                } => write!(f, "{} dot={dot} nodes={}", dims(plan), g.nodes.len())?,
                Kind::Collective {
                    out_perm: Some(perm),
                }
                | Kind::Start {
                    out_perm: Some(perm),
                } => write!(f, " out_perm={perm:?}")?,
                Kind::PartitionId
                | Kind::Alias(_)
                | Kind::Move(_)
                | Kind::Kernel
                | Kind::Oracle
                | Kind::SumProduct
                | Kind::Collective { out_perm: None }
                | Kind::Start { out_perm: None }
                | Kind::Wait
                | Kind::OracleCollective => {}
            }
            writeln!(f, " | {}", s.label)?;
        }
        Ok(())
    }
}

/// Whether value `v` is one of the program's outputs.
pub(crate) fn is_output(p: &Program, v: ValueId) -> bool {
    p.outputs.iter().any(|(_, o)| *o == v)
}

/// The name of instruction `v` in profiles: `dot_general %12`.
pub(crate) fn op_label(p: &Program, v: ValueId) -> String {
    format!("{} %{}", p.instrs[v.index()].op.name(), v.0)
}
