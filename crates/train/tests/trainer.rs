//! The training loop on a tiny model and a synthetic corpus: the loss falls, a run killed
//! mid-way resumes from its checkpoint to the same loss curve as an uninterrupted run, and
//! corrupt checkpoints and bad configs are clear errors.

use std::path::PathBuf;
use std::sync::Arc;
use train::checkpoint;
use train::config::TrainConfig;
use train::data::{Corpus, Pair};
use train::trainer::{run, Event, RunOptions};

const WORDS: [(&str, &str, &str); 10] = [
    ("one", "eins", "un"),
    ("two", "zwei", "deux"),
    ("three", "drei", "trois"),
    ("four", "vier", "quatre"),
    ("five", "fünf", "cinq"),
    ("six", "sechs", "six"),
    ("red", "rot", "rouge"),
    ("blue", "blau", "bleu"),
    ("cat", "Katze", "chat"),
    ("dog", "Hund", "chien"),
];

/// Word-by-word "translations" of random 2-4 word phrases into English.
fn corpus() -> Corpus {
    let mut pairs = Vec::new();
    let mut x: u64 = 12345;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    for _ in 0..1500 {
        let n = 2 + next() % 3;
        let idx: Vec<usize> = (0..n).map(|_| next() % WORDS.len()).collect();
        let en: Vec<&str> = idx.iter().map(|&i| WORDS[i].0).collect();
        let de: Vec<&str> = idx.iter().map(|&i| WORDS[i].1).collect();
        let fr: Vec<&str> = idx.iter().map(|&i| WORDS[i].2).collect();
        for (lang, src) in [("de", de.join(" ")), ("fr", fr.join(" "))] {
            pairs.push(Pair {
                lang: Arc::from(lang),
                origin: Arc::from("test"),
                english: en.join(" "),
                source: src,
            });
        }
    }
    Corpus::from_pairs(pairs)
}

fn tiny() -> TrainConfig {
    let mut c = TrainConfig {
        steps: 6,
        log_every: 1,
        eval_every: 0,
        checkpoint_every: 3,
        ..TrainConfig::default()
    };
    c.mesh.data = 1;
    c.mesh.expert = 2;
    c.data.batch_size = 8;
    c.data.max_len = 8;
    c.data.dev_size = 8;
    c.data.vocab_size = 300;
    c.model.model_dim = 16;
    c.model.heads = 2;
    c.model.head_dim = 8;
    c.model.ffn_dim = 32;
    c.model.enc_layers = 1;
    c.model.dec_layers = 1;
    c.model.moe_every = 1;
    c.model.experts = 4;
    c.model.group_size = 16;
    c.eval.beam = 2;
    c
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-trainer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn losses(dir: &std::path::Path) -> Vec<(u64, u64)> {
    train::metrics::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.get("tokens_per_s").is_some())
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["loss"].as_f64().unwrap().to_bits(),
            )
        })
        .collect()
}

#[test]
fn killed_run_resumes_to_the_same_loss_curve() {
    let cfg = tiny();
    let c = corpus();
    let full = tmp("full");
    let report = run(
        &cfg,
        &c,
        &RunOptions {
            out: full.clone(),
            resume: false,
            stop_after: None,
            comm: None,
            profile: None,
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.steps, 6);
    assert!(report.dev_loss.is_finite());
    for f in [
        "config.toml",
        "metrics.jsonl",
        "checkpoint.safetensors",
        "tokenizer.json",
        "loss.png",
        "expert_load.png",
    ] {
        assert!(full.join(f).exists(), "{f} missing");
    }

    let cut = tmp("cut");
    // "Kill" after step 4: the last checkpoint is at step 3, and step 4 was logged.
    run(
        &cfg,
        &c,
        &RunOptions {
            out: cut.clone(),
            resume: false,
            stop_after: Some(4),
            comm: None,
            profile: None,
        },
        &mut |_| {},
    )
    .unwrap();
    let mut resumed_from = None;
    run(
        &cfg,
        &c,
        &RunOptions {
            out: cut.clone(),
            resume: true,
            stop_after: None,
            comm: None,
            profile: None,
        },
        &mut |e| {
            if let Event::Started { first_step, .. } = e {
                resumed_from = Some(first_step);
            }
        },
    )
    .unwrap();
    assert_eq!(resumed_from, Some(3));
    let (a, b) = (losses(&full), losses(&cut));
    assert_eq!(a.len(), 6);
    assert_eq!(
        a, b,
        "the resumed run must reproduce the loss curve bit for bit"
    );
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&cut).ok();
}

#[test]
fn loss_falls_on_a_learnable_task() {
    let mut cfg = tiny();
    cfg.steps = 60;
    cfg.checkpoint_every = 0;
    cfg.model.dropout = 0.0;
    let dir = tmp("learn");
    run(
        &cfg,
        &corpus(),
        &RunOptions {
            out: dir.clone(),
            resume: false,
            stop_after: None,
            comm: None,
            profile: None,
        },
        &mut |_| {},
    )
    .unwrap();
    let recs = train::metrics::read(&dir.join("metrics.jsonl")).unwrap();
    let ce: Vec<f64> = recs.iter().filter_map(|r| r["ce"].as_f64()).collect();
    let first = ce[..5].iter().sum::<f64>() / 5.0;
    let last = ce[ce.len() - 5..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.7 * first, "loss did not fall: {first} -> {last}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupt_or_truncated_checkpoints_are_rejected() {
    let dir = tmp("corrupt");
    std::fs::create_dir_all(&dir).unwrap();
    let ck = checkpoint::Checkpoint {
        step: 7,
        config: "seed = 1".into(),
        tensors: [(
            "w".to_string(),
            runtime::HostTensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]),
        )]
        .into(),
    };
    let path = dir.join("ck.safetensors");
    checkpoint::save(&path, &ck).unwrap();
    assert_eq!(checkpoint::load(&path).unwrap(), ck);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("corrupt or truncated"), "{e}");
    let mut flipped = bytes.clone();
    let n = flipped.len();
    flipped[n - 2] ^= 0x40;
    std::fs::write(&path, &flipped).unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_configs_are_one_line_errors() {
    let e = TrainConfig::from_toml("stepz = 3", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("stepz") && e.contains("c.toml"), "{e}");
    let e = TrainConfig::from_toml("steps = \"many\"", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("steps") || e.contains("integer"), "{e}");
    let e = TrainConfig::from_toml("[model]\nexperts = 6\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("experts") && e.contains("expert=4"), "{e}");
    let e = TrainConfig::from_toml("[data]\nbatch_size = 12\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size") && e.contains("8 devices"), "{e}");
    assert!(!e.contains('\n'));
    // Every field has a default: an empty file is the main job's config.
    assert_eq!(
        TrainConfig::from_toml("", "c.toml").unwrap(),
        TrainConfig::default()
    );
}
