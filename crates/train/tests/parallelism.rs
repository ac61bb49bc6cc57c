//! Every parallelism the training mesh takes, against one device: five training steps of a
//! tiny MoE Transformer on data x model x expert meshes, with and without weight-update
//! sharding, give the single device's loss curve and weights (f32 tolerance), and a model
//! axis that does not divide a dimension is a one-line error naming it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use train::checkpoint;
use train::config::TrainConfig;
use train::data::Corpus;
use train::trainer::{run, RunOptions};

fn corpus() -> Corpus {
    common::corpus(600, &["de", "fr"])
}

fn tiny(data: usize, expert: usize, model: usize) -> TrainConfig {
    let mut c = TrainConfig {
        steps: 5,
        log_every: 1,
        eval_every: 0,
        checkpoint_every: 5,
        ..TrainConfig::default()
    };
    c.mesh.data = data;
    c.mesh.expert = expert;
    c.mesh.model = model;
    // 128 tokens: 8 groups of 16, one per device of the largest mesh.
    c.data.batch_size = 16;
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
    c.model.group_size = 16;
    c.eval.beam = 1;
    c
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-par-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Train `cfg` in `dir`: the logged losses and the final checkpoint's tensors.
fn train(cfg: &TrainConfig, c: &Corpus, dir: &Path) -> (Vec<f64>, HashMap<String, Vec<f64>>) {
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
            let v = ck.read_whole(&k).unwrap().to_f64_vec();
            (k, v)
        })
        .collect();
    (losses, tensors)
}

#[test]
fn five_steps_on_every_mesh_equal_one_device() {
    let c = corpus();
    let dir = tmp("one");
    let (want_loss, want) = train(&tiny(1, 1, 1), &c, &dir);
    assert_eq!(want_loss.len(), 5);
    for (d, e, m, shard) in [
        (1, 1, 2, ""),
        (2, 1, 2, ""),
        (1, 2, 2, ""),
        (2, 2, 2, ""),
        (1, 1, 4, ""),
        (2, 2, 1, "data"),
        (2, 2, 2, "data"),
        (1, 2, 2, "expert"),
        // The main job's mesh: chained small all-reduces of sharded weights' norms.
        (2, 4, 1, "data"),
        (2, 4, 1, "expert"),
    ] {
        let mut cfg = tiny(d, e, m);
        cfg.mesh.shard_weights = shard.to_string();
        let mesh = cfg.mesh.describe();
        let out = tmp(&format!("{d}{e}{m}{shard}"));
        let (loss, got) = train(&cfg, &c, &out);
        for (step, (a, b)) in want_loss.iter().zip(&loss).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * a.abs(),
                "mesh {mesh}, step {}: loss {b} vs one device's {a}",
                step + 1
            );
        }
        assert_eq!(got.len(), want.len(), "mesh {mesh}");
        for (name, w) in &want {
            let g = &got[name];
            let worst = w
                .iter()
                .zip(g)
                .map(|(a, b)| (a - b).abs() / (1e-3 + a.abs()))
                .fold(0.0, f64::max);
            assert!(worst < 1e-3, "mesh {mesh}: {name} differs by {worst:e}");
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_model_axis_that_does_not_divide_the_heads_is_refused_by_name() {
    let mut cfg = tiny(1, 1, 3);
    let err = cfg.validate().unwrap_err().to_string();
    assert!(
        err.contains("model.heads = 4 does not divide over mesh axis model=3")
            && err.contains("1, 2, 4"),
        "{err}"
    );
    cfg.mesh.model = 2;
    cfg.model.ffn_dim = 33;
    cfg.model.expert_dim = 16;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("model.ffn_dim = 33"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
