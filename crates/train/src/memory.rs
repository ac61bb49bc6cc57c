//! Memory before running: what a program (or a training run) will hold, from its planned
//! per-device peak (the executor's policy: every value freed after its last use), checked
//! against the memory this host has available, so a program that cannot fit is refused with
//! one line naming its size and its biggest tensors, before a byte is allocated.

use ir::{Program, Type};
use thiserror::Error;

/// Most devices one process runs as tasks (more is not a mesh this host can step through in
/// useful time: run them as MPI ranks across machines).
pub const MAX_IN_PROCESS_DEVICES: usize = 4096;

/// Refuse `devices` in-process devices beyond [`MAX_IN_PROCESS_DEVICES`], naming `flag`.
pub fn check_in_process_devices(devices: usize, flag: &str) -> Result<(), String> {
    if devices > MAX_IN_PROCESS_DEVICES {
        Err(format!(
            "{flag} asks for {devices} devices in this process; one process runs at most {MAX_IN_PROCESS_DEVICES} (as tasks on its cores): use fewer, or one device per MPI rank across machines (`mpirun -np N ... --backend mpi`)"
        ))
    } else {
        Ok(())
    }
}

/// A program or run that does not fit.
#[derive(Debug, Error)]
#[error("{what} needs about {} ({breakdown}) but {}; its biggest tensors: {biggest}; use a smaller model or batch, more devices, or --max-memory to set the limit", human(*need), limit.describe())]
pub struct MemoryError {
    pub what: String,
    pub need: u64,
    pub breakdown: String,
    pub limit: Limit,
    pub biggest: String,
}

/// The memory a check allows, and where that figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `--max-memory`.
    Given(u64),
    /// What the host has available now.
    Available(u64),
}

impl Limit {
    pub fn bytes(self) -> u64 {
        match self {
            Limit::Given(b) | Limit::Available(b) => b,
        }
    }
    fn describe(self) -> String {
        match self {
            Limit::Given(b) => format!("--max-memory allows {}", human(b)),
            Limit::Available(b) => format!("this host has {} available", human(b)),
        }
    }
}

/// Bytes as a short human string (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    runtime::alloc::human_bytes(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// The memory this host has available now (`MemAvailable` of `/proc/meminfo`), if known.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The limit to check against: `max` if given, else what the host has available. `None`
/// when neither is known (then nothing is refused).
pub fn limit(max: Option<u64>) -> Option<Limit> {
    match max {
        Some(m) => Some(Limit::Given(m)),
        None => available_bytes().map(Limit::Available),
    }
}

/// Planned peak bytes on one device of a (per-device) program.
pub fn program_peak(p: &Program) -> u64 {
    spmd::report::peak_bytes(p) as u64
}

/// `names` with their types, the largest first, as `name f32[..] 1.0 GiB` (at most `n`).
pub fn biggest<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Type)>, n: usize) -> String {
    let mut v: Vec<(&str, &Type)> = tensors.into_iter().collect();
    v.sort_by_key(|(_, t)| std::cmp::Reverse(t.size_bytes()));
    v.iter()
        .take(n)
        .map(|(name, t)| format!("`{name}` {t} {}", human(t.size_bytes() as u64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Refuse `need` bytes when over the limit (`max`, or the host's available memory).
pub fn check(
    what: &str,
    need: u64,
    breakdown: String,
    max: Option<u64>,
    biggest: impl FnOnce() -> String,
) -> Result<(), MemoryError> {
    match limit(max) {
        Some(limit) if need > limit.bytes() => Err(MemoryError {
            what: what.to_string(),
            need,
            breakdown,
            limit,
            biggest: biggest(),
        }),
        _ => Ok(()),
    }
}

/// What the bytes live at a program's peak hold, per device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Breakdown {
    /// Parameters with a next value (`new/<x>`) or a gradient output (`grad_<x>`) that the
    /// forward pass reads, and their new values.
    pub weights: u64,
    /// Parameter gradients and the partial sums they are accumulated from.
    pub gradients: u64,
    /// State only the optimizer reads (Adafactor's factors, Adam's moments) and its new value.
    pub optimizer_state: u64,
    /// Forward values that the backward pass reads.
    pub activations: u64,
    /// Everything else a step computes and frees.
    pub temporaries: u64,
    /// Collective operands while their results are made, all-to-all results placed before
    /// their round, and collective results that are not gradients.
    pub collective_buffers: u64,
    /// The batch and other inputs that are not state.
    pub inputs: u64,
}

impl Breakdown {
    /// The sum of every part: the peak.
    pub fn total(&self) -> u64 {
        self.weights
            + self.gradients
            + self.optimizer_state
            + self.activations
            + self.temporaries
            + self.collective_buffers
            + self.inputs
    }

    /// The parts as `(name, bytes)`, in a fixed order.
    pub fn parts(&self) -> [(&'static str, u64); 7] {
        [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations", self.activations),
            ("temporaries", self.temporaries),
            ("collective buffers", self.collective_buffers),
            ("inputs", self.inputs),
        ]
    }

    /// One line: `weights 1.0 MiB, gradients ..., ...` (parts of zero bytes left out).
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .parts()
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|(n, b)| format!("{n} {}", human(*b)))
            .collect();
        parts.join(", ")
    }
}

/// A program's planned per-device peak and what it holds.
#[derive(Clone, Debug)]
pub struct PlannedMemory {
    pub plan: runtime::MemoryPlan,
    pub breakdown: Breakdown,
    /// Bytes of the program's inputs (weights, optimizer state, the batch) not live at the
    /// peak: the executor counts an input from its first reader to its last, while the
    /// caller holds it through the whole step.
    pub inputs_elsewhere: u64,
}

impl PlannedMemory {
    /// What a device holds at the peak, with the inputs the caller keeps.
    pub fn resident_bytes(&self) -> u64 {
        self.plan.peak_bytes as u64 + self.inputs_elsewhere
    }
}

/// Plan the memory of per-device program `p` with the executor's own buffer planning
/// ([`runtime::Executable::memory_plan`]): exact, and no tensor allocated.
pub fn plan_memory(
    p: &Program,
    opts: runtime::MemoryOptions,
) -> Result<PlannedMemory, runtime::ExecError> {
    let exe = runtime::Executable::for_planning(p)?;
    Ok(plan_of(&exe, opts))
}

/// [`plan_memory`] of a prepared executable.
pub fn plan_of(exe: &runtime::Executable, opts: runtime::MemoryOptions) -> PlannedMemory {
    let p = exe.program();
    let plan = exe.memory_plan(opts);
    let breakdown = breakdown(p, &plan);
    let is_param = |v: ir::ValueId| matches!(p.instrs[v.index()].op, ir::Op::Parameter { .. });
    let inputs: u64 = p
        .params()
        .iter()
        .map(|&(_, v)| p.ty(v).size_bytes() as u64)
        .sum();
    let at_peak: u64 = plan
        .at_peak
        .iter()
        .filter(|b| b.held == runtime::Held::Value && is_param(b.value))
        .map(|b| b.bytes as u64)
        .sum();
    PlannedMemory {
        plan,
        breakdown,
        inputs_elsewhere: inputs.saturating_sub(at_peak),
    }
}

/// What a device holds over a whole step, whatever the peak: its weights, the gradients
/// the optimizer reads, its optimizer state (all in their per-device layouts), and the
/// forward values the backward pass reads (the sum over the step, as if all were kept at
/// once; the executor frees each after its last reader). Weights and state fall as 1/N
/// over an axis they are sharded over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Held {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    pub saved_activations: u64,
}

/// Whether instruction `i` of `p` is the optimizer's (its scope is under `optimizer`).
fn in_optimizer(p: &Program, i: usize) -> bool {
    p.scope(ir::ValueId(i as u32)).path.starts_with("optimizer")
}

/// [`Held`] of per-device program `p`.
pub fn held(p: &Program) -> Held {
    let roles = roles(p);
    let optimizer = |i: usize| in_optimizer(p, i);
    let mut read_by_optimizer = vec![false; p.instrs.len()];
    for (i, ins) in p.instrs.iter().enumerate() {
        if optimizer(i) {
            for o in &ins.operands {
                read_by_optimizer[o.index()] = true;
            }
        }
    }
    let is_param = |i: usize| matches!(p.instrs[i].op, ir::Op::Parameter { .. });
    let mut h = Held::default();
    for (i, role) in roles.iter().enumerate() {
        let bytes = p.instrs[i].ty.size_bytes() as u64;
        match role {
            Role::Weight if is_param(i) => h.weights += bytes,
            Role::OptimizerState if is_param(i) => h.optimizer_state += bytes,
            Role::Gradient if read_by_optimizer[i] && !optimizer(i) => h.gradients += bytes,
            Role::Activation => h.saved_activations += bytes,
            _ => {}
        }
    }
    h
}

/// What each value of a program is, for [`Breakdown`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Weight,
    Gradient,
    OptimizerState,
    Activation,
    Temporary,
    Collective,
    Input,
}

/// Sort the buffers live at `plan`'s peak into the parts of a [`Breakdown`].
pub fn breakdown(p: &Program, plan: &runtime::MemoryPlan) -> Breakdown {
    let roles = roles(p);
    let mut b = Breakdown::default();
    for buf in &plan.at_peak {
        let role = match buf.held {
            runtime::Held::Value => roles[buf.value.index()],
            runtime::Held::CollectiveOperand | runtime::Held::Placed | runtime::Held::InFlight => {
                Role::Collective
            }
        };
        let slot = match role {
            Role::Weight => &mut b.weights,
            Role::Gradient => &mut b.gradients,
            Role::OptimizerState => &mut b.optimizer_state,
            Role::Activation => &mut b.activations,
            Role::Temporary => &mut b.temporaries,
            Role::Collective => &mut b.collective_buffers,
            Role::Input => &mut b.inputs,
        };
        *slot += buf.bytes as u64;
    }
    b
}

/// The role of every value of `p` (see [`Breakdown`]'s fields).
fn roles(p: &Program) -> Vec<Role> {
    use ir::Op;
    let n = p.instrs.len();
    let optimizer = |i: usize| in_optimizer(p, i);
    let grad = |i: usize| p.scopes.is_grad(p.instrs[i].scope);
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ins) in p.instrs.iter().enumerate() {
        for o in &ins.operands {
            readers[o.index()].push(i);
        }
    }
    let mut roles = vec![Role::Temporary; n];
    // Parameters: state (with a next value or a gradient) read outside the optimizer is a
    // weight, read only by it optimizer state; the rest are inputs.
    let has_output = |name: &str| p.outputs.iter().any(|(o, _)| o == name);
    for (name, v) in p.params() {
        let i = v.index();
        let state =
            has_output(&format!("new/{name}")) || has_output(&autodiff::grad_output_name(name));
        let only_optimizer = !readers[i].is_empty() && readers[i].iter().all(|&r| optimizer(r));
        roles[i] = match (state, only_optimizer) {
            (true, true) => Role::OptimizerState,
            (true, false) => Role::Weight,
            (false, _) => Role::Input,
        };
    }
    // New state: the output `new/<x>` has `x`'s role.
    for (name, v) in &p.outputs {
        if let Some(x) = name.strip_prefix("new/") {
            if let Some(pv) = p.param(x) {
                roles[v.index()] = roles[pv.index()];
            }
        }
    }
    // Gradients: backward values the optimizer reads (or `grad_` outputs), and what they
    // are summed, converted, moved or reduced from.
    let mut stack: Vec<usize> = Vec::new();
    for (i, rs) in readers.iter().enumerate() {
        let to_optimizer = rs.iter().any(|&r| optimizer(r) && !optimizer(i));
        if grad(i) && to_optimizer {
            stack.push(i);
        }
    }
    for (name, v) in &p.outputs {
        if name.starts_with("grad_") {
            stack.push(v.index());
        }
    }
    let mut is_grad = vec![false; n];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut is_grad[i], true) {
            continue;
        }
        let ins = &p.instrs[i];
        let passes = matches!(
            ins.op,
            Op::Binary(ir::BinaryOp::Add) | Op::Convert | Op::Copy | Op::Reshape
        ) || ins.op.is_collective();
        if passes {
            stack.extend(
                ins.operands
                    .iter()
                    .map(|o| o.index())
                    .filter(|&o| grad(o) && !is_grad[o]),
            );
        }
    }
    for (i, role) in roles.iter_mut().enumerate() {
        if *role != Role::Temporary || matches!(p.instrs[i].op, Op::Parameter { .. }) {
            continue;
        }
        *role = if is_grad[i] {
            Role::Gradient
        } else if p.instrs[i].op.is_collective() {
            Role::Collective
        } else if !grad(i) && !optimizer(i) && readers[i].iter().any(|&r| grad(r)) {
            Role::Activation
        } else {
            Role::Temporary
        };
    }
    roles
}
