//! Dense layers over IR values: linear, RMS and layer norm with their parameters, embedding
//! lookup, multi-head attention (self, causal, cross; padding masks), dropout with the
//! counter-based RNG, sinusoidal positions, and token cross-entropy.

use crate::params::{Init, Params};
use ir::{DType, RngDist, Type, Value};
use sharding::ShardingError;

/// `x [..., in] . w [in, out]`.
pub fn linear(x: &Value, w: &Value) -> Value {
    x.matmul(w)
}

/// Scale-only RMS norm over the last dim (GShard/Lingvo `_LNInternal`): `x rsqrt(mean x^2 + eps) g`.
/// An `x` in a narrower dtype than the parameters' (mixed precision) has its squares summed
/// in the parameters' dtype ([`norm_scale`]) and is scaled in its own.
pub fn rms_norm(p: &mut Params, x: &Value, eps: f64) -> Result<Value, ShardingError> {
    let m = *x.shape().last().unwrap();
    let g = p.param("scale", &[m], Init::Ones, Some(&[&[]]))?;
    if x.dtype() == p.dtype {
        return Ok(x.rms_norm(eps).mul(&g));
    }
    Ok(x.mul(&norm_scale(x, p.dtype, eps))
        .mul(&g.convert(x.dtype())))
}

/// `rsqrt(mean(x^2) + eps)` over the last dim of `x`, kept as a dim of 1, in `x`'s dtype:
/// the squares (rounded once each) are accumulated and the root taken in `stats`. The
/// backward pass saves `x` alone, at its own width.
pub fn norm_scale(x: &Value, stats: DType, eps: f64) -> Value {
    let d = x.rank() - 1;
    let mut keep = x.shape();
    keep[d] = 1;
    x.mul(x)
        .convert(stats)
        .mean(&[d])
        .add(eps)
        .rsqrt()
        .convert(x.dtype())
        .reshape(&keep)
}

/// Layer norm over the last dim with learned scale and bias. An `x` in a narrower dtype
/// than the parameters' (mixed precision) has its statistics computed in the parameters'.
pub fn layer_norm(p: &mut Params, x: &Value, eps: f64) -> Result<Value, ShardingError> {
    let m = *x.shape().last().unwrap();
    let g = p.param("scale", &[m], Init::Ones, Some(&[&[]]))?;
    let bias = p.param("bias", &[m], Init::Zeros, Some(&[&[]]))?;
    let dt = x.dtype();
    if dt == p.dtype {
        return Ok(x.layer_norm(eps).mul(&g).add(&bias));
    }
    let d = x.rank() - 1;
    let mut keep = x.shape();
    keep[d] = 1;
    let mu = x.convert(p.dtype).mean(&[d]).convert(dt).reshape(&keep);
    let xc = x.sub(&mu);
    Ok(xc
        .mul(&norm_scale(&xc, p.dtype, eps))
        .mul(&g.convert(dt))
        .add(&bias.convert(dt)))
}

/// Rows of `table [V, M]` for integer `ids [...]`: `[..., M]`.
pub fn embed(table: &Value, ids: &Value) -> Value {
    table.gather(ids, 0, 0)
}

/// Inverted dropout: zero each element with probability `rate`, scale the rest by
/// `1/(1-rate)`. Counter-based RNG keyed by `seed`, so the mask is the same on any mesh.
pub fn dropout(x: &Value, rate: f64, seed: Option<&Value>) -> Value {
    match seed {
        Some(seed) if rate > 0.0 => {
            let u = x.builder().rng(RngDist::Uniform, seed, x.ty());
            u.ge(rate).select(&x.mul(1.0 / (1.0 - rate)), 0.0)
        }
        _ => x.clone(),
    }
}

/// Sinusoidal positions `[t, m]`: `sin(pos / 10000^(2i/m))` in the first half of the
/// features, `cos` in the second.
pub fn sinusoid(b: &ir::Builder, t: usize, m: usize, dtype: DType) -> Value {
    let half = m / 2;
    let pos = b.iota(Type::new(dtype, vec![t, half]), 0);
    let i = b.iota(Type::new(dtype, vec![t, half]), 1);
    let freq = i.mul(-(10000f64.ln()) * 2.0 / m as f64).exp();
    let angle = pos.mul(&freq);
    let mut parts = vec![angle.sin(), angle.cos()];
    if m % 2 == 1 {
        parts.push(b.splat(0.0, Type::new(dtype, vec![t, 1])));
    }
    let refs: Vec<&Value> = parts.iter().collect();
    b.concat(&refs, 1)
}

/// The mesh axes a layer's annotations split over: the batch dim over `batch` (data
/// parallelism) and the heads, hidden or vocabulary dim over `model` (tensor parallelism,
/// Megatron's layout written as annotations). Empty: not split.
#[derive(Clone, Copy, Debug, Default)]
pub struct Axes<'a> {
    pub batch: &'a [&'a str],
    pub model: &'a [&'a str],
}

/// An additive attention bias `[B or 1, 1, T, S]`-broadcastable from masks.
#[derive(Clone, Debug, Default)]
pub struct AttnMask {
    /// Causal: query `t` sees keys `s <= t` (self-attention in decoders).
    pub causal: bool,
    /// `[B, S]` float, 1 = padding key.
    pub key_padding: Option<Value>,
    /// `[B, T, S]` additive bias (0 or -1e9), e.g. [`segment_bias`] of a packed batch.
    pub bias: Option<Value>,
}

/// The weights of one multi-head attention layer: `wq, wk, wv [M,N,D]`, `wo [N,D,M]`.
#[derive(Clone, Debug)]
pub struct AttnWeights {
    pub wq: Value,
    pub wk: Value,
    pub wv: Value,
    pub wo: Value,
}

/// Which weight of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnWeight {
    Q,
    K,
    V,
    O,
}

/// One attention weight in the current scope (`wq`, `wk`, `wv`: `[M,N,D]`; `wo`: `[N,D,M]`),
/// its heads split over `model` (replicated when `model` is empty).
pub fn attn_weight(
    p: &mut Params,
    which: AttnWeight,
    m: usize,
    heads: usize,
    head_dim: usize,
    model: &[&str],
) -> Result<Value, ShardingError> {
    let std = 1.0 / (m as f64).sqrt();
    let dims: &[&[&str]] = match which {
        AttnWeight::O => &[model, &[], &[]],
        _ => &[&[], model, &[]],
    };
    let (name, shape, init) = match which {
        AttnWeight::Q => ("wq", [m, heads, head_dim], Init::Normal(std)),
        AttnWeight::K => ("wk", [m, heads, head_dim], Init::Normal(std)),
        AttnWeight::V => ("wv", [m, heads, head_dim], Init::Normal(std)),
        AttnWeight::O => (
            "wo",
            [heads, head_dim, m],
            Init::Normal(1.0 / ((heads * head_dim) as f64).sqrt()),
        ),
    };
    p.param(name, &shape, init, Some(dims))
}

/// The four weights of an attention layer, created in the order `wq, wk, wv, wo`.
pub fn attn_weights(
    p: &mut Params,
    m: usize,
    heads: usize,
    head_dim: usize,
    model: &[&str],
) -> Result<AttnWeights, ShardingError> {
    Ok(AttnWeights {
        wq: attn_weight(p, AttnWeight::Q, m, heads, head_dim, model)?,
        wk: attn_weight(p, AttnWeight::K, m, heads, head_dim, model)?,
        wv: attn_weight(p, AttnWeight::V, m, heads, head_dim, model)?,
        wo: attn_weight(p, AttnWeight::O, m, heads, head_dim, model)?,
    })
}

/// Scaled queries `[B,T,N,D]` of `x [B,T,M]`: `x . wq / sqrt(D)`.
pub fn attn_queries(x: &Value, wq: &Value) -> Value {
    let head_dim = *wq.shape().last().unwrap();
    x.builder()
        .einsum("BTM,MND->BTND", &[x, wq])
        .mul(1.0 / (head_dim as f64).sqrt())
}

/// Keys or values `[B,S,N,D]` of `x [B,S,M]` (`w` is `wk` or `wv`).
pub fn attn_project(x: &Value, w: &Value) -> Value {
    x.builder().einsum("BSM,MND->BSND", &[x, w])
}

/// The additive bias of a masked-out key (its softmax weight is exactly 0).
const MASKED: f64 = -1e9;

/// Attention logits `[B,N,T,S]` of queries `q [B,T,N,D]` over keys `k [B,S,N,D]`, the batch
/// split over `axes.batch` and the heads over `axes.model` when annotated.
pub fn attn_logits(q: &Value, k: &Value, axes: Axes) -> Result<Value, ShardingError> {
    let b = q.builder();
    let logits = b.einsum("BTND,BSND->BNTS", &[q, k]);
    if (!axes.batch.is_empty() || !axes.model.is_empty()) && b.mesh().is_some() {
        return sharding::mesh_split(&logits, &[axes.batch, axes.model, &[], &[]]);
    }
    Ok(logits)
}

/// The causal bias `[B,N,T,S]`: 0 where key `s <= t`, -1e9 elsewhere.
pub fn causal_bias(
    b: &ir::Builder,
    bsz: usize,
    heads: usize,
    t: usize,
    s: usize,
    dt: DType,
) -> Value {
    let ti = b.iota(Type::new(DType::I32, vec![t, s]), 0);
    let si = b.iota(Type::new(DType::I32, vec![t, s]), 1);
    si.le(&ti)
        .select(0.0, &b.splat(MASKED, Type::new(dt, vec![t, s])))
        .reshape(&[1, 1, t, s])
        .broadcast_to(&[bsz, heads, t, s])
}

/// The causal bias `[B,N,1,S]` of one query per row at position `pos [B]` (i32): the row of
/// [`causal_bias`] at `t = pos[b]`, so 0 where key `s <= pos[b]`, -1e9 elsewhere.
pub fn position_bias(pos: &Value, heads: usize, s: usize, dt: DType) -> Value {
    let b = pos.builder();
    let bsz = pos.shape()[0];
    let si = b.iota(Type::new(DType::I32, vec![bsz, s]), 1);
    let at = pos.reshape(&[bsz, 1]).broadcast_to(&[bsz, s]);
    si.le(&at)
        .select(0.0, &b.splat(MASKED, Type::new(dt, vec![bsz, s])))
        .reshape(&[bsz, 1, 1, s])
        .broadcast_to(&[bsz, heads, 1, s])
}

/// The key-padding bias `[B,N,T,S]` of `key_padding [B,S]` (1 = padding): -1e9 on padding.
pub fn padding_bias(key_padding: &Value, heads: usize, t: usize) -> Value {
    let (bsz, s) = (key_padding.shape()[0], key_padding.shape()[1]);
    key_padding
        .mul(MASKED)
        .reshape(&[bsz, 1, 1, s])
        .broadcast_to(&[bsz, heads, t, s])
}

/// The attention bias `[B,T,S]` of a packed batch: 0 where the query's segment id
/// `seg_q [B,T]` (i32) equals the key's `seg_k [B,S]` and the key is real (segment 0 is
/// padding), -1e9 elsewhere; with `causal`, also -1e9 where key `s > t`. A sentence attends
/// only within itself (self-attention) or to its own source (cross-attention).
pub fn segment_bias(seg_q: &Value, seg_k: &Value, causal: bool, dt: DType) -> Value {
    let b = seg_q.builder();
    let (bsz, t, s) = (seg_q.shape()[0], seg_q.shape()[1], seg_k.shape()[1]);
    let q = seg_q.reshape(&[bsz, t, 1]).broadcast_to(&[bsz, t, s]);
    let k = seg_k.reshape(&[bsz, 1, s]).broadcast_to(&[bsz, t, s]);
    let mut keep = q.eq(&k).and(&k.ne(0.0));
    if causal {
        let ti = b.iota(Type::new(DType::I32, vec![t, s]), 0);
        let si = b.iota(Type::new(DType::I32, vec![t, s]), 1);
        keep = keep.and(&si.le(&ti).reshape(&[1, t, s]).broadcast_to(&[bsz, t, s]));
    }
    keep.select(0.0, &b.splat(MASKED, Type::new(dt, vec![bsz, t, s])))
}

/// Softmax over the keys of `logits [B,N,T,S]` (biases added), the weighted sum of
/// `v [B,S,N,D]`, projected by `wo [N,D,M]`: `[B,T,M]`. The softmax is computed in the
/// logits' dtype, the rest in `v`'s (mixed precision: the probabilities are rounded to it).
pub fn attn_output(logits: &Value, v: &Value, wo: &Value) -> Value {
    let b = logits.builder();
    let probs = logits.softmax(3).convert(v.dtype());
    let ctx = b.einsum("BNTS,BSND->BTND", &[&probs, v]);
    b.einsum("BTND,NDM->BTM", &[&ctx, &wo.convert(v.dtype())])
}

/// Multi-head attention of queries from `xq [B,T,M]` over keys/values from `xkv [B,S,M]`
/// (`xq` itself for self-attention). Weights `wq, wk, wv [M,N,D]`, `wo [N,D,M]`, created in
/// the current scope; the batch split over `axes.batch` and the heads over `axes.model`
/// when annotated (with heads split, the output projection sums over devices: one
/// all-reduce per attention layer). The projections compute in the inputs' dtype; the
/// logits, masks and softmax in the parameters' (`p.dtype`, wider under mixed precision).
pub fn attention(
    p: &mut Params,
    xq: &Value,
    xkv: &Value,
    heads: usize,
    head_dim: usize,
    mask: &AttnMask,
    axes: Axes,
) -> Result<Value, ShardingError> {
    let b = xq.builder().clone();
    let m = *xq.shape().last().unwrap();
    let (bsz, t) = (xq.shape()[0], xq.shape()[1]);
    let s = xkv.shape()[1];
    let w = attn_weights(p, m, heads, head_dim, axes.model)?;
    let dt = xq.dtype();
    let q = attn_queries(xq, &w.wq.convert(dt));
    let k = attn_project(xkv, &w.wk.convert(dt));
    let v = attn_project(xkv, &w.wv.convert(dt));
    let mut logits = attn_logits(&q, &k, axes)?.convert(p.dtype);
    if mask.causal {
        logits = logits.add(&causal_bias(&b, bsz, heads, t, s, p.dtype));
    }
    if let Some(kp) = &mask.key_padding {
        logits = logits.add(&padding_bias(kp, heads, t));
    }
    if let Some(bias) = &mask.bias {
        logits = logits.add(
            &bias
                .reshape(&[bsz, 1, t, s])
                .broadcast_to(&[bsz, heads, t, s]),
        );
    }
    Ok(attn_output(&logits, &v, &w.wo))
}

/// Mean token cross-entropy of `logits [B,T,V]` against integer `targets [B,T]`, weighted by
/// `weights [B,T]` (1 = real token, 0 = padding), with optional label smoothing. Returns
/// `(mean loss, number of real tokens)`.
///
/// With `ε` the smoothing, the target distribution is `q = (1-ε) onehot + ε/V`; a token's
/// loss `-Σ_v q_v log p_v` is, since `Σ_v q_v = 1` and `log p_v = z_v - lse` (`z` the
/// logits less their maximum, `lse = log Σ_v exp z_v`), `lse - (1-ε) z_target - (ε/V) Σ_v z_v`.
/// So neither the log-probabilities nor the one-hot are built: the target's `z` is picked
/// with the one-hot's mask (a `gather` instead, whose gradient scatters into a zeroed row,
/// made the main job's step 8% longer).
pub fn cross_entropy(
    logits: &Value,
    targets: &Value,
    weights: &Value,
    label_smoothing: f64,
) -> (Value, Value) {
    let v = *logits.shape().last().unwrap();
    let z = logits.sub(&logits.max_keepdims(&[2]).stop_gradient());
    let lse = z.exp().sum(&[2]).log();
    let picked = targets.one_hot_mask(v).select(&z, 0.0).sum(&[2]);
    let tok = if label_smoothing > 0.0 {
        lse.sub(&picked.mul(1.0 - label_smoothing))
            .sub(&z.sum(&[2]).mul(label_smoothing / v as f64))
    } else {
        lse.sub(&picked)
    };
    let n = weights.sum_all();
    let loss = tok.mul(weights).sum_all().div(&n.max(1.0));
    (loss, n)
}
