//! The GShard models of Lepikhin et al. 2020, Table 1 (six models) and the 1T-parameter
//! MoE(2048E,60L) of §4.3, as run configs at full size: model dimension 1024, 16 heads of
//! 128, dense and expert hidden size 8192, top-2 MoE in every other feed-forward layer of
//! both encoder and decoder (L/2 MoE layers), as many experts as devices (one expert per
//! device on an `expert` mesh axis), Adafactor as the paper trains it (relative step, no
//! momentum, factored second moments), capacity factor 2, dropout 0.1, label
//! smoothing 0.1. The batch is Table 3's: 4M tokens per step for the 2048-expert models,
//! 1M for the others, as rows of 1024 tokens with one MoE group per row.
//!
//! Two choices are ours, as the paper does not give them: the sequence length (1024) and a
//! shared 32k vocabulary (the paper has a 64k source and a 32k target vocabulary; the
//! difference is 65M parameters, under 1% of the smallest model).

use serde::Serialize;
use train::config::TrainConfig;
use train::optim::{AdafactorConfig, Optimizer};

/// One preset.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Preset {
    pub name: &'static str,
    /// Another name it answers to.
    pub alias: Option<&'static str>,
    /// Experts per MoE layer (and devices).
    pub experts: usize,
    /// Encoder plus decoder layers.
    pub layers: usize,
    /// Tokens per training step.
    pub batch_tokens: usize,
    /// The weights the paper prints (Table 1), for comparison.
    pub paper_params: f64,
    /// Training steps per second on TPU v3 (Table 3), where the paper gives them.
    pub paper_steps_per_s: Option<f64>,
}

/// Sequence length of the presets (our choice).
pub const SEQ_LEN: usize = 1024;
/// Shared vocabulary of the presets (our choice).
pub const VOCAB: usize = 32_000;

/// Table 1's models, then the 1T-parameter model.
pub const PRESETS: [Preset; 7] = [
    preset(
        "gshard-128e-12l",
        None,
        128,
        12,
        1 << 20,
        12.5e9,
        Some(2.16),
    ),
    preset("gshard-128e-36l", None, 128, 36, 1 << 20, 37e9, Some(0.67)),
    preset("gshard-512e-12l", None, 512, 12, 1 << 20, 50e9, Some(3.28)),
    preset("gshard-512e-36l", None, 512, 36, 1 << 20, 150e9, Some(1.05)),
    preset(
        "gshard-2048e-12l",
        None,
        2048,
        12,
        4 << 20,
        200e9,
        Some(2.15),
    ),
    preset(
        "gshard-2048e-36l",
        Some("gshard-600b"),
        2048,
        36,
        4 << 20,
        600e9,
        Some(0.72),
    ),
    preset(
        "gshard-2048e-60l",
        Some("gshard-1t"),
        2048,
        60,
        4 << 20,
        1e12,
        None,
    ),
];

const fn preset(
    name: &'static str,
    alias: Option<&'static str>,
    experts: usize,
    layers: usize,
    batch_tokens: usize,
    paper_params: f64,
    paper_steps_per_s: Option<f64>,
) -> Preset {
    Preset {
        name,
        alias,
        experts,
        layers,
        batch_tokens,
        paper_params,
        paper_steps_per_s,
    }
}

impl Preset {
    /// The preset named `name` (or by its alias).
    pub fn find(name: &str) -> Option<&'static Preset> {
        PRESETS
            .iter()
            .find(|p| p.name == name || p.alias == Some(name))
    }

    /// Every name, for error messages.
    pub fn names() -> String {
        PRESETS
            .iter()
            .map(|p| match p.alias {
                Some(a) => format!("{} ({a})", p.name),
                None => p.name.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The run config: the paper's model, batch and devices (mesh `expert = E`).
    pub fn config(&self) -> TrainConfig {
        let mut c = TrainConfig::default();
        c.mesh.data = 1;
        c.mesh.expert = self.experts;
        c.data.max_len = SEQ_LEN;
        c.data.batch_size = self.batch_tokens / SEQ_LEN;
        c.data.vocab_size = VOCAB;
        c.eval.beam = 1;
        // Not the main job's optimizer (momentum costs a weight-sized state per weight).
        c.optimizer = Optimizer::Adafactor(AdafactorConfig::default());
        let m = &mut c.model;
        m.model_dim = 1024;
        m.heads = 16;
        m.head_dim = 128;
        m.ffn_dim = 8192;
        m.enc_layers = self.layers / 2;
        m.dec_layers = self.layers / 2;
        m.moe_every = 2;
        m.experts = self.experts;
        m.expert_dim = 0;
        m.group_size = SEQ_LEN;
        m.capacity_factor = 2.0;
        m.second_expert = "random".into();
        m.dropout = 0.1;
        m.label_smoothing = 0.1;
        m.activation = "relu".into();
        c
    }
}
