//! Incremental decoding of the [`crate::transformer`] model with cached keys and values: an
//! encoder program, run once per batch, that outputs every decoder layer's cross-attention
//! keys and values, and a step program that runs the decoder on one position of every row.
//!
//! The step's inputs are the previous token and the position of every row, each decoder
//! layer's self-attention cache (`[B,L,N,D]`, the keys and values of the row's earlier
//! positions; what it holds at positions `>= pos` is ignored) and the encoder's outputs. It
//! writes this position's keys and values into the cache (a select, so the softmax sees
//! exactly the full program's keys), masks keys after `pos` with the full program's causal
//! bias, and outputs the next-token logits `[B,V]` and this position's keys and values, which
//! the host stores in its cache (reordering rows between beams).
//!
//! Every value is computed by the same model code as [`crate::transformer::build`], so a step
//! equals the full program's position `pos` (up to the rounding of f32 dot products, whose
//! shapes differ) whenever a position's output depends on its own row's earlier tokens only.
//! Attention, norms and dense layers are causal; an MoE layer is per token only when no
//! assignment is dropped for capacity, since tokens of a group compete for slots (GShard's
//! top-2 gating: first choices in group order, then second choices after all first choices).
//! The step therefore routes dropless: its `B` tokens form one group per device of the batch
//! axes, with capacity equal to the group size, and the full program it is compared with must
//! be dropless too (capacity `C >= S`, see [`dropless`]).
//!
//! Both programs run in the model's master dtype whatever its
//! [`crate::transformer::Precision`] (mixed precision is a training setting; a run trained
//! in bf16 decodes from its f32 weights).

use crate::layers::{
    attn_logits, attn_output, attn_project, attn_queries, attn_weight, attn_weights, embed,
    padding_bias, position_bias, rms_norm, sinusoid, AttnWeight, Axes,
};
use crate::params::{ParamSpec, Params};
use crate::transformer::{tgt_table, BatchShape, Ctx, Layout, MoeConfig, TransformerConfig};
use ir::{Builder, DType, Type, Value};
use sharding::ShardingError;
use std::fmt;

/// The step's input of the previous token of every row (i32 `[B]`; `<s>` at position 0).
pub const TOKEN: &str = "token";
/// The step's input of every row's position (i32 `[B]`).
pub const POS: &str = "pos";
/// The source padding (`[B,S]`, 1 = padding), an input of both programs.
pub const SRC_PAD: &str = "src_pad";
/// The source ids (i32 `[B,S]`), the encoder's input.
pub const SRC: &str = "src";
/// The step's output of next-token logits `[B,V]`.
pub const LOGITS: &str = "logits";

/// Which attention a cache belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attn {
    /// A decoder layer's self-attention (grows by one position per step).
    SelfAttn,
    /// A decoder layer's cross-attention over the encoder states (fixed per batch).
    Cross,
}

/// Keys or values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kv {
    Keys,
    Values,
}

/// The name of one cached tensor: `self/layer0/k`, `cross/layer1/v`. The step's output of
/// a position's self-attention keys is the cache's name under `new/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheName {
    pub attn: Attn,
    pub layer: usize,
    pub kv: Kv,
}

impl fmt::Display for CacheName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = match self.attn {
            Attn::SelfAttn => "self",
            Attn::Cross => "cross",
        };
        let k = match self.kv {
            Kv::Keys => "k",
            Kv::Values => "v",
        };
        write!(f, "{a}/layer{}/{k}", self.layer)
    }
}

impl CacheName {
    /// The step's output of this position's keys or values (`new/self/layer0/k`).
    pub fn new_name(&self) -> String {
        format!("new/{self}")
    }

    /// The caches of one kind, for every decoder layer: keys then values per layer.
    pub fn all(cfg: &TransformerConfig, attn: Attn) -> Vec<CacheName> {
        (0..cfg.dec_layers)
            .flat_map(|layer| [Kv::Keys, Kv::Values].map(|kv| CacheName { attn, layer, kv }))
            .collect()
    }
}

/// `cfg` with every MoE layer dropless: capacity `max(C, S)` for groups of `S` tokens. Top-2
/// gating gives a token two distinct experts (unless its router's softmax underflows to
/// exact zeros), so no expert receives more than `S` assignments in a group and none is
/// dropped: each token's routing and output are then functions of the token alone, whatever
/// the rest of its group (other rows, padding). Unchanged when `C >= S` already.
pub fn dropless(cfg: &TransformerConfig) -> TransformerConfig {
    let moe = cfg.moe.as_ref().map(|mc| MoeConfig {
        capacity: mc.capacity.max(mc.group_size),
        // Decoding routes unchunked: the dropless capacity need not divide by the chunks.
        overlap_chunks: 1,
        ..mc.clone()
    });
    TransformerConfig { moe, ..cfg.clone() }
}

/// Whether `cfg`'s MoE layers can never drop a token (`C >= S`, or no MoE): then the
/// evaluation program routes every token by itself and decoding may use it as it is.
pub fn is_dropless(cfg: &TransformerConfig) -> bool {
    cfg.moe
        .as_ref()
        .is_none_or(|mc| mc.capacity >= mc.group_size)
}

/// The encoder program's parts.
pub struct BuiltEncoder {
    pub params: Vec<ParamSpec>,
    /// Per decoder layer, its cross-attention keys and values `[B,S,N,D]`, by name.
    pub outputs: Vec<(CacheName, Value)>,
}

/// The encoder on `src`, `src_pad` (`[B, src_len]`) and the cross-attention keys and values
/// of every decoder layer, computed as [`crate::transformer::build`] computes them (no
/// dropout). Panics when `cfg` has no encoder (a programming error).
pub fn build_encoder(
    b: &Builder,
    cfg: &TransformerConfig,
    shape: &BatchShape,
    layout: &Layout,
) -> Result<BuiltEncoder, ShardingError> {
    assert!(
        cfg.enc_layers > 0,
        "build_encoder: the model has no encoder"
    );
    let cfg = &cfg.full_precision();
    let dt = cfg.dtype;
    let mut p = Params::new(b, dt).shard_weights(&layout.weight_axes);
    let mut cx = Ctx::eval(cfg, layout);
    let model = cx.model();
    let (bsz, s) = (shape.batch, shape.src_len);
    let tgt = tgt_table(&mut p, cfg, &cx.model())?;
    let src = cx.annotate_batch(&b.param(SRC, Type::new(DType::I32, vec![bsz, s])))?;
    let src_pad = cx.annotate_batch(&b.param(SRC_PAD, Type::new(dt, vec![bsz, s])))?;
    let table = cx.src_table(&mut p, &tgt)?;
    let mem = cx.encoder(&mut p, &table, &src, &src_pad)?;
    let mut outputs = Vec::new();
    for layer in 0..cfg.dec_layers {
        let (k, v) = p.scope("decoder", |p| {
            p.scope(&format!("layer{layer}"), |p| {
                p.scope("cross", |p| -> Result<(Value, Value), ShardingError> {
                    let (m, n, d) = (cfg.model_dim, cfg.heads, cfg.head_dim);
                    let wk = attn_weight(p, AttnWeight::K, m, n, d, &model)?;
                    let wv = attn_weight(p, AttnWeight::V, m, n, d, &model)?;
                    Ok((attn_project(&mem, &wk), attn_project(&mem, &wv)))
                })
            })
        })?;
        for (kv, x) in [(Kv::Keys, k), (Kv::Values, v)] {
            let name = CacheName {
                attn: Attn::Cross,
                layer,
                kv,
            };
            outputs.push((name, cx.annotate_batch(&x)?));
        }
    }
    Ok(BuiltEncoder {
        params: p.specs,
        outputs,
    })
}

/// The step program's parts.
pub struct BuiltStep {
    pub params: Vec<ParamSpec>,
    /// Next-token logits `[B,V]`.
    pub logits: Value,
    /// Per decoder layer, this position's self-attention keys and values `[B,N,D]`, by the
    /// name of the cache they belong in.
    pub new_kv: Vec<(CacheName, Value)>,
}

/// The number of MoE groups of a step: one per device of the batch axes (1 without a mesh).
pub fn step_groups(b: &Builder, layout: &Layout) -> usize {
    match b.mesh() {
        Some(mesh) => mesh.size_of(&layout.batch_axes),
        None => 1,
    }
}

/// The decoder on one position of each of `shape.batch` rows, with self-attention caches
/// of `shape.tgt_len` positions and cross-attention over `shape.src_len` source positions
/// (inputs [`TOKEN`], [`POS`], the caches named by [`CacheName`], and [`SRC_PAD`] with an
/// encoder). MoE layers route the step's tokens dropless in [`step_groups`] groups. Panics
/// when the batch does not divide into those groups (a programming error).
pub fn build_step(
    b: &Builder,
    cfg: &TransformerConfig,
    shape: &BatchShape,
    layout: &Layout,
) -> Result<BuiltStep, ShardingError> {
    let (bsz, l, s) = (shape.batch, shape.tgt_len, shape.src_len);
    let groups = step_groups(b, layout);
    assert!(
        groups > 0 && bsz % groups == 0,
        "build_step: a batch of {bsz} rows does not divide into {groups} MoE groups"
    );
    let per = bsz / groups;
    let step_cfg = TransformerConfig {
        moe: cfg.moe.as_ref().map(|mc| MoeConfig {
            group_size: per,
            capacity: per,
            overlap_chunks: 1,
            ..mc.clone()
        }),
        ..cfg.full_precision()
    };
    let cfg = &step_cfg;
    let (dt, m, heads, hd) = (cfg.dtype, cfg.model_dim, cfg.heads, cfg.head_dim);
    let mut p = Params::new(b, dt).shard_weights(&layout.weight_axes);
    let mut cx = Ctx::eval(cfg, layout);
    let (batch, model) = (cx.batch(), cx.model());
    let axes = Axes {
        batch: &batch,
        model: &model,
    };
    let i32t = Type::new(DType::I32, vec![bsz]);
    let token = cx.annotate_batch(&b.param(TOKEN, i32t.clone()))?;
    let pos = cx.annotate_batch(&b.param(POS, i32t))?;
    let table = tgt_table(&mut p, cfg, &cx.model())?;
    let cache_ty = |len: usize| Type::new(dt, vec![bsz, len, heads, hd]);
    let input =
        |name: CacheName, len: usize| cx.annotate_batch(&b.param(&name.to_string(), cache_ty(len)));
    let caches: Vec<(Value, Value)> = (0..cfg.dec_layers)
        .map(|layer| -> Result<(Value, Value), ShardingError> {
            let name = |kv| CacheName {
                attn: Attn::SelfAttn,
                layer,
                kv,
            };
            Ok((input(name(Kv::Keys), l)?, input(name(Kv::Values), l)?))
        })
        .collect::<Result<_, _>>()?;
    let cross: Option<(Vec<(Value, Value)>, Value)> = if cfg.enc_layers > 0 {
        let kv = (0..cfg.dec_layers)
            .map(|layer| -> Result<(Value, Value), ShardingError> {
                let name = |kv| CacheName {
                    attn: Attn::Cross,
                    layer,
                    kv,
                };
                Ok((input(name(Kv::Keys), s)?, input(name(Kv::Values), s)?))
            })
            .collect::<Result<_, _>>()?;
        let pad = cx.annotate_batch(&b.param(SRC_PAD, Type::new(dt, vec![bsz, s])))?;
        Some((kv, pad))
    } else {
        None
    };
    let row = embed(&table, &token)
        .mul((m as f64).sqrt())
        .add(&sinusoid(b, l, m, dt).gather(&pos, 0, 0));
    let mut x = cx.annotate_batch(&row.reshape(&[bsz, 1, m]))?;
    let mut new_kv = Vec::new();
    for (layer, (ck, cv)) in caches.iter().enumerate() {
        let (h, k_t, v_t) = p.scope("decoder", |p| {
            p.scope(&format!("layer{layer}"), |p| {
                p.scope(
                    "attn",
                    |p| -> Result<(Value, Value, Value), ShardingError> {
                        let n = p.scope("norm", |p| rms_norm(p, &x, 1e-6))?;
                        let w = attn_weights(p, m, heads, hd, &model)?;
                        let q = attn_queries(&n, &w.wq);
                        let k_t = attn_project(&n, &w.wk);
                        let v_t = attn_project(&n, &w.wv);
                        let k = write_at(ck, &k_t, &pos);
                        let v = write_at(cv, &v_t, &pos);
                        let logits =
                            attn_logits(&q, &k, axes)?.add(&position_bias(&pos, heads, l, dt));
                        Ok((attn_output(&logits, &v, &w.wo), k_t, v_t))
                    },
                )
            })
        })?;
        x = cx.annotate_batch(&x.add(&h))?;
        for (kv, t) in [(Kv::Keys, k_t), (Kv::Values, v_t)] {
            let name = CacheName {
                attn: Attn::SelfAttn,
                layer,
                kv,
            };
            new_kv.push((name, cx.annotate_batch(&t.reshape(&[bsz, heads, hd]))?));
        }
        if let Some((kv, pad)) = &cross {
            let (k, v) = kv.get(layer).expect("one cross cache per decoder layer");
            let h = p.scope("decoder", |p| {
                p.scope(&format!("layer{layer}"), |p| {
                    p.scope("cross", |p| -> Result<Value, ShardingError> {
                        let n = p.scope("norm", |p| rms_norm(p, &x, 1e-6))?;
                        let wq = attn_weight(p, AttnWeight::Q, m, heads, hd, &model)?;
                        let wo = attn_weight(p, AttnWeight::O, m, heads, hd, &model)?;
                        let logits = attn_logits(&attn_queries(&n, &wq), k, axes)?
                            .add(&padding_bias(pad, heads, 1));
                        Ok(attn_output(&logits, v, &wo))
                    })
                })
            })?;
            x = cx.annotate_batch(&x.add(&h))?;
        }
        x = p.scope("decoder", |p| {
            p.scope(&format!("layer{layer}"), |p| cx.ffn_residual(p, &x, layer))
        })?;
    }
    let y = p.scope("decoder", |p| {
        p.scope("final_norm", |p| rms_norm(p, &x, 1e-6))
    })?;
    let logits = cx.annotate_batch(&b.einsum("BTM,VM->BTV", &[&y, &table]))?;
    let logits = cx.annotate_batch(&logits.reshape(&[bsz, cfg.vocab]))?;
    Ok(BuiltStep {
        params: p.specs,
        logits,
        new_kv,
    })
}

/// `cache [B,L,N,D]` with row `b`'s position `pos[b]` replaced by `x [B,1,N,D]`.
fn write_at(cache: &Value, x: &Value, pos: &Value) -> Value {
    let b = cache.builder();
    let sh = cache.shape().to_vec();
    let (bsz, l) = (sh[0], sh[1]);
    let at = b
        .iota(Type::new(DType::I32, vec![bsz, l]), 1)
        .eq(&pos.reshape(&[bsz, 1]).broadcast_to(&[bsz, l]))
        .reshape(&[bsz, l, 1, 1])
        .broadcast_to(&sh);
    at.select(&x.broadcast_to(&sh), cache)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::{Activation, SecondPolicy};
    use crate::transformer::{Balance, MoeGating, Packing};

    fn model(group_size: usize, capacity: usize) -> TransformerConfig {
        TransformerConfig {
            vocab: 11,
            src_vocab: None,
            model_dim: 8,
            heads: 2,
            head_dim: 4,
            ffn_dim: 16,
            enc_layers: 1,
            dec_layers: 2,
            moe_every: 1,
            moe: Some(MoeConfig {
                experts: 4,
                expert_dim: 8,
                group_size,
                capacity,
                policy: SecondPolicy::All,
                aux_loss_coef: 0.01,
                gating: MoeGating::Top2,
                balance: Balance::AuxLoss,
                overlap_chunks: 1,
            }),
            activation: Activation::Relu,
            dropout: 0.0,
            label_smoothing: 0.0,
            dtype: DType::F32,
            precision: crate::transformer::Precision::Full,
            checkpoint: Default::default(),
        }
    }

    #[test]
    fn dropless_raises_the_capacity_to_the_group_size_only_when_below() {
        // The default config's MoE: S = 256, E = 8, factor 2 -> C = 128 < S.
        let c = crate::capacity::gshard(256, 8, 2.0);
        assert_eq!(c, 128);
        let m = model(256, c);
        assert!(!is_dropless(&m));
        let d = dropless(&m);
        assert!(is_dropless(&d));
        assert_eq!(d.moe.as_ref().unwrap().capacity, 256);
        let wide = model(16, 20);
        assert_eq!(dropless(&wide), wide, "C >= S is kept as it is");
        let dense = TransformerConfig {
            moe: None,
            moe_every: 0,
            ..m
        };
        assert!(is_dropless(&dense));
    }

    #[test]
    fn cache_names_are_per_layer_keys_then_values() {
        let names: Vec<String> = CacheName::all(&model(16, 16), Attn::SelfAttn)
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "self/layer0/k",
                "self/layer0/v",
                "self/layer1/k",
                "self/layer1/v"
            ]
        );
        let c = CacheName {
            attn: Attn::Cross,
            layer: 1,
            kv: Kv::Values,
        };
        assert_eq!(c.new_name(), "new/cross/layer1/v");
    }

    #[test]
    fn the_step_program_verifies_with_one_moe_group_per_device() {
        let cfg = model(16, 8);
        let mesh = ir::Mesh::new(&[("data", 2), ("expert", 2)]).unwrap();
        let b = Builder::with_mesh(mesh);
        let layout = Layout {
            batch_axes: vec!["data".into(), "expert".into()],
            expert_axes: vec!["expert".into()],
            model_axes: Vec::new(),
            weight_axes: Vec::new(),
        };
        assert_eq!(step_groups(&b, &layout), 4);
        let shape = BatchShape {
            batch: 8,
            src_len: 6,
            tgt_len: 5,
            packing: Packing::Padded,
        };
        let st = build_step(&b, &cfg, &shape, &layout).unwrap();
        assert_eq!(st.logits.shape(), [8, 11]);
        assert_eq!(st.new_kv.len(), 4);
        assert!(st.new_kv.iter().all(|(_, v)| v.shape() == [8, 2, 4]));
        b.output(LOGITS, &st.logits);
        ir::verify(&b.finish()).unwrap();
    }
}
