//! The device executor: runs one per-device program on every mesh position this process
//! owns, bulk-synchronously, with native kernels ([`crate::kernels`]).
//!
//! **Preparation** ([`Executable::new`], once per program) is a small compiler of named
//! passes over a typed [`Plan`]:
//! - [`lower`]: one step per live instruction, elementwise chains fused into groups
//!   evaluated in one pass over L1-sized chunks (splat constants, iotas and broadcasts
//!   inlined as generated leaves), dots normalised once ([`DotPlan`](crate::kernels::dot::DotPlan)).
//! - [`passes`]: the rewrites, each a module with one entry `run(&Program, &mut Plan)`
//!   and the exactness condition it relies on: coded ReLUs, folded transposes, identities
//!   as aliases, masked dots and their sums, dot epilogues, sums of products, indicator
//!   reads; then the collective rounds and streamed outputs. [`Plan::verify`] checks the
//!   plan after lowering and every pass in debug builds and tests.
//! - [`liveness`]: computed once, from the final plan: buffer classes, releases after each
//!   buffer's last reader (outputs kept), the supports values share and the early releases
//!   they allow; the segments (maximal runs of non-collective steps; each collective is a
//!   segment alone) and the all-to-alls placed by their senders.
//!
//! [`ExecOptions::reference`] is the same pipeline with no passes: every instruction a
//! step computed by the reference interpreter (a differential-testing mode that isolates
//! executor plumbing from kernel numerics).
//!
//! **Running** ([`Executable::run`], `run`): for each local segment, every device runs the
//! whole segment as one task on the one rayon pool (devices in parallel; kernels inside
//! split their work on the same pool, so busy threads never exceed the pool's). Tasks
//! never block. Between segments, each collective runs over all device buffers through the
//! [`Communicator`] (`collective`). Where the communicator shares memory (in-process
//! devices), an all-to-all whose operand exists when the segment before its round ends is
//! instead placed by its senders: the results are allocated before that segment and each
//! device task, as it ends, copies its blocks into every receiver's result. There, too,
//! the pool's other threads stay busy through the run and a device task that ends waits
//! busily for its segment's last one (`schedule`), instead of falling asleep at every
//! barrier. Deterministic and deadlock-free: no task waits for a peer (the busy waits end
//! by themselves).
//!
//! **Memory**: freed buffers go to a per-device pool (exact dtype and length), kept across
//! runs of the same [`Executable`] and capped at the run's peak of live bytes; a fused group
//! whose input dies at that step and has the output's dtype and length writes in place.
//! [`RunResult::peak_bytes_per_device`] is the peak of live buffer bytes (parameters
//! included, aliases counted once, a collective's operand until its results exist);
//! `peak_resident_bytes_per_device` adds the pool. [`Executable::memory_plan`] computes the
//! same peak from the plan alone, with the buffers live there (`memory`).

mod collective;
mod ids;
mod kernel;
pub(crate) mod liveness;
pub(crate) mod lower;
mod memory;
pub(crate) mod passes;
pub(crate) mod plan;
mod run;
mod schedule;
mod steps;

pub use ids::StepId;
pub use memory::{Held, LiveBuffer, MemoryOptions, MemoryPlan};
pub use plan::{Plan, PlanError, PlanProblem};

use crate::comm::{CommError, Communicator};
use crate::error::RuntimeError;
use crate::kernels::dot::Tables;
use crate::profile::Profiler;
use crate::tensor::HostTensor;
use ir::Program;
use liveness::{Liveness, Segments};
use plan::Kind;
use run::Pool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ExecError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("{got} input maps for {want} local devices; pass one per local mesh position")]
    DeviceCount { want: usize, got: usize },
    /// [`Executable::run`] of an executable prepared by [`Executable::for_planning`].
    #[error("this program was prepared for planning only (Executable::for_planning); prepare it with Executable::new to run it")]
    PlanningOnly,
    /// A pass left a plan that breaks an invariant (a bug of the executor, caught by
    /// [`Plan::verify`] in debug builds).
    #[error("the plan after {pass}: {source}")]
    Plan {
        pass: &'static str,
        source: PlanError,
    },
}

/// Which passes prepare a program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Passes {
    /// Fusion, dot plans and every rewrite; native kernels.
    #[default]
    All,
    /// None: every instruction one step computed by the reference interpreter (kernels and
    /// collectives), on rayon's own scheduling (no sends, no busy waits); buffers, liveness
    /// and collective rounds as in [`Passes::All`].
    None,
}

/// How [`Executable::with_options`] prepares a program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub passes: Passes,
    /// Split every all-to-all into a start and a wait (the `overlap` pass): the
    /// communicator runs it while the steps up to its first reader compute, where it can
    /// ([`Communicator::start`]). Off by default; all-to-alls then run between segments, or
    /// placed by their senders in process.
    pub overlap: bool,
}

impl ExecOptions {
    /// Native kernels and every pass (what [`Executable::new`] uses).
    pub fn native() -> ExecOptions {
        ExecOptions {
            passes: Passes::All,
            overlap: false,
        }
    }

    /// These options with the `overlap` pass on or off ([`ExecOptions::overlap`]).
    pub fn with_overlap(self, overlap: bool) -> ExecOptions {
        ExecOptions { overlap, ..self }
    }

    /// No passes: the reference interpreter computes every step, with the executor's
    /// buffers, liveness and collective rounds (a differential-testing mode that isolates
    /// executor plumbing from kernel numerics).
    pub fn reference() -> ExecOptions {
        ExecOptions {
            passes: Passes::None,
            overlap: false,
        }
    }
}

/// Bytes moved by one kind of collective in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveStat {
    pub kind: &'static str,
    pub count: usize,
    /// Sum over local devices of the bytes each sends to other devices
    /// ([`wire_bytes`](crate::comm::wire_bytes)).
    pub bytes: usize,
}

/// What a run produced: outputs per local device, memory and communication.
pub struct RunResult {
    pub outputs: Vec<HashMap<String, HostTensor>>,
    /// Peak bytes of live buffers on any device (parameters included).
    pub peak_bytes_per_device: usize,
    /// Peak of live plus pooled (freed, kept for reuse) bytes on any device.
    pub peak_resident_bytes_per_device: usize,
    /// Sum over local devices and collectives of the bytes sent to other devices.
    pub collective_bytes: usize,
    /// The same per collective kind, in first-use order.
    pub collectives: Vec<CollectiveStat>,
}

/// A program prepared for execution: its plan, liveness and segments.
pub struct Executable {
    program: Program,
    options: ExecOptions,
    plan: Plan,
    live: Liveness,
    order: Segments,
    pools: Mutex<Vec<Pool>>,
    /// [`Tables::ShapesOnly`] for an executable that is planned, never run.
    tables: Tables,
}

impl Executable {
    /// Verify and prepare `p` (see the module doc).
    pub fn new(p: &Program) -> Result<Executable, ExecError> {
        Executable::with_options(p, ExecOptions::native())
    }

    /// [`Executable::new`] with `options` ([`ExecOptions::reference`]: no passes, every
    /// step computed by the reference interpreter).
    pub fn with_options(p: &Program, options: ExecOptions) -> Result<Executable, ExecError> {
        Executable::prepare(p, options, Tables::Built)
    }

    /// [`Executable::new`] for planning only: the same plan, liveness and
    /// [`memory_plan`](Executable::memory_plan), but no dot builds the offset tables its
    /// kernels read (their size follows the operands' dims, the work of planning does not
    /// then grow with the shapes). [`Executable::run`] refuses it.
    pub fn for_planning(p: &Program) -> Result<Executable, ExecError> {
        Executable::for_planning_with(p, ExecOptions::native())
    }

    /// [`Executable::for_planning`] with `options` (the run's: with
    /// [`ExecOptions::overlap`], collectives in flight hold their operands).
    pub fn for_planning_with(p: &Program, options: ExecOptions) -> Result<Executable, ExecError> {
        Executable::prepare(p, options, Tables::ShapesOnly)
    }

    fn prepare(p: &Program, options: ExecOptions, tables: Tables) -> Result<Executable, ExecError> {
        if p.mesh.is_none() {
            if let Some((index, ins)) = p
                .instrs
                .iter()
                .enumerate()
                .find(|(_, i)| i.op.is_collective())
            {
                return Err(RuntimeError::NoMesh {
                    index,
                    op: ins.op.name().to_string(),
                }
                .into());
            }
        }
        ir::verify(p).map_err(RuntimeError::from)?;
        let mut plan = lower::lower(p, options.passes, tables);
        passes::run(p, &mut plan, options.passes, options.overlap)
            .map_err(|(pass, source)| ExecError::Plan { pass, source })?;
        let live = Liveness::of(p, &plan);
        if cfg!(debug_assertions) {
            live.verify(p, &plan).map_err(|source| ExecError::Plan {
                pass: "liveness",
                source,
            })?;
        }
        let order = Segments::of(p, &plan);
        Ok(Executable {
            program: p.clone(),
            options,
            plan,
            live,
            order,
            pools: Mutex::new(Vec::new()),
            tables,
        })
    }

    /// The plan the devices run (its text: [`Plan`]'s `Display`).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The options the program was prepared with.
    pub fn options(&self) -> ExecOptions {
        self.options
    }

    /// Rounds of collectives per run: runs of collectives with no local steps between them
    /// (each round is one barrier across the device tasks; see [`passes::rounds`]).
    pub fn collective_rounds(&self) -> usize {
        self.order.rounds()
    }

    /// The prepared program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Number of steps (kernels, fused groups, aliases, collectives, parameters).
    pub fn num_steps(&self) -> usize {
        self.plan.len()
    }

    /// Number of ReLUs whose pre-activation is read back from their coded result instead of
    /// being kept ([`passes::coded_relus`]).
    pub fn coded_relus(&self) -> usize {
        self.plan
            .steps
            .iter()
            .filter(|s| match &s.kind {
                Kind::Fused { f, .. } | Kind::DotFused { f, .. } => f
                    .nodes
                    .iter()
                    .any(|(n, _)| matches!(n, crate::kernels::elementwise::Node::ReluCode(_))),
                _ => false,
            })
            .count()
    }

    /// Number of values that share another buffer's support (`convert(x != 0)` groups; see
    /// [`Support`](crate::kernels::dot::Support)).
    pub fn shared_supports(&self) -> usize {
        let live = &self.live;
        live.class
            .ids()
            .filter(|&v| live.support_of[v].class() != live.class[v])
            .count()
    }

    /// Number of values released before their last reader when a run finds their support
    /// (their later readers are summed masked dots or plain dots; see the module docs).
    pub fn sparse_releases(&self) -> usize {
        self.live.frees_sparse.iter().map(Vec::len).sum()
    }

    /// Number of dot operands read as indicators, `convert(x != 0)` computed by no step
    /// ([`passes::indicator_dots`]).
    pub fn indicator_reads(&self) -> usize {
        self.plan
            .steps
            .iter()
            .map(|s| match &s.kind {
                Kind::Dot(plan) => plan.indicators().iter().filter(|&&b| b).count(),
                _ => 0,
            })
            .sum()
    }

    /// Number of fused groups and of instructions folded into them.
    pub fn fusion_stats(&self) -> (usize, usize) {
        let mut groups = 0;
        let mut ops = 0;
        for s in self.plan.steps.iter() {
            if let Kind::Fused { f, .. } | Kind::DotFused { f, .. } = &s.kind {
                groups += 1;
                ops += f.ops();
            }
        }
        (groups, ops)
    }

    /// Run on the local devices of `comm`; `inputs[j]` feeds `comm.local_positions()[j]`
    /// (copied into device buffers). Events go to `profiler` if given.
    pub fn run(
        &self,
        comm: &dyn Communicator,
        inputs: &[HashMap<String, HostTensor>],
        profiler: Option<&Profiler>,
    ) -> Result<RunResult, ExecError> {
        let shared: Vec<HashMap<String, Arc<HostTensor>>> = inputs
            .iter()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), Arc::new(v.clone())))
                    .collect()
            })
            .collect();
        self.run_shared(comm, &shared, profiler)
    }

    /// Give the buffers of a run's outputs back to the device pools (for repeated steps:
    /// the next run reuses them instead of faulting in fresh pages).
    pub fn recycle(&self, outputs: Vec<HashMap<String, HostTensor>>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for (j, m) in outputs.into_iter().enumerate() {
            let Some(pool) = pools.get_mut(j) else { break };
            let cap = pool.cap;
            for (_, t) in m {
                pool.give(t.data, cap);
            }
        }
    }
}

/// Run `p` on the local devices of `comm`; `inputs[j]` feeds `comm.local_positions()[j]`.
pub fn run_devices(
    p: &Program,
    comm: &dyn Communicator,
    inputs: &[HashMap<String, HostTensor>],
) -> Result<RunResult, ExecError> {
    run_devices_profiled(p, comm, inputs, None)
}

/// [`run_devices`] recording per-op and per-collective timings into `profiler`.
pub fn run_devices_profiled(
    p: &Program,
    comm: &dyn Communicator,
    inputs: &[HashMap<String, HostTensor>],
    profiler: Option<&Profiler>,
) -> Result<RunResult, ExecError> {
    Executable::new(p)?.run(comm, inputs, profiler)
}
