//! `gshard export`: write ready-made programs as text. `moe-layer` is one GShard top-2 MoE
//! layer with its loss and gradients, annotated with GShard's 1-D layout (groups and experts
//! split over mesh axis `expert`), so `gshard run` reproduces the JAX vectors in
//! `testdata/moe-top2` on one device or with `--mesh expert=N`. `train-step` is the training
//! step of a run config (forward, loss, gradients, optimizer update), for `gshard inspect`.

use crate::files;
use anyhow::{bail, Context, Result};
use clap::{Subcommand, ValueEnum};
use ir::{Builder, DType, Mesh, Type};
use nn::moe::{
    moe_layer_with, Activation, Gate, MoeLayerOptions, MoeSharding, MoeWeights, Route,
    SecondPolicy, Top2,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// One GShard top-2 MoE layer: forward, loss = sum(y * loss_weight) + 0.01 * aux_loss, gradients.
    MoeLayer(MoeArgs),
    /// The training step of a run config (default: the main job's), before partitioning.
    TrainStep(StepArgs),
}

#[derive(clap::Args)]
pub struct StepArgs {
    /// TOML config, as for `gshard train` (default: the main job's).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Vocabulary size (a run's tokenizer decides it; the config's `data.vocab_size` by default).
    #[arg(long)]
    vocab: Option<usize>,
    /// Output file (.gsir).
    #[arg(short, long)]
    out: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Policy {
    All,
    Random,
    Sampling,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Act {
    Relu,
    /// Also spelled `gelu_tanh`, as in the training config.
    #[value(alias = "gelu_tanh")]
    GeluTanh,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Dt {
    F32,
    F64,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Formula {
    /// C = ceil(2 S cf / E) (GShard paper), at least 1.
    Gshard,
    /// auto = floor(2 S cf / E), rounded up to a multiple of 4 (Praxis/Lingvo code).
    Praxis,
}

/// The MoE layer's shape and options (shared with `gshard bench moe-layer`).
#[derive(clap::Args)]
pub struct MoeLayerArgs {
    /// G: number of token groups.
    #[arg(long)]
    pub groups: usize,
    /// S: tokens per group.
    #[arg(long)]
    pub group_size: usize,
    /// E: number of experts.
    #[arg(long)]
    pub experts: usize,
    /// M: model dim.
    #[arg(long)]
    pub model_dim: usize,
    /// H: expert hidden dim.
    #[arg(long)]
    pub hidden_dim: usize,
    /// C: expert capacity (slots per expert per group).
    #[arg(long, conflicts_with = "capacity_factor")]
    pub capacity: Option<usize>,
    /// Derive C from a capacity factor instead.
    #[arg(long)]
    pub capacity_factor: Option<f64>,
    /// Formula for --capacity-factor.
    #[arg(long, value_enum, default_value = "gshard")]
    pub capacity_formula: Formula,
    /// Second-expert policy.
    #[arg(long, value_enum, default_value = "all")]
    pub policy: Policy,
    /// Threshold of the random policy (0.5 keeps the 2nd expert with probability 2*g2).
    #[arg(long, default_value_t = 0.5)]
    pub threshold: f64,
    #[arg(long, value_enum, default_value = "relu")]
    pub activation: Act,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dt,
    /// Renormalise gates after dropping instead of before (legacy_mtf_behavior = false).
    #[arg(long)]
    pub no_legacy: bool,
    /// Cut the expert buffers into K chunks along capacity, each with its own all-to-alls
    /// (`nn::moe::MoeLayerOptions::overlap_chunks`); K must divide C.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub overlap: usize,
}

#[derive(clap::Args)]
pub struct MoeArgs {
    #[command(flatten)]
    layer: MoeLayerArgs,
    /// Output file (.gsir).
    #[arg(short, long)]
    out: PathBuf,
}

pub fn main(a: Args) -> Result<()> {
    match a.what {
        What::MoeLayer(m) => moe(m),
        What::TrainStep(s) => train_step(s),
    }
}

fn train_step(a: StepArgs) -> Result<()> {
    let cfg = super::train::load_config(a.config.as_deref())?;
    let vocab = a.vocab.unwrap_or(cfg.data.vocab_size);
    let step = train::trainer::step_program(&cfg, vocab).context("building the training step")?;
    let header = format!(
        "# The training step of {}: forward, loss, gradients, optimizer update (vocabulary {vocab}).\n",
        a.config
            .as_ref()
            .map_or("the main job's config".to_string(), |p| p.display().to_string())
    );
    let text = format!("{header}{}", ir::text::print(&step.program));
    files::write_atomic(&a.out, text.as_bytes())?;
    println!(
        "wrote {} ({} instructions, {} parameters, {} MoE layers)",
        a.out.display(),
        step.program.len(),
        step.params.len(),
        step.moe_layers.len()
    );
    Ok(())
}

fn moe(args: MoeArgs) -> Result<()> {
    let (p, c, header) = moe_program(&args.layer)?;
    let text = format!("{header}{}", ir::text::print(&p));
    files::write_atomic(&args.out, text.as_bytes())?;
    println!(
        "wrote {} ({} instructions, capacity C={c})",
        args.out.display(),
        p.len()
    );
    Ok(())
}

/// The MoE layer program (forward, loss, gradients, GShard's 1-D annotations on mesh
/// `expert=1`), its capacity C and a comment header describing it.
pub fn moe_program(a: &MoeLayerArgs) -> Result<(ir::Program, usize, String)> {
    let (g, s, e, m, h) = (a.groups, a.group_size, a.experts, a.model_dim, a.hidden_dim);
    if [g, s, e, m, h].contains(&0) {
        bail!("--groups, --group-size, --experts, --model-dim and --hidden-dim must all be at least 1");
    }
    if e < 2 {
        bail!("top-2 gating needs --experts >= 2");
    }
    let c = match (a.capacity, a.capacity_factor) {
        (Some(c), _) if c >= 1 => c,
        (Some(_), _) => bail!("--capacity must be at least 1"),
        (None, Some(cf)) if cf.is_finite() && cf > 0.0 => match a.capacity_formula {
            Formula::Gshard => nn::capacity::gshard(s, e, cf),
            Formula::Praxis => nn::capacity::praxis(s, e, cf, None),
        },
        (None, Some(cf)) => bail!("--capacity-factor must be a positive number, got {cf}"),
        (None, None) => bail!("give --capacity C or --capacity-factor F"),
    };
    let dt = match a.dtype {
        Dt::F32 => DType::F32,
        Dt::F64 => DType::F64,
    };
    let policy = match a.policy {
        Policy::All => SecondPolicy::All,
        Policy::Random => SecondPolicy::Random {
            threshold: a.threshold,
        },
        Policy::Sampling => SecondPolicy::Sampling,
    };
    let act = match a.activation {
        Act::Relu => Activation::Relu,
        Act::GeluTanh => Activation::GeluTanh,
    };
    let t = |shape: &[usize]| Type::new(dt, shape.to_vec());
    let b = Builder::with_mesh(Mesh::new(&[("expert", 1)])?);
    let x = b.param("x", t(&[g, s, m]));
    let wg = b.param("wg", t(&[m, e]));
    let wi = b.param("wi", t(&[e, m, h]));
    let wo = b.param("wo", t(&[e, h, m]));
    let loss_weight = b.param("loss_weight", t(&[g, s, m]));
    let noise = match policy {
        SecondPolicy::All => None,
        SecondPolicy::Random { .. } => Some(b.param("noise", t(&[g, s]))),
        SecondPolicy::Sampling => Some(b.param("noise", t(&[g, s, e]))),
    };
    let cfg = Top2 {
        capacity: c,
        policy,
        legacy: !a.no_legacy,
        eps: 1e-9,
    };
    let layout = MoeSharding::one_axis("expert");
    let gate = Gate::Top2(cfg);
    let weights = MoeWeights {
        wg: &wg,
        wi: &wi,
        wo: &wo,
    };
    let route = Route::new(&gate).noise(noise.as_ref());
    let layer_scope = b.scope("moe");
    if a.overlap == 0 {
        bail!("--overlap must be at least 1");
    }
    let opts = MoeLayerOptions {
        sharding: Some(&layout),
        overlap_chunks: a.overlap,
    };
    let out = moe_layer_with(&x, weights, route, act, opts)?;
    drop(layer_scope);
    let _loss_scope = b.scope("loss");
    let gt = out
        .gating
        .as_top2()
        .expect("a top-2 gate routes with top-2");
    let loss = out
        .y
        .mul(&loss_weight)
        .sum_all()
        .add(&gt.aux_loss.mul(0.01));
    b.output("loss", &loss);
    b.output("y", &out.y);
    b.output("aux_loss", &gt.aux_loss);
    b.output("logits", &out.logits);
    b.output("raw_gates", &gt.raw_gates);
    b.output("combine", &gt.combine);
    b.output("dispatch", &gt.dispatch);
    b.output("index_1", &gt.index_1);
    b.output("index_2", &gt.index_2);
    b.output("pos_1", &gt.pos_1);
    b.output("pos_2", &gt.pos_2);
    b.output("kept_1", &gt.kept_1);
    b.output("kept_2", &gt.kept_2);
    b.output("gate_1", &gt.gate_1);
    b.output("gate_2", &gt.gate_2);
    if let Some(k) = &gt.keep_2 {
        b.output("keep_2", k);
    }
    b.output("over_capacity_1", &gt.over_capacity_1);
    b.output("over_capacity_2", &gt.over_capacity_2);
    b.output("expert_inputs", &out.expert_inputs);
    b.output("hidden", &out.hidden);
    b.output("expert_outputs", &out.expert_outputs);
    let fwd = b.finish();
    let p = autodiff::grad(&fwd, "loss", &["x", "wg", "wi", "wo"])
        .context("differentiating the MoE layer")?;
    let header = format!(
        "# GShard top-2 MoE layer: G={g} S={s} E={e} M={m} H={h} C={c} policy={} activation={} dtype={dt}\n\
         # loss = sum(y * loss_weight) + 0.01 * aux_loss, with grad_x, grad_wg, grad_wi, grad_wo.\n\
         # Groups and experts are split over mesh axis `expert`: run with --mesh expert=N.\n",
        match policy {
            SecondPolicy::All => "all".to_string(),
            SecondPolicy::Random { threshold } => format!("random(threshold {threshold})"),
            SecondPolicy::Sampling => "sampling".to_string(),
        },
        match act {
            Activation::Relu => "relu",
            Activation::GeluTanh => "gelu_tanh",
        },
    );
    Ok((p, c, header))
}
