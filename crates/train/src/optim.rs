//! Optimizers as IR: the parameter update is appended to the training-step program, so
//! optimizer state is an ordinary program input that propagation shards like its parameter
//! and the partitioner updates locally (GShard, Lepikhin et al. 2020, trains with Adafactor).
//!
//! # Protocol
//!
//! The training step is one program: forward -> loss -> `autodiff::grad` (outputs
//! `grad_<param>`) -> [`Optimizer::append_update`]. The caller:
//!
//! 1. builds the forward program and runs `autodiff::grad` for the parameters `params`;
//! 2. calls [`Optimizer::append_update`] on `Builder::from_program(that)`; it creates the
//!    state parameters listed by [`Optimizer::state_specs`] (reusing any that already exist
//!    with the right type) and adds the outputs [`new_name`]`(x)` for every parameter and
//!    state tensor `x`, plus [`LR_OUTPUT`] (the schedule value used by this step);
//! 3. initialises every state tensor to zeros ([`Init::Zeros`]) and, after each step, feeds
//!    output `new/<x>` back as input `<x>` of the next step.
//!
//! State names: `opt/step` (i32 scalar, the number of updates applied so far; the step
//! being taken is `t = opt/step + 1`, 1-based), and per parameter `p`: `opt/<p>/v_row`,
//! `opt/<p>/v_col` (Adafactor, factored), `opt/<p>/v` (Adafactor unfactored, Adam),
//! `opt/<p>/m` (Adafactor with `beta1 > 0`, Adam, SGD with momentum). State tensors have
//! their parameter's dtype. Scalar schedule arithmetic (learning rate, decay, bias
//! correction) runs in the *schedule dtype*: f64 if any parameter is f64, else f32; it is
//! converted to each parameter's dtype where it meets that parameter.
//!
//! # Sharding
//!
//! When a parameter's instruction carries a sharding annotation, its state and its new
//! value are annotated consistently: `v` and `m` exactly like the parameter, `v_row` with
//! the last dim's entry removed, `v_col` with the second-to-last removed, `new/<p>` like the
//! parameter. A split expert weight then keeps split Adafactor state and its update needs
//! no gather (only scalar/row all-reduces for means and RMS). Unannotated parameters get no
//! annotations; propagation decides.
//!
//! # Formulas
//!
//! Learning-rate schedules ([`LrSchedule`]), with `t` the 1-based step:
//! - `constant`: `lr(t) = value`;
//! - `rsqrt`: `lr(t) = base * min(t / warmup, 1) * rsqrt(max(t, warmup))` with
//!   `linear_warmup`, `lr(t) = base * rsqrt(max(t, warmup))` without (the default).
//!   `warmup_steps = 0` means no warm-up factor and `lr = base * rsqrt(t)`.
//!   Adafactor's *relative step* `min(1e-2, 1/sqrt(t))` (the GShard setting "1.0 with
//!   inverse-sqrt decay after 10k steps") is `rsqrt { base: 1, warmup_steps: 10000,
//!   linear_warmup: false }` ([`LrSchedule::relative_step`]).
//!   With `cooldown = c > 0` the value is further multiplied by
//!   `clamp((T + 1 - t) / n, 0, 1)`, `T` the run's steps and `n = max(1, round(c T))`:
//!   the last `n` steps run at `n/n, (n-1)/n, ..., 1/n` of the rate, the annealing that
//!   ends a short run at a lower loss than inverse-sqrt alone (with `n = 1`, a run of
//!   under `1.5/c` steps, no step is reduced). A step the trainer skips (non-finite)
//!   does not advance `t`, so each skipped step leaves the last applied one a step
//!   further from the end of the cool-down.
//!
//! Adafactor (Shazeer & Stern 2018, Alg. 4/5; [`AdafactorConfig`]), per parameter `X` with
//! gradient `G`, in the parameter's dtype:
//! ```text
//! beta2_t = 1 - t^(-decay_rate)                  (min(beta2_cap, .) when a cap is set)
//! G2      = G^2 + eps1
//! rank >= 2 and factored (last two dims; "rows" = dim -2, "cols" = dim -1):
//!   v_row' = beta2_t v_row + (1 - beta2_t) mean(G2, dim -1)      shape [.., n]
//!   v_col' = beta2_t v_col + (1 - beta2_t) mean(G2, dim -2)      shape [.., m]
//!   U      = G * rsqrt(v_row' / mean(v_row', dim -1))[.., :, None] * rsqrt(v_col')[.., None, :]
//!            (= G / sqrt(V^) with V^ = v_row v_col^T / mean(v_row), the paper's R C / 1^T R)
//! otherwise:
//!   v'     = beta2_t v + (1 - beta2_t) G2 ;  U = G * rsqrt(v')
//! clipping:   U  = U / max(1, RMS(U) / clipping_threshold)            (when set)
//! step size:  a  = lr(t) * max(eps2, RMS(X))    with multiply_by_parameter_scale,
//!             a  = lr(t)                         without
//! momentum:   m' = beta1 m + (1 - beta1) a U ;  D = m'    (beta1 > 0; else D = a U)
//! update:     X' = X - D - weight_decay * lr(t) * X
//! ```
//! RMS is over the whole tensor. This matches optax's `adafactor(learning_rate=lr,
//! min_dim_size_to_factor=1, decay_rate=0.8, multiply_by_parameter_scale=True,
//! clipping_threshold=1.0, eps=1e-30)` for matrices (optax factors the two largest dims, we
//! the last two; they coincide for rank 2) and T2T's `AdafactorOptimizer`.
//!
//! Adam ([`AdamConfig`]): `m' = b1 m + (1-b1) G`, `v' = b2 v + (1-b2) G^2`,
//! `U = (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)` (bias correction on by default),
//! `X' = X - lr(t) (U + weight_decay X)` (decoupled weight decay, as AdamW).
//!
//! SGD ([`SgdConfig`]): with momentum `mu > 0`, `m' = mu m + G` and `D = m'` (or
//! `G + mu m'` with `nesterov`); without, `D = G`. `X' = X - lr(t) (D + weight_decay X)`.

use ir::{Builder, DType, Program, Sharding, Type, Value, ValueId};
use nn::params::{Init, ParamSpec};
use serde::{Deserialize, Serialize};
use sharding::ShardingError;
use thiserror::Error;

/// Name of the step counter: i32 scalar, the number of updates applied so far.
pub const STEP: &str = "opt/step";

/// Name of the output holding the schedule value `lr(t)` used by this step (in the schedule
/// dtype; see the module doc).
pub const LR_OUTPUT: &str = "lr";

/// The output that carries the next value of input `name` (a parameter or a state tensor).
pub fn new_name(name: &str) -> String {
    format!("new/{name}")
}

/// Name of state tensor `slot` (`v_row`, `v_col`, `v`, `m`) of parameter `param`.
pub fn state_name(param: &str, slot: &str) -> String {
    format!("opt/{param}/{slot}")
}

/// Why an optimizer update could not be appended. Each message names the parameter (or
/// setting) and the fix.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum OptimError {
    #[error("parameter `{name}` is not a parameter of the program; build the model with this ParamSpec, or drop it from the list passed to the optimizer")]
    MissingParam { name: String },
    #[error("parameter `{name}` has type {program} in the program but {spec} in its ParamSpec; pass the specs the model was built with")]
    ParamType {
        name: String,
        program: Type,
        spec: Type,
    },
    #[error("parameter `{name}` has type {ty}; only float parameters can be optimized, so drop it from the list")]
    NotFloat { name: String, ty: Type },
    #[error("the program has no output `{output}` (the gradient of parameter `{name}`); run autodiff::grad(program, loss, wrt) with `{name}` in wrt before append_update")]
    MissingGrad { name: String, output: String },
    #[error("gradient output `{output}` has type {grad} but parameter `{name}` has type {param}; the gradient must have its parameter's type")]
    GradType {
        name: String,
        output: String,
        grad: Type,
        param: Type,
    },
    #[error("output `{output}` already exists; append_update adds it, so call it once per program and rename any model output called `{output}`")]
    OutputExists { output: String },
    #[error("optimizer state `{name}` already exists in the program with type {found}, but the optimizer needs {expected}; rename the conflicting parameter")]
    StateType {
        name: String,
        found: Type,
        expected: Type,
    },
    #[error("cannot annotate `{name}` like its parameter: {source}")]
    Sharding {
        name: String,
        #[source]
        source: Box<ShardingError>,
    },
    #[error("optimizer setting `{field}` = {value} is invalid: it must be {expected}")]
    BadConfig {
        field: &'static str,
        value: f64,
        expected: &'static str,
    },
}

fn check(
    field: &'static str,
    value: f64,
    ok: bool,
    expected: &'static str,
) -> Result<(), OptimError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(OptimError::BadConfig {
            field,
            value,
            expected,
        })
    }
}

/// A learning-rate schedule as a function of the 1-based step `t` of a run of `T` steps
/// (formulas in the module doc). Serialized as `{"kind": "constant", "value": 0.1}` or
/// `{"kind": "rsqrt", "base": 1.0, "warmup_steps": 10000, "linear_warmup": false,
/// "cooldown": 0.0}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    /// `lr(t) = value`.
    Constant { value: f64 },
    /// `lr(t) = base * min(t / warmup_steps, 1) * rsqrt(max(t, warmup_steps))`; without
    /// `linear_warmup` the `min` factor is dropped (constant, then inverse-sqrt decay);
    /// times `clamp((T + 1 - t) / n, 0, 1)` with a `cooldown`.
    Rsqrt {
        base: f64,
        warmup_steps: u64,
        /// Omitted: `false` (the main job's schedule).
        #[serde(default)]
        linear_warmup: bool,
        /// Share of the run's steps, at its end, over which the rate falls linearly
        /// towards zero; omitted: 0 (no cool-down; a run config laid over the main job's
        /// takes its 0.3).
        #[serde(default)]
        cooldown: f64,
    },
}

impl LrSchedule {
    /// Adafactor's relative step size `min(1e-2, 1/sqrt(t))`, GShard's "learning rate 1.0
    /// with inverse-square-root decay after 10k steps".
    pub fn relative_step() -> LrSchedule {
        LrSchedule::Rsqrt {
            base: 1.0,
            warmup_steps: 10_000,
            linear_warmup: false,
            cooldown: 0.0,
        }
    }

    /// Steps in the cool-down of a run of `run_steps` steps (0 without one).
    pub fn cooldown_steps(&self, run_steps: u64) -> u64 {
        match *self {
            LrSchedule::Rsqrt { cooldown, .. } if cooldown > 0.0 => {
                ((cooldown * run_steps as f64).round() as u64).max(1)
            }
            _ => 0,
        }
    }

    /// The first step of a run of `run_steps` steps that the cool-down runs below the full
    /// rate (`T + 2 - n`; `T + 1`, past the run, when `n = 1`); `None` without a cool-down.
    pub fn first_cooled_step(&self, run_steps: u64) -> Option<u64> {
        match self.cooldown_steps(run_steps) {
            0 => None,
            n => Some(run_steps.saturating_add(2).saturating_sub(n)),
        }
    }

    /// The value at 1-based step `t` of a run of `run_steps` steps, computed on the host in
    /// f64 with the same operations, in the same order, as [`LrSchedule::emit`].
    pub fn value(&self, t: f64, run_steps: u64) -> f64 {
        let n = self.cooldown_steps(run_steps);
        match *self {
            LrSchedule::Constant { value } => value,
            LrSchedule::Rsqrt {
                base,
                warmup_steps,
                linear_warmup,
                ..
            } => {
                let w = warmup_steps as f64;
                let decay = 1.0 / t.max(w).sqrt();
                let lr = if linear_warmup && warmup_steps > 0 {
                    (t / w).min(1.0) * base * decay
                } else {
                    base * decay
                };
                if n > 0 {
                    let left = (run_steps as f64 + 1.0 - t) / n as f64;
                    lr * left.clamp(0.0, 1.0)
                } else {
                    lr
                }
            }
        }
    }

    /// The schedule as IR: `t` is a float scalar holding the 1-based step of a run of
    /// `run_steps` steps; the result has `t`'s type.
    pub fn emit(&self, t: &Value, run_steps: u64) -> Value {
        let b = t.builder();
        let n = self.cooldown_steps(run_steps);
        match *self {
            LrSchedule::Constant { value } => b.scalar(value, t.dtype()),
            LrSchedule::Rsqrt {
                base,
                warmup_steps,
                linear_warmup,
                ..
            } => {
                let w = warmup_steps as f64;
                let decay = t.max(w).rsqrt();
                let lr = if linear_warmup && warmup_steps > 0 {
                    t.div(w).min(1.0).mul(base).mul(&decay)
                } else {
                    b.scalar(base, t.dtype()).mul(&decay)
                };
                if n > 0 {
                    let left = t.neg().add(run_steps as f64 + 1.0).div(n as f64);
                    lr.mul(&left.max(0.0).min(1.0))
                } else {
                    lr
                }
            }
        }
    }

    fn validate(&self) -> Result<(), OptimError> {
        match *self {
            LrSchedule::Constant { value } => {
                check("lr.value", value, value >= 0.0, "finite and >= 0")
            }
            LrSchedule::Rsqrt { base, cooldown, .. } => {
                check("lr.base", base, base >= 0.0, "finite and >= 0")?;
                check(
                    "lr.cooldown",
                    cooldown,
                    (0.0..=1.0).contains(&cooldown),
                    "a share of the run from 0 to 1",
                )
            }
        }
    }
}

/// Adafactor settings (formulas in the module doc). The defaults are GShard's (Lepikhin et al. 2020)
/// and the paper's: relative step size with parameter scaling, `beta1 = 0`, decay exponent
/// 0.8, `eps1 = 1e-30`, `eps2 = 1e-3`, update clipping at 1.0, factored second moments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdafactorConfig {
    /// The relative (or absolute, without parameter scaling) step size `lr(t)`.
    pub lr: LrSchedule,
    /// Multiply the step size by `max(eps2, RMS(X))` (the paper's relative step).
    pub multiply_by_parameter_scale: bool,
    /// First-moment decay; 0 keeps no momentum state.
    pub beta1: f64,
    /// `beta2_t = 1 - t^(-decay_rate)`.
    pub decay_rate: f64,
    /// Optional upper bound on `beta2_t` (`min(cap, 1 - t^-decay_rate)`); `None` = no cap.
    pub beta2_cap: Option<f64>,
    /// Added to squared gradients.
    pub eps1: f64,
    /// Floor of the parameter scale `RMS(X)`.
    pub eps2: f64,
    /// Update clipping threshold `d`: `U /= max(1, RMS(U) / d)`; `None` disables.
    pub clipping_threshold: Option<f64>,
    /// Factor the second moment of rank >= 2 parameters over their last two dims.
    pub factored: bool,
    /// Decoupled weight decay, multiplied by `lr(t)`.
    pub weight_decay: f64,
}

impl Default for AdafactorConfig {
    fn default() -> Self {
        AdafactorConfig {
            lr: LrSchedule::relative_step(),
            multiply_by_parameter_scale: true,
            beta1: 0.0,
            decay_rate: 0.8,
            beta2_cap: None,
            eps1: 1e-30,
            eps2: 1e-3,
            clipping_threshold: Some(1.0),
            factored: true,
            weight_decay: 0.0,
        }
    }
}

/// Adam settings: `beta1 = 0.9`, `beta2 = 0.999` (Transformers often use 0.98), `eps =
/// 1e-9`, bias correction, optional decoupled weight decay. Default `lr` is constant 1e-3.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamConfig {
    pub lr: LrSchedule,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub bias_correction: bool,
    /// Decoupled weight decay (AdamW): `X -= lr(t) * weight_decay * X`.
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: LrSchedule::Constant { value: 1e-3 },
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-9,
            bias_correction: true,
            weight_decay: 0.0,
        }
    }
}

/// SGD settings: optional heavy-ball (or Nesterov) momentum and decoupled weight decay.
/// Default `lr` is constant 0.1, no momentum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SgdConfig {
    pub lr: LrSchedule,
    /// 0 keeps no momentum state.
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: LrSchedule::Constant { value: 0.1 },
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

/// An optimizer. Serialized as its config with a `kind` tag:
/// `{"kind": "adafactor", "beta1": 0.0}`, `{"kind": "adam", "lr": {...}}`, `{"kind": "sgd"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Optimizer {
    Adafactor(AdafactorConfig),
    Adam(AdamConfig),
    Sgd(SgdConfig),
}

impl Default for Optimizer {
    /// GShard's optimizer: [`AdafactorConfig::default`].
    fn default() -> Self {
        Optimizer::Adafactor(AdafactorConfig::default())
    }
}

/// One state tensor of one parameter.
struct Slot {
    name: String,
    ty: Type,
    /// Which parameter dims the slot keeps (for deriving its sharding).
    kept_dims: Vec<usize>,
}

impl Optimizer {
    /// The learning-rate schedule.
    pub fn lr(&self) -> &LrSchedule {
        match self {
            Optimizer::Adafactor(c) => &c.lr,
            Optimizer::Adam(c) => &c.lr,
            Optimizer::Sgd(c) => &c.lr,
        }
    }

    /// Check every setting; [`Optimizer::append_update`] calls this first.
    pub fn validate(&self) -> Result<(), OptimError> {
        self.lr().validate()?;
        match self {
            Optimizer::Adafactor(c) => {
                check("beta1", c.beta1, (0.0..1.0).contains(&c.beta1), "in [0, 1)")?;
                check("decay_rate", c.decay_rate, c.decay_rate > 0.0, "> 0")?;
                if let Some(cap) = c.beta2_cap {
                    check("beta2_cap", cap, (0.0..1.0).contains(&cap), "in [0, 1)")?;
                }
                check("eps1", c.eps1, c.eps1 >= 0.0, ">= 0")?;
                check("eps2", c.eps2, c.eps2 >= 0.0, ">= 0")?;
                if let Some(d) = c.clipping_threshold {
                    check("clipping_threshold", d, d > 0.0, "> 0 (or null to disable)")?;
                }
                check(
                    "weight_decay",
                    c.weight_decay,
                    c.weight_decay >= 0.0,
                    ">= 0",
                )
            }
            Optimizer::Adam(c) => {
                check("beta1", c.beta1, (0.0..1.0).contains(&c.beta1), "in [0, 1)")?;
                check("beta2", c.beta2, (0.0..1.0).contains(&c.beta2), "in [0, 1)")?;
                check("eps", c.eps, c.eps >= 0.0, ">= 0")?;
                check(
                    "weight_decay",
                    c.weight_decay,
                    c.weight_decay >= 0.0,
                    ">= 0",
                )
            }
            Optimizer::Sgd(c) => {
                check(
                    "momentum",
                    c.momentum,
                    (0.0..1.0).contains(&c.momentum),
                    "in [0, 1)",
                )?;
                check(
                    "weight_decay",
                    c.weight_decay,
                    c.weight_decay >= 0.0,
                    ">= 0",
                )
            }
        }
    }

    fn slots(&self, p: &ParamSpec) -> Vec<Slot> {
        let shape = &p.ty.shape;
        let r = shape.len();
        let all: Vec<usize> = (0..r).collect();
        let slot = |s: &str, kept: Vec<usize>| Slot {
            name: state_name(&p.name, s),
            ty: p
                .ty
                .with_shape(kept.iter().map(|&d| shape[d]).collect::<Vec<_>>()),
            kept_dims: kept,
        };
        match self {
            Optimizer::Adafactor(c) => {
                let mut v = if c.factored && r >= 2 {
                    let row: Vec<usize> = (0..r - 1).collect();
                    let col: Vec<usize> = (0..r - 2).chain([r - 1]).collect();
                    vec![slot("v_row", row), slot("v_col", col)]
                } else {
                    vec![slot("v", all.clone())]
                };
                if c.beta1 > 0.0 {
                    v.push(slot("m", all));
                }
                v
            }
            Optimizer::Adam(_) => vec![slot("m", all.clone()), slot("v", all)],
            Optimizer::Sgd(c) if c.momentum > 0.0 => vec![slot("m", all)],
            Optimizer::Sgd(_) => vec![],
        }
    }

    /// The optimizer state: [`STEP`] (i32 scalar) first, then each parameter's slots in
    /// parameter order, all initialised to zeros.
    pub fn state_specs(&self, params: &[ParamSpec]) -> Vec<ParamSpec> {
        let mut out = vec![ParamSpec {
            name: STEP.to_string(),
            ty: Type::scalar(DType::I32),
            init: Init::Zeros,
        }];
        for p in params {
            for s in self.slots(p) {
                out.push(ParamSpec {
                    name: s.name,
                    ty: s.ty,
                    init: Init::Zeros,
                });
            }
        }
        out
    }

    /// Append the update of `params` to the program under construction in `b`, for a run
    /// of `run_steps` steps (the end of the schedule's cool-down; see the module doc for the
    /// protocol, the names and the formulas).
    pub fn append_update(
        &self,
        b: &Builder,
        params: &[ParamSpec],
        run_steps: u64,
    ) -> Result<(), OptimError> {
        self.validate()?;
        let prog = b.program();
        // Check everything before emitting anything.
        let mut found = Vec::with_capacity(params.len());
        for spec in params {
            found.push(lookup(&prog, spec)?);
        }
        for out in params
            .iter()
            .map(|p| new_name(&p.name))
            .chain(self.state_specs(params).iter().map(|s| new_name(&s.name)))
            .chain([LR_OUTPUT.to_string()])
        {
            if prog.output(&out).is_some() {
                return Err(OptimError::OutputExists { output: out });
            }
        }
        for s in self.state_specs(params) {
            if let Some(id) = prog.param(&s.name) {
                if *prog.ty(id) != s.ty {
                    return Err(OptimError::StateType {
                        name: s.name,
                        found: prog.ty(id).clone(),
                        expected: s.ty,
                    });
                }
            }
        }

        let sdt = if params.iter().any(|p| p.ty.dtype == DType::F64) {
            DType::F64
        } else {
            DType::F32
        };
        // The update has its own scope: `optimizer` for the shared scalars,
        // `optimizer/<param>` for each weight's update.
        let optimizer_scope = b.scope("optimizer");
        let step = state_param(b, &prog, STEP, &Type::scalar(DType::I32));
        let t = step.convert(sdt).add(1.0);
        let lr = self.lr().emit(&t, run_steps);
        // Scalars shared by every parameter.
        let shared = match self {
            Optimizer::Adafactor(c) => {
                let mut beta2 = t.pow(-c.decay_rate).neg().add(1.0);
                if let Some(cap) = c.beta2_cap {
                    beta2 = beta2.min(cap);
                }
                Shared::Adafactor { beta2 }
            }
            Optimizer::Adam(c) if c.bias_correction => {
                let one_minus_pow = |beta: f64| b.scalar(beta, sdt).pow(&t).neg().add(1.0);
                Shared::Adam {
                    bc: Some((one_minus_pow(c.beta1), one_minus_pow(c.beta2))),
                }
            }
            Optimizer::Adam(_) => Shared::Adam { bc: None },
            Optimizer::Sgd(_) => Shared::Sgd,
        };

        for (spec, (pid, gid)) in params.iter().zip(found) {
            let _weight_scope = b.scope(&spec.name);
            let p = b.value(pid);
            let g = b.value(gid);
            let annotation = prog.instr(pid).sharding.clone();
            let slots = self.slots(spec);
            let mut state = Vec::with_capacity(slots.len());
            for s in &slots {
                let v = state_param(b, &prog, &s.name, &s.ty);
                if let Some(a) = &annotation {
                    annotate(&v, &s.name, slot_sharding(a, &s.kept_dims))?;
                }
                state.push(v);
            }
            let dt = spec.ty.dtype;
            let lr_p = lr.convert(dt);
            let (new_p, new_state) = match (self, &shared) {
                (Optimizer::Adafactor(c), Shared::Adafactor { beta2 }) => {
                    adafactor(c, &p, &g, &state, &lr_p, &beta2.convert(dt))
                }
                (Optimizer::Adam(c), Shared::Adam { bc }) => {
                    let bc = bc.as_ref().map(|(a, b)| (a.convert(dt), b.convert(dt)));
                    adam(c, &p, &g, &state, &lr_p, bc.as_ref())
                }
                (Optimizer::Sgd(c), Shared::Sgd) => sgd(c, &p, &g, &state, &lr_p),
                _ => unreachable!("shared scalars are built for this optimizer"),
            };
            let new_p = match &annotation {
                Some(a) => annotate(&new_p, &spec.name, a.clone())?,
                None => new_p,
            };
            b.output(&new_name(&spec.name), &new_p);
            for ((s, v), old) in slots.iter().zip(new_state).zip(&state) {
                debug_assert_eq!(v.ty(), old.ty());
                let v = match &annotation {
                    Some(a) => annotate(&v, &s.name, slot_sharding(a, &s.kept_dims))?,
                    None => v,
                };
                b.output(&new_name(&s.name), &v);
            }
        }
        b.output(&new_name(STEP), &step.add(1.0));
        b.output(LR_OUTPUT, &lr);
        drop(optimizer_scope);
        Ok(())
    }
}

/// Per-step scalars in the schedule dtype, shared by all parameters.
enum Shared {
    Adafactor {
        beta2: Value,
    },
    /// `(1 - beta1^t, 1 - beta2^t)` when bias correction is on.
    Adam {
        bc: Option<(Value, Value)>,
    },
    Sgd,
}

/// The parameter and its gradient output, checked against the spec.
fn lookup(prog: &Program, spec: &ParamSpec) -> Result<(ValueId, ValueId), OptimError> {
    let name = &spec.name;
    let pid = prog
        .param(name)
        .ok_or_else(|| OptimError::MissingParam { name: name.clone() })?;
    let pty = prog.ty(pid);
    if *pty != spec.ty {
        return Err(OptimError::ParamType {
            name: name.clone(),
            program: pty.clone(),
            spec: spec.ty.clone(),
        });
    }
    if !pty.dtype.is_float() {
        return Err(OptimError::NotFloat {
            name: name.clone(),
            ty: pty.clone(),
        });
    }
    let output = autodiff::grad_output_name(name);
    let gid = prog
        .output(&output)
        .ok_or_else(|| OptimError::MissingGrad {
            name: name.clone(),
            output: output.clone(),
        })?;
    if prog.ty(gid) != pty {
        return Err(OptimError::GradType {
            name: name.clone(),
            output,
            grad: prog.ty(gid).clone(),
            param: pty.clone(),
        });
    }
    Ok((pid, gid))
}

/// The existing parameter `name` (its type was checked) or a new one.
fn state_param(b: &Builder, prog: &Program, name: &str, ty: &Type) -> Value {
    match prog.param(name) {
        Some(id) => b.value(id),
        None => b.param(name, ty.clone()),
    }
}

/// The parameter's sharding restricted to the dims a slot keeps.
fn slot_sharding(param: &Sharding, kept_dims: &[usize]) -> Sharding {
    Sharding {
        dims: kept_dims.iter().map(|&d| param.dims[d].clone()).collect(),
        partial: Vec::new(),
    }
}

fn annotate(v: &Value, name: &str, s: Sharding) -> Result<Value, OptimError> {
    sharding::annotate::annotate(v, s).map_err(|source| OptimError::Sharding {
        name: name.to_string(),
        source: Box::new(source),
    })
}

/// `sqrt(mean(x^2))` over the whole tensor (a scalar).
fn rms(x: &Value) -> Value {
    x.mul(x).mean_all().sqrt()
}

/// `beta * old + (1 - beta) * new`, with `beta` a scalar value.
fn ema(beta: &Value, old: &Value, new: &Value) -> Value {
    let one_minus = beta.neg().add(1.0);
    beta.mul(old).add(&one_minus.mul(new))
}

/// Adafactor for one parameter; returns the new parameter and the new slots in slot order.
fn adafactor(
    c: &AdafactorConfig,
    p: &Value,
    g: &Value,
    state: &[Value],
    lr: &Value,
    beta2: &Value,
) -> (Value, Vec<Value>) {
    let shape = p.shape();
    let r = shape.len();
    let g2 = g.mul(g).add(c.eps1);
    let mut new_state = Vec::new();
    let factored = c.factored && r >= 2;
    let mut u = if factored {
        let v_row = ema(beta2, &state[0], &g2.mean(&[r - 1]));
        let v_col = ema(beta2, &state[1], &g2.mean(&[r - 2]));
        let lead: Vec<usize> = (0..r - 2).collect();
        let row_mean = v_row.mean(&[r - 2]).broadcast_in_dim(&v_row.shape(), &lead);
        let row_factor = v_row.div(&row_mean).rsqrt();
        let col_factor = v_col.rsqrt();
        let row_dims: Vec<usize> = (0..r - 1).collect();
        let col_dims: Vec<usize> = (0..r - 2).chain([r - 1]).collect();
        let u = g
            .mul(&row_factor.broadcast_in_dim(&shape, &row_dims))
            .mul(&col_factor.broadcast_in_dim(&shape, &col_dims));
        new_state.push(v_row);
        new_state.push(v_col);
        u
    } else {
        let v = ema(beta2, &state[0], &g2);
        let u = g.mul(&v.rsqrt());
        new_state.push(v);
        u
    };
    if let Some(d) = c.clipping_threshold {
        u = u.div(&rms(&u).div(d).max(1.0));
    }
    let step_size = if c.multiply_by_parameter_scale {
        lr.mul(&rms(p).max(c.eps2))
    } else {
        lr.clone()
    };
    let mut delta = u.mul(&step_size);
    if c.beta1 > 0.0 {
        let m_old = state.last().expect("momentum slot");
        let beta1 = p.builder().scalar(c.beta1, p.dtype());
        delta = ema(&beta1, m_old, &delta);
        new_state.push(delta.clone());
    }
    let mut new_p = p.sub(&delta);
    if c.weight_decay > 0.0 {
        new_p = new_p.sub(&p.mul(&lr.mul(c.weight_decay)));
    }
    (new_p, new_state)
}

/// Adam for one parameter; `bc` = `(1 - beta1^t, 1 - beta2^t)` in the parameter's dtype.
fn adam(
    c: &AdamConfig,
    p: &Value,
    g: &Value,
    state: &[Value],
    lr: &Value,
    bc: Option<&(Value, Value)>,
) -> (Value, Vec<Value>) {
    let b = p.builder();
    let beta1 = b.scalar(c.beta1, p.dtype());
    let beta2 = b.scalar(c.beta2, p.dtype());
    let m = ema(&beta1, &state[0], g);
    let v = ema(&beta2, &state[1], &g.mul(g));
    let (mhat, vhat) = match bc {
        Some((bc1, bc2)) => (m.div(bc1), v.div(bc2)),
        None => (m.clone(), v.clone()),
    };
    let mut u = mhat.div(&vhat.sqrt().add(c.eps));
    if c.weight_decay > 0.0 {
        u = u.add(&p.mul(c.weight_decay));
    }
    (p.sub(&u.mul(lr)), vec![m, v])
}

/// SGD for one parameter.
fn sgd(c: &SgdConfig, p: &Value, g: &Value, state: &[Value], lr: &Value) -> (Value, Vec<Value>) {
    let mut new_state = Vec::new();
    let mut d = if c.momentum > 0.0 {
        let m = state[0].mul(c.momentum).add(g);
        new_state.push(m.clone());
        if c.nesterov {
            g.add(&m.mul(c.momentum))
        } else {
            m
        }
    } else {
        g.clone()
    };
    if c.weight_decay > 0.0 {
        d = d.add(&p.mul(c.weight_decay));
    }
    (p.sub(&d.mul(lr)), new_state)
}
