//! The Mixture-of-Experts layer in GShard's einsum form (Lepikhin et al. 2020, arXiv
//! 2006.16668, Algorithm 2) and GShard top-2 gating. Everything is ordinary IR built with
//! `ir::Builder`. The layer takes any router through [`Gate`]: top-2 here, Switch top-1, noisy
//! top-k and expert choice in [`crate::gating`]; all produce the same `[G,S,E,C]`
//! combine/dispatch pair.
//!
//! ```text
//! logits   [G,S,E]   = einsum(GSM,ME->GSE, x, wg)
//! combine, dispatch  [G,S,E,C] = gating(logits)
//! xin      [E,G,C,M] = einsum(GSEC,GSM->EGCM, dispatch, x)     all-to-all G -> E
//! h        [E,G,C,H] = act(einsum(EGCM,EMH->EGCH, xin, wi))
//! yout     [E,G,C,M] = einsum(EGCH,EHM->EGCM, h, wo)            all-to-all E -> G
//! y        [G,S,M]   = einsum(GSEC,EGCM->GSM, combine, yout)
//! ```
//!
//! Masks, positions and counts are i32 (bf16 cannot count past 256); they carry
//! no gradient because integer values never do. Gradients reach the router only through the
//! gate values in `combine` and through the mean gate in the auxiliary loss.

use crate::gating::{
    expert_choice_gating, fraction_over, noisy_top_k_gating, slot_combine, switch_gating,
    switch_router_logits, ExpertChoice, ExpertChoiceGating, NoisyTopK, NoisyTopKGating, Switch,
    SwitchGating,
};
use crate::hierarchical::{
    hierarchical_gating, Hierarchical, HierarchicalGating, HierarchicalNoise,
};
use ir::{DType, Value};
use sharding::{mesh_split, replicate, ShardingError};

/// What to do with each token's second expert (GShard's Algorithm 1: random routing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SecondPolicy {
    /// Always dispatch to the second expert (capacity permitting).
    All,
    /// Keep the second expert with probability `min(1, g2 / threshold)` (GShard random
    /// routing; threshold 0.5 is the paper's `2 * g2`). Needs uniform noise `[G,S]`.
    Random { threshold: f64 },
    /// Pick the second expert by Gumbel-max sampling over the logits with the first masked.
    /// Needs uniform noise `[G,S,E]`.
    Sampling,
}

/// Top-2 gating options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Top2 {
    /// Expert capacity C (slots per expert per group); see [`crate::capacity`].
    pub capacity: usize,
    pub policy: SecondPolicy,
    /// `legacy_mtf_behavior`: normalise `g1, g2` by `g1 + g2 + eps` before capacity and
    /// random dropping and never again (the default of Lingvo and Praxis). Otherwise
    /// renormalise the surviving gates after dropping.
    pub legacy: bool,
    pub eps: f64,
}

impl Top2 {
    pub fn new(capacity: usize) -> Top2 {
        Top2 {
            capacity,
            policy: SecondPolicy::All,
            legacy: true,
            eps: 1e-9,
        }
    }
}

/// Everything the gating computes, for the layer and for diagnostics.
#[derive(Clone, Debug)]
pub struct Gating {
    pub raw_gates: Value,
    /// `[G,S,E,C]` float.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1.
    pub dispatch: Value,
    /// Scalar load-balancing loss (`E^2 * mean(density * density_proxy)`, ~1 when balanced).
    pub aux_loss: Value,
    pub index_1: Value,
    pub index_2: Value,
    /// Final gates: normalised, zero where dropped.
    pub gate_1: Value,
    pub gate_2: Value,
    pub pos_1: Value,
    pub pos_2: Value,
    /// i32 `[G,S]`: 1 where the assignment was dispatched.
    pub kept_1: Value,
    pub kept_2: Value,
    /// Random policy only: i32 `[G,S]`, the coin before the capacity check.
    pub keep_2: Option<Value>,
    /// Fraction of first/second assignments at a position `>= C` (dropped for capacity).
    pub over_capacity_1: Value,
    pub over_capacity_2: Value,
}

/// GShard top-2 gating on `logits [G,S,E]` (the vectorised semantics of lingvo's
/// `Top2GatingOnLogits` and praxis's `top2_gating_on_logits`, `legacy_mtf_behavior`). `noise`:
/// `[G,S]` uniform for `Random`, `[G,S,E]` uniform for `Sampling`, unused for `All`.
/// `paddings`: optional `[G,S]` float, 1 = padding token (routes nowhere, consumes no capacity,
/// counted in the aux loss denominators as in the legacy code).
pub fn top2_gating(
    logits: &Value,
    cfg: &Top2,
    noise: Option<&Value>,
    paddings: Option<&Value>,
) -> Gating {
    top2_gating_biased(logits, cfg, noise, paddings, None)
}

/// [`top2_gating`] with DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437
/// section 2.1.2): `bias [E]` is added to the router probabilities for the choice of the two
/// experts only; the gates (combine weights) and the aux loss's probabilities stay the
/// unbiased ones, and no gradient reaches the bias. With the sampling policy the bias is
/// added to the masked logits before the Gumbel-max. `None` is exactly [`top2_gating`].
pub fn top2_gating_biased(
    logits: &Value,
    cfg: &Top2,
    noise: Option<&Value>,
    paddings: Option<&Value>,
    bias: Option<&Value>,
) -> Gating {
    let sh = logits.shape();
    assert_eq!(
        sh.len(),
        3,
        "top2_gating: logits must be [G,S,E], got {}",
        logits.ty()
    );
    let e = sh[2];
    assert!(e >= 2, "top2_gating needs at least 2 experts, got {e}");
    let c = cfg.capacity;
    let dt = logits.dtype();
    let raw = logits.softmax(2);
    let not_pad: Option<Value> = paddings.map(|p| p.mul(-1.0).add(1.0));
    let scores = bias.map(|bv| raw.add(&bv.reshape(&[1, 1, sh[2]])));
    let index_1 = scores.as_ref().unwrap_or(&raw).argmax(2);
    let mut mask_1 = index_1.one_hot(e, DType::I32);
    if let Some(np) = &not_pad {
        let np = np.convert(DType::I32).reshape(&[sh[0], sh[1], 1]);
        mask_1 = mask_1.mul(&np);
    }
    let mask_1f = mask_1.convert(dt);
    let gate_1 = raw.mul(&mask_1f).sum(&[2]);
    let raw_wo1 = raw.mul(&mask_1f.mul(-1.0).add(1.0));
    let index_2 = match cfg.policy {
        SecondPolicy::All | SecondPolicy::Random { .. } => match &scores {
            Some(sc) => mask_1.gt(0.0).select(f64::NEG_INFINITY, sc).argmax(2),
            None => raw_wo1.argmax(2),
        },
        SecondPolicy::Sampling => {
            let u = noise.expect("top2_gating: the sampling policy needs uniform noise [G,S,E]");
            // Gumbel-max over the logits with the first choice masked out.
            let gumbel = u.log().neg().log().neg();
            let masked = mask_1.gt(0.0).select(-0.7 * f64::from(f32::MAX), logits);
            match bias {
                Some(bv) => masked.add(&bv.reshape(&[1, 1, e])).add(&gumbel).argmax(2),
                None => masked.add(&gumbel).argmax(2),
            }
        }
    };
    let mut mask_2 = index_2.one_hot(e, DType::I32);
    if let Some(np) = &not_pad {
        mask_2 = mask_2.mul(&np.convert(DType::I32).reshape(&[sh[0], sh[1], 1]));
    }
    let mut gate_2 = raw_wo1.mul(&mask_2.convert(dt)).sum(&[2]);
    let mut gate_1 = gate_1;
    if cfg.legacy {
        let denom = gate_1.add(&gate_2).add(cfg.eps);
        gate_1 = gate_1.div(&denom);
        gate_2 = gate_2.div(&denom);
    }

    // Aux loss from the first choice before capacity (density is a count: no gradient).
    let proxy = match &not_pad {
        Some(np) => raw.mul(&np.reshape(&[sh[0], sh[1], 1])),
        None => raw.clone(),
    };
    let density_1 = mask_1f.mean(&[1]);
    let density_1_proxy = proxy.mean(&[1]);
    let aux_loss = density_1_proxy
        .mul(&density_1)
        .mean_all()
        .mul((e * e) as f64);

    let pos_1_full = mask_1.cumsum(1, true, false);
    let over_capacity_1 = fraction_over(&mask_1, &pos_1_full, c, dt);
    let mask_1 = mask_1.mul(&pos_1_full.lt(c as f64).convert(DType::I32));
    let pos_1 = pos_1_full.mul(&mask_1).sum(&[2]);
    let count_1 = mask_1.sum(&[1]);
    let kept_1 = mask_1.sum(&[2]);

    let mut keep_2 = None;
    if let SecondPolicy::Random { threshold } = cfg.policy {
        let u = noise.expect("top2_gating: the random policy needs uniform noise [G,S]");
        let k = u.lt(&gate_2.div(threshold.max(1e-9))).convert(DType::I32);
        gate_2 = gate_2.mul(&k.convert(dt));
        mask_2 = mask_2.mul(&k.reshape(&[sh[0], sh[1], 1]));
        keep_2 = Some(k);
    }
    let pos_2_full = mask_2
        .cumsum(1, true, false)
        .add(&count_1.reshape(&[sh[0], 1, e]));
    let over_capacity_2 = fraction_over(&mask_2, &pos_2_full, c, dt);
    let mask_2 = mask_2.mul(&pos_2_full.lt(c as f64).convert(DType::I32));
    let pos_2 = pos_2_full.mul(&mask_2).sum(&[2]);
    let kept_2 = mask_2.sum(&[2]);

    let mut gate_1 = gate_1.mul(&kept_1.convert(dt));
    let mut gate_2 = gate_2.mul(&kept_2.convert(dt));
    if !cfg.legacy {
        let d = gate_1.add(&gate_2);
        let d = d.gt(0.0).select(&d, 1.0);
        gate_1 = gate_1.div(&d);
        gate_2 = gate_2.div(&d);
    }

    // combine[g,s,e,c] = g1 [e == i1][c == p1] + g2 [e == i2][c == p2]
    let combine = slot_combine(&gate_1, &mask_1, &pos_1, c, dt)
        .add(&slot_combine(&gate_2, &mask_2, &pos_2, c, dt));
    let dispatch = combine.ne(0.0).convert(dt);
    Gating {
        raw_gates: raw,
        combine,
        dispatch,
        aux_loss,
        index_1,
        index_2,
        gate_1,
        gate_2,
        pos_1,
        pos_2,
        kept_1,
        kept_2,
        keep_2,
        over_capacity_1,
        over_capacity_2,
    }
}

/// Expert activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    GeluTanh,
}

impl Activation {
    pub fn apply(self, h: &Value) -> Value {
        match self {
            Activation::Relu => h.relu(),
            Activation::GeluTanh => h.gelu_tanh(),
        }
    }
}

/// Which router the MoE layer uses, with its options.
///
/// The layer's `noise` argument means, per router: `Top2`: uniform `[G,S]` (random policy)
/// or `[G,S,E]` (sampling); `Switch`: uniform `[G,S,M]` on `[0,1)` for the input jitter;
/// `NoisyTopK`: standard normal `[G,S,E]`; `ExpertChoice`: none; `Hierarchical`: standard
/// normal `[G,S,A+E]` (the primary gate's `A` values, then the secondary gates' `E`). `None` means evaluation
/// (no jitter, no gating noise; top-2 random routing then needs `SecondPolicy::All`).
#[derive(Clone, Debug)]
pub enum Gate {
    /// GShard top-2 ([`top2_gating`]).
    Top2(Top2),
    /// Switch top-1 ([`crate::gating::switch_gating`]).
    Switch(Switch),
    /// Shazeer noisy top-k ([`crate::gating::noisy_top_k_gating`]); `w_noise [M,E]` is the
    /// noise-scale projection, needed only when the layer gets noise (training).
    NoisyTopK {
        cfg: NoisyTopK,
        w_noise: Option<Value>,
    },
    /// Expert choice ([`crate::gating::expert_choice_gating`]).
    ExpertChoice(ExpertChoice),
    /// Shazeer's hierarchical MoE ([`crate::hierarchical::hierarchical_gating`]): the layer's
    /// `wg [M,E]` holds the secondary gates of all groups, `w_primary [M,A]` the primary
    /// gate; `w_noise` the noise-scale projections, needed only when the layer gets noise.
    Hierarchical {
        cfg: Hierarchical,
        w_primary: Value,
        w_noise: Option<HierarchicalNoiseWeights>,
    },
}

/// The noise-scale projections of a hierarchical gate: `primary [M,A]`, `secondary [M,E]`.
#[derive(Clone, Debug)]
pub struct HierarchicalNoiseWeights {
    pub primary: Value,
    pub secondary: Value,
}

impl From<Top2> for Gate {
    fn from(t: Top2) -> Gate {
        Gate::Top2(t)
    }
}

/// What the layer's router computed: one variant per [`Gate`].
#[derive(Clone, Debug)]
pub enum Routing {
    Top2(Gating),
    Switch(SwitchGating),
    NoisyTopK(NoisyTopKGating),
    ExpertChoice(ExpertChoiceGating),
    Hierarchical(HierarchicalGating),
}

impl Routing {
    /// `[G,S,E,C]` combine weights.
    pub fn combine(&self) -> &Value {
        match self {
            Routing::Top2(r) => &r.combine,
            Routing::Switch(r) => &r.combine,
            Routing::NoisyTopK(r) => &r.combine,
            Routing::ExpertChoice(r) => &r.combine,
            Routing::Hierarchical(r) => &r.combine,
        }
    }

    /// `[G,S,E,C]` 0/1 dispatch mask.
    pub fn dispatch(&self) -> &Value {
        match self {
            Routing::Top2(r) => &r.dispatch,
            Routing::Switch(r) => &r.dispatch,
            Routing::NoisyTopK(r) => &r.dispatch,
            Routing::ExpertChoice(r) => &r.dispatch,
            Routing::Hierarchical(r) => &r.dispatch,
        }
    }

    /// The router's auxiliary losses, unweighted, by name: top-2 `aux`; Switch `aux` and
    /// `z`; noisy top-k `importance` and `load` (CV^2 each); expert choice none;
    /// hierarchical `importance` and `load` (over all experts) and `primary_importance` and
    /// `primary_load` (over the groups).
    pub fn losses(&self) -> Vec<(&'static str, &Value)> {
        match self {
            Routing::Top2(r) => vec![("aux", &r.aux_loss)],
            Routing::Switch(r) => vec![("aux", &r.aux_loss), ("z", &r.z_loss)],
            Routing::NoisyTopK(r) => {
                vec![("importance", &r.importance_loss), ("load", &r.load_loss)]
            }
            Routing::ExpertChoice(_) => vec![],
            Routing::Hierarchical(r) => vec![
                ("importance", &r.importance_loss),
                ("load", &r.load_loss),
                ("primary_importance", &r.primary_importance_loss),
                ("primary_load", &r.primary_load_loss),
            ],
        }
    }

    /// The top-2 diagnostics, when the layer used [`Gate::Top2`].
    pub fn as_top2(&self) -> Option<&Gating> {
        match self {
            Routing::Top2(r) => Some(r),
            Routing::Switch(_)
            | Routing::NoisyTopK(_)
            | Routing::ExpertChoice(_)
            | Routing::Hierarchical(_) => None,
        }
    }
}

/// The MoE layer's outputs and intermediates.
#[derive(Clone, Debug)]
pub struct MoeOut {
    /// `[G,S,M]`.
    pub y: Value,
    /// `[G,S,E]` router logits (Switch: from the jittered inputs; noisy top-k: the clean
    /// logits).
    pub logits: Value,
    pub gating: Routing,
    pub expert_inputs: Value,
    pub hidden: Value,
    pub expert_outputs: Value,
}

/// Where the layer's annotations go (GShard section 3.2; GSPMD's 2-D layouts). Groups of tokens
/// are split over `group_axes` (every batch-like mesh axis), experts over `expert_axes`.
/// GShard's 1-D layout uses one axis for both; on a `data x expert` mesh, groups split over
/// both axes and experts over `expert`, so the all-to-alls run within each `expert` row.
/// `model_axes` split each expert's hidden dim H (GShard's 2-D expert sharding): the
/// all-to-alls stay those of the expert axes, and the experts' output projection sums
/// over the model axes (one all-reduce).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoeSharding {
    pub group_axes: Vec<String>,
    pub expert_axes: Vec<String>,
    pub model_axes: Vec<String>,
}

impl MoeSharding {
    /// GShard's 1-D layout: G and E both split over `axis`.
    pub fn one_axis(axis: &str) -> MoeSharding {
        MoeSharding {
            group_axes: vec![axis.to_string()],
            expert_axes: vec![axis.to_string()],
            model_axes: Vec::new(),
        }
    }

    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
}

/// The weights of an MoE layer: gating `wg [M,E]`, experts' `wi [E,M,H]` and `wo [E,H,M]`.
#[derive(Clone, Copy)]
pub struct MoeWeights<'a> {
    pub wg: &'a Value,
    pub wi: &'a Value,
    pub wo: &'a Value,
}

/// How an MoE layer routes: the gate, its noise (see [`Gate`]), the padding mask
/// `paddings [G,S]` (float, 1 = padding token: pads route nowhere, consume no capacity and
/// are left out of the routers' loss numerators) and the choice bias `bias [E]` of
/// auxiliary-loss-free balancing ([`top2_gating_biased`]; top-2 only).
#[derive(Clone, Copy)]
pub struct Route<'a> {
    pub gate: &'a Gate,
    pub noise: Option<&'a Value>,
    pub paddings: Option<&'a Value>,
    pub bias: Option<&'a Value>,
}

impl<'a> Route<'a> {
    /// Route with `gate`, no noise, no padding.
    pub fn new(gate: &'a Gate) -> Route<'a> {
        Route {
            gate,
            noise: None,
            paddings: None,
            bias: None,
        }
    }

    /// With the gate's noise values.
    pub fn noise(self, noise: Option<&'a Value>) -> Route<'a> {
        Route { noise, ..self }
    }

    /// With a padding mask.
    pub fn paddings(self, paddings: Option<&'a Value>) -> Route<'a> {
        Route { paddings, ..self }
    }

    /// With a choice bias `[E]` (top-2 only).
    pub fn bias(self, bias: Option<&'a Value>) -> Route<'a> {
        Route { bias, ..self }
    }
}

/// Options of [`moe_layer_with`]: where the annotations go, and how many chunks the expert
/// buffers are cut into so that communication overlaps the experts' compute.
#[derive(Clone, Copy, Debug)]
pub struct MoeLayerOptions<'a> {
    /// The layer's layout ([`MoeSharding`]); `None` leaves the layer unannotated.
    pub sharding: Option<&'a MoeSharding>,
    /// `k`: the dispatched tensor `[E,G,C,M]` is cut along the capacity dim C into `k`
    /// chunks of `C / k` slots; each chunk has its own dispatch all-to-all, expert FFN and
    /// combine all-to-all, and the chunks are concatenated back along C before the combine
    /// einsum (whose reduction is then the unchunked one). 1 (the default) is the unchunked
    /// layer. `C` must divide by `k` ([`MoeLayerError::Chunks`]).
    pub overlap_chunks: usize,
}

impl Default for MoeLayerOptions<'_> {
    fn default() -> Self {
        MoeLayerOptions {
            sharding: None,
            overlap_chunks: 1,
        }
    }
}

/// Why [`moe_layer_with`] refused to build the layer.
#[derive(Debug, thiserror::Error)]
pub enum MoeLayerError {
    #[error(transparent)]
    Sharding(#[from] ShardingError),
    #[error("overlap = {k} does not divide the expert capacity {capacity}: use one of its divisors ({})", divisors_text(*capacity))]
    Chunks { capacity: usize, k: usize },
}

/// The divisors of `n`, comma-separated (for [`MoeLayerError::Chunks`]).
pub fn divisors_text(n: usize) -> String {
    let d: Vec<String> = (1..=n)
        .filter(|d| n.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    d.join(", ")
}

/// The GShard MoE feed-forward layer on `x [G,S,M]` with weights `w`, routed by `route`.
/// With `sharding`, `x` is split on G, `wg` (and a noisy gate's `w_noise`) replicated, the
/// expert buffers and weights split on E, and the expert outputs split back on G before
/// the combine (the two all-to-alls). Mixed precision: an `x` narrower than the weights
/// (bf16 activations, f32 master weights) is routed and combined in the weights' dtype
/// and dispatched and run through the experts in its own, so the all-to-alls move it at
/// its width. [`moe_layer_with`] with one chunk.
pub fn moe_layer(
    x: &Value,
    w: MoeWeights,
    route: Route,
    act: Activation,
    sharding: Option<&MoeSharding>,
) -> Result<MoeOut, ShardingError> {
    let opts = MoeLayerOptions {
        sharding,
        overlap_chunks: 1,
    };
    moe_layer_with(x, w, route, act, opts).map_err(|e| match e {
        MoeLayerError::Sharding(e) => e,
        MoeLayerError::Chunks { .. } => unreachable!("one chunk divides every capacity"),
    })
}

/// [`moe_layer`] with its options: with `overlap_chunks = k > 1` the expert buffers go
/// through the all-to-alls and the experts in `k` chunks along capacity (see
/// [`MoeLayerOptions::overlap_chunks`]). The program then holds every chunk's dispatch
/// all-to-all first, then each chunk's experts and combine all-to-all in turn, so an
/// executor that starts collectives early and waits late runs chunk `i + 1`'s all-to-all
/// during chunk `i`'s experts. Every chunk computes what the unchunked layer computes on
/// its slots (the dots' rows do not depend on how many there are), and autodiff gives the
/// backward pass its chunks.
pub fn moe_layer_with(
    x: &Value,
    w: MoeWeights,
    route: Route,
    act: Activation,
    opts: MoeLayerOptions,
) -> Result<MoeOut, MoeLayerError> {
    let sharding = opts.sharding;
    let k = opts.overlap_chunks.max(1);
    let MoeWeights { wg, wi, wo } = w;
    let Route {
        gate,
        noise,
        paddings,
        bias,
    } = route;
    let b = x.builder();
    // The gate's own weights beyond `wg`: a noisy gate's noise projection, a hierarchical
    // gate's primary gate and noise projections; all replicated like `wg`.
    let extra: Vec<Value> = match gate {
        Gate::NoisyTopK { w_noise, .. } => w_noise.iter().cloned().collect(),
        Gate::Hierarchical {
            w_primary, w_noise, ..
        } => std::iter::once(w_primary.clone())
            .chain(
                w_noise
                    .iter()
                    .flat_map(|w| [w.primary.clone(), w.secondary.clone()]),
            )
            .collect(),
        Gate::Top2(_) | Gate::Switch(_) | Gate::ExpertChoice(_) => Vec::new(),
    };
    assert!(
        bias.is_none() || matches!(gate, Gate::Top2(_)),
        "moe_layer: a choice bias is implemented for top-2 gating only"
    );
    let (x, wg, wi, wo, extra) = match sharding {
        Some(s) => {
            let g = MoeSharding::strs(&s.group_axes);
            let e = MoeSharding::strs(&s.expert_axes);
            let h = MoeSharding::strs(&s.model_axes);
            (
                mesh_split(x, &[&g, &[], &[]])?,
                replicate(wg)?,
                mesh_split(wi, &[&e, &[], &h])?,
                mesh_split(wo, &[&e, &h, &[]])?,
                extra.iter().map(replicate).collect::<Result<Vec<_>, _>>()?,
            )
        }
        None => (x.clone(), wg.clone(), wi.clone(), wo.clone(), extra),
    };
    let scope = b.scope("gating");
    // The router computes in its weights' dtype (the master dtype under mixed precision).
    let xr = x.convert(wg.dtype());
    let (logits, gating) = match gate {
        Gate::Top2(cfg) => {
            let logits = b.einsum("GSM,ME->GSE", &[&xr, &wg]);
            let r = top2_gating_biased(&logits, cfg, noise, paddings, bias);
            (logits, Routing::Top2(r))
        }
        Gate::Switch(cfg) => {
            let logits = switch_router_logits(&xr, &wg, cfg.jitter_eps, noise);
            let r = switch_gating(&logits, cfg, paddings);
            (logits, Routing::Switch(r))
        }
        Gate::NoisyTopK { cfg, .. } => {
            let logits = b.einsum("GSM,ME->GSE", &[&xr, &wg]);
            let raw_noise = noise.map(|n| {
                let wn = extra
                    .first()
                    .expect("moe_layer: a noisy top-k gate with noise needs w_noise");
                (b.einsum("GSM,ME->GSE", &[&xr, wn]), n)
            });
            let r = noisy_top_k_gating(
                &logits,
                raw_noise.as_ref().map(|(r, n)| (r, *n)),
                cfg,
                paddings,
            );
            (logits, Routing::NoisyTopK(r))
        }
        Gate::ExpertChoice(cfg) => {
            assert!(
                noise.is_none(),
                "moe_layer: expert-choice gating takes no noise"
            );
            let logits = b.einsum("GSM,ME->GSE", &[&xr, &wg]);
            let r = expert_choice_gating(&logits, cfg, paddings);
            (logits, Routing::ExpertChoice(r))
        }
        Gate::Hierarchical { cfg, .. } => {
            let logits = b.einsum("GSM,ME->GSE", &[&xr, &wg]);
            let primary = b.einsum("GSM,MA->GSA", &[&xr, &extra[0]]);
            let (a, e) = (cfg.groups, wg.shape()[1]);
            let raw = noise.map(|n| {
                assert!(
                    extra.len() == 3,
                    "moe_layer: a hierarchical gate with noise needs w_noise"
                );
                let sh = n.shape();
                assert_eq!(
                    sh[2],
                    a + e,
                    "moe_layer: hierarchical noise must be [G,S,A+E], got {}",
                    n.ty()
                );
                (
                    b.einsum("GSM,MA->GSA", &[&xr, &extra[1]]),
                    n.slice_dim(2, 0, a),
                    b.einsum("GSM,ME->GSE", &[&xr, &extra[2]]),
                    n.slice_dim(2, a, a + e),
                )
            });
            let hn = raw.as_ref().map(|(pr, pn, sr, sn)| HierarchicalNoise {
                primary_raw: pr,
                primary_normal: pn,
                secondary_raw: sr,
                secondary_normal: sn,
            });
            let r = hierarchical_gating(&primary, &logits, hn, cfg, paddings);
            (logits, Routing::Hierarchical(r))
        }
    };
    drop(scope);
    let scope = b.scope("dispatch");
    // Dispatch and experts in `x`'s dtype (0/1 dispatch values are exact in any), so the
    // all-to-alls move it at its width. The combine reads the routing's weights in their
    // own dtype: under mixed precision the expert outputs are widened for it (after their
    // all-to-all) and its result narrowed, so the f32 combine weights are read as the f32
    // step reads them (by their non-zeros, with no bf16 copy kept for the backward pass)
    // and keep f32's precision.
    let dt = x.dtype();
    let rt = gating.combine().dtype();
    let combine = |yout: &Value| {
        if dt == rt {
            b.einsum("GSEC,EGCM->GSM", &[gating.combine(), yout])
        } else {
            b.einsum("GSEC,EGCM->GSM", &[gating.combine(), &yout.convert(rt)])
                .convert(dt)
        }
    };
    let xin = b.einsum("GSEC,GSM->EGCM", &[&gating.dispatch().convert(dt), &x]);
    let c = xin.shape()[2];
    if !c.is_multiple_of(k) {
        return Err(MoeLayerError::Chunks { capacity: c, k });
    }
    // The expert buffers: E split over the expert axes, G over the remaining group axes.
    let buffers = sharding.map(|s| {
        let rest: Vec<&str> = s
            .group_axes
            .iter()
            .filter(|a| !s.expert_axes.contains(a))
            .map(String::as_str)
            .collect();
        (
            MoeSharding::strs(&s.expert_axes),
            rest,
            MoeSharding::strs(&s.group_axes),
        )
    });
    let to_experts = |v: &Value| -> Result<Value, ShardingError> {
        match &buffers {
            Some((e, rest, _)) => mesh_split(v, &[e, rest, &[], &[]]),
            None => Ok(v.clone()),
        }
    };
    let to_groups = |v: &Value| -> Result<Value, ShardingError> {
        match &buffers {
            Some((_, _, g)) => mesh_split(v, &[&[], g, &[], &[]]),
            None => Ok(v.clone()),
        }
    };
    if k == 1 {
        let xin = to_experts(&xin)?;
        drop(scope);
        let scope = b.scope("experts");
        let hidden = act.apply(&b.einsum("EGCM,EMH->EGCH", &[&xin, &wi.convert(dt)]));
        let yout = to_experts(&b.einsum("EGCH,EHM->EGCM", &[&hidden, &wo.convert(dt)]))?;
        let expert_outputs = yout.clone();
        drop(scope);
        let _scope = b.scope("combine");
        let yout = to_groups(&yout)?;
        let y = combine(&yout);
        return Ok(MoeOut {
            y,
            logits,
            gating,
            expert_inputs: xin,
            hidden,
            expert_outputs,
        });
    }
    // Chunks along capacity: the whole buffer stays where the dispatch einsum makes it (G
    // split), each chunk a slice of it there, then moved to its experts (one all-to-all
    // each), every chunk's before any chunk's experts.
    let xin = to_groups(&xin)?;
    let cc = c / k;
    let mut chunks = Vec::with_capacity(k);
    for j in 0..k {
        let xj = to_groups(&xin.slice_dim(2, j * cc, (j + 1) * cc))?;
        chunks.push(to_experts(&xj)?);
    }
    drop(scope);
    let (wi, wo) = (wi.convert(dt), wo.convert(dt));
    let (mut hiddens, mut outs, mut back) = (Vec::new(), Vec::new(), Vec::new());
    for xj in &chunks {
        let scope = b.scope("experts");
        let h = act.apply(&b.einsum("EGCM,EMH->EGCH", &[xj, &wi]));
        let yj = to_experts(&b.einsum("EGCH,EHM->EGCM", &[&h, &wo]))?;
        drop(scope);
        let _scope = b.scope("combine");
        back.push(to_groups(&yj)?);
        hiddens.push(h);
        outs.push(yj);
    }
    let _scope = b.scope("combine");
    let cat = |v: &[Value]| b.concat(&v.iter().collect::<Vec<_>>(), 2);
    let yout = to_groups(&cat(&back))?;
    let y = combine(&yout);
    // The diagnostics whole again (dead code unless a caller reads them).
    Ok(MoeOut {
        y,
        logits,
        gating,
        expert_inputs: cat(&chunks),
        hidden: cat(&hiddens),
        expert_outputs: cat(&outs),
    })
}
