//! The two programs of a run: the training step (forward, loss, gradients, optimizer update)
//! and the evaluation forward pass, built from the config and partitioned once; and the
//! initial value of every parameter.

use super::TrainError;
use crate::config::TrainConfig;
use ir::{Builder, DType, RngDist};
use nn::params::{Init, ParamSpec};
use nn::transformer::{build, BatchShape, Packing, TransformerConfig};
use runtime::HostTensor;
use spmd::Partitioned;
use std::time::Instant;

/// The two programs of a run, partitioned once.
pub struct Programs {
    pub step: Partitioned,
    pub eval: Partitioned,
    pub params: Vec<ParamSpec>,
    pub state: Vec<ParamSpec>,
    /// Non-trainable model state (the MoE layers' choice biases): step inputs whose next
    /// values the step computes (`new/<name>`), kept and checkpointed like the parameters.
    pub buffers: Vec<ParamSpec>,
    pub moe_layers: Vec<String>,
    pub partition_seconds: f64,
}

/// The training step of a run before partitioning: forward, loss, gradients, optimizer
/// update and the non-finite guard, with the model's parameters and MoE layers.
pub struct StepProgram {
    pub program: ir::Program,
    pub params: Vec<ParamSpec>,
    /// Non-trainable model state (`Programs::buffers`).
    pub buffers: Vec<ParamSpec>,
    pub moe_layers: Vec<String>,
    /// The instructions that recompute forward values in the backward pass (`model.remat`).
    pub recomputed: Vec<ir::ValueId>,
}

/// Build the training step of `cfg` (not partitioned; `gshard export train-step`).
pub fn step_program(cfg: &TrainConfig, vocab: usize) -> Result<StepProgram, TrainError> {
    let mesh = cfg.mesh()?;
    let model = cfg.transformer(vocab)?;
    let shape = BatchShape {
        batch: cfg.data.batch_size,
        src_len: cfg.data.max_len,
        tgt_len: cfg.data.max_len,
        packing: cfg.data.packing.into(),
    };
    let b = Builder::with_mesh(mesh);
    let built = build(&b, &model, &shape, &cfg.layout(), true)?;
    b.output("loss", &built.loss);
    b.output("ce", &built.ce);
    let mut moe_layers = Vec::new();
    for (i, (name, st)) in built.moe.iter().enumerate() {
        b.output(&format!("moe{i}/load"), &st.load);
        b.output(&format!("moe{i}/aux"), &st.aux_loss);
        b.output(&format!("moe{i}/dropped_1"), &st.dropped_1);
        b.output(&format!("moe{i}/dropped_2"), &st.dropped_2);
        moe_layers.push(name.trim_end_matches('/').to_string());
    }
    for (name, v) in &built.updates {
        b.output(&format!("new/{name}"), v);
    }
    let fwd = b.finish();
    let names: Vec<String> = built.params.iter().map(|s| s.name.clone()).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let with_grads = autodiff::grad(&fwd, "loss", &wrt)?;
    // Recompute what the policy does not keep before the optimizer reads the gradients
    // (and before partitioning, so the recomputed code gets its collectives too).
    let policy = cfg.remat()?;
    let autodiff::remat::Rematerialised {
        program: with_grads,
        recomputed,
    } = autodiff::remat::remat(&with_grads, &policy)?;
    let b = Builder::from_program(with_grads);
    cfg.optimizer.append_update(&b, &built.params, cfg.steps)?;
    let mut program = guard_nonfinite(&b, &built.params).map_err(TrainError::Model)?;
    // Keep only what the loop reads: metrics and the new state (the gradients themselves
    // are consumed by the update).
    program.outputs.retain(|(n, _)| !n.starts_with("grad_"));
    let new_ids = program.prune();
    let recomputed = recomputed
        .iter()
        .filter_map(|v| new_ids[v.index()])
        .collect();
    Ok(StepProgram {
        program,
        params: built.params,
        buffers: built.buffers,
        moe_layers,
        recomputed,
    })
}

/// Build and partition the training-step and evaluation programs.
pub fn build_programs(cfg: &TrainConfig, vocab: usize) -> Result<Programs, TrainError> {
    let model = cfg.transformer(vocab)?;
    let t0 = Instant::now();
    let StepProgram {
        program: step_prog,
        params,
        buffers,
        moe_layers,
        ..
    } = step_program(cfg, vocab)?;
    let state = cfg.optimizer.state_specs(&params);

    let eval_prog = eval_program(cfg, &model)?;

    let step = spmd::compile(&step_prog)?;
    let eval = spmd::compile(&eval_prog)?;
    // State must flow from `new/x` back into `x` without moving.
    for l in &step.outputs {
        if let Some(x) = l.name.strip_prefix("new/") {
            let p = step.params.iter().find(|p| p.name == x);
            if p.is_none_or(|p| p.sharding != l.sharding) {
                return Err(TrainError::Model(format!(
                    "state `{x}` changes layout across a step ({:?} -> {})",
                    p.map(|p| p.sharding.to_string()),
                    l.sharding
                )));
            }
        }
    }
    Ok(Programs {
        step,
        eval,
        params,
        state,
        buffers,
        moe_layers,
        partition_seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The evaluation program of `model` on the run's mesh and batch: outputs `ce` (mean token
/// cross-entropy) and `logits` `[B,T,V]`; no dropout, no random routing.
pub(super) fn eval_program(
    cfg: &TrainConfig,
    model: &TransformerConfig,
) -> Result<ir::Program, TrainError> {
    let shape = BatchShape {
        batch: cfg.data.batch_size,
        src_len: cfg.data.max_len,
        tgt_len: cfg.data.max_len,
        packing: Packing::Padded,
    };
    let eb = Builder::with_mesh(cfg.mesh()?);
    let ebuilt = build(&eb, model, &shape, &cfg.layout(), false)?;
    eb.output("ce", &ebuilt.ce);
    eb.output("logits", &ebuilt.logits);
    Ok(eb.finish())
}

impl Programs {
    /// Where the experts of every MoE layer live: from the layout of its `wi` weight
    /// (`[E, M, H]`, experts on dim 0) in the step program.
    pub fn expert_placement(&self) -> Vec<crate::pictures::Placement> {
        let Some(mesh) = self.step.program.mesh.as_ref() else {
            return Vec::new();
        };
        self.moe_layers
            .iter()
            .filter_map(|layer| {
                let wi = format!("{layer}/wi");
                let l = self.step.params.iter().find(|l| l.name == wi)?;
                let experts = *l.global.shape.first()?;
                Some(crate::pictures::placement(
                    layer,
                    mesh,
                    &l.sharding,
                    experts,
                ))
            })
            .collect()
    }

    /// Every parameter, optimizer-state and buffer tensor a checkpoint holds, with its type.
    pub fn state_types(&self) -> Vec<(String, ir::Type)> {
        self.all_state()
            .map(|s| (s.name.clone(), s.ty.clone()))
            .collect()
    }

    /// The specs of everything a run keeps between steps: parameters, optimizer state and
    /// buffers.
    pub fn all_state(&self) -> impl Iterator<Item = &ParamSpec> {
        self.params
            .iter()
            .chain(self.state.iter())
            .chain(self.buffers.iter())
    }
}

/// The step's output that says whether its update was applied (bool scalar).
pub const APPLIED: &str = "applied";
/// The step's output with the global gradient norm `sqrt(sum of g^2)` (f32 scalar).
pub const GRAD_NORM: &str = "gradient_norm";

/// The non-finite guard: the update of a step whose loss or gradient norm is not finite is
/// not applied. Every state output `new/x` becomes `applied ? new/x : x`, where `applied` is
/// `|loss| <= MAX && grad_norm^2 <= MAX` (false for NaN and infinities). A select moves no
/// value, so applied steps keep their bits; the outputs [`APPLIED`] and [`GRAD_NORM`] tell
/// the loop what happened.
fn guard_nonfinite(b: &Builder, params: &[ParamSpec]) -> Result<ir::Program, String> {
    let _scope = b.scope("optimizer/guard");
    let prog = b.program();
    let output = |name: &str| {
        prog.output(name)
            .map(|id| b.value(id))
            .ok_or_else(|| format!("the training step has no output `{name}`"))
    };
    let mut sq: Option<ir::Value> = None;
    for p in params {
        let g = output(&autodiff::grad_output_name(&p.name))?;
        let g = if g.dtype() == DType::F32 {
            g
        } else {
            g.convert(DType::F32)
        };
        let s = g.mul(&g).sum_all();
        sq = Some(match sq {
            Some(acc) => acc.add(&s),
            None => s,
        });
    }
    let sq = sq.unwrap_or_else(|| b.scalar(0.0, DType::F32));
    let loss = output("loss")?;
    let finite = |x: &ir::Value| x.abs().le(f32::MAX as f64);
    let applied = finite(&loss.convert(DType::F32)).and(&finite(&sq));
    let mut guarded = Vec::new();
    for (name, id) in &prog.outputs {
        if let Some(x) = name.strip_prefix("new/") {
            let old = prog
                .param(x)
                .map(|pid| b.value(pid))
                .ok_or_else(|| format!("state output `{name}` has no parameter `{x}`"))?;
            guarded.push((name.clone(), applied.select(&b.value(*id), &old)));
        }
    }
    b.output(APPLIED, &applied);
    b.output(GRAD_NORM, &sq.sqrt());
    let mut out = b.program();
    for (name, v) in guarded {
        if let Some(slot) = out.outputs.iter_mut().find(|(n, _)| *n == name) {
            slot.1 = v.id;
        }
    }
    Ok(out)
}

/// Initial value of a parameter (counter-based RNG: independent of the mesh).
pub fn init_tensor(spec: &ParamSpec, seed: u64, stream: u64) -> HostTensor {
    let n = spec.ty.num_elements();
    let s = seed as i32;
    let v: Vec<f64> = match spec.init {
        Init::Normal(std) => (0..n)
            .map(|i| std * runtime::rng::sample(RngDist::Normal, DType::F64, s, stream, i as u64))
            .collect(),
        Init::Uniform(lim) => (0..n)
            .map(|i| {
                lim * (2.0
                    * runtime::rng::sample(RngDist::Uniform, DType::F64, s, stream, i as u64)
                    - 1.0)
            })
            .collect(),
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
    };
    HostTensor::from_f64_values(spec.ty.clone(), &v)
}
