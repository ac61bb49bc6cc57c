//! Incremental decoding (the encoder once per batch, one decoder position per step with
//! cached keys and values) gives the same tokens as the whole-model re-decode, for greedy
//! and beam search, on random MoE Transformers and meshes.
//!
//! The condition: both route MoE tokens dropless. When the run's capacity holds every token
//! of a group (`C >= S`), the re-decode is the evaluation program itself, exactly today's
//! decoding; otherwise (the default config: `S = 256`, `C = 128`) decoding re-runs a
//! dropless copy of it, since with drops a token's routing depends on the rest of its group
//! (other sentences, padding at later positions) and no cache can reproduce that.

mod common;

use train::config::TrainConfig;
use train::data::Corpus;
use train::tokenizer::Tokenizer;
use train::trainer::{load_run, run, translate, DecodeMode, DecodeOptions, LoadedRun, RunOptions};

/// A tiny MoE encoder-decoder: every FFN is MoE, `E = 4` experts, groups of `S = 16`.
fn tiny(mesh: (usize, usize), capacity_factor: f64) -> TrainConfig {
    let mut c = TrainConfig::default();
    c.mesh.data = mesh.0;
    c.mesh.expert = mesh.1;
    c.data.batch_size = 8;
    c.data.max_len = 8;
    c.data.vocab_size = 300;
    c.model.model_dim = 16;
    c.model.heads = 2;
    c.model.head_dim = 8;
    c.model.ffn_dim = 32;
    c.model.enc_layers = 1;
    c.model.dec_layers = 2;
    c.model.moe_every = 1;
    c.model.experts = 4;
    c.model.group_size = 16;
    c.model.capacity_factor = capacity_factor;
    c
}

/// Word-by-word "translations" of random 2-4 word phrases into English.
fn corpus() -> Corpus {
    common::corpus(1500, &["de", "fr"])
}

/// `cfg` trained for a few steps (so that translations depend on the source and vary along
/// the sentence), loaded back.
fn trained(cfg: &TrainConfig, tag: &str) -> LoadedRun {
    let mut cfg = cfg.clone();
    cfg.steps = TRAIN_STEPS;
    cfg.log_every = TRAIN_STEPS;
    cfg.eval_every = 0;
    cfg.checkpoint_every = TRAIN_STEPS;
    cfg.data.dev_size = 8;
    let dir = std::env::temp_dir().join(format!("gshard-decode-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    run(&cfg, &corpus(), &RunOptions::new(dir.clone()), &mut |_| {}).unwrap();
    let loaded = load_run(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    loaded
}

const TRAIN_STEPS: u64 = 150;

fn sources(tok: &Tokenizer, n: usize, max_len: usize) -> Vec<Vec<u32>> {
    testkit::phrases::phrases(n)
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (lang, text) = if i % 2 == 0 {
                ("de", &p.de)
            } else {
                ("fr", &p.fr)
            };
            tok.encode_source(lang, text, max_len).unwrap()
        })
        .collect()
}

/// Decode 11 sentences (two batches and a part) greedily and with beams of 2 and 3 (3 leaves
/// rows of every batch unused) both ways; the tokens must be equal.
fn check(cfg: &TrainConfig, tag: &str) {
    cfg.validate().unwrap();
    let LoadedRun {
        tok, trainer: tr, ..
    } = trained(cfg, tag);
    let srcs = sources(&tok, 11, cfg.data.max_len);
    for beam in [1, 2, 3] {
        let opts = DecodeOptions::new(beam, 0.6);
        let fast = translate(&tr, &tok, &srcs, &opts).unwrap();
        let full = translate(&tr, &tok, &srcs, &opts.mode(DecodeMode::Full)).unwrap();
        assert_eq!(fast.len(), srcs.len());
        assert!(fast.iter().all(|h| !h.is_empty()));
        assert_eq!(
            fast, full,
            "beam {beam}: incremental and full decoding differ"
        );
    }
}

/// `C = ceil(2 * 16 * 2 / 4) = 16 = S`: the evaluation program drops nothing, and the
/// re-decode is today's decoding exactly.
#[test]
fn incremental_equals_full_redecode_of_the_eval_program() {
    check(&tiny((1, 2), 2.0), "eval");
}

/// `C = 8 < S = 16` (as in the default config): decoding routes dropless in both modes.
#[test]
fn incremental_equals_dropless_full_redecode_when_capacity_can_drop() {
    check(&tiny((1, 2), 1.0), "drops");
}

/// Groups and experts split over a 2x2 mesh: the step's MoE groups are one per device.
#[test]
fn incremental_equals_full_redecode_on_a_2x2_mesh() {
    let mut c = tiny((2, 2), 1.0);
    c.model.enc_layers = 2;
    c.model.moe_every = 2;
    check(&c, "mesh");
}

/// A decoder-only model decodes the same way (no encoder program, no cross-attention).
#[test]
fn incremental_equals_full_redecode_without_an_encoder() {
    let mut c = tiny((1, 2), 1.0);
    c.model.enc_layers = 0;
    check(&c, "lm");
}
