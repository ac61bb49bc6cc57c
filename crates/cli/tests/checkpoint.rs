//! `gshard checkpoint` and the sharded checkpoint through the binary: `info`, `verify`,
//! `consolidate` (a file any safetensors reader loads: checked with Python's `safetensors`
//! and numpy when `GSHARD_TEST_PYTHON`, default `python3`, has them) and `reshard`; bad input
//! is a one-line error naming the file; and a run killed (SIGKILL) at random moments of its
//! saves always resumes from a complete checkpoint.

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Python that checks a consolidated file, if it has `safetensors` and numpy.
fn python() -> Option<String> {
    let py = std::env::var("GSHARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import safetensors.numpy, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping the Python check: `{py}` lacks safetensors or numpy (set GSHARD_TEST_PYTHON to a python that has them)");
    }
    ok.then_some(py)
}

#[test]
fn checkpoint_commands_describe_verify_consolidate_and_reshard() {
    let d = tiny_setup("ckpt-tools", "");
    ok(&gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run", "--steps", "3",
        ],
        &d.0,
    ));
    let info = ok(&gshard(&["checkpoint", "info", "run"], &d.0));
    assert!(
        info.contains("gshard-sharded-1")
            && info.contains("step 3")
            && info.contains("mesh data=1 x expert=2")
            && info.contains("2 files"),
        "{info}"
    );
    assert!(
        info.contains("/moe/") && info.contains("[expert, _, _]"),
        "{info}"
    );
    let v = ok(&gshard(&["checkpoint", "verify", "run"], &d.0));
    assert!(v.contains(": ok (2 files"), "{v}");

    // Consolidated: plain names, the single-file format, readable by any reader.
    ok(&gshard(
        &[
            "checkpoint",
            "consolidate",
            "run",
            "--out",
            "all.safetensors",
        ],
        &d.0,
    ));
    let ck = train::checkpoint::load(&d.path("all.safetensors")).unwrap();
    assert_eq!(ck.step, 3);
    let src = train::checkpoint::Source::open(&d.path("run/checkpoint")).unwrap();
    let want = src.tensors().unwrap();
    assert_eq!(ck.tensors, want);
    if let Some(py) = python() {
        let script = r#"
import sys, numpy
from safetensors.numpy import load_file
from safetensors import safe_open
t = load_file(sys.argv[1])
with safe_open(sys.argv[1], "numpy") as f:
    meta = f.metadata()
print(meta["format"], meta["step"], len(t))
for k in sorted(t):
    a = t[k]
    print(k, a.dtype, list(a.shape), float(numpy.asarray(a, dtype=numpy.float64).sum()))
"#;
        let out = Command::new(&py)
            .args(["-c", script])
            .arg(d.path("all.safetensors"))
            .output()
            .unwrap();
        let text = ok(&out);
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            format!("gshard-checkpoint-2 3 {}", want.len())
        );
        let mut names: Vec<&String> = want.keys().collect();
        names.sort();
        for (line, name) in lines.zip(names) {
            let t = &want[name];
            let parts: Vec<&str> = line.rsplitn(2, ' ').collect();
            let sum: f64 = t.to_f64_vec().iter().sum();
            assert!(parts[1].starts_with(&format!("{name} ")), "{line}");
            let got: f64 = parts[0].parse().unwrap();
            assert!(
                (got - sum).abs() <= 1e-9 * sum.abs().max(1.0),
                "{line}: {sum}"
            );
        }
    }

    // Resharded onto 4 devices (data=2 x expert=2): one file per device, the same tensors.
    let out = ok(&gshard(
        &[
            "checkpoint",
            "reshard",
            "run",
            "--mesh",
            "data=2,expert=2",
            "--out",
            "wide",
        ],
        &d.0,
    ));
    assert!(out.contains("4 files"), "{out}");
    ok(&gshard(&["checkpoint", "verify", "wide"], &d.0));
    let wide = train::checkpoint::Source::open(&d.path("wide")).unwrap();
    assert_eq!(wide.tensors().unwrap(), want);
    // A consolidated file reshards too, and a single file is described.
    ok(&gshard(
        &[
            "checkpoint",
            "reshard",
            "all.safetensors",
            "--mesh",
            "expert=2",
            "--out",
            "again",
        ],
        &d.0,
    ));
    let again = train::checkpoint::Source::open(&d.path("again")).unwrap();
    assert_eq!(again.tensors().unwrap(), want);
    let info = ok(&gshard(&["checkpoint", "info", "all.safetensors"], &d.0));
    assert!(
        info.contains("single file") && info.contains("step 3"),
        "{info}"
    );

    // Bad input: one line naming the file and the fix; nothing written over.
    let out = gshard(
        &[
            "checkpoint",
            "reshard",
            "run",
            "--mesh",
            "expert=2",
            "--out",
            "wide",
        ],
        &d.0,
    );
    assert_fails(&out, &["wide", "already exists", "choose another"]);
    let out = gshard(
        &[
            "checkpoint",
            "consolidate",
            "run",
            "--out",
            "all.safetensors",
        ],
        &d.0,
    );
    assert_fails(&out, &["all.safetensors", "already exists"]);
    let m = train::checkpoint::Manifest::read(&d.path("wide")).unwrap();
    let f = d.path("wide").join(&m.files[3].name);
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&f, &bytes).unwrap();
    let out = gshard(&["checkpoint", "verify", "wide"], &d.0);
    assert_fails(&out, &[&m.files[3].name, "SHA-256", "restore"]);
    std::fs::remove_file(&f).unwrap();
    let out = gshard(&["checkpoint", "verify", "wide"], &d.0);
    assert_fails(&out, &[&m.files[3].name, "is missing", "restore"]);
    let out = gshard(&["checkpoint", "info", "data"], &d.0);
    assert_fails(&out, &["holds no checkpoint"]);
}

/// A small pseudo-random number from the clock (the kill times need not repeat).
fn jitter(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn a_run_killed_at_random_moments_resumes_from_a_complete_checkpoint() {
    // Bigger than TINY so that a save takes a while (about as long as a step).
    let d = tiny_setup("ckpt-kill", "");
    let cfg = TINY
        .replace("checkpoint_every = 3", "checkpoint_every = 1")
        .replace("model_dim = 16", "model_dim = 128")
        .replace("ffn_dim = 32", "ffn_dim = 512");
    std::fs::write(d.path("kill.toml"), cfg).unwrap();
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |t| t.as_nanos() as u64)
        | 1;
    let mut last = 0;
    let mut kills = 0;
    for round in 0..12 {
        let mut args = vec![
            "train",
            "--config",
            "kill.toml",
            "--data",
            "data",
            "--out",
            "run",
            "--steps",
            "1000",
        ];
        args.push(if last > 0 { "--resume" } else { "--overwrite" });
        let mut child = spawn(&args, &d.0);
        let rx = stderr_lines(&mut child);
        wait_for(&rx, "step ");
        std::thread::sleep(Duration::from_millis(jitter(&mut seed) % 400));
        kill(child.id(), "KILL");
        child.wait().unwrap();
        kills += 1;
        let ck = d.path("run/checkpoint");
        if !ck.join("manifest.json").exists() {
            // Killed before the first commit: nothing to resume yet.
            assert_eq!(last, 0, "round {round}: the checkpoint disappeared");
            continue;
        }
        let out = gshard(&["checkpoint", "verify", "run"], &d.0);
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let step = checkpoint_step(&ck);
        assert!(step >= last, "round {round}: step {step} after {last}");
        last = step;
    }
    assert!(kills == 12 && last > 0);
    // The run resumes from the last checkpoint and finishes.
    let next = (checkpoint_step(&d.path("run/checkpoint")) + 1).to_string();
    let out = gshard(
        &[
            "train", "--data", "data", "--out", "run", "--resume", "--steps", &next,
        ],
        &d.0,
    );
    ok(&out);
    assert_eq!(checkpoint_step(&d.path("run/checkpoint")).to_string(), next);
}
