//! The training loop on a tiny model and a synthetic corpus: the loss falls, a run killed
//! mid-way resumes from its checkpoint to the same loss curve as an uninterrupted run, and
//! corrupt checkpoints and bad configs are clear errors.

use std::path::PathBuf;
use std::sync::Arc;
use train::checkpoint;
use train::config::TrainConfig;
use train::data::{Corpus, Pair};
use train::trainer::{run, Event, RunOptions};

/// Word-by-word "translations" of random 2-4 word phrases into English.
fn corpus() -> Corpus {
    corpus_skipping(0)
}

/// [`corpus`] without every `k`-th German pair (`k` = 0: none), so that French is the larger
/// language and the corpus's order (by size) differs from the alphabetical one.
fn corpus_skipping(k: usize) -> Corpus {
    let mut pairs = Vec::new();
    for p in testkit::phrases::phrases(1500) {
        let skip_de = k > 0 && pairs.len() % k == 0;
        for (lang, src) in [("de", &p.de), ("fr", &p.fr)] {
            if lang == "de" && skip_de {
                continue;
            }
            pairs.push(Pair {
                lang: Arc::from(lang),
                origin: Arc::from("test"),
                english: p.en.clone(),
                source: src.clone(),
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
            resume: false,
            stop_after: None,
            ..RunOptions::new(full.clone())
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.steps, 6);
    assert!(report.dev_loss.is_finite());
    for f in [
        "config.toml",
        "metrics.jsonl",
        "checkpoint/manifest.json",
        "tokenizer.json",
        "loss.png",
        "expert_load.png",
        "expert_placement.png",
    ] {
        assert!(full.join(f).exists(), "{f} missing");
    }

    let cut = tmp("cut");
    // "Kill" after step 4: the last checkpoint is at step 3, and step 4 was logged.
    run(
        &cfg,
        &c,
        &RunOptions {
            resume: false,
            stop_after: Some(4),
            ..RunOptions::new(cut.clone())
        },
        &mut |_| {},
    )
    .unwrap();
    let mut resumed_from = None;
    run(
        &cfg,
        &c,
        &RunOptions {
            resume: true,
            stop_after: None,
            ..RunOptions::new(cut.clone())
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

/// Every step's record in the metrics log (every field but the timings; not the records of
/// the evaluation a run ends with) and the checkpoint's bytes (every file of it, by name).
fn trajectory(dir: &std::path::Path) -> (Vec<String>, Vec<(String, Vec<u8>)>) {
    let recs = train::metrics::read(&dir.join("metrics.jsonl")).unwrap();
    let lines = recs
        .into_iter()
        .filter(|r| r.get("lr").is_some())
        .map(|mut r| {
            if let Some(o) = r.as_object_mut() {
                o.remove("tokens_per_s");
                o.remove("step_seconds");
            }
            r.to_string()
        })
        .collect();
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    (lines, files)
}

#[test]
fn resuming_anywhere_reproduces_the_run_bit_for_bit() {
    let c = corpus_skipping(3);
    let mut configs = Vec::new();
    // Dropout, random routing, a dev loss in between.
    let mut a = tiny();
    a.eval_every = 2;
    a.checkpoint_every = 1;
    configs.push(("dropout-random-eval", a));
    // Sampled second expert, Adam.
    let mut b = tiny();
    b.model.second_expert = "sampling".into();
    b.checkpoint_every = 1;
    b.optimizer = TrainConfig::from_toml("[optimizer]\nkind = \"adam\"\n", "adam")
        .unwrap()
        .optimizer;
    configs.push(("sampling-adam", b));
    // Dense, SGD with momentum.
    let mut d = tiny();
    d.model.experts = 0;
    d.checkpoint_every = 1;
    d.optimizer = TrainConfig::from_toml("[optimizer]\nkind = \"sgd\"\nmomentum = 0.9\n", "sgd")
        .unwrap()
        .optimizer;
    configs.push(("dense-sgd", d));
    // Bias balancing (the choice biases are state the checkpoint must carry).
    let mut e = tiny();
    e.model.balance = "bias".into();
    e.model.bias_rate = 0.05;
    e.checkpoint_every = 1;
    configs.push(("bias-balance", e));
    // Shazeer's hierarchical MoE (noisy gates from the step's seed).
    let mut h = tiny();
    h.model.gating = "hierarchical".into();
    h.model.expert_groups = 2;
    h.model.secondary_k = 1;
    h.checkpoint_every = 1;
    configs.push(("hierarchical", h));
    for (tag, cfg) in configs {
        let full = tmp(&format!("bits-full-{tag}"));
        run(&cfg, &c, &RunOptions::new(full.clone()), &mut |_| {}).unwrap();
        let want = trajectory(&full);
        // Cut after step 2, resume and cut after 4, resume to the end.
        let cut = tmp(&format!("bits-cut-{tag}"));
        for (resume, stop) in [(false, Some(2)), (true, Some(4)), (true, None)] {
            let opts = RunOptions {
                resume,
                stop_after: stop,
                ..RunOptions::new(cut.clone())
            };
            run(&cfg, &c, &opts, &mut |_| {}).unwrap();
        }
        let got = trajectory(&cut);
        assert_eq!(got.0, want.0, "{tag}: the metrics differ after resuming");
        assert!(got.1 == want.1, "{tag}: the final checkpoints differ");
        std::fs::remove_dir_all(&full).ok();
        std::fs::remove_dir_all(&cut).ok();
    }
}

#[test]
fn resuming_with_other_steps_keeps_the_cool_down_or_says_it_moved() {
    let c = corpus();
    let mut cfg = tiny();
    cfg.steps = 10;
    cfg.checkpoint_every = 1;
    // The last half cools down: 10 steps run below the full rate from step 7 on, 6 steps
    // from step 5 on.
    cfg.optimizer = TrainConfig::from_toml("[optimizer.lr]\ncooldown = 0.5\n", "cool")
        .unwrap()
        .optimizer;
    let full = tmp("cool-full");
    run(&cfg, &c, &RunOptions::new(full.clone()), &mut |_| {}).unwrap();
    // A 6-step run cut after step 2, resumed as a 10-step run: the uninterrupted one.
    let cut = tmp("cool-cut");
    let short = TrainConfig {
        steps: 6,
        ..cfg.clone()
    };
    let first = RunOptions {
        stop_after: Some(2),
        ..RunOptions::new(cut.clone())
    };
    run(&short, &c, &first, &mut |_| {}).unwrap();
    let resume = RunOptions {
        resume: true,
        ..RunOptions::new(cut.clone())
    };
    let mut said = Vec::new();
    run(&cfg, &c, &resume, &mut |e| {
        if let Event::Status(s) = e {
            said.push(s.to_string());
        }
    })
    .unwrap();
    assert!(!said.iter().any(|s| s.contains("cooldown")), "{said:?}");
    let (got, want) = (trajectory(&cut), trajectory(&full));
    assert_eq!(got.0, want.0, "the metrics differ after resuming");
    assert!(got.1 == want.1, "the final checkpoints differ");
    // The finished 10-step run took its cooled steps: resumed as a 12-step run, its rate
    // rises again, and the notice says so (the first resumption had nothing to say).
    let longer = TrainConfig {
        steps: 12,
        ..cfg.clone()
    };
    let mut notices = Vec::new();
    let opts = RunOptions {
        resume: true,
        ..RunOptions::new(full.clone())
    };
    run(&longer, &c, &opts, &mut |e| {
        if let Event::Status(s) = e {
            notices.push(s.to_string());
        }
    })
    .unwrap();
    let notice = notices
        .iter()
        .find(|n| n.contains("optimizer.lr.cooldown"))
        .unwrap_or_else(|| panic!("no cool-down notice in {notices:?}"));
    assert!(
        notice.contains("from step 7")
            && notice.contains("instead of 10")
            && !notice.contains('\n'),
        "{notice}"
    );
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&cut).ok();
}

#[test]
fn nonfinite_steps_are_not_applied_and_stop_the_run() {
    // SGD at a learning rate of 1e30: step 1 leaves huge but finite weights, from step 2 on
    // the loss overflows.
    let mut cfg = tiny();
    cfg.steps = 20;
    cfg.checkpoint_every = 1;
    cfg.nonfinite_limit = 3;
    cfg.optimizer = TrainConfig::from_toml(
        "[optimizer]\nkind = \"sgd\"\n[optimizer.lr]\nkind = \"constant\"\nvalue = 1e30\n",
        "sgd",
    )
    .unwrap()
    .optimizer;
    let dir = tmp("nonfinite");
    let mut skipped = Vec::new();
    let e = run(&cfg, &corpus(), &RunOptions::new(dir.clone()), &mut |e| {
        if let Event::Skipped { step, .. } = e {
            skipped.push(step);
        }
    })
    .err()
    .expect("the run must stop");
    let msg = e.to_string();
    assert!(
        msg.starts_with("step 4: the ") && msg.contains("is not finite"),
        "{msg}"
    );
    assert!(
        msg.contains("last finite loss") && msg.contains("learning rate"),
        "{msg}"
    );
    assert!(msg.contains("3 step(s) in a row"), "{msg}");
    assert_eq!(skipped, [2, 3, 4]);
    // The checkpoint is step 1's, and finite: the skipped steps changed nothing.
    let ck = checkpoint::Source::open(&dir.join("checkpoint")).unwrap();
    assert_eq!(ck.step(), 1);
    for (name, t) in &ck.tensors().unwrap() {
        assert!(t.to_f64_vec().iter().all(|v| v.is_finite()), "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_edited_checkpoint_header_is_caught() {
    let dir = tmp("header");
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
    let bytes = std::fs::read(&path).unwrap();
    // Same length, another step: `"step":"7"` -> `"step":"8"`.
    let key = bytes
        .windows(6)
        .position(|w| w == b"\"step\"")
        .expect("the step is in the header");
    let at = key + bytes[key..].iter().position(|&b| b == b'7').unwrap();
    let mut edited = bytes.clone();
    edited[at] = b'8';
    std::fs::write(&path, &edited).unwrap();
    let e = checkpoint::load(&path).unwrap_err().to_string();
    assert!(e.contains("checksum"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
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
            resume: false,
            stop_after: None,
            ..RunOptions::new(dir.clone())
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
    let e = TrainConfig::from_toml("[mesh]\nexpert = 4\n[model]\nexperts = 6\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("experts") && e.contains("expert=4"), "{e}");
    let e = TrainConfig::from_toml(
        "[mesh]\ndata = 2\nexpert = 4\n[data]\nbatch_size = 12\n",
        "c.toml",
    )
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

#[test]
fn bias_balancing_trains_without_the_aux_loss_and_keeps_its_biases() {
    let mut cfg = tiny();
    cfg.model.balance = "bias".into();
    cfg.model.bias_rate = 0.05;
    let dir = tmp("bias");
    run(&cfg, &corpus(), &RunOptions::new(dir.clone()), &mut |_| {}).unwrap();
    let recs = train::metrics::read(&dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<_> = recs.iter().filter(|r| r.get("lr").is_some()).collect();
    assert_eq!(steps.len(), 6);
    for r in &steps {
        // The aux loss is computed (and logged) but weighs nothing in the loss.
        assert!(r["aux"].as_f64().unwrap() > 0.0);
        assert_eq!(r["loss"].as_f64(), r["ce"].as_f64(), "{r}");
    }
    let ck = checkpoint::Source::open(&dir.join("checkpoint"))
        .unwrap()
        .tensors()
        .unwrap();
    let biases: Vec<&String> = ck
        .keys()
        .filter(|k| k.ends_with("/moe/choice_bias"))
        .collect();
    assert_eq!(biases.len(), 2, "{:?}", ck.keys().collect::<Vec<_>>());
    for name in biases {
        let b = ck[name].to_f64_vec();
        assert_eq!(b.len(), 4);
        // Six steps of +-0.05 (or 0 where an expert sat exactly at the mean): multiples of
        // the rate, at most six of them, and not all zero.
        for v in &b {
            let k = v / 0.05;
            assert!(
                (k - k.round()).abs() < 1e-4 && k.abs() <= 6.0 + 1e-4,
                "{name}: {b:?}"
            );
        }
        assert!(
            b.iter().any(|v| v.abs() > 0.01),
            "{name} never moved: {b:?}"
        );
    }
    // With the aux loss (the default) the loss is the cross-entropy plus the weighted aux.
    let plain = tmp("bias-off");
    run(
        &tiny(),
        &corpus(),
        &RunOptions::new(plain.clone()),
        &mut |_| {},
    )
    .unwrap();
    let recs = train::metrics::read(&plain.join("metrics.jsonl")).unwrap();
    let r = recs.iter().find(|r| r.get("lr").is_some()).unwrap();
    assert!(r["loss"].as_f64().unwrap() > r["ce"].as_f64().unwrap());
    for f in ["expert_load.png", "dropped.png"] {
        assert!(dir.join(f).exists(), "{f} missing");
    }
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&plain).ok();
}

/// `langs = []` takes the languages users try first (`FIRST_LANGS`, in its order) before
/// larger ones, fills `max_langs` with the largest others, and orders the run's languages
/// largest first.
#[test]
fn an_empty_language_list_takes_the_first_languages_then_the_largest() {
    // Training pairs per language, well apart so that the held-out cut keeps the order.
    let sizes = [
        ("xx", 900),
        ("yy", 700),
        ("fr", 500),
        ("ja", 300),
        ("de", 100),
    ];
    let mut pairs = Vec::new();
    for (lang, n) in sizes {
        for i in 0..n {
            pairs.push(Pair {
                lang: Arc::from(lang),
                origin: Arc::from("test"),
                english: format!("english sentence {lang} {i}"),
                source: format!("source {lang} {i}"),
            });
        }
    }
    let corpus = Corpus::from_pairs(pairs);
    let pick = |max_langs: usize| {
        let mut c = TrainConfig::default();
        c.data.max_langs = max_langs;
        train::trainer::select_langs(&c, &corpus).unwrap()
    };
    assert_eq!(pick(2), ["fr", "de"]);
    assert_eq!(pick(3), ["fr", "ja", "de"]);
    assert_eq!(pick(4), ["xx", "fr", "ja", "de"]);
    assert_eq!(pick(9), ["xx", "yy", "fr", "ja", "de"]);
    assert_eq!(
        TrainConfig::default().data.max_langs,
        8,
        "the main job trains on the first eight of FIRST_LANGS"
    );
    assert_eq!(
        &train::trainer::FIRST_LANGS[..8],
        ["fr", "de", "es", "it", "pt-BR", "ru", "zh-Hans", "ja"]
    );
}

/// A resumed `langs = []` run trains on the languages its tokenizer holds, in the corpus's
/// order, whatever the rule would choose today. A run started before `FIRST_LANGS` with
/// `max_langs = 1` on this corpus (German and French, the same size) took German, the first
/// tag; its config says `langs = []`, under which the rule now picks French. Resumed, its
/// loss curve is the uninterrupted German run's.
#[test]
fn a_resumed_run_keeps_the_languages_it_started_with() {
    let c = corpus();
    let mut german = tiny();
    german.data.langs = vec!["de".into()];
    let full = tmp("langs-full");
    run(&german, &c, &RunOptions::new(full.clone()), &mut |_| {}).unwrap();
    let cut = tmp("langs-cut");
    let first = RunOptions {
        stop_after: Some(4),
        ..RunOptions::new(cut.clone())
    };
    run(&german, &c, &first, &mut |_| {}).unwrap();
    // The run's config as the older version wrote it.
    let mut rule = german.clone();
    rule.data.langs = vec![];
    rule.data.max_langs = 1;
    std::fs::write(cut.join("config.toml"), rule.to_toml()).unwrap();
    assert_eq!(train::trainer::select_langs(&rule, &c).unwrap(), ["fr"]);
    let resume = RunOptions {
        resume: true,
        ..RunOptions::new(cut.clone())
    };
    run(&rule, &c, &resume, &mut |_| {}).unwrap();
    assert_eq!(losses(&full), losses(&cut));
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&cut).ok();
}
