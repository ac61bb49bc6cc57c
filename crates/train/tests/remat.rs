//! `model.remat` in training runs: a run that recomputes activations (per layer, or all but
//! dot products) logs the metrics and saves the tensors of the run that keeps them
//! (dropout and random routing on, two devices): the first step bit for bit, then within
//! f32 rounding (the executor's f32 dot products may take another path in a recomputed
//! context); under `dots` the first step too is within f32 rounding, since every operand
//! of the backward's dots but the kept products is a recomputed clone, and the executor
//! fuses such dots with other epilogues (a dot with its row sums fused, or a multiply, a
//! select and an add after it, in one program and not the other), which round
//! differently; a run may switch policy when it resumes; a bad policy is a one-line error.
//! `remat = "marked"` recomputes the sublayers `model.checkpoint` marks: the same run, a
//! lower measured peak memory per device, and a one-line error when nothing is marked.

mod common;

use common::{scratch, trajectory, Trajectory};

use train::config::TrainConfig;
use train::data::Corpus;
use train::trainer::{run, RunOptions};

fn corpus() -> Corpus {
    common::corpus(400, &["de"])
}

fn tiny(remat: &str) -> TrainConfig {
    let mut c = common::tiny_moe(1, 2, 8, 4);
    c.model.remat = remat.to_string();
    c
}

/// [`tiny`] with `remat` and the sublayers `checkpoint` marked.
fn tiny_marking(remat: &str, checkpoint: &[&str]) -> TrainConfig {
    let mut c = tiny(remat);
    c.model.checkpoint = checkpoint.iter().map(|s| s.to_string()).collect();
    c
}

/// `got` equals `want`: the first step bit for bit (when `first_exact`), every step within
/// f32 rounding.
fn assert_same(got: &Trajectory, want: &Trajectory, what: &str, first_exact: bool) {
    assert_eq!(got.0.len(), want.0.len(), "{what}: steps");
    if first_exact {
        assert_eq!(got.0[0], want.0[0], "{what}: step 1 differs");
    }
    for (s, (g, w)) in got.0.iter().zip(&want.0).enumerate() {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{what}: step {}: {g:?} vs {w:?}",
                s + 1
            );
        }
    }
    assert_eq!(got.1.len(), want.1.len(), "{what}: tensors");
    for ((n, g), (_, w)) in got.1.iter().zip(&want.1) {
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs() / (1e-3 + b.abs()))
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "{what}: `{n}` differs by {worst:e}");
    }
}

#[test]
fn recomputing_runs_train_like_the_run_that_keeps_activations() {
    let c = corpus();
    let base = scratch("remat", "none");
    run(
        &tiny("none"),
        &c,
        &RunOptions::new(base.clone()),
        &mut |_| {},
    )
    .unwrap();
    let want = trajectory(&base);
    assert_eq!(want.0.len(), 4);
    assert!(!want.1.is_empty());
    for policy in ["layer", "dots", "scopes:encoder,decoder/layer1"] {
        let dir = scratch("remat", &policy.replace([':', '/', ','], "-"));
        run(
            &tiny(policy),
            &c,
            &RunOptions::new(dir.clone()),
            &mut |_| {},
        )
        .unwrap();
        let first_exact = policy != "dots";
        assert_same(
            &trajectory(&dir),
            &want,
            &format!("remat {policy}"),
            first_exact,
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    // Switching the policy on resume is allowed and changes nothing.
    let cut = scratch("remat", "switch");
    let first = RunOptions {
        stop_after: Some(2),
        ..RunOptions::new(cut.clone())
    };
    run(&tiny("none"), &c, &first, &mut |_| {}).unwrap();
    let resumed = RunOptions {
        resume: true,
        ..RunOptions::new(cut.clone())
    };
    run(&tiny("layer"), &c, &resumed, &mut |_| {}).unwrap();
    let got = trajectory(&cut);
    assert_eq!(
        got.0, want.0,
        "resumed with remat layer: the metrics differ"
    );
    assert!(
        got.1 == want.1,
        "resumed with remat layer: the saved tensors differ"
    );
    std::fs::remove_dir_all(&cut).ok();
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn a_bad_remat_policy_is_a_one_line_error() {
    for (text, needle) in [
        ("[model]\nremat = \"layers\"\n", "\"layers\""),
        ("[model]\nremat = \"scopes:\"\n", "lists no scope"),
    ] {
        let e = TrainConfig::from_toml(text, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.remat") && e.contains(needle) && !e.contains('\n'),
            "{e}"
        );
    }
    // A scope that names nothing is refused when the step is built, by name.
    let cfg = tiny("scopes:encoder/layer9");
    cfg.validate().unwrap();
    let e = train::trainer::step_program(&cfg, 300)
        .err()
        .expect("an unknown scope is refused")
        .to_string();
    assert!(e.contains("`encoder/layer9`") && !e.contains('\n'), "{e}");
}

#[test]
fn marked_checkpoint_regions_train_like_keeping_everything_in_less_memory() {
    let c = corpus();
    let base = scratch("remat-marked", "none");
    let none = run(
        &tiny("none"),
        &c,
        &RunOptions::new(base.clone()),
        &mut |_| {},
    )
    .unwrap();
    let want = trajectory(&base);
    for checkpoint in [&["attention", "ffn"][..], &["ffn"]] {
        let cfg = tiny_marking("marked", checkpoint);
        let dir = scratch("remat-marked", &checkpoint.join("-"));
        let marked = run(&cfg, &c, &RunOptions::new(dir.clone()), &mut |_| {}).unwrap();
        assert_same(
            &trajectory(&dir),
            &want,
            &format!("marked {checkpoint:?}"),
            true,
        );
        eprintln!(
            "peak per device: none {} B, marked {checkpoint:?} {} B",
            none.peak_bytes_per_device, marked.peak_bytes_per_device
        );
        assert!(
            marked.peak_bytes_per_device < none.peak_bytes_per_device,
            "marked {checkpoint:?}: peak {} B, with none {} B",
            marked.peak_bytes_per_device,
            none.peak_bytes_per_device
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&base).ok();
}

#[test]
fn marked_without_a_marked_sublayer_is_a_one_line_config_error() {
    let e = TrainConfig::from_toml("[model]\nremat = \"marked\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.remat = \"marked\"")
            && e.contains("model.checkpoint")
            && !e.contains('\n'),
        "{e}"
    );
    let e = TrainConfig::from_toml(
        "[model]\nremat = \"marked\"\ncheckpoint = [\"ffns\"]\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model.checkpoint")
            && e.contains("\"ffns\"")
            && e.contains("\"attention\"")
            && !e.contains('\n'),
        "{e}"
    );
    // Marks without `marked` are valid, with a warning that they do nothing.
    let cfg = TrainConfig::from_toml("[model]\ncheckpoint = [\"ffn\"]\n", "c.toml").unwrap();
    assert!(
        cfg.warnings()
            .iter()
            .any(|w| w.contains("model.checkpoint") && w.contains("\"marked\"")),
        "{:?}",
        cfg.warnings()
    );
    let cfg = TrainConfig::from_toml(
        "[model]\nremat = \"marked\"\ncheckpoint = [\"attention\", \"ffn\"]\n",
        "c.toml",
    )
    .unwrap();
    assert!(cfg.warnings().is_empty(), "{:?}", cfg.warnings());
    let m = cfg.transformer(300).unwrap();
    assert!(m.checkpoint.attention && m.checkpoint.ffn);
}
