//! The Transformer's MoE feed-forward sub-layer: the router its config chooses
//! ([`MoeGating`]: GShard top-2 or Shazeer's hierarchical MoE) with its train-time noise, how
//! the expert load is kept balanced ([`Balance`]: GShard's auxiliary loss, or DeepSeek-V3's
//! per-expert choice bias, a buffer updated by the program itself), and the layer's
//! diagnostics ([`MoeStats`]).

use crate::hierarchical::Hierarchical;
use crate::moe::{
    moe_layer_with, Gate, HierarchicalNoiseWeights, MoeLayerError, MoeLayerOptions, MoeSharding,
    MoeWeights, Route, Routing, SecondPolicy, Top2,
};
use crate::params::{Init, Params};
use crate::transformer::{Ctx, MoeConfig, MoeStats};
use ir::{RngDist, Type, Value};
use sharding::ShardingError;

/// Which router a model's MoE layers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeGating {
    /// GShard top-2 ([`crate::moe::top2_gating`]), the second expert by
    /// [`MoeConfig::policy`].
    Top2,
    /// Shazeer's hierarchical MoE ([`crate::hierarchical::hierarchical_gating`]): the experts
    /// in `groups` groups; each token takes `k_primary` groups and `k_secondary` experts of
    /// each. Noisy gates at train time (needs the step's seed).
    Hierarchical {
        groups: usize,
        k_primary: usize,
        k_secondary: usize,
    },
}

/// How a model's MoE layers keep the expert load balanced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Balance {
    /// The router's auxiliary losses, weighted by [`MoeConfig::aux_loss_coef`] (GShard).
    AuxLoss,
    /// No auxiliary loss (DeepSeek-V3, arXiv 2412.19437 section 2.1.2): a per-expert bias,
    /// added to the router probabilities for the choice only, moves by `rate` after every
    /// step towards the mean load ([`bias_update`]). Top-2 gating only.
    Bias { rate: f64 },
}

impl MoeConfig {
    /// Whether training routes with random numbers (and so needs the step's seed).
    pub fn needs_seed(&self) -> bool {
        match self.gating {
            MoeGating::Top2 => self.policy != SecondPolicy::All,
            MoeGating::Hierarchical { .. } => true,
        }
    }

    /// Expert assignments per token before capacity: 2 for top-2, `k_primary * k_secondary`
    /// for hierarchical.
    pub fn assignments(&self) -> usize {
        match self.gating {
            MoeGating::Top2 => 2,
            MoeGating::Hierarchical {
                k_primary,
                k_secondary,
                ..
            } => k_primary * k_secondary,
        }
    }
}

/// The buffer that holds an MoE layer's choice bias `[E]` under [`Balance::Bias`]
/// (`<layer>/choice_bias`, e.g. `encoder/layer1/moe/choice_bias`).
pub const CHOICE_BIAS: &str = "choice_bias";

/// DeepSeek-V3's bias update: `bias + rate * sign(mean(load) - load)`, where `load [E]` is
/// the step's assignments per expert (any scale: only the comparison with the mean counts).
/// Underloaded experts gain, overloaded ones lose, balanced ones stay.
pub fn bias_update(bias: &Value, load: &Value, rate: f64) -> Value {
    let mean = load.mean_all();
    bias.add(&mean.sub(load).sign().mul(rate))
}

/// The MoE feed-forward of `x [B,T,M]` (its parameters under `p`'s prefix): routes, records
/// the layer's [`MoeStats`] and aux loss in `cx`, and the new choice bias in `p`.
pub(crate) fn moe_ffn(cx: &mut Ctx, p: &mut Params, x: &Value) -> Result<Value, ShardingError> {
    let cfg = cx.cfg;
    let (bsz, t, m) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let mc = cfg.moe.as_ref().expect("an MoE layer has an MoE config");
    let (e, s) = (mc.experts, mc.group_size);
    assert!(
        (bsz * t) % s == 0,
        "MoE group size {s} must divide batch*length {}",
        bsz * t
    );
    let g = bsz * t / s;
    let b = x.builder();
    // Routing noise and diagnostics in the master dtype, as the router (`moe_layer`).
    let dt = p.dtype;
    let lim = |fan_in: usize| (3.0 / fan_in as f64).sqrt();
    // Experts over the expert axes, each expert's hidden dim over the model axes (when the
    // layer is sharded; `moe_layer` annotates the same).
    let sharded = !cx.layout.expert_axes.is_empty() && b.mesh().is_some();
    let ex: Vec<&str> = cx.layout.expert_axes.iter().map(String::as_str).collect();
    let hid = cx.model();
    let wg_dims: [&[&str]; 2] = [&[], &[]];
    let wi_dims: [&[&str]; 3] = [&ex, &[], &hid];
    let wo_dims: [&[&str]; 3] = [&ex, &hid, &[]];
    let wg = p.param(
        "wg",
        &[m, e],
        Init::Uniform(lim(m)),
        sharded.then_some(&wg_dims[..]),
    )?;
    let wi = p.param(
        "wi",
        &[e, m, mc.expert_dim],
        Init::Uniform(lim(m)),
        sharded.then_some(&wi_dims[..]),
    )?;
    let wo = p.param(
        "wo",
        &[e, mc.expert_dim, m],
        Init::Uniform(lim(mc.expert_dim)),
        sharded.then_some(&wo_dims[..]),
    )?;
    let xg = x.reshape(&[g, s, m]);
    let rng = |shape: Vec<usize>, dist| {
        cx.seed
            .as_ref()
            .map(|sd| b.rng(dist, sd, Type::new(dt, shape)))
    };
    let (gate, noise) = match mc.gating {
        MoeGating::Top2 => {
            let noise = match mc.policy {
                SecondPolicy::All => None,
                SecondPolicy::Random { .. } => rng(vec![g, s], RngDist::Uniform),
                SecondPolicy::Sampling => rng(vec![g, s, e], RngDist::Uniform),
            };
            // Without a seed (evaluation), random routing keeps every second expert.
            let policy = if noise.is_none() {
                SecondPolicy::All
            } else {
                mc.policy
            };
            let top2 = Top2 {
                capacity: mc.capacity,
                policy,
                legacy: true,
                eps: 1e-9,
            };
            (Gate::Top2(top2), noise)
        }
        MoeGating::Hierarchical {
            groups,
            k_primary,
            k_secondary,
        } => {
            // The noise projections start at zero, as in T2T; every program has them (the
            // evaluation and decoding programs, which take no noise, leave them unused).
            let w_primary = p.param("wg_primary", &[m, groups], Init::Uniform(lim(m)), None)?;
            let wn_primary = p.param("wn_primary", &[m, groups], Init::Zeros, None)?;
            let wn = p.param("wn", &[m, e], Init::Zeros, None)?;
            let noise = rng(vec![g, s, groups + e], RngDist::Normal);
            let gate = Gate::Hierarchical {
                cfg: Hierarchical::new(groups, k_primary, k_secondary, mc.capacity),
                w_primary,
                w_noise: noise.is_some().then_some(HierarchicalNoiseWeights {
                    primary: wn_primary,
                    secondary: wn,
                }),
            };
            (gate, noise)
        }
    };
    let bias = match mc.balance {
        Balance::Bias { .. } => Some(p.buffer(CHOICE_BIAS, &[e], Init::Zeros)?),
        Balance::AuxLoss => None,
    };
    let layout = (!cx.layout.expert_axes.is_empty() && b.mesh().is_some()).then(|| MoeSharding {
        group_axes: cx.layout.batch_axes.clone(),
        expert_axes: cx.layout.expert_axes.clone(),
        model_axes: cx.layout.model_axes.clone(),
    });
    let opts = MoeLayerOptions {
        sharding: layout.as_ref(),
        overlap_chunks: mc.overlap_chunks,
    };
    let out = match moe_layer_with(
        &xg,
        MoeWeights {
            wg: &wg,
            wi: &wi,
            wo: &wo,
        },
        Route::new(&gate).noise(noise.as_ref()).bias(bias.as_ref()),
        cfg.activation,
        opts,
    ) {
        Ok(out) => out,
        Err(MoeLayerError::Sharding(e)) => return Err(e),
        // A config error the config's checks refuse first (`train::config`).
        Err(e @ MoeLayerError::Chunks { .. }) => panic!("MoeConfig::overlap_chunks: {e}"),
    };
    // Per expert: the share of first choices (the stats) and of all assignments (the bias
    // update), both before capacity.
    let share = |idx: &Value| idx.one_hot(e, dt).mean(&[0, 1]);
    let (stats, assigned) = match &out.gating {
        Routing::Top2(r) => (
            MoeStats {
                load: share(&r.index_1),
                aux_loss: r.aux_loss.clone(),
                dropped_1: r.over_capacity_1.clone(),
                dropped_2: r.over_capacity_2.clone(),
            },
            share(&r.index_1).add(&share(&r.index_2)),
        ),
        Routing::Hierarchical(r) => {
            let losses = out.gating.losses();
            let aux = losses[1..]
                .iter()
                .fold(losses[0].1.clone(), |acc, (_, l)| acc.add(*l));
            // Every rank holds one assignment per token, so the mean of the later ranks'
            // dropped fractions is their joint fraction.
            let later = &r.over_by_rank[1..];
            let dropped_2 = match later.split_first() {
                Some((first, rest)) => rest
                    .iter()
                    .fold(first.clone(), |acc, v| acc.add(v))
                    .div(later.len() as f64),
                None => b.scalar(0.0, dt),
            };
            let first = r.top_index.slice_dim(2, 0, 1).reshape(&[g, s]);
            (
                MoeStats {
                    load: share(&first),
                    aux_loss: aux,
                    dropped_1: r.over_by_rank[0].clone(),
                    dropped_2,
                },
                r.top_index.one_hot(e, dt).sum(&[2]).mean(&[0, 1]),
            )
        }
        Routing::Switch(_) | Routing::NoisyTopK(_) | Routing::ExpertChoice(_) => {
            unreachable!("the Transformer builds top-2 or hierarchical gates")
        }
    };
    match (mc.balance, &bias) {
        (Balance::Bias { rate }, Some(bias)) => {
            p.update(CHOICE_BIAS, &bias_update(bias, &assigned, rate))?;
        }
        _ => cx.aux.push(stats.aux_loss.clone()),
    }
    cx.moe.push((p.full_name(""), stats));
    Ok(out.y.reshape(&[bsz, t, m]))
}
