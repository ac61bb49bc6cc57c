//! Shazeer et al. 2017 (arXiv 1701.06538) appendix B: the hierarchical mixture of experts.
//! A primary gate picks `k_p` of `A` groups of experts; each group `i` has its own secondary
//! gate `G_i` that picks `k_s` of the group's `B` experts. The `E = A * B` experts are
//! numbered `i * B + j`, and a token's output is
//! `sum_i sum_j G_primary(x)_i G_i(x)_j E_{i,j}(x)`.
//!
//! Both gates are noisy top-k gates ([`crate::gating::noisy_top_k_gating`]'s form: softmax
//! over the k kept noisy logits). The balancing losses are those of the appendix, over all
//! `E` experts:
//!
//! ```text
//! Importance_H(X)_{i,j} = sum_x G_primary(x)_i G_i(x)_j
//! Load_H(X)_{i,j}       = Load_primary(X)_i Load_i(X^(i))_j / |X^(i)|
//! ```
//!
//! with `X^(i)` the tokens whose primary top-k holds group `i`, and `Load` the smooth load
//! estimator (the count of non-zero gates without noise). Load_H is written this way so that
//! the primary gate gets a gradient from it. Next to these (`importance`, `load`), the
//! primary gate's own CV^2 losses over the `A` groups (`primary_importance`, `primary_load`)
//! balance the upper level directly: losses at both levels. All four are unweighted.
//!
//! A token has `K = k_p * k_s` assignments, ranked (primary rank, secondary rank) in
//! lexicographic order; capacity C per expert and group is shared by all ranks and filled
//! rank by rank ([`crate::gating::fill_ranked`]). The combine weight of an assignment is the
//! product of its two gates, not renormalised after drops.

use crate::gating::{cv_squared, fill_ranked, not_pad, top_k_gates};
use ir::{DType, Value};

/// Hierarchical MoE gating options (Shazeer et al. 2017 appendix B; the paper's language
/// models use k = 2 at both levels).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hierarchical {
    /// Groups of experts `A` (the primary gate's width); the experts `E` divide into `A`
    /// groups of `B = E / A`.
    pub groups: usize,
    /// Groups per token (`1 <= k_primary <= A`).
    pub k_primary: usize,
    /// Experts per chosen group (`1 <= k_secondary <= B`).
    pub k_secondary: usize,
    /// Expert capacity C per group of tokens, for all `k_primary * k_secondary` ranks.
    pub capacity: usize,
    /// Added to `softplus(x . W_noise)` at both levels (T2T 1e-2).
    pub noise_epsilon: f64,
}

impl Hierarchical {
    pub fn new(groups: usize, k_primary: usize, k_secondary: usize, capacity: usize) -> Self {
        Hierarchical {
            groups,
            k_primary,
            k_secondary,
            capacity,
            noise_epsilon: 1e-2,
        }
    }

    /// Assignments per token, `k_primary * k_secondary`.
    pub fn assignments(&self) -> usize {
        self.k_primary * self.k_secondary
    }
}

/// The train-time noise of both levels: `x . W_noise` and standard normal values, `[G,S,A]`
/// for the primary gate and `[G,S,E]` for the secondary gates.
#[derive(Clone, Copy, Debug)]
pub struct HierarchicalNoise<'a> {
    pub primary_raw: &'a Value,
    pub primary_normal: &'a Value,
    pub secondary_raw: &'a Value,
    pub secondary_normal: &'a Value,
}

/// What hierarchical routing computes.
#[derive(Clone, Debug)]
pub struct HierarchicalGating {
    /// `[G,S,A]` primary gates (softmax over the kept groups, 0 elsewhere and on pads).
    pub primary_gates: Value,
    /// `[G,S,A,B]` every group's secondary gates (softmax over its kept experts).
    pub secondary_gates: Value,
    /// `[G,S,E]` the product `G_primary(x)_i G_i(x)_j` at expert `i * B + j`.
    pub gates: Value,
    /// `[G,S,E,C]` float.
    pub combine: Value,
    /// `[G,S,E,C]` float 0/1 (from the masks).
    pub dispatch: Value,
    /// `[E]` Importance_H and Load_H (see the module doc).
    pub importance: Value,
    pub load: Value,
    /// `[A]` the primary gate's importance and load.
    pub primary_importance: Value,
    pub primary_load: Value,
    /// Scalars: CV^2 of the four above.
    pub importance_loss: Value,
    pub load_loss: Value,
    pub primary_importance_loss: Value,
    pub primary_load_loss: Value,
    /// i32 `[G,S,K]`: the experts `i * B + j` by rank (primary rank major).
    pub top_index: Value,
    /// `[G,S,K]`: their combine weights `G_primary(x)_i G_i(x)_j` (0 on pads).
    pub top_gates: Value,
    /// i32 `[G,S,K]`: each rank's slot (0 where dropped) and whether it was kept.
    pub pos: Value,
    pub kept: Value,
    /// Per rank, the fraction of its assignments dropped for capacity.
    pub over_by_rank: Vec<Value>,
    /// Fraction of all (token, rank) assignments dropped for capacity.
    pub over_capacity: Value,
}

/// Hierarchical routing on the primary logits `x . W_primary` `[G,S,A]` and the secondary
/// logits `x . W_g` `[G,S,E]` (group `i`'s logits at `i*B .. (i+1)*B`). `noise`: train time
/// (see [`HierarchicalNoise`]); `None`: evaluation. `paddings [G,S]`: 1 = padding token.
pub fn hierarchical_gating(
    primary: &Value,
    secondary: &Value,
    noise: Option<HierarchicalNoise>,
    cfg: &Hierarchical,
    paddings: Option<&Value>,
) -> HierarchicalGating {
    let (ps, ss) = (primary.shape(), secondary.shape());
    assert!(
        ps.len() == 3 && ss.len() == 3 && ps[..2] == ss[..2],
        "hierarchical_gating: logits must be [G,S,A] and [G,S,E], got {} and {}",
        primary.ty(),
        secondary.ty()
    );
    let (g, s, a, e) = (ps[0], ps[1], ps[2], ss[2]);
    assert!(
        a == cfg.groups && a >= 1 && e.is_multiple_of(a),
        "hierarchical_gating: {e} experts do not divide into {} groups (primary logits {})",
        cfg.groups,
        primary.ty()
    );
    let bw = e / a;
    let (kp, ks, c) = (cfg.k_primary, cfg.k_secondary, cfg.capacity);
    assert!(
        (1..=a).contains(&kp) && (1..=bw).contains(&ks),
        "hierarchical_gating: k_primary={kp} must be in 1..={a} and k_secondary={ks} in 1..={bw}"
    );
    assert!(c >= 1, "hierarchical_gating: capacity must be at least 1");
    let dt = primary.dtype();
    let np = not_pad(paddings);
    let np3 = np.as_ref().map(|np| np.reshape(&[g, s, 1]));
    let eps = cfg.noise_epsilon;

    let p = top_k_gates(
        primary,
        noise.map(|n| (n.primary_raw, n.primary_normal)),
        kp,
        eps,
        np3.as_ref(),
    );
    // The secondary gates of every group at once: tokens x groups as rows of B experts.
    let rows = |v: &Value| v.reshape(&[g, s * a, bw]);
    let sec_noise = noise.map(|n| (rows(n.secondary_raw), rows(n.secondary_normal)));
    let np_rows = np3
        .as_ref()
        .map(|m| m.broadcast_to(&[g, s, a]).reshape(&[g, s * a, 1]));
    let q = top_k_gates(
        &rows(secondary),
        sec_noise.as_ref().map(|(r, n)| (r, n)),
        ks,
        eps,
        np_rows.as_ref(),
    );
    let secondary_gates = q.gates.reshape(&[g, s, a, bw]);
    let gates = p
        .gates
        .reshape(&[g, s, a, 1])
        .mul(&secondary_gates)
        .reshape(&[g, s, e]);

    // X^(i): the real tokens whose primary top-k holds group i.
    let mut in_group = p.top_index.one_hot(a, dt).sum(&[2]);
    if let Some(np3) = &np3 {
        in_group = in_group.mul(np3);
    }
    let group_size = in_group.sum(&[0, 1]);
    let primary_importance = p.gates.sum(&[0, 1]);
    let primary_load = p.load.sum(&[0, 1]);
    let secondary_load = q
        .load
        .reshape(&[g, s, a, bw])
        .mul(&in_group.reshape(&[g, s, a, 1]))
        .sum(&[0, 1]);
    let load = primary_load
        .reshape(&[a, 1])
        .mul(&secondary_load)
        .div(&group_size.max(1.0).reshape(&[a, 1]))
        .reshape(&[e]);
    let importance = gates.sum(&[0, 1]);

    // The K assignments: rank (rp, rs) -> expert i*B + j with weight G_p(x)_i G_i(x)_j.
    let sec_index = q.top_index.reshape(&[g, s, a, ks]);
    let sec_weights = q.weights.reshape(&[g, s, a, ks]);
    let (mut idx, mut wts) = (Vec::new(), Vec::new());
    for rp in 0..kp {
        let group = p.top_index.slice_dim(2, rp, rp + 1);
        let pick = group.reshape(&[g, s]).one_hot(a, DType::I32);
        let j = pick.reshape(&[g, s, a, 1]).mul(&sec_index).sum(&[2]);
        let w = pick
            .convert(dt)
            .reshape(&[g, s, a, 1])
            .mul(&sec_weights)
            .sum(&[2]);
        idx.push(group.mul(bw as f64).add(&j));
        wts.push(p.weights.slice_dim(2, rp, rp + 1).mul(&w));
    }
    let b = primary.builder();
    let cat = |v: &[Value]| b.concat(&v.iter().collect::<Vec<_>>(), 2);
    let (top_index, top_gates) = (cat(&idx), cat(&wts));
    let rs = fill_ranked(&top_index, &top_gates, np.as_ref(), e, c, dt);
    HierarchicalGating {
        primary_gates: p.gates,
        secondary_gates,
        gates,
        combine: rs.combine,
        dispatch: rs.dispatch,
        importance_loss: cv_squared(&importance),
        load_loss: cv_squared(&load),
        primary_importance_loss: cv_squared(&primary_importance),
        primary_load_loss: cv_squared(&primary_load),
        importance,
        load,
        primary_importance,
        primary_load,
        top_index,
        top_gates,
        pos: rs.pos,
        kept: rs.kept,
        over_by_rank: rs.over_by_rank,
        over_capacity: rs.over_capacity,
    }
}
