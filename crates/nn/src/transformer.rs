//! GShard's Transformer (Lepikhin et al. 2020, arXiv 2006.16668): pre-norm residual blocks
//! `x + F(RMSNorm(x))`, MoE replacing every k-th feed-forward layer, a final norm; an
//! encoder-decoder for translation and a decoder-only language model. Shared or separate
//! vocabularies, tied output embeddings. Builds the forward program and its loss;
//! `autodiff::grad` adds the backward.
//!
//! Sharding (with a mesh): the batch is split over `batch_axes`, dense weights replicated
//! (data parallel: their gradients need an all-reduce), MoE groups split over `batch_axes`
//! and experts over `expert_axes` (GShard's layout). With `model_axes` (tensor
//! parallelism), attention heads, the dense FFN's hidden dim, the experts' hidden dim and
//! the vocabulary (embedding tables and logits) are split over them: one all-reduce after
//! each attention and each feed-forward layer, none of a weight.
//!
//! Checkpoint regions ([`Checkpoint`]): the model marks its attention and/or feed-forward
//! sublayers (scopes `attn`, `cross`; `ffn`, `moe`) as checkpoint regions
//! ([`Params::checkpoint_scope`]) when its config asks, so that `autodiff`'s `marked` remat
//! policy recomputes them in the backward pass. The marks change no value.

use crate::layers::{
    attention, cross_entropy, dropout, embed, rms_norm, segment_bias, sinusoid, AttnMask, Axes,
};
use crate::moe::{Activation, SecondPolicy};
pub use crate::moe_ffn::{Balance, MoeGating};
use crate::params::{Init, ParamSpec, Params};
use ir::{Builder, DType, Type, Value};
use sharding::ShardingError;

/// How a model's MoE layers route tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Hidden size of each expert (`ffn_dim / 2` gives top-2 MoE the per-token FLOPs of the
    /// dense FFN it replaces).
    pub expert_dim: usize,
    /// Tokens per group S (`B*T` must divide by it).
    pub group_size: usize,
    /// Expert capacity per group.
    pub capacity: usize,
    pub policy: SecondPolicy,
    /// Weight of the summed aux losses in the total loss (GShard: 0.01); unused with
    /// [`Balance::Bias`].
    pub aux_loss_coef: f64,
    /// The router (top-2 by default).
    pub gating: MoeGating,
    /// How the expert load is kept balanced.
    pub balance: Balance,
    /// Chunks of the expert buffers along capacity, so that each chunk's all-to-alls
    /// overlap another chunk's experts ([`crate::moe::MoeLayerOptions::overlap_chunks`]);
    /// 1 = unchunked. Must divide `capacity` (`train::config` checks it).
    pub overlap_chunks: usize,
}

/// Model hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Target (or only) vocabulary.
    pub vocab: usize,
    /// Source vocabulary when separate; `None` shares `vocab` and the embedding table.
    pub src_vocab: Option<usize>,
    pub model_dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    /// Encoder layers (0 for a decoder-only LM).
    pub enc_layers: usize,
    pub dec_layers: usize,
    /// Every `moe_every`-th feed-forward layer (the 2nd, 4th, ... for 2) is MoE; 0 = dense.
    pub moe_every: usize,
    pub moe: Option<MoeConfig>,
    pub activation: Activation,
    pub dropout: f64,
    pub label_smoothing: f64,
    /// The master dtype: parameters, optimizer state, and what [`Precision::Mixed`] keeps
    /// numerically sensitive parts in.
    pub dtype: DType,
    /// What activations and matmul operands compute in.
    pub precision: Precision,
    /// Which sublayers the model code marks as checkpoint regions (none by default).
    pub checkpoint: Checkpoint,
}

/// Which sublayers of every block the model marks as checkpoint regions, to be recomputed
/// in the backward pass by `autodiff`'s `marked` remat policy (each marked sublayer is one
/// region: what it passes on, its output, is kept; its inside is recomputed). Marks are
/// metadata: the step computes the same values whatever they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    /// The self-attention and cross-attention sublayers (scopes `attn` and `cross`, their
    /// norms included).
    pub attention: bool,
    /// The feed-forward sublayers, dense and MoE (scopes `ffn` and `moe`, their norms
    /// included).
    pub ffn: bool,
}

impl Checkpoint {
    /// Whether any sublayer is marked.
    pub fn any(self) -> bool {
        self.attention || self.ffn
    }
}

/// What a model's activations and matmul operands compute in.
///
/// Mixed precision keeps the master weights (and so their gradients and optimizer state) in
/// [`TransformerConfig::dtype`] and converts each weight to the compute dtype where it is
/// used; the embeddings are converted once, so the residual stream, attention and expert
/// activations, and what the backward pass saves of them, are in the compute dtype. Parts
/// whose rounding compounds stay in the master dtype: the norms' mean squares (accumulated
/// there), the attention softmax with its masks, the router with its softmax, top-k and
/// auxiliary loss, and the output softmax and cross-entropy. Dots accumulate in f32 whatever
/// their dtype (the runtime's rule), so a bf16 product is rounded once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Everything in the master dtype.
    #[default]
    Full,
    /// Activations and matmul operands in this dtype (bf16: GShard's training precision).
    Mixed(DType),
}

impl Precision {
    /// The dtype activations compute in under a master dtype `master`.
    pub fn compute(self, master: DType) -> DType {
        match self {
            Precision::Full => master,
            Precision::Mixed(dt) => dt,
        }
    }
}

impl TransformerConfig {
    /// The dtype activations and matmul operands compute in.
    pub fn compute_dtype(&self) -> DType {
        self.precision.compute(self.dtype)
    }

    /// This model with everything in the master dtype (what decoding runs).
    pub fn full_precision(&self) -> TransformerConfig {
        TransformerConfig {
            precision: Precision::Full,
            ..self.clone()
        }
    }
}

/// Mesh axes for the layout (empty = no annotations).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layout {
    pub batch_axes: Vec<String>,
    pub expert_axes: Vec<String>,
    /// Tensor parallelism: heads, hidden dims and the vocabulary split over these.
    pub model_axes: Vec<String>,
    /// Weight-update sharding: weights (and their gradients and optimizer state) stored
    /// split over these too, gathered before use ([`Params::shard_weights`]).
    pub weight_axes: Vec<String>,
}

/// The sequence batch fed to a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchShape {
    pub batch: usize,
    pub src_len: usize,
    pub tgt_len: usize,
    pub packing: Packing,
}

/// How sentences sit in the rows of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// One sentence pair per row, padded to the row's length (input `src_pad`).
    #[default]
    Padded,
    /// Several pairs per row, one after the other: the inputs `src_seg`, `tgt_seg` (i32,
    /// the pair's number in its row from 1, 0 = padding) keep each sentence's attention
    /// within itself and its own source, and `src_pos`, `tgt_pos` (i32) give each token
    /// its position in its sentence. Short sentences fill a batch without padding.
    Packed,
}

/// What building a model produced.
pub struct Built {
    pub params: Vec<ParamSpec>,
    /// Scalar total loss (cross-entropy + aux).
    pub loss: Value,
    /// Mean token cross-entropy alone.
    pub ce: Value,
    /// Per MoE layer: (name, gating diagnostics).
    pub moe: Vec<(String, MoeStats)>,
    /// Non-trainable state the program reads (the choice biases of
    /// [`Balance::Bias`]), and its new value after the step, by name.
    pub buffers: Vec<ParamSpec>,
    pub updates: Vec<(String, Value)>,
    /// Decoder logits `[B, T, V]`.
    pub logits: Value,
}

/// Per-layer expert-load diagnostics, all computed in the program.
#[derive(Clone, Debug)]
pub struct MoeStats {
    /// `[E]`: fraction of first choices per expert (before capacity).
    pub load: Value,
    pub aux_loss: Value,
    /// Fraction of first/second assignments dropped for capacity.
    pub dropped_1: Value,
    pub dropped_2: Value,
}

pub(crate) fn is_moe(cfg: &TransformerConfig, layer: usize) -> bool {
    cfg.moe.is_some() && cfg.moe_every > 0 && (layer + 1).is_multiple_of(cfg.moe_every)
}

/// What building a model's blocks shares: its config, layout, the dropout/routing seed (none
/// in evaluation) and the MoE layers' diagnostics and aux losses so far.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a TransformerConfig,
    pub(crate) layout: &'a Layout,
    pub(crate) seed: Option<Value>,
    pub(crate) moe: Vec<(String, MoeStats)>,
    pub(crate) aux: Vec<Value>,
}

impl<'a> Ctx<'a> {
    /// An evaluation context (no seed).
    pub(crate) fn eval(cfg: &'a TransformerConfig, layout: &'a Layout) -> Ctx<'a> {
        Ctx {
            cfg,
            layout,
            seed: None,
            moe: Vec::new(),
            aux: Vec::new(),
        }
    }

    pub(crate) fn batch(&self) -> Vec<&'a str> {
        self.layout.batch_axes.iter().map(String::as_str).collect()
    }

    /// The model (tensor-parallel) axes (parameters ignore them without a mesh).
    pub(crate) fn model(&self) -> Vec<&'a str> {
        self.layout.model_axes.iter().map(String::as_str).collect()
    }

    /// `x [B, ..., V]` with the batch split over the batch axes and the last dim (the
    /// vocabulary) over the model axes: logits that are never gathered whole.
    pub(crate) fn annotate_vocab(&self, x: &Value) -> Result<Value, ShardingError> {
        let model = self.model();
        if model.is_empty() || x.builder().mesh().is_none() {
            return self.annotate_batch(x);
        }
        let b = self.batch();
        let mut dims: Vec<&[&str]> = vec![&b];
        dims.extend(std::iter::repeat_n(&[] as &[&str], x.rank() - 2));
        dims.push(&model);
        sharding::mesh_split(x, &dims)
    }

    pub(crate) fn annotate_batch(&self, x: &Value) -> Result<Value, ShardingError> {
        if self.layout.batch_axes.is_empty() || x.builder().mesh().is_none() {
            return Ok(x.clone());
        }
        let b = self.batch();
        let mut dims: Vec<&[&str]> = vec![&b];
        dims.extend(std::iter::repeat_n(&[] as &[&str], x.rank() - 1));
        sharding::mesh_split(x, &dims)
    }

    fn ffn(&mut self, p: &mut Params, x: &Value, layer: usize) -> Result<Value, ShardingError> {
        let cfg = self.cfg;
        let m = x.shape()[2];
        if !is_moe(cfg, layer) {
            // The hidden dim over the model axes: `wo`'s product sums over them.
            let model = self.model();
            let wi = p.param(
                "wi",
                &[m, cfg.ffn_dim],
                Init::Normal(1.0 / (m as f64).sqrt()),
                Some(&[&[], &model]),
            )?;
            let wo = p.param(
                "wo",
                &[cfg.ffn_dim, m],
                Init::Normal(1.0 / (cfg.ffn_dim as f64).sqrt()),
                Some(&[&model, &[]]),
            )?;
            let dt = x.dtype();
            let h = dropout(
                &cfg.activation.apply(&x.matmul(&wi.convert(dt))),
                cfg.dropout,
                self.seed.as_ref(),
            );
            return Ok(h.matmul(&wo.convert(dt)));
        }
        crate::moe_ffn::moe_ffn(self, p, x)
    }

    /// One pre-norm block: self-attention, optional cross-attention, feed-forward.
    fn block(
        &mut self,
        p: &mut Params,
        x: &Value,
        layer: usize,
        self_mask: &AttnMask,
        cross: Option<(&Value, &AttnMask)>,
    ) -> Result<Value, ShardingError> {
        let cfg = self.cfg;
        let (batch, model) = (self.batch(), self.model());
        let axes = Axes {
            batch: &batch,
            model: &model,
        };
        let mut x = x.clone();
        let mark = cfg.checkpoint.attention;
        let h = p.scope_marked("attn", mark, |p| -> Result<Value, ShardingError> {
            let n = p.scope("norm", |p| rms_norm(p, &x, 1e-6))?;
            attention(p, &n, &n, cfg.heads, cfg.head_dim, self_mask, axes)
        })?;
        x = self.annotate_batch(&x.add(&dropout(&h, cfg.dropout, self.seed.as_ref())))?;
        if let Some((mem, mask)) = cross {
            let h = p.scope_marked("cross", mark, |p| -> Result<Value, ShardingError> {
                let n = p.scope("norm", |p| rms_norm(p, &x, 1e-6))?;
                attention(p, &n, mem, cfg.heads, cfg.head_dim, mask, axes)
            })?;
            x = self.annotate_batch(&x.add(&dropout(&h, cfg.dropout, self.seed.as_ref())))?;
        }
        self.ffn_residual(p, &x, layer)
    }

    /// The block's feed-forward (dense or MoE) sub-layer with its residual: `x + F(norm(x))`.
    pub(crate) fn ffn_residual(
        &mut self,
        p: &mut Params,
        x: &Value,
        layer: usize,
    ) -> Result<Value, ShardingError> {
        let name = if is_moe(self.cfg, layer) {
            "moe"
        } else {
            "ffn"
        };
        let mark = self.cfg.checkpoint.ffn;
        let h = p.scope_marked(name, mark, |p| -> Result<Value, ShardingError> {
            let n = p.scope("norm", |p| rms_norm(p, x, 1e-6))?;
            self.ffn(p, &n, layer)
        })?;
        self.annotate_batch(&x.add(&dropout(&h, self.cfg.dropout, self.seed.as_ref())))
    }

    /// The encoder on `src [B,S]` (i32) with `src_pad [B,S]` (1 = padding), embedded by
    /// `table`: its final-normed states `[B,S,M]`.
    pub(crate) fn encoder(
        &mut self,
        p: &mut Params,
        table: &Value,
        src: &Value,
        src_pad: &Value,
    ) -> Result<Value, ShardingError> {
        let mask = AttnMask {
            causal: false,
            key_padding: Some(src_pad.clone()),
            bias: None,
        };
        self.encode(p, table, src, None, &mask)
    }

    /// The encoder on `src [B,S]` with token positions `pos [B,S]` (i32; `None`: the row's
    /// positions `0..S`) and its self-attention `mask`.
    pub(crate) fn encode(
        &mut self,
        p: &mut Params,
        table: &Value,
        src: &Value,
        pos: Option<&Value>,
        mask: &AttnMask,
    ) -> Result<Value, ShardingError> {
        let cfg = self.cfg;
        let s = src.shape()[1];
        let embed_scope = src.builder().scope("encoder/embed");
        let x = embed(table, src)
            .mul((cfg.model_dim as f64).sqrt())
            .add(&positions(src.builder(), cfg, s, pos))
            .convert(cfg.compute_dtype());
        let mut x = self.annotate_batch(&dropout(&x, cfg.dropout, self.seed.as_ref()))?;
        drop(embed_scope);
        for l in 0..cfg.enc_layers {
            x = p.scope("encoder", |p| {
                p.scope(&format!("layer{l}"), |p| self.block(p, &x, l, mask, None))
            })?;
        }
        p.scope("encoder", |p| {
            p.scope("final_norm", |p| rms_norm(p, &x, 1e-6))
        })
    }

    /// The source embedding table: `src_embed` with a separate vocabulary, else `tgt_table`.
    pub(crate) fn src_table(
        &self,
        p: &mut Params,
        tgt_table: &Value,
    ) -> Result<Value, ShardingError> {
        let m = self.cfg.model_dim;
        let model = self.model();
        let _scope = p.b.scope("encoder/embed");
        match self.cfg.src_vocab {
            Some(v) => p.param(
                "src_embed",
                &[v, m],
                Init::Normal(1.0 / (m as f64).sqrt()),
                Some(&[&model, &[]]),
            ),
            None => Ok(tgt_table.clone()),
        }
    }
}

/// Sinusoidal position encodings added to the embeddings of a row of `len` tokens: `[1,len,M]`
/// for positions `0..len`, or `[B,len,M]` looked up at `pos [B,len]` (i32, a packed batch).
fn positions(b: &Builder, cfg: &TransformerConfig, len: usize, pos: Option<&Value>) -> Value {
    let (m, dt) = (cfg.model_dim, cfg.dtype);
    let table = sinusoid(b, len, m, dt);
    match pos {
        None => table.reshape(&[1, len, m]),
        Some(pos) => embed(&table, pos),
    }
}

/// The target embedding table `embed [V,M]`: the vocabulary split over `model` (replicated
/// when empty).
pub(crate) fn tgt_table(
    p: &mut Params,
    cfg: &TransformerConfig,
    model: &[&str],
) -> Result<Value, ShardingError> {
    let m = cfg.model_dim;
    // Its own scope (the name stays `embed`): the table is shared by the encoder, the
    // decoder and the softmax, and its summed gradient is reduced here.
    let _scope = p.b.scope("embed");
    p.param(
        "embed",
        &[cfg.vocab, m],
        Init::Normal(1.0 / (m as f64).sqrt()),
        Some(&[model, &[]]),
    )
}

/// Build the training (or evaluation) loss of a model on one batch.
///
/// Parameters created: the model's weights (see [`Built::params`]) plus the data inputs
/// `tgt_in`, `tgt_out` (i32 `[B, T]`), `tgt_weight` (`[B, T]`, 1 = real token) and, for
/// encoder-decoders, `src` (i32 `[B, S]`) and `src_pad` (`[B, S]`, 1 = padding); and `seed`
/// (i32 scalar) when `train` (dropout and random routing). A [`Packing::Packed`] batch takes
/// `src_seg`, `src_pos` `[B, S]` and `tgt_seg`, `tgt_pos` `[B, T]` (i32) instead of `src_pad`.
pub fn build(
    b: &Builder,
    cfg: &TransformerConfig,
    shape: &BatchShape,
    layout: &Layout,
    train: bool,
) -> Result<Built, ShardingError> {
    let dt = cfg.dtype;
    let mut p = Params::new(b, dt).shard_weights(&layout.weight_axes);
    let (bsz, s, t, m) = (shape.batch, shape.src_len, shape.tgt_len, cfg.model_dim);
    let i32t = |shape: &[usize]| Type::new(DType::I32, shape.to_vec());
    let seed = (train
        && (cfg.dropout > 0.0 || cfg.moe.as_ref().is_some_and(MoeConfig::needs_seed)))
    .then(|| b.param("seed", Type::scalar(DType::I32)));
    let mut cx = Ctx {
        cfg,
        layout,
        seed,
        moe: Vec::new(),
        aux: Vec::new(),
    };
    let tgt_in = cx.annotate_batch(&b.param("tgt_in", i32t(&[bsz, t])))?;
    let tgt_out = cx.annotate_batch(&b.param("tgt_out", i32t(&[bsz, t])))?;
    let tgt_weight = cx.annotate_batch(&b.param("tgt_weight", Type::new(dt, vec![bsz, t])))?;
    let tgt_table = tgt_table(&mut p, cfg, &cx.model())?;
    let scale = (m as f64).sqrt();
    // A packed batch: segment ids and in-sentence positions of both sides.
    let packed = match shape.packing {
        Packing::Padded => None,
        Packing::Packed => {
            let input =
                |name: &str, len: usize| cx.annotate_batch(&b.param(name, i32t(&[bsz, len])));
            let src = (input("src_seg", s)?, input("src_pos", s)?);
            let tgt = (input("tgt_seg", t)?, input("tgt_pos", t)?);
            Some((src, tgt))
        }
    };
    let memory = if cfg.enc_layers > 0 {
        let src = cx.annotate_batch(&b.param("src", i32t(&[bsz, s])))?;
        let (pos, self_mask, cross_mask) = match &packed {
            None => {
                let src_pad =
                    cx.annotate_batch(&b.param("src_pad", Type::new(dt, vec![bsz, s])))?;
                let mask = AttnMask {
                    causal: false,
                    key_padding: Some(src_pad),
                    bias: None,
                };
                (None, mask.clone(), mask)
            }
            Some(((src_seg, src_pos), (tgt_seg, _))) => {
                let bias = |q: &Value, k: &Value| cx.annotate_batch(&segment_bias(q, k, false, dt));
                let self_mask = AttnMask {
                    bias: Some(bias(src_seg, src_seg)?),
                    ..AttnMask::default()
                };
                let cross_mask = AttnMask {
                    bias: Some(bias(tgt_seg, src_seg)?),
                    ..AttnMask::default()
                };
                (Some(src_pos), self_mask, cross_mask)
            }
        };
        let src_table = cx.src_table(&mut p, &tgt_table)?;
        let x = cx.encode(&mut p, &src_table, &src, pos, &self_mask)?;
        Some((x, cross_mask))
    } else {
        None
    };
    let embed_scope = b.scope("decoder/embed");
    let mut y = embed(&tgt_table, &tgt_in)
        .mul(scale)
        .add(&positions(
            b,
            cfg,
            t,
            packed.as_ref().map(|(_, (_, pos))| pos),
        ))
        .convert(cfg.compute_dtype());
    y = cx.annotate_batch(&dropout(&y, cfg.dropout, cx.seed.as_ref()))?;
    drop(embed_scope);
    let causal = match &packed {
        None => AttnMask {
            causal: true,
            ..AttnMask::default()
        },
        Some((_, (tgt_seg, _))) => AttnMask {
            bias: Some(cx.annotate_batch(&segment_bias(tgt_seg, tgt_seg, true, dt))?),
            ..AttnMask::default()
        },
    };
    for l in 0..cfg.dec_layers {
        let cross = memory.as_ref().map(|(mem, mask)| (mem, mask));
        y = p.scope("decoder", |p| {
            p.scope(&format!("layer{l}"), |p| cx.block(p, &y, l, &causal, cross))
        })?;
    }
    let y = p.scope("decoder", |p| {
        p.scope("final_norm", |p| rms_norm(p, &y, 1e-6))
    })?;
    let _output_scope = b.scope("output");
    // The logits in the compute dtype, then the softmax and the loss in the master dtype.
    let logits = b.einsum("BTM,VM->BTV", &[&y, &tgt_table.convert(y.dtype())]);
    let logits = cx.annotate_vocab(&logits)?.convert(dt);
    let (ce, _) = cross_entropy(
        &logits,
        &tgt_out,
        &tgt_weight,
        if train { cfg.label_smoothing } else { 0.0 },
    );
    let mut loss = ce.clone();
    if let Some(mc) = &cfg.moe {
        for a in &cx.aux {
            loss = loss.add(&a.mul(mc.aux_loss_coef));
        }
    }
    Ok(Built {
        buffers: p.buffers,
        updates: p.updates,
        params: p.specs,
        loss,
        ce,
        moe: cx.moe,
        logits,
    })
}
