//! Sharded checkpoints through the training loop: a checkpoint saved on 8 devices (data x
//! expert) loads bitwise on 4, 2 and 1 devices and the run continues to the uninterrupted
//! run's loss; a save stopped at any point of its commit leaves a complete checkpoint that
//! resumes bit for bit; bad checkpoints (a missing, corrupt or truncated shard, an unknown
//! format, a mesh that cannot hold the state, another model's checkpoint) are one-line
//! errors naming the file and the fix, and nothing is overwritten on the way.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use train::checkpoint::{self, CheckpointError, CrashPoint, Source};
use train::config::TrainConfig;
use train::data::Corpus;
use train::tokenizer::Tokenizer;
use train::trainer::{build_programs, run, Event, RunOptions, Trainer};

fn corpus() -> Corpus {
    common::corpus(1500, &["de", "fr"])
}

fn tiny(data: usize, expert: usize) -> TrainConfig {
    let mut c = TrainConfig {
        steps: 4,
        log_every: 1,
        eval_every: 0,
        checkpoint_every: 1,
        ..TrainConfig::default()
    };
    c.mesh.data = data;
    c.mesh.expert = expert;
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
    c.model.group_size = 8;
    c.eval.beam = 1;
    c
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// (step, loss) of every step record.
fn losses(dir: &Path) -> Vec<(u64, f64)> {
    train::metrics::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.get("tokens_per_s").is_some())
        .map(|r| (r["step"].as_u64().unwrap(), r["loss"].as_f64().unwrap()))
        .collect()
}

/// Run `cfg` in `dir`; returns the step it started from.
fn train(cfg: &TrainConfig, c: &Corpus, dir: &Path, opts: RunOptions) -> Result<u64, String> {
    let mut first = None;
    run(cfg, c, &opts, &mut |e| {
        if let Event::Started { first_step, .. } = e {
            first = Some(first_step);
        }
    })
    .map_err(|e| e.to_string())?;
    let _ = dir;
    Ok(first.unwrap_or(0))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(snapshot(&p));
        } else if e.file_name() != ".lock" {
            out.insert(p.clone(), std::fs::read(&p).unwrap());
        }
    }
    out
}

/// The global state a trainer on mesh `data x expert` loads from the run in `dir`.
fn loaded_state(
    cfg: &TrainConfig,
    dir: &Path,
) -> std::collections::HashMap<String, runtime::HostTensor> {
    let tok = Tokenizer::load(dir.join("tokenizer.json")).unwrap();
    let programs = build_programs(cfg, tok.vocab_size()).unwrap();
    let src = Source::open(&dir.join("checkpoint")).unwrap();
    let comm = Arc::new(runtime::InProcess::new(cfg.devices()));
    let tr = Trainer::from_source(cfg, programs, &src, comm).unwrap();
    assert_eq!(tr.step, src.step());
    tr.global_state().unwrap()
}

fn same_bits(a: &runtime::HostTensor, b: &runtime::HostTensor) -> bool {
    a.ty == b.ty && a.data.as_bytes() == b.data.as_bytes()
}

#[test]
fn a_checkpoint_saved_on_8_devices_resumes_on_4_2_and_1_and_with_a_model_axis() {
    let c = corpus();
    let cfg8 = tiny(2, 4);
    let full = tmp("mesh-full");
    train(&cfg8, &c, &full, RunOptions::new(full.clone())).unwrap();
    let want = losses(&full);
    assert_eq!(want.len(), 4);
    let cut = tmp("mesh-cut");
    let opts = RunOptions {
        stop_after: Some(3),
        ..RunOptions::new(cut.clone())
    };
    train(&cfg8, &c, &cut, opts).unwrap();
    // One file per device, and the manifest.
    let m = checkpoint::Manifest::read(&cut.join("checkpoint")).unwrap();
    assert_eq!((m.step, m.files.len()), (3, 8));
    assert_eq!(
        std::fs::read_dir(cut.join("checkpoint")).unwrap().count(),
        9
    );
    let saved = loaded_state(&cfg8, &cut);
    // (data, expert, model, weights sharded over): fewer devices, and a model axis with
    // the weights stored split.
    let meshes = [
        (1, 4, 1, ""),
        (2, 2, 1, ""),
        (1, 2, 1, ""),
        (1, 1, 1, ""),
        (2, 2, 2, ""),
        (2, 1, 2, "data"),
    ];
    for (d, e, model, shard) in meshes {
        let mut cfg = tiny(d, e);
        cfg.mesh.model = model;
        cfg.mesh.shard_weights = shard.to_string();
        let mesh = cfg.mesh.describe();
        let got = loaded_state(&cfg, &cut);
        assert_eq!(got.len(), saved.len());
        for (name, t) in &saved {
            assert!(
                same_bits(t, &got[name]),
                "{name} differs after loading on {mesh}"
            );
        }
        let dir = tmp(&format!("mesh-{d}x{e}x{model}"));
        copy_dir(&cut, &dir);
        let opts = RunOptions {
            resume: true,
            ..RunOptions::new(dir.clone())
        };
        assert_eq!(train(&cfg, &c, &dir, opts).unwrap(), 3);
        let l = losses(&dir);
        assert_eq!(l.len(), 4);
        assert_eq!(&l[..3], &want[..3]);
        let (a, b) = (l[3].1, want[3].1);
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{mesh}: step 4's loss {a} vs the uninterrupted run's {b}"
        );
        // The resumed run's checkpoint is on its own mesh.
        let m = checkpoint::Manifest::read(&dir.join("checkpoint")).unwrap();
        assert_eq!((m.step, m.files.len()), (4, d * e * model));
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&cut).ok();
}

#[test]
fn a_save_stopped_anywhere_leaves_a_complete_checkpoint() {
    let c = corpus();
    let cfg = tiny(1, 2);
    let full = tmp("crash-full");
    train(&cfg, &c, &full, RunOptions::new(full.clone())).unwrap();
    let want = losses(&full);
    for point in CrashPoint::ALL {
        let dir = tmp(&format!("crash-{point:?}"));
        let opts = RunOptions {
            crash_save: Some((3, point)),
            ..RunOptions::new(dir.clone())
        };
        let e = train(&cfg, &c, &dir, opts).unwrap_err();
        assert!(e.contains("simulated crash"), "{e}");
        // Whatever the point, the checkpoint opens and every byte checks out.
        let src = Source::open(&dir.join("checkpoint")).unwrap();
        checkpoint::tools::verify(&src).unwrap();
        let expect = if point == CrashPoint::Committed { 3 } else { 2 };
        assert_eq!(src.step(), expect, "{point:?}");
        let opts = RunOptions {
            resume: true,
            ..RunOptions::new(dir.clone())
        };
        assert_eq!(train(&cfg, &c, &dir, opts).unwrap(), expect);
        let got = losses(&dir);
        let bits = |v: &[(u64, f64)]| v.iter().map(|(s, l)| (*s, l.to_bits())).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{point:?}: the resumed run differs"
        );
        // Nothing is left but the manifest and the files it names.
        let m = checkpoint::Manifest::read(&dir.join("checkpoint")).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.join("checkpoint"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut named: Vec<String> = m.files.iter().map(|f| f.name.clone()).collect();
        named.push(checkpoint::MANIFEST.to_string());
        named.sort();
        assert_eq!(names, named, "{point:?}");
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&full).ok();
}

/// A resumption of `dir` that must fail: its one-line message, and nothing changed.
fn resume_fails(cfg: &TrainConfig, c: &Corpus, dir: &Path) -> String {
    let before = snapshot(dir);
    let opts = RunOptions {
        resume: true,
        ..RunOptions::new(dir.to_path_buf())
    };
    let e = train(cfg, c, dir, opts).unwrap_err();
    assert!(!e.contains('\n'), "{e}");
    assert!(
        snapshot(dir) == before,
        "a failed resumption changed {}",
        dir.display()
    );
    e
}

#[test]
fn bad_checkpoints_are_one_line_errors_and_nothing_is_overwritten() {
    let c = corpus();
    let mut cfg = tiny(1, 2);
    cfg.steps = 2;
    let base = tmp("bad-base");
    train(&cfg, &c, &base, RunOptions::new(base.clone())).unwrap();
    let m = checkpoint::Manifest::read(&base.join("checkpoint")).unwrap();
    let shard = m.files[1].name.clone();
    let case = |tag: &str| {
        let d = tmp(&format!("bad-{tag}"));
        copy_dir(&base, &d);
        d
    };
    // A missing shard.
    let d = case("missing");
    std::fs::remove_file(d.join("checkpoint").join(&shard)).unwrap();
    let e = resume_fails(&cfg, &c, &d);
    assert!(
        e.contains(&shard) && e.contains("is missing") && e.contains("restore"),
        "{e}"
    );
    // A flipped bit in a shard's data.
    let d = case("flipped");
    let p = d.join("checkpoint").join(&shard);
    let mut bytes = std::fs::read(&p).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x10;
    std::fs::write(&p, &bytes).unwrap();
    let e = resume_fails(&cfg, &c, &d);
    assert!(
        e.contains(&shard) && e.contains("SHA-256") && e.contains("restore"),
        "{e}"
    );
    // A truncated shard.
    let d = case("truncated");
    let original = std::fs::read(base.join("checkpoint").join(&shard)).unwrap();
    std::fs::write(d.join("checkpoint").join(&shard), &original[..n - 5]).unwrap();
    let e = resume_fails(&cfg, &c, &d);
    assert!(
        e.contains(&shard) && e.contains("truncated") && e.contains("restore"),
        "{e}"
    );
    // A manifest of an unknown format.
    let d = case("version");
    let mp = d.join("checkpoint").join(checkpoint::MANIFEST);
    let text = std::fs::read_to_string(&mp).unwrap();
    std::fs::write(
        &mp,
        text.replace(checkpoint::MANIFEST_FORMAT, "gshard-sharded-9"),
    )
    .unwrap();
    let e = resume_fails(&cfg, &c, &d);
    assert!(
        e.contains("manifest.json")
            && e.contains("gshard-sharded-9")
            && e.contains("does not read"),
        "{e}"
    );
    // A mesh that cannot hold the state: 4 experts over 3 devices.
    let src = Source::open(&base.join("checkpoint")).unwrap();
    let out = tmp("bad-mesh");
    let mesh = ir::Mesh::new(&[("expert", 3)]).unwrap();
    let e = checkpoint::tools::reshard(&src, &mesh, &out).unwrap_err();
    assert!(matches!(e, CheckpointError::Mesh { .. }), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("manifest.json") && e.contains("expert") && e.contains("choose mesh axis sizes"),
        "{e}"
    );
    assert!(!out.exists());
    // Another model's checkpoint.
    let mut other = cfg.clone();
    other.model.ffn_dim = 64;
    let tok = Tokenizer::load(base.join("tokenizer.json")).unwrap();
    let programs = build_programs(&other, tok.vocab_size()).unwrap();
    let comm = Arc::new(runtime::InProcess::new(other.devices()));
    let e = Trainer::from_source(&other, programs, &src, comm)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("manifest.json")
            && e.contains("does not fit this model")
            && e.contains("use the config"),
        "{e}"
    );
    // Tools never write over what exists.
    let e = checkpoint::tools::consolidate(&src, &mp)
        .unwrap_err()
        .to_string();
    assert!(e.contains("already exists"), "{e}");
    for tag in ["base", "missing", "flipped", "truncated", "version"] {
        std::fs::remove_dir_all(tmp(&format!("bad-{tag}"))).ok();
    }
}

#[test]
fn consolidated_and_single_file_checkpoints_resume_into_sharded_ones() {
    let c = corpus();
    let cfg = tiny(1, 2);
    let full = tmp("single-full");
    train(&cfg, &c, &full, RunOptions::new(full.clone())).unwrap();
    let want = losses(&full);
    let cut = tmp("single-cut");
    let opts = RunOptions {
        stop_after: Some(2),
        ..RunOptions::new(cut.clone())
    };
    train(&cfg, &c, &cut, opts).unwrap();
    // Consolidate into the run's single file, as a run written before the sharded format
    // holds it, and drop the directory.
    let src = Source::open(&cut.join("checkpoint")).unwrap();
    checkpoint::tools::consolidate(&src, &cut.join("checkpoint.safetensors")).unwrap();
    let ck = checkpoint::load(&cut.join("checkpoint.safetensors")).unwrap();
    assert_eq!(ck.step, 2);
    for (name, _) in src.types() {
        let t = match &src {
            Source::Sharded(r) => r.read_whole(&name).unwrap(),
            Source::Single { .. } => unreachable!(),
        };
        assert!(same_bits(&t, &ck.tensors[&name]), "{name}");
    }
    std::fs::remove_dir_all(cut.join("checkpoint")).unwrap();
    let opts = RunOptions {
        resume: true,
        ..RunOptions::new(cut.clone())
    };
    assert_eq!(train(&cfg, &c, &cut, opts).unwrap(), 2);
    let bits = |v: &[(u64, f64)]| v.iter().map(|(s, l)| (*s, l.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&losses(&cut)), bits(&want));
    // The first commit replaced the single file.
    assert!(!cut.join("checkpoint.safetensors").exists());
    assert!(cut.join("checkpoint").join(checkpoint::MANIFEST).exists());
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&cut).ok();
}
