//! The rewrites of a lowered [`Plan`], each a module with one entry `run(&Program, &mut
//! Plan)` whose doc states the exactness condition it relies on: why the plan it leaves
//! computes the reference interpreter's bits.
//!
//! They run in the order of [`REWRITES`] (later ones match what earlier ones left, and
//! that order is part of what the plan is), then [`rounds`] and [`stream_outputs`], which
//! reorder steps and mark dots without changing any value. With [`Passes::None`] (the
//! reference mode) only [`rounds`] runs. Last, with
//! [`ExecOptions::overlap`](super::ExecOptions::overlap), [`overlap`] splits the
//! all-to-alls into a start and a wait. In debug builds and tests, [`Plan::verify`] checks
//! the plan after lowering and after every pass.

use super::plan::{Plan, PlanError};
use super::Passes;
use ir::{DType, Program, ValueId};

pub(crate) mod coded_relus;
pub(crate) mod dot_epilogues;
pub(crate) mod identities;
pub(crate) mod indicator_dots;
pub(crate) mod masked_dot_sums;
pub(crate) mod masked_dots;
pub(crate) mod overlap;
pub(crate) mod rounds;
pub(crate) mod stream_outputs;
pub(crate) mod sum_products;
pub(crate) mod transposes;

#[cfg(test)]
mod tests;

/// A rewrite: edits the plan of the program in place.
pub(crate) type Pass = fn(&Program, &mut Plan);

/// The rewrites of [`Passes::All`], in order, by name.
pub(crate) const REWRITES: [(&str, Pass); 8] = [
    ("coded_relus", coded_relus::run),
    ("transposes", transposes::run),
    ("identities", identities::run),
    ("masked_dots", masked_dots::run),
    ("masked_dot_sums", masked_dot_sums::run),
    ("dot_epilogues", dot_epilogues::run),
    ("sum_products", sum_products::run),
    ("indicator_dots", indicator_dots::run),
];

/// The passes that reorder or mark steps without changing a value, after the rewrites.
const SCHEDULE: [(&str, Pass); 2] = [
    ("rounds", rounds::run),
    ("stream_outputs", stream_outputs::run),
];

/// Run the passes `passes` selects on `plan`, checking it after each one in debug builds
/// (the error names the pass after which the plan broke).
pub(crate) fn run(
    p: &Program,
    plan: &mut Plan,
    passes: Passes,
    overlap: bool,
) -> Result<(), (&'static str, PlanError)> {
    check(p, plan, "lower")?;
    let rewrites: &[(&'static str, Pass)] = match passes {
        Passes::All => &REWRITES,
        Passes::None => &[],
    };
    let schedule: &[(&'static str, Pass)] = match passes {
        Passes::All => &SCHEDULE,
        Passes::None => &SCHEDULE[..1],
    };
    for &(name, pass) in rewrites.iter().chain(schedule) {
        pass(p, plan);
        check(p, plan, name)?;
    }
    if overlap {
        overlap::run(p, plan);
        check(p, plan, "overlap")?;
    }
    Ok(())
}

/// [`Plan::verify`] in debug builds and tests.
fn check(p: &Program, plan: &Plan, after: &'static str) -> Result<(), (&'static str, PlanError)> {
    if cfg!(debug_assertions) {
        plan.verify(p).map_err(|e| (after, e))?;
    }
    Ok(())
}

/// Whether value `v` is f32.
pub(crate) fn f32_value(p: &Program, v: ValueId) -> bool {
    p.instrs[v.index()].ty.dtype == DType::F32
}
