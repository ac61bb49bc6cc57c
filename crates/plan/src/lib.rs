//! Plans a training run without running it (`gshard plan`): builds the real training step
//! of a run config (model, gradients, optimizer) at its full logical size, propagates and
//! partitions it for the mesh, prepares the per-device program for the executor and walks
//! its buffer planning on shapes alone. No tensor is allocated, and the per-device program
//! does not grow with the device count, so planning 2,048 devices costs what planning 2
//! does.
//!
//! The [`Report`] holds the parameter count; the per-device peak memory and its breakdown
//! ([`train::memory::Breakdown`], exact: the executor's measured peak for the same
//! program) against the hardware's memory; FLOPs per device by op family and bytes per
//! collective kind and mesh axes ([`cost`]); the step time by a roofline and alpha-beta
//! model over a hardware profile ([`time`], [`hardware`]) with MFU, tokens per second and
//! days for a token budget; and, when the run does not fit, what would help.
//! [`comm`] predicts the step under each communication option of the MPI backend.
//! [`search`] plans every layout of a config on a device count and ranks those that fit a
//! memory limit; [`probe`] measures this machine through the executor for `this-cpu`.
//!
//! Options that change the program (a model axis, weight-update sharding,
//! rematerialisation) belong to the run config: whatever the step program builds from the
//! config is what is planned.

pub mod comm;
pub mod cost;
pub mod hardware;
pub mod presets;
pub mod probe;
pub mod search;
pub mod text;
pub mod time;

use cost::{CollectiveTotal, StepCost};
use hardware::Hardware;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;
use thiserror::Error;
use train::config::TrainConfig;
use train::memory::Breakdown;

pub use hardware::HardwareError;
pub use presets::{Preset, PRESETS};

/// Why a run could not be planned.
#[derive(Debug, Error)]
pub enum PlanError {
    #[error("unknown preset `{name}`: use one of {known}")]
    UnknownPreset { name: String, known: String },
    #[error(transparent)]
    Hardware(#[from] HardwareError),
    #[error(transparent)]
    Config(#[from] train::config::ConfigError),
    #[error("{0}")]
    Train(#[from] train::trainer::TrainError),
    #[error("partitioning the step: {0}")]
    Partition(#[from] spmd::SpmdError),
    #[error("preparing the step for the executor: {0}")]
    Exec(#[from] runtime::ExecError),
}

/// How to plan.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    pub hardware: Hardware,
    /// How the devices run (one per process on accelerators; in process for `this-cpu`).
    pub memory: runtime::MemoryOptions,
    /// Tokens the `days` figure is for (GShard trains on 1T tokens, §4.1).
    pub tokens: f64,
    /// A name for the run in the report.
    pub label: String,
    /// The preset the config came from, whose paper figures the report compares with.
    pub preset: Option<Preset>,
}

impl PlanOptions {
    /// Plan on `hardware` for 1T tokens; devices in process where the profile says they
    /// share a machine.
    pub fn new(hardware: Hardware, label: &str) -> PlanOptions {
        let memory = if hardware.device.shared_by_devices {
            runtime::MemoryOptions::in_process()
        } else {
            runtime::MemoryOptions::distributed()
        };
        PlanOptions {
            hardware,
            memory,
            tokens: 1e12,
            label: label.to_string(),
            preset: None,
        }
    }
}

/// The plan of one training step.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub label: String,
    pub mesh: String,
    pub devices: usize,
    pub hardware: String,
    /// The profile planned with (as measured, for `this-cpu`).
    pub profile: Hardware,
    /// Trainable parameters of the model (global).
    pub params: u64,
    /// Peak bytes live on one device in a step, and what they hold.
    pub peak_bytes_per_device: u64,
    pub breakdown: Breakdown,
    /// What one device holds over the step: weights, gradients and optimizer state in their
    /// per-device layouts, and the activations saved for the backward pass.
    pub held: train::memory::Held,
    /// The step where the peak is reached (scope of its instruction).
    pub peak_at: String,
    /// The largest buffers live at the peak, the largest first (at most
    /// [`LARGEST_AT_PEAK`]): what to shrink first.
    pub largest_at_peak: Vec<PeakBuffer>,
    /// Inputs (weights, optimizer state, batch) the caller holds that are not live at the
    /// peak, and the peak with them: what must fit.
    pub inputs_elsewhere_bytes: u64,
    pub resident_bytes_per_device: u64,
    /// Memory one device has, and whether the peak fits in it.
    pub memory_bytes: u64,
    pub fits: bool,
    pub flops_per_device: u64,
    pub flops_by_family: BTreeMap<&'static str, u64>,
    /// Bytes one device sends per collective kind and mesh axes.
    pub collective_bytes: Vec<CollectiveTotal>,
    pub step_seconds: f64,
    pub time: time::StepTime,
    /// The step under each communication option (compression, overlap, two-level).
    pub comm_options: Vec<comm::CommOption>,
    /// The largest part of the step.
    pub dominant: String,
    /// Matmul FLOPs over the step time at the model dtype's peak (every device's FLOPs
    /// over the machine's peak when the devices share one).
    pub mfu: f64,
    pub tokens_per_step: u64,
    pub tokens_per_s: f64,
    /// Days to train on `tokens` tokens.
    pub days: f64,
    pub tokens: f64,
    /// What would make it fit (empty when it fits).
    pub advice: Vec<String>,
    /// Instructions of the per-device program, and of its executor plan.
    pub instructions: usize,
    pub plan_steps: usize,
    /// Seconds spent building, partitioning and planning.
    pub plan_seconds: f64,
    /// The preset planned, with the paper's parameter count and steps per second.
    pub preset: Option<Preset>,
}

/// How many of the largest buffers at the peak a report lists.
pub const LARGEST_AT_PEAK: usize = 8;

/// One buffer live on a device at its peak.
#[derive(Clone, Debug, Serialize)]
pub struct PeakBuffer {
    /// The value (`%N` of the per-device program), or what the executor holds for it.
    pub value: String,
    /// The scope of the instruction that made it.
    pub scope: String,
    /// Its per-device type.
    pub ty: String,
    pub bytes: u64,
}

/// The largest buffers of `plan`'s peak in program `p` (see [`Report::largest_at_peak`]).
fn largest_at_peak(p: &ir::Program, plan: &runtime::MemoryPlan) -> Vec<PeakBuffer> {
    let mut v: Vec<&runtime::LiveBuffer> = plan.at_peak.iter().collect();
    v.sort_by_key(|b| (std::cmp::Reverse(b.bytes), b.value));
    v.into_iter()
        .take(LARGEST_AT_PEAK)
        .map(|b| {
            let what = match b.held {
                runtime::Held::Value => "",
                runtime::Held::CollectiveOperand => " (collective operand)",
                runtime::Held::Placed => " (all-to-all result, placed)",
                runtime::Held::InFlight => " (collective operand, in flight)",
            };
            PeakBuffer {
                value: format!("%{}{what}", b.value.index()),
                scope: p.scope(b.value).to_string(),
                ty: p.ty(b.value).to_string(),
                bytes: b.bytes as u64,
            }
        })
        .collect()
}

/// The run config of preset `name`.
pub fn preset_config(name: &str) -> Result<TrainConfig, PlanError> {
    Preset::find(name)
        .map(Preset::config)
        .ok_or_else(|| PlanError::UnknownPreset {
            name: name.to_string(),
            known: Preset::names(),
        })
}

/// Plan one training step of `cfg` (see the crate doc).
pub fn plan(cfg: &TrainConfig, opts: &PlanOptions) -> Result<Report, PlanError> {
    let t0 = Instant::now();
    cfg.validate()?;
    let vocab = cfg.data.vocab_size;
    let step = train::trainer::step_program(cfg, vocab)?;
    let params: u64 = step.params.iter().map(|s| s.ty.num_elements() as u64).sum();
    let part = spmd::compile(&step.program)?;
    drop(step);
    let p = &part.program;
    // Prepared as the run prepares it (the trainer's executor options).
    let exec = runtime::ExecOptions::native().with_overlap(cfg.model.overlap > 1);
    let exe = runtime::Executable::for_planning_with(p, exec)?;
    let planned = train::memory::plan_of(&exe, opts.memory);
    let mut cost = StepCost::of(p);
    let untimed = p
        .instrs
        .iter()
        .filter(|i| {
            matches!(i.op, ir::Op::Parameter { .. }) || i.op.class() == ir::OpClass::Collective
        })
        .count();
    cost.work_steps = exe.num_steps().saturating_sub(untimed);
    let devices = cfg.devices();
    let hw = &opts.hardware;
    let t = time::step_time(&cost, hw, devices);
    let peak = planned.plan.peak_bytes as u64;
    let memory_bytes = if hw.device.shared_by_devices {
        (hw.device.memory_bytes / devices as f64) as u64
    } else {
        hw.device.memory_bytes as u64
    };
    let resident = planned.resident_bytes();
    let fits = resident <= memory_bytes;
    let model_dtype = cfg.transformer(vocab)?.dtype;
    let matmul = cost.flops_by_family().get("matmul").copied().unwrap_or(0) as f64;
    // In-process devices share the machine's peak, and the step is all of theirs.
    let sharing = if hw.device.shared_by_devices {
        devices as f64
    } else {
        1.0
    };
    let mfu =
        sharing * matmul / (t.step_seconds * hw.device.peak_flops.of(model_dtype)).max(1e-300);
    let tokens_per_step = (cfg.data.batch_size * cfg.data.max_len) as u64;
    let tokens_per_s = tokens_per_step as f64 / t.step_seconds.max(1e-300);
    let peak_at = {
        let si = planned.plan.peak_step;
        exe.plan()
            .value_of(si)
            .map(|v| p.scope(v).to_string())
            .unwrap_or_default()
    };
    let mut report = Report {
        label: opts.label.clone(),
        mesh: p.mesh.as_ref().map(|m| m.to_string()).unwrap_or_default(),
        devices,
        hardware: hw.name.clone(),
        profile: hw.clone(),
        params,
        peak_bytes_per_device: peak,
        breakdown: planned.breakdown,
        held: train::memory::held(p),
        peak_at,
        largest_at_peak: largest_at_peak(p, &planned.plan),
        inputs_elsewhere_bytes: planned.inputs_elsewhere,
        resident_bytes_per_device: resident,
        memory_bytes,
        fits,
        flops_per_device: cost.flops(),
        flops_by_family: cost.flops_by_family(),
        collective_bytes: cost.collective_totals(),
        step_seconds: t.step_seconds,
        dominant: t.dominant().0,
        comm_options: comm::options(&cost, hw, devices, &t),
        time: t,
        mfu,
        tokens_per_step,
        tokens_per_s,
        days: opts.tokens / tokens_per_s / 86_400.0,
        tokens: opts.tokens,
        advice: Vec::new(),
        instructions: p.len(),
        plan_steps: exe.num_steps(),
        plan_seconds: 0.0,
        preset: opts.preset,
    };
    report.advice = advice(&report);
    report.plan_seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// What would make a run that does not fit fit, largest part first.
fn advice(r: &Report) -> Vec<String> {
    if r.fits {
        return Vec::new();
    }
    let b = &r.breakdown;
    let h = |x: u64| train::memory::human(x);
    let over = r.resident_bytes_per_device.saturating_sub(r.memory_bytes);
    let mut out = Vec::new();
    let state = b.weights + b.gradients + b.optimizer_state;
    let mut parts = [
        (
            b.activations + b.temporaries,
            format!(
                "rematerialisation: {} of activations and {} of temporaries are live at the peak; recomputing the forward pass in the backward one frees most of them",
                h(b.activations),
                h(b.temporaries)
            ),
        ),
        (
            state,
            format!(
                "weight sharding: weights {}, gradients {} and optimizer state {} per device; sharding replicated weights and their update over the data-parallel devices divides them",
                h(b.weights),
                h(b.gradients),
                h(b.optimizer_state)
            ),
        ),
        (
            b.collective_buffers,
            format!(
                "smaller collective buffers: {} of collective operands and results are live at the peak",
                h(b.collective_buffers)
            ),
        ),
    ];
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    for (bytes, text) in parts {
        if bytes > 0 {
            out.push(text);
        }
    }
    let ratio = r.resident_bytes_per_device as f64 / r.memory_bytes.max(1) as f64;
    out.push(format!(
        "more devices: the step needs {} more than the {} a device has ({ratio:.1}x); about {} devices with the batch split over them divide the activations in proportion",
        h(over),
        h(r.memory_bytes),
        (r.devices as f64 * ratio).ceil() as u64
    ));
    out
}
