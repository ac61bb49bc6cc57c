//! What the training tests share: a small parallel corpus built from the test kit's
//! phrases, so every test trains on the same kind of data without files; a tiny MoE run
//! config; scratch directories; and a run's trajectory (losses, gradient norms, saved
//! tensors) to compare runs by.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use train::config::TrainConfig;
use train::data::{Corpus, Pair};

/// A tiny MoE Transformer run on mesh `data x expert` (2+2 layers of width 16, 4 experts,
/// dropout on), logging every step, checkpointing every second, no evaluation.
pub fn tiny_moe(data: usize, expert: usize, batch_size: usize, steps: u64) -> TrainConfig {
    let mut c = TrainConfig {
        steps,
        log_every: 1,
        eval_every: 0,
        checkpoint_every: 2,
        ..TrainConfig::default()
    };
    c.mesh.data = data;
    c.mesh.expert = expert;
    c.data.batch_size = batch_size;
    c.data.max_len = 8;
    c.data.dev_size = 8;
    c.data.vocab_size = 300;
    c.model.model_dim = 16;
    c.model.heads = 2;
    c.model.head_dim = 8;
    c.model.ffn_dim = 32;
    c.model.enc_layers = 2;
    c.model.dec_layers = 2;
    c.model.experts = 4;
    c.model.group_size = 16;
    c.model.dropout = 0.1;
    c
}

/// A fresh (removed) scratch path for test `suite`'s case `tag`.
pub fn scratch(suite: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-{suite}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Every step's loss and gradient norm, and every tensor of the final checkpoint.
pub type Trajectory = (Vec<[f64; 2]>, Vec<(String, Vec<f64>)>);

/// The [`Trajectory`] of the run in `dir`.
pub fn trajectory(dir: &Path) -> Trajectory {
    let steps = train::metrics::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| r.get("lr").is_some())
        .map(|r| {
            [
                r["loss"].as_f64().unwrap(),
                r["grad_norm"].as_f64().unwrap(),
            ]
        })
        .collect();
    let ck = train::checkpoint::ShardedReader::open(&dir.join("checkpoint")).unwrap();
    let mut tensors: Vec<(String, Vec<f64>)> = ck
        .manifest
        .types()
        .into_iter()
        .map(|(k, _)| {
            let v = ck.read_whole(&k).unwrap().to_f64_vec();
            (k, v)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    (steps, tensors)
}

/// `phrases` test phrases, each in every language of `langs` ("de", "fr") against English.
pub fn corpus(phrases: usize, langs: &[&str]) -> Corpus {
    let mut pairs = Vec::new();
    for p in testkit::phrases::phrases(phrases) {
        for &lang in langs {
            let source = match lang {
                "de" => &p.de,
                "fr" => &p.fr,
                other => panic!("the test phrases have no {other}"),
            };
            pairs.push(Pair {
                lang: Arc::from(lang),
                origin: Arc::from("test"),
                english: p.en.clone(),
                source: source.clone(),
            });
        }
    }
    Corpus::from_pairs(pairs)
}
