//! The run configuration: TOML with every field defaulted (`gshard train` with no config is
//! the main job), unknown fields and wrong types rejected with the field's name. Maps onto
//! the model ([`nn::transformer::TransformerConfig`]), the mesh and the optimizer.
//! `[model] remat` is the training step's rematerialisation policy and `[model] checkpoint`
//! the sublayers the model marks as checkpoint regions for `remat = "marked"`.

use crate::optim::{AdafactorConfig, LrSchedule, Optimizer};
use autodiff::remat::Policy;
use ir::{DType, Mesh};
use nn::moe::{Activation, SecondPolicy};
use nn::transformer::{Balance, Checkpoint, Layout, MoeConfig, MoeGating, TransformerConfig};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Most devices a training mesh may have.
pub const MAX_DEVICES: usize = 1 << 20;
/// Longest sequence, largest model dimension, largest vocabulary, largest capacity factor
/// that validation accepts (far beyond what fits; the memory check before running refuses
/// what does not fit this machine).
const MAX_LEN: usize = 1 << 16;
const MAX_DIM: usize = 1 << 24;
const MAX_VOCAB: usize = 1 << 22;
const MAX_CAPACITY_FACTOR: f64 = 1e4;

/// `value` in `[lo, hi]`, or an error naming the field and the range.
fn in_range(field: &str, value: usize, lo: usize, hi: usize) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{field} = {value}: use a value from {lo} to {hi}"
        )))
    }
}

/// Lay `user` over `base`: tables merge key by key, anything else replaces. A table whose
/// `kind` differs from the base table's replaces it whole (another variant, other fields).
fn overlay(base: &mut toml::Table, user: toml::Table) {
    for (k, v) in user {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(u))
                if u.get("kind").is_none_or(|kind| b.get("kind") == Some(kind)) =>
            {
                overlay(b, u)
            }
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A TOML error as a one-line [`ConfigError::Parse`] naming the file.
fn parse_error(path: &str, e: toml::de::Error) -> ConfigError {
    ConfigError::Parse {
        path: path.to_string(),
        msg: e.to_string().replace('\n', " ").trim().to_string(),
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config {path}: {msg}")]
    Parse { path: String, msg: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// Everything a run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Seed of parameter init, batch sampling, dropout and random routing.
    pub seed: u64,
    /// Optimizer steps.
    pub steps: u64,
    /// Log metrics every N steps (and at the last step).
    pub log_every: u64,
    /// Dev loss every N steps (0 = only at the end).
    pub eval_every: u64,
    /// Checkpoint every N steps (and at the end).
    pub checkpoint_every: u64,
    /// Stop the run after this many steps in a row whose loss or gradient norm is not
    /// finite. Such a step is never applied: the weights and optimizer state stay as they
    /// were, and no checkpoint of non-finite values is ever written.
    pub nonfinite_limit: u64,
    pub mesh: MeshConfig,
    pub data: DataConfig,
    pub model: ModelConfig,
    pub optimizer: Optimizer,
    pub eval: EvalConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshConfig {
    /// Data-parallel axis size (batch split; dense weights replicated).
    pub data: usize,
    /// Expert axis size (batch split too; experts split over it).
    pub expert: usize,
    /// Model (tensor-parallel) axis size: attention heads, the feed-forward and expert
    /// hidden dims and the vocabulary split over it; 1 = no model axis.
    pub model: usize,
    /// Weight-update sharding (ZeRO-3 / FSDP): the axis (`data`, `expert` or `model`) over
    /// which every weight, its gradient and its optimizer state are stored split, the
    /// weight all-gathered before use and its gradient reduce-scattered; "" = off.
    pub shard_weights: String,
}

impl MeshConfig {
    /// The mesh as a user writes it: `data=2 x expert=4` (`x model=2` when it has one).
    pub fn describe(&self) -> String {
        let mut s = format!("data={} x expert={}", self.data, self.expert);
        if self.model != 1 {
            s.push_str(&format!(" x model={}", self.model));
        }
        if !self.shard_weights.is_empty() {
            s.push_str(&format!(", weights sharded over {}", self.shard_weights));
        }
        s
    }

    /// Devices that split the batch (`data x expert`).
    pub fn batch_devices(&self) -> usize {
        self.data.saturating_mul(self.expert)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Where the corpus lives (built by `gshard data` when absent).
    pub dir: String,
    /// Source languages; empty = `max_langs` of the corpus's: those users try first (French,
    /// German, Spanish, Italian, Brazilian Portuguese, Russian, Simplified Chinese,
    /// Japanese, then Korean, ...; `trainer::FIRST_LANGS`), then the largest others.
    pub langs: Vec<String>,
    pub max_langs: usize,
    /// GShard's data balancing: p(lang) ∝ n^(1/T).
    pub temperature: f64,
    /// Tokens per sequence (source incl. its language tag and `</s>`; target incl. `<s>`/`</s>`).
    pub max_len: usize,
    /// Rows per step (must divide by the device count): one sentence pair each, or, packed,
    /// as many as fit in `max_len` tokens per side.
    pub batch_size: usize,
    /// "packed" (short pairs share a row, each attending only within itself) or "padded"
    /// (one pair per row).
    pub packing: Packing,
    /// Dev pairs used for dev loss and BLEU.
    pub dev_size: usize,
    pub vocab_size: usize,
    /// Pairs per language (at most) used to train the tokenizer.
    pub tokenizer_pairs_per_lang: usize,
    /// Skip pairs whose English side has fewer words (software labels are tiny).
    pub min_english_words: usize,
    /// What happens to a training pair with a side longer than `max_len` tokens: "drop" it
    /// (a cut target ending in `</s>` teaches the model to stop early) or "cut" it.
    pub long_pairs: LongPairs,
}

/// What [`DataConfig::long_pairs`] does with a training pair that does not fit `max_len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LongPairs {
    Drop,
    Cut,
}

/// How a training step's pairs fill its rows ([`nn::transformer::Packing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packing {
    Packed,
    Padded,
}

impl From<Packing> for nn::transformer::Packing {
    fn from(p: Packing) -> Self {
        match p {
            Packing::Packed => nn::transformer::Packing::Packed,
            Packing::Padded => nn::transformer::Packing::Padded,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    pub model_dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Dense FFN and expert hidden size.
    pub ffn_dim: usize,
    pub enc_layers: usize,
    pub dec_layers: usize,
    /// Every k-th FFN is MoE (GShard: 2); 0 = dense baseline.
    pub moe_every: usize,
    pub experts: usize,
    /// Hidden size of each expert; 0 = `ffn_dim` (GShard: experts have the dense FFN's
    /// shape). `ffn_dim / 2` gives top-2 MoE the dense model's per-token FLOPs.
    pub expert_dim: usize,
    /// Tokens per MoE group.
    pub group_size: usize,
    /// C = ceil(2 S cf / E) (GShard's formula).
    pub capacity_factor: f64,
    /// "all", "random" (GShard random routing) or "sampling".
    pub second_expert: String,
    pub threshold: f64,
    /// Weight of the router's auxiliary losses (with `balance = "aux_loss"`).
    pub aux_loss_coef: f64,
    /// The router: "top2" (GShard) or "hierarchical" (Shazeer et al. 2017 appendix B:
    /// `expert_groups` groups, `primary_k` groups per token, `secondary_k` experts of each).
    pub gating: String,
    pub expert_groups: usize,
    pub primary_k: usize,
    pub secondary_k: usize,
    /// Load balancing: "aux_loss" (GShard's auxiliary loss, weighted by `aux_loss_coef`) or
    /// "bias" (DeepSeek-V3: no auxiliary loss; a per-expert bias on the routing scores, for
    /// the choice only, moved by `bias_rate` per step towards the mean load; top2 only).
    pub balance: String,
    pub bias_rate: f64,
    /// "relu" or "gelu_tanh" (also spelled "gelu-tanh", as on the command line).
    pub activation: String,
    pub dropout: f64,
    pub label_smoothing: f64,
    /// Rematerialisation of the training step: "none" (keep every activation the backward
    /// pass reads), "layer" (keep each layer's output, recompute the layer's forward pass in
    /// its backward pass), "dots" (keep dot-product outputs, recompute the rest), "marked"
    /// (recompute the checkpoint regions the model marks, `checkpoint`) or
    /// "scopes:PATH,PATH" (checkpoint regions named by path: these scopes recomputed like
    /// layers).
    pub remat: String,
    /// Activation checkpointing (not the run's saved checkpoints): the sublayers the model
    /// marks as checkpoint regions, which `remat = "marked"` recomputes in the backward
    /// pass: "attention" (self- and cross-attention) and/or "ffn" (dense and MoE
    /// feed-forward), e.g. `["ffn"]`. Empty (the default): nothing marked. The marks change
    /// no value ([`nn::transformer::Checkpoint`]).
    pub checkpoint: Vec<String>,
    /// Chunks of each MoE layer's expert buffers along capacity (`overlap = k`): every
    /// chunk gets its own all-to-alls, so an executor that overlaps collectives with compute
    /// runs one chunk's all-to-all during another's experts
    /// ([`nn::moe::MoeLayerOptions::overlap_chunks`]). 1 = unchunked; must divide the
    /// expert capacity. The results are those of 1, bit for bit.
    pub overlap: usize,
    /// "f32", or "bf16" for mixed precision: f32 master weights, gradients and optimizer
    /// state; activations and matmul operands in bf16 (dots accumulate in f32); norms'
    /// statistics, softmaxes, routing and the loss in f32
    /// ([`nn::transformer::Precision`]).
    pub precision: Precision,
}

/// What a model computes its activations in ([`ModelConfig::precision`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
}

impl From<Precision> for nn::transformer::Precision {
    fn from(p: Precision) -> Self {
        match p {
            Precision::F32 => nn::transformer::Precision::Full,
            Precision::Bf16 => nn::transformer::Precision::Mixed(DType::BF16),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!(
                "precision {other:?}: use \"f32\" or \"bf16\" (mixed precision)"
            )),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Beam width for BLEU decoding (1 = greedy, the default; a beam of k decodes k
    /// hypotheses per sentence, one decoder position per step over cached keys and values).
    pub beam: usize,
    /// Length penalty alpha of beam search ((5+len)/6)^alpha.
    pub length_penalty: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 1,
            steps: 2600,
            log_every: 10,
            eval_every: 500,
            checkpoint_every: 500,
            nonfinite_limit: 1,
            mesh: MeshConfig::default(),
            data: DataConfig::default(),
            model: ModelConfig::default(),
            optimizer: Optimizer::Adafactor(AdafactorConfig {
                // 0.05 for 100 steps, then inverse-sqrt decay: twice this rate (Adafactor's
                // usual 1.0) learns half as fast in a short run. The last 30% of the steps
                // fall linearly towards zero, and momentum (0.9) smooths the updates: dev
                // loss 2.441 against 2.469 without either (README table).
                lr: LrSchedule::Rsqrt {
                    base: 0.5,
                    warmup_steps: 100,
                    linear_warmup: false,
                    cooldown: 0.3,
                },
                beta1: 0.9,
                ..AdafactorConfig::default()
            }),
            eval: EvalConfig::default(),
        }
    }
}

impl Default for MeshConfig {
    fn default() -> Self {
        // One device per core of a 2-core machine: eight devices on two cores ran 22% fewer
        // tokens a second (the per-op work of eight small devices).
        MeshConfig {
            data: 1,
            expert: 2,
            model: 1,
            shard_weights: String::new(),
        }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dir: "data".into(),
            langs: Vec::new(),
            max_langs: 8,
            temperature: 5.0,
            // 64 tokens a side: cutting at 32 left the longest sentences, which carry most
            // of the dev set's characters, half translated.
            max_len: 64,
            batch_size: 32,
            packing: Packing::Packed,
            dev_size: 256,
            vocab_size: 4000,
            tokenizer_pairs_per_lang: 3000,
            min_english_words: 2,
            long_pairs: LongPairs::Drop,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            // Width 96 on two devices runs 10% fewer tokens a second than width 64 did on
            // eight and reaches a lower dev loss in about the same time (README table).
            model_dim: 96,
            heads: 6,
            head_dim: 16,
            ffn_dim: 128,
            enc_layers: 2,
            dec_layers: 2,
            moe_every: 2,
            experts: 8,
            expert_dim: 0,
            group_size: 256,
            capacity_factor: 2.0,
            second_expert: "random".into(),
            threshold: 0.5,
            aux_loss_coef: 0.01,
            gating: "top2".into(),
            expert_groups: 2,
            primary_k: 2,
            secondary_k: 2,
            balance: "aux_loss".into(),
            bias_rate: 0.001,
            activation: "relu".into(),
            dropout: 0.1,
            label_smoothing: 0.1,
            remat: "none".into(),
            checkpoint: Vec::new(),
            overlap: 1,
            precision: Precision::F32,
        }
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            beam: 1,
            length_penalty: 0.6,
        }
    }
}

impl TrainConfig {
    /// Parse TOML; errors name the field and say what type it needs. Every field is
    /// optional: the text is laid over the main job's config ([`TrainConfig::default`]) table
    /// by table, so `[optimizer.lr]` with only `base` keeps the default's other settings. A
    /// table whose `kind` differs from the default's (`[optimizer] kind = "adam"`) replaces
    /// the default's table instead, taking that kind's own defaults.
    pub fn from_toml(text: &str, path: &str) -> Result<TrainConfig, ConfigError> {
        let cfg = TrainConfig::parse_toml(text, path)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// [`TrainConfig::from_toml`] without [`TrainConfig::validate`], for a caller that
    /// overrides fields (the CLI's `--mesh`, `--steps`) and validates the result.
    pub fn parse_toml(text: &str, path: &str) -> Result<TrainConfig, ConfigError> {
        let parse_err = |e: toml::de::Error| parse_error(path, e);
        let user: toml::Table = toml::from_str(text).map_err(parse_err)?;
        let mut merged: toml::Table =
            toml::from_str(&TrainConfig::default().to_toml()).expect("the default config parses");
        overlay(&mut merged, user);
        let cfg: TrainConfig = toml::Value::Table(merged).try_into().map_err(parse_err)?;
        Ok(cfg)
    }

    /// A run's own config, as [`TrainConfig::to_toml`] wrote it into its run directory or
    /// checkpoint, parsed as is (not laid over the main job's): a field a run written by
    /// an older version lacks takes its own default (no `lr.cooldown` is 0), so resuming
    /// the run keeps the schedule it trained with. Validated.
    pub fn from_run_toml(text: &str, path: &str) -> Result<TrainConfig, ConfigError> {
        let cfg: TrainConfig = toml::from_str(text).map_err(|e| parse_error(path, e))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("configs serialise")
    }

    /// The device count of the mesh (saturating: validation refuses more than
    /// [`MAX_DEVICES`]).
    pub fn devices(&self) -> usize {
        self.mesh.batch_devices().saturating_mul(self.mesh.model)
    }

    /// The mesh: `data x expert`, then `model` innermost (neighbouring ranks, the fastest
    /// links) when it has more than one device.
    pub fn mesh(&self) -> Result<Mesh, ConfigError> {
        let mut axes = vec![("data", self.mesh.data), ("expert", self.mesh.expert)];
        if self.mesh.model != 1 {
            axes.push(("model", self.mesh.model));
        }
        Mesh::new(&axes).map_err(|e| ConfigError::Invalid(e.to_string()))
    }

    /// Batch over `data` and `expert`; experts over `expert`; heads, hidden dims and the
    /// vocabulary over `model` when the mesh has it.
    pub fn layout(&self) -> Layout {
        Layout {
            batch_axes: vec!["data".into(), "expert".into()],
            expert_axes: vec!["expert".into()],
            model_axes: if self.mesh.model != 1 {
                vec!["model".into()]
            } else {
                Vec::new()
            },
            weight_axes: match self.mesh.shard_weights.as_str() {
                "" => Vec::new(),
                axis => vec![axis.to_string()],
            },
        }
    }

    /// Check every field's range and every constraint between the fields; the message names
    /// the field, its value and the fix. Never panics, whatever the values.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let (d, e, tp) = (self.mesh.data, self.mesh.expert, self.mesh.model);
        let mesh = self.mesh.describe();
        match self.mesh.shard_weights.as_str() {
            "" | "data" | "expert" => {}
            "model" if tp > 1 => {}
            other => {
                return bad(format!(
                    "mesh.shard_weights = \"{other}\": use \"data\", \"expert\", \"model\" (with mesh.model > 1) or \"\" (off)"
                ))
            }
        }
        if d == 0 || e == 0 || tp == 0 {
            return bad(format!(
                "mesh {mesh}: every mesh axis needs at least 1 device"
            ));
        }
        // `n`: the devices that split the batch (the model axis does not).
        let n = match d
            .checked_mul(e)
            .and_then(|n| n.checked_mul(tp).map(|all| (n, all)))
        {
            Some((n, all)) if all <= MAX_DEVICES => n,
            _ => {
                return bad(format!(
                    "mesh {mesh} has more than {MAX_DEVICES} devices; use a smaller mesh"
                ))
            }
        };
        let data = &self.data;
        let m = &self.model;
        if self.nonfinite_limit == 0 {
            return bad("nonfinite_limit = 0: use at least 1 (the run stops after that many non-finite steps in a row)".into());
        }
        if data.batch_size == 0 {
            return bad(format!(
                "data.batch_size = 0: a batch needs at least one sentence pair per device; use a multiple of {n}"
            ));
        }
        if !data.batch_size.is_multiple_of(n) {
            return bad(format!(
                "data.batch_size = {} does not divide over the {n} devices that split the batch (data x expert) of mesh {mesh}; use a multiple of {n}",
                data.batch_size
            ));
        }
        in_range("data.max_len", data.max_len, 4, MAX_LEN)?;
        in_range("data.max_langs", data.max_langs, 1, 10_000)?;
        in_range("data.dev_size", data.dev_size, 1, 1 << 24)?;
        in_range("data.vocab_size", data.vocab_size, 256, MAX_VOCAB)?;
        in_range(
            "data.tokenizer_pairs_per_lang",
            data.tokenizer_pairs_per_lang,
            1,
            1 << 30,
        )?;
        if !(data.temperature.is_finite() && data.temperature > 0.0) {
            return bad(format!(
                "data.temperature = {}: use a finite value > 0 (1 samples languages by size, larger values flatten)",
                data.temperature
            ));
        }
        if data.batch_size.checked_mul(data.max_len).is_none() {
            return bad("data.batch_size x data.max_len overflows; use smaller values".into());
        }
        for (field, v) in [
            ("model.model_dim", m.model_dim),
            ("model.heads", m.heads),
            ("model.head_dim", m.head_dim),
            ("model.ffn_dim", m.ffn_dim),
            ("model.dec_layers", m.dec_layers),
        ] {
            in_range(field, v, 1, MAX_DIM)?;
        }
        in_range("model.enc_layers", m.enc_layers, 0, MAX_DIM)?;
        in_range("model.expert_dim", m.expert_dim, 0, MAX_DIM)?;
        in_range("model.moe_every", m.moe_every, 0, MAX_DIM)?;
        if tp > 1 {
            let mut split = vec![("model.heads", m.heads), ("model.ffn_dim", m.ffn_dim)];
            if m.moe_every > 0 && m.experts > 0 {
                split.push(("model.expert_dim", m.expert_dim));
            }
            for (field, v) in split {
                if !v.is_multiple_of(tp) {
                    let divisors: Vec<String> = (1..=v.min(4096))
                        .filter(|k| v.is_multiple_of(*k))
                        .map(|k| k.to_string())
                        .collect();
                    return bad(format!(
                        "{field} = {v} does not divide over mesh axis model={tp}; use a multiple of {tp}, or mesh.model one of {}",
                        divisors.join(", ")
                    ));
                }
            }
        }
        if m.heads.checked_mul(m.head_dim).is_none_or(|x| x > MAX_DIM) {
            return bad(format!(
                "model.heads x model.head_dim = {} x {} is over {MAX_DIM}; use smaller values",
                m.heads, m.head_dim
            ));
        }
        if !(m.capacity_factor.is_finite()
            && (0.0..=MAX_CAPACITY_FACTOR).contains(&m.capacity_factor))
        {
            return bad(format!(
                "model.capacity_factor = {}: use a finite value in [0, {MAX_CAPACITY_FACTOR}] (GShard uses 2)",
                m.capacity_factor
            ));
        }
        for (field, v) in [
            ("model.threshold", m.threshold),
            ("model.aux_loss_coef", m.aux_loss_coef),
            ("model.bias_rate", m.bias_rate),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{field} = {v}: use a finite value >= 0"));
            }
        }
        if m.moe_every > 0 && m.experts > 0 {
            in_range("model.experts", m.experts, 2, MAX_DIM)?;
            if !m.experts.is_multiple_of(e) {
                return bad(format!(
                    "model.experts = {} does not divide over mesh axis expert={e}; use a multiple of {e} or change mesh.expert",
                    m.experts
                ));
            }
            let tokens = data.batch_size * data.max_len;
            if m.group_size == 0
                || !tokens.is_multiple_of(m.group_size)
                || !(tokens / m.group_size).is_multiple_of(n)
            {
                return bad(format!(
                    "model.group_size = {} must divide the {tokens} tokens of a batch into a number of groups that divides over the {n} devices of mesh axes data x expert",
                    m.group_size
                ));
            }
        }
        self.policy()?;
        self.remat()?;
        self.checkpoint()?;
        self.moe_capacity()?;
        self.activation()?;
        self.gating()?;
        self.balance()?;
        for (field, v) in [
            ("model.dropout", m.dropout),
            ("model.label_smoothing", m.label_smoothing),
        ] {
            if !(0.0..1.0).contains(&v) {
                return bad(format!("{field} = {v}: use a value in [0, 1)"));
            }
        }
        if self.eval.beam == 0 || self.eval.beam > data.batch_size {
            return bad(format!(
                "eval.beam = {}: use a width from 1 (greedy) to data.batch_size = {}",
                self.eval.beam, data.batch_size
            ));
        }
        if !self.eval.length_penalty.is_finite() {
            return bad(format!(
                "eval.length_penalty = {}: use a finite value (0 = none, 0.6 is usual)",
                self.eval.length_penalty
            ));
        }
        self.optimizer
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        Ok(())
    }

    /// Settings that are valid but likely not what the user meant, one message each (the CLI
    /// prints them before training).
    pub fn warnings(&self) -> Vec<String> {
        let m = &self.model;
        let mut out = Vec::new();
        if m.moe_every > 0 && m.experts > 0 && m.capacity_factor < 1.0 {
            let c = nn::capacity::gshard(m.group_size, m.experts, m.capacity_factor);
            let fair = nn::capacity::gshard(m.group_size, m.experts, 1.0);
            out.push(format!(
                "model.capacity_factor = {} gives each expert {c} slot(s) per group of {} tokens where a balanced top-2 load needs {fair}: a large share of tokens will be dropped (GShard uses 2)",
                m.capacity_factor, m.group_size
            ));
        }
        if !m.checkpoint.is_empty() && self.remat().is_ok_and(|p| p != Policy::Marked) {
            out.push(format!(
                "model.checkpoint marks {} as checkpoint regions, but model.remat = {:?} does not recompute marked regions; set model.remat = \"marked\" to recompute them",
                m.checkpoint.join(", "),
                m.remat
            ));
        }
        out
    }

    fn policy(&self) -> Result<SecondPolicy, ConfigError> {
        match self.model.second_expert.as_str() {
            "all" => Ok(SecondPolicy::All),
            "random" => Ok(SecondPolicy::Random {
                threshold: self.model.threshold,
            }),
            "sampling" => Ok(SecondPolicy::Sampling),
            other => Err(ConfigError::Invalid(format!(
                "model.second_expert = {other:?}: use \"all\", \"random\" or \"sampling\""
            ))),
        }
    }

    /// The router, its options checked against the expert count.
    fn gating(&self) -> Result<MoeGating, ConfigError> {
        let m = &self.model;
        match m.gating.as_str() {
            "top2" => Ok(MoeGating::Top2),
            "hierarchical" => {
                let moe = m.moe_every > 0 && m.experts > 0;
                let a = m.expert_groups;
                if moe && (a == 0 || a > m.experts || !m.experts.is_multiple_of(a)) {
                    return Err(ConfigError::Invalid(format!(
                        "model.expert_groups = {a} must divide model.experts = {} (e.g. 8 groups of 8 for 64 experts)",
                        m.experts
                    )));
                }
                let b = if moe { m.experts / a } else { usize::MAX };
                if moe && !(1..=a).contains(&m.primary_k) {
                    return Err(ConfigError::Invalid(format!(
                        "model.primary_k = {}: use a value from 1 to model.expert_groups = {a}",
                        m.primary_k
                    )));
                }
                if moe && !(1..=b).contains(&m.secondary_k) {
                    return Err(ConfigError::Invalid(format!(
                        "model.secondary_k = {}: use a value from 1 to the {b} experts per group",
                        m.secondary_k
                    )));
                }
                Ok(MoeGating::Hierarchical {
                    groups: a,
                    k_primary: m.primary_k,
                    k_secondary: m.secondary_k,
                })
            }
            other => Err(ConfigError::Invalid(format!(
                "model.gating = {other:?}: use \"top2\" or \"hierarchical\""
            ))),
        }
    }

    fn balance(&self) -> Result<Balance, ConfigError> {
        let m = &self.model;
        match (m.balance.as_str(), m.gating.as_str()) {
            ("aux_loss", _) => Ok(Balance::AuxLoss),
            ("bias", "top2") => Ok(Balance::Bias { rate: m.bias_rate }),
            ("bias", g) => Err(ConfigError::Invalid(format!(
                "model.balance = \"bias\" is implemented for model.gating = \"top2\", not {g:?}"
            ))),
            (other, _) => Err(ConfigError::Invalid(format!(
                "model.balance = {other:?}: use \"aux_loss\" or \"bias\""
            ))),
        }
    }

    /// The MoE layers' expert capacity per group (GShard's `C = ceil(K S cf / E)` for K
    /// assignments a token), checked against `model.overlap`, which must divide it.
    pub fn moe_capacity(&self) -> Result<usize, ConfigError> {
        let m = &self.model;
        let k = match self.gating()? {
            MoeGating::Top2 => 2,
            MoeGating::Hierarchical {
                k_primary,
                k_secondary,
                ..
            } => k_primary * k_secondary,
        };
        let c = nn::capacity::gshard(m.group_size * k, 2 * m.experts.max(1), m.capacity_factor);
        if m.overlap == 0 || m.overlap > MAX_DIM {
            return Err(ConfigError::Invalid(format!(
                "model.overlap = {}: use a number of chunks from 1 (no overlap) to {MAX_DIM}",
                m.overlap
            )));
        }
        if m.moe_every > 0 && m.experts > 0 && !c.is_multiple_of(m.overlap) {
            return Err(ConfigError::Invalid(format!(
                "model.overlap = {} does not divide the expert capacity {c}: use one of its divisors ({})",
                m.overlap,
                nn::moe::divisors_text(c)
            )));
        }
        Ok(c)
    }

    /// The training step's rematerialisation policy (`model.remat`).
    pub fn remat(&self) -> Result<Policy, ConfigError> {
        Policy::parse(&self.model.remat)
            .map_err(|e| ConfigError::Invalid(format!("model.remat: {e}")))
    }

    /// The sublayers the model marks as checkpoint regions (`model.checkpoint`), checked
    /// against `model.remat`: `"marked"` needs at least one.
    pub fn checkpoint(&self) -> Result<Checkpoint, ConfigError> {
        let m = &self.model;
        let mut c = Checkpoint::default();
        for name in &m.checkpoint {
            match name.as_str() {
                "attention" => c.attention = true,
                "ffn" => c.ffn = true,
                other => {
                    return Err(ConfigError::Invalid(format!(
                        "model.checkpoint: {other:?} is not a sublayer; use \"attention\" and/or \"ffn\", e.g. checkpoint = [\"ffn\"]"
                    )))
                }
            }
        }
        if !c.any() && self.remat()? == Policy::Marked {
            return Err(ConfigError::Invalid(
                "model.remat = \"marked\" recomputes the checkpoint regions the model marks, but model.checkpoint marks none; set model.checkpoint = [\"ffn\"] (or [\"attention\", \"ffn\"]), or use another model.remat".into(),
            ));
        }
        Ok(c)
    }

    fn activation(&self) -> Result<Activation, ConfigError> {
        match self.model.activation.as_str() {
            "relu" => Ok(Activation::Relu),
            "gelu_tanh" | "gelu-tanh" => Ok(Activation::GeluTanh),
            other => Err(ConfigError::Invalid(format!(
                "model.activation = {other:?}: use \"relu\" or \"gelu_tanh\""
            ))),
        }
    }

    /// The model for a vocabulary of `vocab` tokens.
    pub fn transformer(&self, vocab: usize) -> Result<TransformerConfig, ConfigError> {
        let m = &self.model;
        let gating = self.gating()?;
        let balance = self.balance()?;
        let capacity = self.moe_capacity()?;
        let moe = (m.moe_every > 0 && m.experts > 0).then_some(MoeConfig {
            experts: m.experts,
            expert_dim: if m.expert_dim == 0 {
                m.ffn_dim
            } else {
                m.expert_dim
            },
            group_size: m.group_size,
            capacity,
            policy: SecondPolicy::All,
            // Bias balancing trains without the auxiliary loss.
            aux_loss_coef: match balance {
                Balance::AuxLoss => m.aux_loss_coef,
                Balance::Bias { .. } => 0.0,
            },
            gating,
            balance,
            overlap_chunks: m.overlap,
        });
        let moe = match moe {
            Some(mc) => Some(MoeConfig {
                policy: self.policy()?,
                ..mc
            }),
            None => None,
        };
        Ok(TransformerConfig {
            vocab,
            src_vocab: None,
            model_dim: m.model_dim,
            heads: m.heads,
            head_dim: m.head_dim,
            ffn_dim: m.ffn_dim,
            enc_layers: m.enc_layers,
            dec_layers: m.dec_layers,
            moe_every: if moe.is_some() { m.moe_every } else { 0 },
            moe,
            activation: self.activation()?,
            dropout: m.dropout,
            label_smoothing: m.label_smoothing,
            dtype: DType::F32,
            precision: m.precision.into(),
            checkpoint: self.checkpoint()?,
        })
    }
}
