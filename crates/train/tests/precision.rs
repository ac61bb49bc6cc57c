//! Mixed precision in training (`model.precision = "bf16"`): a few steps of a tiny MoE
//! Transformer in bf16 follow the f32 run's losses, the bf16 run on a data=2 x expert=4
//! mesh follows the single device's, the weights and optimizer state stay f32, and a wrong
//! precision is a one-line error naming the values it takes.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use train::checkpoint;
use train::config::{LongPairs, Precision, TrainConfig};
use train::data::Corpus;
use train::trainer::{run, RunOptions};

fn corpus() -> Corpus {
    common::corpus(600, &["de", "fr"])
}

fn tiny(data: usize, expert: usize, precision: Precision) -> TrainConfig {
    let mut c = TrainConfig {
        steps: 6,
        log_every: 1,
        eval_every: 0,
        checkpoint_every: 6,
        ..TrainConfig::default()
    };
    c.mesh.data = data;
    c.mesh.expert = expert;
    c.data.batch_size = 8;
    c.data.max_len = 8;
    c.data.dev_size = 8;
    c.data.vocab_size = 300;
    c.model.model_dim = 16;
    c.model.heads = 4;
    c.model.head_dim = 4;
    c.model.ffn_dim = 32;
    c.model.enc_layers = 1;
    c.model.dec_layers = 2;
    c.model.moe_every = 2;
    c.model.experts = 4;
    c.model.expert_dim = 16;
    c.model.group_size = 8;
    c.model.precision = precision;
    // The bounds below were derived and measured on these pairs (cut to 8 tokens) without
    // dropout, whose masks would amplify the rounding differences further.
    c.data.long_pairs = LongPairs::Cut;
    c.model.dropout = 0.0;
    c
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-bf16-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A run's logged losses and its final checkpoint's tensors with their dtypes.
type Trained = (Vec<f64>, HashMap<String, (ir::DType, Vec<f64>)>);

fn train(cfg: &TrainConfig, c: &Corpus, dir: &Path) -> Trained {
    run(cfg, c, &RunOptions::new(dir.to_path_buf()), &mut |_| {})
        .unwrap_or_else(|e| panic!("mesh {}: {e}", cfg.mesh.describe()));
    let losses = train::metrics::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.get("tokens_per_s").is_some())
        .map(|r| r["loss"].as_f64().unwrap())
        .collect();
    let ck = checkpoint::ShardedReader::open(&dir.join("checkpoint")).unwrap();
    let tensors = ck
        .manifest
        .types()
        .into_iter()
        .map(|(k, _)| {
            let t = ck.read_whole(&k).unwrap();
            (k, (t.ty.dtype, t.to_f64_vec()))
        })
        .collect();
    std::fs::remove_dir_all(dir).unwrap();
    (losses, tensors)
}

#[test]
fn bf16_training_follows_f32_and_keeps_f32_state() {
    let c = corpus();
    let (f32_loss, f32_state) = train(&tiny(1, 1, Precision::F32), &c, &tmp("f32"));
    let (bf16_loss, bf16_state) = train(&tiny(1, 1, Precision::Bf16), &c, &tmp("bf16"));
    assert_eq!(bf16_loss.len(), 6);
    for (step, (a, b)) in f32_loss.iter().zip(&bf16_loss).enumerate() {
        // A few bf16 roundings (u = 2^-8 each) of the logits move the loss: 2 % is ~5u.
        assert!(
            (a - b).abs() <= 0.02 * a.abs(),
            "step {}: loss {b} in bf16 against {a} in f32",
            step + 1
        );
    }
    assert_ne!(f32_loss, bf16_loss, "the bf16 run computes in bf16");
    assert_eq!(bf16_state.len(), f32_state.len());
    for (name, (dt, _)) in &bf16_state {
        assert_eq!(*dt, f32_state[name].0, "{name} is kept as in the f32 run");
        assert_ne!(*dt, ir::DType::BF16, "{name} is kept in f32");
    }
}

#[test]
fn bf16_on_8_devices_follows_one_device() {
    let c = corpus();
    let (want_loss, want) = train(&tiny(1, 1, Precision::Bf16), &c, &tmp("one"));
    let (loss, got) = train(&tiny(2, 4, Precision::Bf16), &c, &tmp("eight"));
    // The first step's forward pass rounds the same values in the same ops: the same
    // loss. Each update then differs by the bf16 rounding of the weight gradients' partial
    // sums (each device rounds its own before the all-reduce), a few u of the update
    // (`crates/nn/tests/precision.rs`), which moves the next losses by less than u
    // (measured: 1.2e-3 at most, 0.3 u).
    assert_eq!(want_loss[0], loss[0], "step 1 on 8 devices against one");
    let u = 1.0 / 256.0;
    for (step, (a, b)) in want_loss.iter().zip(&loss).enumerate() {
        assert!(
            (a - b).abs() <= u * a.abs(),
            "step {}: loss {b} on 8 devices against {a} on one",
            step + 1
        );
    }
    // The weights, norm-wise: six Adafactor updates, each a step of at most the learning
    // rate (0.05) of the weight's scale, whose directions differ where gradient entries
    // nearly cancel (up to ~10 % there): 6 x 0.05 x 0.1 = 3 %, 8 u (measured: 1.6 u). The
    // optimizer's second moments square such entries: not compared.
    let mut worst = (0.0f64, "");
    for (name, (_, w)) in want.iter().filter(|(k, _)| !k.starts_with("opt/")) {
        let g = &got[name].1;
        let diff: f64 = w.iter().zip(g).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f64 = w.iter().map(|a| a * a).sum();
        let e = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
        if e > worst.0 {
            worst = (e, name);
        }
    }
    eprintln!("weights: worst {} at {:.1e}", worst.1, worst.0);
    assert!(
        worst.0 <= 8.0 * u,
        "{} differs by {:e} norm-wise",
        worst.1,
        worst.0
    );
}

#[test]
fn precision_parses_and_a_wrong_one_names_the_choices() {
    let cfg = TrainConfig::from_toml("[model]\nprecision = \"bf16\"\n", "run.toml").unwrap();
    assert_eq!(cfg.model.precision, Precision::Bf16);
    assert_eq!(TrainConfig::default().model.precision, Precision::F32);
    let err = TrainConfig::from_toml("[model]\nprecision = \"fp16\"\n", "run.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fp16") && err.contains("bf16") && err.contains("f32") && !err.contains('\n'),
        "{err}"
    );
    assert_eq!("bf16".parse::<Precision>(), Ok(Precision::Bf16));
    let err = "half".parse::<Precision>().unwrap_err();
    assert!(err.contains("\"bf16\""), "{err}");
}
