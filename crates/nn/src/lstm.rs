//! The LSTM-MoE language model of Shazeer et al. 2017: an embedding, a stacked LSTM with an
//! MoE layer between the two LSTM layers (noisy top-k gating with the importance and load
//! losses), a softmax over the vocabulary. The IR has no loop op, so the recurrence is
//! unrolled over the (static) sequence length: one cell's ops per time step.

use crate::gating::NoisyTopK;
use crate::layers::{cross_entropy, embed};
use crate::moe::{moe_layer, Activation, Gate, MoeSharding, MoeWeights, Route};
use crate::params::{Init, ParamSpec, Params};
use ir::{Builder, DType, RngDist, Type, Value};
use sharding::ShardingError;

/// Hyper-parameters of the LSTM-MoE LM.
#[derive(Clone, Debug, PartialEq)]
pub struct LstmMoeConfig {
    pub vocab: usize,
    /// Embedding and LSTM state size.
    pub dim: usize,
    pub experts: usize,
    /// Experts per token (Shazeer: 4 for the LM).
    pub k: usize,
    pub expert_dim: usize,
    /// Tokens per MoE group (`batch * len` must divide by it).
    pub group_size: usize,
    pub capacity: usize,
    /// Weight of the importance and of the load loss (Shazeer: 0.1 for the 1B-word LM).
    pub loss_weight: f64,
    pub dtype: DType,
}

/// The built LM.
pub struct LstmMoe {
    pub params: Vec<ParamSpec>,
    pub loss: Value,
    pub ce: Value,
    pub importance_loss: Value,
    pub load_loss: Value,
}

/// One LSTM layer over `x [B,T,D]` (state size D), unrolled; returns `[B,T,D]`.
fn lstm_layer(p: &mut Params, x: &Value) -> Result<Value, ShardingError> {
    let (bsz, t, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let std = 1.0 / (d as f64).sqrt();
    let w = p.param("w", &[d, 4 * d], Init::Uniform(std), Some(&[&[], &[]]))?;
    let u = p.param("u", &[d, 4 * d], Init::Uniform(std), Some(&[&[], &[]]))?;
    let bias = p.param("b", &[4 * d], Init::Zeros, Some(&[&[]]))?;
    let b = x.builder();
    // Input projections of every step at once, then the recurrence.
    let xw = x.matmul(&w).add(&bias);
    let mut h = b.splat(0.0, Type::new(x.dtype(), vec![bsz, d]));
    let mut c = h.clone();
    let mut outs = Vec::with_capacity(t);
    for step in 0..t {
        let z = xw
            .slice_dim(1, step, step + 1)
            .reshape(&[bsz, 4 * d])
            .add(&h.matmul(&u));
        let gate = |k: usize| z.slice_dim(1, k * d, (k + 1) * d);
        let (i, f, g, o) = (
            gate(0).logistic(),
            gate(1).add(1.0).logistic(),
            gate(2).tanh(),
            gate(3).logistic(),
        );
        c = f.mul(&c).add(&i.mul(&g));
        h = o.mul(&c.tanh());
        outs.push(h.reshape(&[bsz, 1, d]));
    }
    let refs: Vec<&Value> = outs.iter().collect();
    Ok(b.concat(&refs, 1))
}

/// Build the LM's loss on `tokens [B, T+1]` (inputs are the first T, targets the last T).
/// With `train`, a `seed` parameter feeds the gating noise. With `sharding`, the MoE layer
/// takes GShard's 1-D layout.
pub fn build(
    b: &Builder,
    cfg: &LstmMoeConfig,
    batch: usize,
    len: usize,
    train: bool,
    sharding: Option<&MoeSharding>,
) -> Result<LstmMoe, ShardingError> {
    let mut p = Params::new(b, cfg.dtype);
    let tokens = b.param("tokens", Type::new(DType::I32, vec![batch, len + 1]));
    let inputs = tokens.slice_dim(1, 0, len);
    let targets = tokens.slice_dim(1, 1, len + 1);
    let d = cfg.dim;
    let table = p.param(
        "embed",
        &[cfg.vocab, d],
        Init::Normal(1.0 / (d as f64).sqrt()),
        Some(&[&[], &[]]),
    )?;
    let x = embed(&table, &inputs);
    let h1 = p.scope("lstm0", |p| lstm_layer(p, &x))?;
    let (g, s) = (batch * len / cfg.group_size, cfg.group_size);
    assert_eq!(
        g * s,
        batch * len,
        "group_size {s} must divide batch*len {}",
        batch * len
    );
    let (e, lim) = (cfg.experts, |fan: usize| (3.0 / fan as f64).sqrt());
    let moe = p.scope("moe", |p| -> Result<_, ShardingError> {
        // Shazeer initialises the gating (and noise) weights at zero.
        let wg = p.param("wg", &[d, e], Init::Zeros, None)?;
        let w_noise = p.param("w_noise", &[d, e], Init::Zeros, None)?;
        let wi = p.param("wi", &[e, d, cfg.expert_dim], Init::Uniform(lim(d)), None)?;
        let wo = p.param(
            "wo",
            &[e, cfg.expert_dim, d],
            Init::Uniform(lim(cfg.expert_dim)),
            None,
        )?;
        let noise = train.then(|| {
            let seed = b.param("seed", Type::scalar(DType::I32));
            b.rng(RngDist::Normal, &seed, Type::new(cfg.dtype, vec![g, s, e]))
        });
        let gate = Gate::NoisyTopK {
            cfg: NoisyTopK::new(cfg.k, cfg.capacity),
            w_noise: Some(w_noise),
        };
        moe_layer(
            &h1.reshape(&[g, s, d]),
            MoeWeights {
                wg: &wg,
                wi: &wi,
                wo: &wo,
            },
            Route::new(&gate).noise(noise.as_ref()),
            Activation::Relu,
            sharding,
        )
    })?;
    let losses = moe.gating.losses();
    let find = |n: &str| {
        losses
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| (*v).clone())
            .expect("noisy top-k losses")
    };
    let (importance_loss, load_loss) = (find("importance"), find("load"));
    let mixed = h1.add(&moe.y.reshape(&[batch, len, d]));
    let h2 = p.scope("lstm1", |p| lstm_layer(p, &mixed))?;
    let logits = b.einsum("BTD,VD->BTV", &[&h2, &table]);
    let ones = b.splat(1.0, Type::new(cfg.dtype, vec![batch, len]));
    let (ce, _) = cross_entropy(&logits, &targets, &ones, 0.0);
    let loss = ce.add(&importance_loss.add(&load_loss).mul(cfg.loss_weight));
    Ok(LstmMoe {
        params: p.specs,
        loss,
        ce,
        importance_loss,
        load_loss,
    })
}
