//! Token routers other than GShard top-2 ([`crate::moe::top2_gating`]), all built as IR and
//! all producing the `[G,S,E,C]` combine/dispatch pair that [`crate::moe::moe_layer`]
//! consumes, plus their losses (unweighted: the caller weights them) and diagnostics.
//!
//! - [`switch_gating`]: Switch Transformer top-1 (Fedus et al. 2021): raw-probability gate,
//!   token-order capacity, GShard-form aux loss, router z-loss; multiplicative jitter on the
//!   router *inputs* through [`switch_router_logits`].
//! - [`noisy_top_k_gating`]: Shazeer et al. 2017 noisy top-k (tensor2tensor's form): softmax
//!   over the k kept noisy logits, importance and smooth load estimators, [`cv_squared`]; slots
//!   filled rank by rank (all rank-1 picks of a group, then rank-2 after the kept rank-1
//!   counts, ...), like Praxis top-k.
//! - [`expert_choice_gating`]: expert-choice (Zhou et al. 2022, Praxis v2 form): every expert
//!   takes the C tokens of its group with the highest router probability; slot = token order.
//!
//! Shared with top-2: [`slots`]/[`slot_combine`] turn (mask, slot position) pairs into the
//! one-hot `[G,S,E,C]` form, and [`fill_slots`] assigns positions by exclusive cumsum over S
//! with `pos < C`. Masks and positions are i32 (bf16 counts exactly only to 256); they carry no
//! gradient. Unlike top-2 (whose dispatch is `combine != 0`, as in the JAX reference), the
//! routers here derive `dispatch` from the integer masks, so a gate that underflows to 0 still
//! dispatches the token that holds the slot.
//!
//! Paddings are `[G,S]` floats, 1 = padding token: pads route nowhere, consume no capacity,
//! and are zeroed in every loss numerator.

use ir::{DType, Value};

// ---- shared slot machinery (also used by top-2) ----

/// `1 - paddings`: the `[G,S]` float mask of real tokens.
pub(crate) fn not_pad(paddings: Option<&Value>) -> Option<Value> {
    paddings.map(|p| p.mul(-1.0).add(1.0))
}

/// `mask [G,S,E]` (i32) with padding rows zeroed.
fn zero_pads_i32(mask: &Value, not_pad: Option<&Value>) -> Value {
    match not_pad {
        Some(np) => {
            let sh = mask.shape();
            mask.mul(&np.convert(DType::I32).reshape(&[sh[0], sh[1], 1]))
        }
        None => mask.clone(),
    }
}

/// Fraction of the assignments in `mask` whose position is `>= c` (dropped for capacity).
pub(crate) fn fraction_over(mask: &Value, pos_full: &Value, c: usize, dt: DType) -> Value {
    let over = mask.mul(pos_full).ge(c as f64).convert(dt).sum_all();
    let n = mask.convert(dt).sum_all().max(1.0);
    over.div(&n)
}

/// The 0/1 `[G,S,E,C]` tensor `mask[g,s,e] * [c == pos]`. `mask` is i32 `[G,S,E]`; `pos` is
/// i32 `[G,S]` (one slot per token, for routers that pick one expert per token and rank) or
/// `[G,S,E]` (one slot per token and expert).
pub fn slots(mask: &Value, pos: &Value, c: usize, dt: DType) -> Value {
    let sh = mask.shape();
    let (g, s, e) = (sh[0], sh[1], sh[2]);
    let m = mask.convert(dt).reshape(&[g, s, e, 1]);
    let p = match pos.rank() {
        2 => pos.one_hot(c, dt).reshape(&[g, s, 1, c]),
        3 => pos.one_hot(c, dt),
        r => panic!("slots: pos must be [G,S] or [G,S,E], got rank {r}"),
    };
    m.mul(&p)
}

/// `combine[g,s,e,c] = gate * mask[g,s,e] * [c == pos]` with `gate` `[G,S]` (per token) or
/// `[G,S,E]` (per token and expert); see [`slots`].
pub fn slot_combine(gate: &Value, mask: &Value, pos: &Value, c: usize, dt: DType) -> Value {
    let sh = mask.shape();
    let (g, s) = (sh[0], sh[1]);
    let gt = match gate.rank() {
        2 => gate.reshape(&[g, s, 1, 1]),
        3 => gate.reshape(&[g, s, gate.shape()[2], 1]),
        r => panic!("slot_combine: gate must be [G,S] or [G,S,E], got rank {r}"),
    };
    slots(mask, pos, c, dt).mul(&gt)
}

/// One choice rank's capacity assignment (see [`fill_slots`]).
#[derive(Clone, Debug)]
pub struct Slots {
    /// i32 `[G,S,E]`: the assignments that got a slot.
    pub mask: Value,
    /// i32 `[G,S]`: the slot of each kept assignment (0 where dropped).
    pub pos: Value,
    /// i32 `[G,S]`: 1 where the token's assignment was kept.
    pub kept: Value,
    /// i32 `[G,E]`: slots used per expert so far (`offset` plus this rank's kept count).
    pub count: Value,
    /// Float scalar: assignments of this rank at a position `>= C`.
    pub over: Value,
    /// Float scalar: assignments of this rank (kept or not).
    pub assigned: Value,
}

/// Slots for the assignments `mask` (i32 `[G,S,E]`, at most one expert per token): in token
/// order, after the `offset` (i32 `[G,E]`) slots that earlier ranks already hold; an assignment
/// is kept iff its position is `< c` (exclusive cumsum: an expert's first token gets slot 0).
pub fn fill_slots(mask: &Value, offset: Option<&Value>, c: usize, dt: DType) -> Slots {
    let sh = mask.shape();
    let (g, e) = (sh[0], sh[2]);
    let mut pos_full = mask.cumsum(1, true, false);
    if let Some(off) = offset {
        pos_full = pos_full.add(&off.reshape(&[g, 1, e]));
    }
    let over = mask.mul(&pos_full).ge(c as f64).convert(dt).sum_all();
    let assigned = mask.convert(dt).sum_all();
    let kept_mask = mask.mul(&pos_full.lt(c as f64).convert(DType::I32));
    let pos = pos_full.mul(&kept_mask).sum(&[2]);
    let kept = kept_mask.sum(&[2]);
    let mut count = kept_mask.sum(&[1]);
    if let Some(off) = offset {
        count = count.add(off);
    }
    Slots {
        mask: kept_mask,
        pos,
        kept,
        count,
        over,
        assigned,
    }
}

fn check_logits(what: &str, logits: &Value) -> (usize, usize, usize) {
    let sh = logits.shape();
    assert_eq!(
        sh.len(),
        3,
        "{what}: logits must be [G,S,E], got {}",
        logits.ty()
    );
    assert!(
        logits.dtype().is_float(),
        "{what}: logits must be float, got {}",
        logits.ty()
    );
    (sh[0], sh[1], sh[2])
}

/// GShard-form load-balancing loss `E^2 * mean_{g,e}(density * density_proxy)` from the
/// pre-capacity first-choice `mask` (pads already zeroed) and the router probabilities `raw`
/// (pads zeroed here); both means run over all S positions (as lingvo's `Top2GatingOnLogits`).
fn load_balancing_loss(raw: &Value, mask: &Value, not_pad: Option<&Value>) -> Value {
    let sh = raw.shape();
    let e = sh[2];
    let proxy = match not_pad {
        Some(np) => raw.mul(&np.reshape(&[sh[0], sh[1], 1])),
        None => raw.clone(),
    };
    let density = mask.convert(raw.dtype()).mean(&[1]);
    proxy
        .mean(&[1])
        .mul(&density)
        .mean_all()
        .mul((e * e) as f64)
}

// ---- Switch top-1 ----

/// Switch Transformer top-1 routing options (Fedus et al. 2021).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Switch {
    /// Expert capacity C per group; [`crate::capacity::mesh_tf`] is the Switch/Mesh-TF rule.
    pub capacity: usize,
    /// ε of the train-time multiplicative jitter `x * U(1-ε, 1+ε)` on the router inputs
    /// (Mesh-TF 1e-2); applied only when jitter noise is supplied.
    pub jitter_eps: f64,
}

impl Switch {
    pub fn new(capacity: usize) -> Switch {
        Switch {
            capacity,
            jitter_eps: 1e-2,
        }
    }
}

/// Multiplicative jitter: `x * (1 - eps + 2 eps u)` with `u` uniform on `[0, 1)` of `x`'s
/// shape, i.e. `x * U(1-eps, 1+eps)` elementwise.
pub fn jitter(x: &Value, eps: f64, u: &Value) -> Value {
    x.mul(&u.mul(2.0 * eps).add(1.0 - eps))
}

/// Switch router logits `einsum(GSM,ME->GSE, x', wg)` in the input dtype, where `x'` is `x`
/// jittered by `uniform` (`[G,S,M]` on `[0,1)`, train time) or `x` itself (no noise). The
/// jitter only changes the router's view: the experts still receive `x`.
pub fn switch_router_logits(x: &Value, wg: &Value, eps: f64, uniform: Option<&Value>) -> Value {
    let xr = match uniform {
        Some(u) => jitter(x, eps, u),
        None => x.clone(),
    };
    x.builder().einsum("GSM,ME->GSE", &[&xr, wg])
}

/// What Switch routing computes.
#[derive(Clone, Debug)]
pub struct SwitchGating {
    /// `[G,S,E]` router probabilities `softmax(logits)`.
    pub raw_gates: Value,
    /// `[G,S,E,C]` float.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1 (from the masks).
    pub dispatch: Value,
    /// Scalar `E^2 * mean_{g,e}(f * P)` (~1 when balanced), f from the argmax before capacity.
    pub aux_loss: Value,
    /// Scalar router z-loss `mean_tokens(logsumexp_e(logits)^2)` over real tokens.
    pub z_loss: Value,
    /// i32 `[G,S]`: the argmax expert (also for dropped tokens and pads).
    pub index: Value,
    /// `[G,S]`: the gate, the raw probability of the chosen expert; 0 where dropped or pad.
    pub gate: Value,
    /// i32 `[G,S]`: the slot (0 where dropped).
    pub pos: Value,
    /// i32 `[G,S]`: 1 where the token was dispatched.
    pub kept: Value,
    /// `[E]`: fraction of all `G*S` positions whose argmax is each expert (pads excluded).
    pub density: Value,
    /// Fraction of the real tokens dropped for capacity.
    pub over_capacity: Value,
}

/// Switch top-1 routing on `logits [G,S,E]` (Fedus et al. 2021): `e* = argmax P` (ties to the
/// lowest index), gate = `P[e*]` without renormalisation, slots by exclusive cumsum over S in
/// token order with `pos < C`. For train-time jitter build the logits with
/// [`switch_router_logits`].
pub fn switch_gating(logits: &Value, cfg: &Switch, paddings: Option<&Value>) -> SwitchGating {
    let (g, s, e) = check_logits("switch_gating", logits);
    let c = cfg.capacity;
    assert!(c >= 1, "switch_gating: capacity must be at least 1");
    let dt = logits.dtype();
    let np = not_pad(paddings);
    let raw = logits.softmax(2);
    let index = raw.argmax(2);
    let mask = zero_pads_i32(&index.one_hot(e, DType::I32), np.as_ref());
    let aux_loss = load_balancing_loss(&raw, &mask, np.as_ref());
    let density = mask.convert(dt).mean(&[0, 1]);

    let lse = logits.logsumexp(2);
    let z = lse.mul(&lse);
    let z_loss = match &np {
        Some(np) => z.mul(np).sum_all().div(&np.sum_all().max(1.0)),
        None => z.mean_all(),
    };

    let sl = fill_slots(&mask, None, c, dt);
    let gate = raw.mul(&sl.mask.convert(dt)).sum(&[2]);
    let dispatch = slots(&sl.mask, &sl.pos, c, dt);
    let combine = dispatch.mul(&gate.reshape(&[g, s, 1, 1]));
    SwitchGating {
        raw_gates: raw,
        combine,
        dispatch,
        aux_loss,
        z_loss,
        index,
        gate,
        pos: sl.pos,
        kept: sl.kept,
        density,
        over_capacity: sl.over.div(&sl.assigned.max(1.0)),
    }
}

// ---- Shazeer noisy top-k ----

/// Noisy top-k gating options (Shazeer et al. 2017).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoisyTopK {
    /// Experts per token (`1 <= k <= E`).
    pub k: usize,
    /// Expert capacity C per group (slots for all ranks together).
    pub capacity: usize,
    /// Added to `softplus(x . W_noise)` (T2T `noise_epsilon`, 1e-2).
    pub noise_epsilon: f64,
}

impl NoisyTopK {
    pub fn new(k: usize, capacity: usize) -> NoisyTopK {
        NoisyTopK {
            k,
            capacity,
            noise_epsilon: 1e-2,
        }
    }
}

/// Numerically stable `log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|))`.
pub fn softplus(x: &Value) -> Value {
    x.max(0.0).add(&x.abs().neg().exp().log1p())
}

/// `P(N(0, std^2) < x)` as in T2T: `0.5 (1 + erf(x / (sqrt(2) std + 1e-20)))`.
pub fn normal_cdf(x: &Value, std: &Value) -> Value {
    let d = std.mul(std::f64::consts::SQRT_2).add(1e-20);
    x.div(&d).erf().add(1.0).mul(0.5)
}

/// Squared coefficient of variation of the 1-D `x`, exactly as T2T `cv_squared`:
/// population variance, `n + 1e-10` denominators and `mean^2 + 1e-10` (so all zeros or a
/// single element give ~0 instead of NaN).
pub fn cv_squared(x: &Value) -> Value {
    assert_eq!(x.rank(), 1, "cv_squared: x must be 1-D, got {}", x.ty());
    let n = x.shape()[0] as f64 + 1e-10;
    let mean = x.sum_all().div(n);
    let d = x.sub(&mean);
    let var = d.mul(&d).sum_all().div(n);
    var.div(&mean.mul(&mean).add(1e-10))
}

/// What noisy top-k routing computes.
#[derive(Clone, Debug)]
pub struct NoisyTopKGating {
    /// `[G,S,E]` the noisy logits `H` (the clean logits when there is no noise).
    pub noisy_logits: Value,
    /// `[G,S,E]` the dense gates `G(x)`: softmax over the k kept logits, 0 elsewhere and on
    /// pads (before capacity).
    pub gates: Value,
    /// `[G,S,E,C]` float.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1 (from the masks).
    pub dispatch: Value,
    /// `[E]`: `sum over tokens of gates`.
    pub importance: Value,
    /// `[E]`: the smooth load estimator (with noise and `k < E`), else the count of
    /// non-zero gates.
    pub load: Value,
    /// Scalars `cv_squared(importance)`, `cv_squared(load)` (T2T weights each by 1e-2).
    pub importance_loss: Value,
    pub load_loss: Value,
    /// i32 `[G,S,k]`: the experts by rank (noisy logits descending, ties to the lowest index).
    pub top_index: Value,
    /// `[G,S,k]`: the softmax weights of the kept experts (0 on pads).
    pub top_gates: Value,
    /// i32 `[G,S,k]`: each rank's slot (0 where dropped) and whether it was kept.
    pub pos: Value,
    pub kept: Value,
    /// Fraction of all (token, rank) assignments dropped for capacity.
    pub over_capacity: Value,
}

/// Shazeer noisy top-k routing (Shazeer et al. 2017; tensor2tensor's `noisy_top_k_gating`) on
/// the clean logits `x . W_g` `[G,S,E]`. `noise = Some((raw_noise, n))` at train time:
/// `raw_noise = x . W_noise` and `n` standard normal, both `[G,S,E]`; then `H = clean + n *
/// (softplus(raw_noise) + noise_epsilon)`. `None` (evaluation): `H = clean`.
///
/// Gates are `softmax` over the k largest `H` (the others 0). Importance and load are summed
/// over every token of every group. The load estimator is
/// `Phi((clean - threshold) / std)` with `threshold` the (k+1)-th largest `H` of the token if
/// the expert is among its top k, else the k-th largest; gradients flow through `clean`,
/// `std` and the threshold values as in T2T.
///
/// Slots: capacity C per expert and group shared by all ranks, filled rank by rank (all
/// rank-1 picks in token order, then rank-2 after the kept rank-1 counts, ...); the combine
/// weight is the softmax weight, not renormalised after drops.
pub fn noisy_top_k_gating(
    clean: &Value,
    noise: Option<(&Value, &Value)>,
    cfg: &NoisyTopK,
    paddings: Option<&Value>,
) -> NoisyTopKGating {
    let (g, s, e) = check_logits("noisy_top_k_gating", clean);
    let (k, c) = (cfg.k, cfg.capacity);
    assert!(
        k >= 1 && k <= e,
        "noisy_top_k_gating: k={k} must be in 1..={e}"
    );
    assert!(c >= 1, "noisy_top_k_gating: capacity must be at least 1");
    let dt = clean.dtype();
    let np = not_pad(paddings);
    let np3 = np.as_ref().map(|np| np.reshape(&[g, s, 1]));
    let tk = top_k_gates(clean, noise, k, cfg.noise_epsilon, np3.as_ref());
    let importance = tk.gates.sum(&[0, 1]);
    let load = tk.load.sum(&[0, 1]);
    let importance_loss = cv_squared(&importance);
    let load_loss = cv_squared(&load);
    let rs = fill_ranked(&tk.top_index, &tk.weights, np.as_ref(), e, c, dt);
    NoisyTopKGating {
        noisy_logits: tk.noisy,
        gates: tk.gates,
        combine: rs.combine,
        dispatch: rs.dispatch,
        importance,
        load,
        importance_loss,
        load_loss,
        top_index: tk.top_index,
        top_gates: tk.weights,
        pos: rs.pos,
        kept: rs.kept,
        over_capacity: rs.over_capacity,
    }
}

/// What [`top_k_gates`] computes on logits `[A,B,E]` (experts last).
#[derive(Clone, Debug)]
pub(crate) struct TopKGates {
    /// `[A,B,E]` the noisy logits `H` (the clean logits without noise).
    pub noisy: Value,
    /// `[A,B,E]` dense gates: softmax over the k kept logits, 0 elsewhere and on pads.
    pub gates: Value,
    /// i32 `[A,B,k]`: the kept experts by rank (ties to the lowest index).
    pub top_index: Value,
    /// `[A,B,k]`: their softmax weights (0 on pads).
    pub weights: Value,
    /// `[A,B,E]`: per token, the smooth load estimator's probability that the expert is in
    /// its top k (with noise and `k < E`), else whether its gate is non-zero; 0 on pads.
    /// Summed over tokens it is T2T's `load`.
    pub load: Value,
}

/// Noisy top-k gates (T2T `noisy_top_k_gating` without capacity) over the last axis of
/// `clean [A,B,E]`; `noise = (x . W_noise, standard normal)`, `np3 [A,B,1]` the real-token
/// mask. The shared core of [`noisy_top_k_gating`] and both levels of
/// [`crate::hierarchical::hierarchical_gating`].
pub(crate) fn top_k_gates(
    clean: &Value,
    noise: Option<(&Value, &Value)>,
    k: usize,
    noise_epsilon: f64,
    np3: Option<&Value>,
) -> TopKGates {
    let sh = clean.shape();
    let (g, s, e) = (sh[0], sh[1], sh[2]);
    let dt = clean.dtype();
    let (noisy, std) = match noise {
        Some((raw_noise, n)) => {
            let std = softplus(raw_noise).add(noise_epsilon);
            (clean.add(&n.mul(&std)), Some(std))
        }
        None => (clean.clone(), None),
    };
    let kk = (k + 1).min(e);
    let (top_vals, top_idx) = noisy.top_k(kk);
    let (top_logits, top_index) = if kk == k {
        (top_vals.clone(), top_idx)
    } else {
        (top_vals.slice_dim(2, 0, k), top_idx.slice_dim(2, 0, k))
    };
    let mut weights = top_logits.softmax(2);
    if let Some(np3) = np3 {
        weights = weights.mul(np3);
    }
    let gates = top_index
        .one_hot(e, dt)
        .mul(&weights.reshape(&[g, s, k, 1]))
        .sum(&[2]);
    let load = match &std {
        Some(std) if k < e => {
            let thr_in = top_vals.slice_dim(2, k, k + 1);
            let thr_out = top_vals.slice_dim(2, k - 1, k);
            let is_in = noisy.gt(&thr_in);
            let p_in = normal_cdf(&clean.sub(&thr_in), std);
            let p_out = normal_cdf(&clean.sub(&thr_out), std);
            let mut prob = is_in.select(&p_in, &p_out);
            if let Some(np3) = np3 {
                prob = prob.mul(np3);
            }
            prob
        }
        _ => gates.gt(0.0).convert(dt),
    };
    TopKGates {
        noisy,
        gates,
        top_index,
        weights,
        load,
    }
}

/// What [`fill_ranked`] assigns.
#[derive(Clone, Debug)]
pub(crate) struct RankedSlots {
    /// `[G,S,E,C]` float.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1 (from the masks).
    pub dispatch: Value,
    /// i32 `[G,S,K]`: each rank's slot (0 where dropped) and whether it was kept.
    pub pos: Value,
    pub kept: Value,
    /// Per rank, the fraction of its assignments dropped for capacity.
    pub over_by_rank: Vec<Value>,
    /// Fraction of all (token, rank) assignments dropped for capacity.
    pub over_capacity: Value,
}

/// Slots for `K` ranked assignments per token (`top_index` i32 `[G,S,K]` into `e` experts,
/// distinct per token; combine weights `[G,S,K]`): capacity `c` per expert and group shared
/// by all ranks, filled rank by rank (all rank-1 picks in token order, then rank-2 after the
/// kept rank-1 counts, ...). Pads (`np`, 1 = real) take no slot.
pub(crate) fn fill_ranked(
    top_index: &Value,
    weights: &Value,
    np: Option<&Value>,
    e: usize,
    c: usize,
    dt: DType,
) -> RankedSlots {
    let sh = top_index.shape();
    let (g, s, k) = (sh[0], sh[1], sh[2]);
    let mut count: Option<Value> = None;
    let (mut combine, mut dispatch): (Option<Value>, Option<Value>) = (None, None);
    let (mut over, mut assigned): (Option<Value>, Option<Value>) = (None, None);
    let (mut pos, mut kept, mut over_by_rank) = (Vec::new(), Vec::new(), Vec::new());
    let acc = |a: Option<Value>, v: &Value| Some(a.map_or_else(|| v.clone(), |a| a.add(v)));
    for r in 0..k {
        let idx_r = top_index.slice_dim(2, r, r + 1).reshape(&[g, s]);
        let mask = zero_pads_i32(&idx_r.one_hot(e, DType::I32), np);
        let sl = fill_slots(&mask, count.as_ref(), c, dt);
        let w_r = weights.slice_dim(2, r, r + 1).reshape(&[g, s]);
        let d = slots(&sl.mask, &sl.pos, c, dt);
        combine = acc(combine, &d.mul(&w_r.reshape(&[g, s, 1, 1])));
        dispatch = acc(dispatch, &d);
        over_by_rank.push(sl.over.div(&sl.assigned.max(1.0)));
        over = acc(over, &sl.over);
        assigned = acc(assigned, &sl.assigned);
        pos.push(sl.pos.reshape(&[g, s, 1]));
        kept.push(sl.kept.reshape(&[g, s, 1]));
        count = Some(sl.count);
    }
    let b = top_index.builder();
    let cat = |v: &[Value]| b.concat(&v.iter().collect::<Vec<_>>(), 2);
    RankedSlots {
        combine: combine.unwrap(),
        dispatch: dispatch.unwrap(),
        pos: cat(&pos),
        kept: cat(&kept),
        over_by_rank,
        over_capacity: over.unwrap().div(&assigned.unwrap().max(1.0)),
    }
}

// ---- expert choice ----

/// Expert-choice routing options (Zhou et al. 2022, arXiv 2202.09368).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertChoice {
    /// Tokens each expert takes from each group (`1 <= C <= S`); Zhou et al. use
    /// `S * cf / E` (cf 2 in the paper's main runs).
    pub capacity: usize,
}

/// What expert-choice routing computes.
#[derive(Clone, Debug)]
pub struct ExpertChoiceGating {
    /// `[G,S,E]` router probabilities `softmax(logits)` over experts.
    pub raw_gates: Value,
    /// `[G,S,E,C]` float: `P[s,e]` at the token's slot for every expert that chose it.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1 (from the selection mask).
    pub dispatch: Value,
    /// i32 `[G,S,E]`: 1 where expert e chose token s.
    pub selected: Value,
    /// i32 `[G,E,C]`: the tokens each expert chose, by decreasing probability.
    pub top_index: Value,
    /// i32 `[G,S]`: how many experts each token got (0..=E).
    pub experts_per_token: Value,
    /// Fraction of the real tokens that no expert chose.
    pub unrouted: Value,
}

/// Expert-choice routing on `logits [G,S,E]` (Zhou et al. 2022; Praxis
/// `expert_choice_gating_on_logits_v2`): `P = softmax_E(logits)`; each expert e takes the C
/// tokens of the group with the largest `P[:, e]` (ties to the lowest token index; pads are
/// scored -1 so they are never preferred to a real token and are then removed, so an expert of
/// a group with fewer than C real tokens takes fewer). The slot of a chosen token is its rank
/// in token order among the expert's chosen tokens (exclusive cumsum over S of the selection
/// mask, as Praxis v2), and the combine weight is `P[s, e]`. No auxiliary loss. Not causal:
/// never use it in an autoregressive decoder (a token's routing depends on later tokens).
pub fn expert_choice_gating(
    logits: &Value,
    cfg: &ExpertChoice,
    paddings: Option<&Value>,
) -> ExpertChoiceGating {
    let (g, s, e) = check_logits("expert_choice_gating", logits);
    let c = cfg.capacity;
    assert!(
        c >= 1 && c <= s,
        "expert_choice_gating: capacity {c} must be in 1..={s} (the group size)"
    );
    let dt = logits.dtype();
    let np = not_pad(paddings);
    let raw = logits.softmax(2);
    let (gates, scores) = match &np {
        Some(np) => {
            let np3 = np.reshape(&[g, s, 1]);
            (raw.mul(&np3), np3.gt(0.0).select(&raw, -1.0))
        }
        None => (raw.clone(), raw.clone()),
    };
    let (_, top_index) = scores.transpose(&[0, 2, 1]).top_k(c);
    let chosen = top_index
        .one_hot(s, DType::I32)
        .sum(&[2])
        .transpose(&[0, 2, 1]);
    let selected = zero_pads_i32(&chosen, np.as_ref());
    let pos = selected.cumsum(1, true, false);
    let dispatch = slots(&selected, &pos, c, dt);
    let combine = dispatch.mul(&gates.reshape(&[g, s, e, 1]));
    let experts_per_token = selected.sum(&[2]);
    let none = experts_per_token.eq(0.0).convert(dt);
    let unrouted = match &np {
        Some(np) => none.mul(np).sum_all().div(&np.sum_all().max(1.0)),
        None => none.mean_all(),
    };
    ExpertChoiceGating {
        raw_gates: raw,
        combine,
        dispatch,
        selected,
        top_index,
        experts_per_token,
        unrouted,
    }
}
