//! The MPI backend through the binary and `mpirun` (built with `--features mpi`): `mpirun -np
//! 4 gshard run --backend mpi` gives bitwise the same outputs as `--devices 4` in one process
//! for a MoE layer with its gradients, and `mpirun -np 4 gshard train --backend mpi` gives
//! bitwise the same losses and checkpoint as the in-process run after 5 steps, and a
//! spatially split convolution (halo exchange by collective-permute) matches too (reductions
//! run in the same rank order on both backends, so no tolerance is needed). Faults: a rank
//! killed mid-run, and a rank that hangs, end the whole job with an error in under 30 s;
//! ranks launched with different programs, or a mesh that does not match the rank count,
//! are refused at start with a message that names the problem.
//!
//! `gshard train --profile` (both backends) writes one Chrome trace with a track per device.
//!
//! Without the `mpi` feature these tests print a notice and pass, unless
//! `GSHARD_REQUIRE_MPI=1` (set by `.ci/run`) makes that a failure.

mod common;

use common::mpi::{mpi_ready, mpirun, ok, run, wait};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gshard")
}

/// A scratch directory, removed when the test ends.
struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for Tmp {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmp(tag: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("gshard-mpi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

fn gshard(args: &[&str]) -> String {
    let mut c = Command::new(bin());
    c.args(args);
    ok(
        &run(c, Duration::from_secs(300), "gshard"),
        &format!("gshard {args:?}"),
    )
}

/// Named tensors of a safetensors file as (type, raw bytes).
fn tensors(path: &Path) -> HashMap<String, (String, Vec<u8>)> {
    let (ts, _) = runtime::read_safetensors(&std::fs::read(path).unwrap()).unwrap();
    ts.into_iter()
        .map(|(n, t)| (n, (t.ty.to_string(), t.data.to_bytes())))
        .collect()
}

fn assert_bitwise_equal(a: &Path, b: &Path) {
    let (x, y) = (tensors(a), tensors(b));
    assert!(!x.is_empty());
    let mut names: Vec<&String> = x.keys().collect();
    names.sort();
    let ynames: Vec<&String> = {
        let mut v: Vec<&String> = y.keys().collect();
        v.sort();
        v
    };
    assert_eq!(names, ynames, "different outputs");
    for n in names {
        assert_eq!(x[n].0, y[n].0, "{n}: types differ");
        assert!(x[n].1 == y[n].1, "{n}: values differ between backends");
    }
}

fn export_moe(dir: &Path, policy: &str, dtype: &str) -> (PathBuf, PathBuf) {
    let prog = dir.join(format!("moe-{policy}-{dtype}.gsir"));
    let inputs = dir.join(format!("moe-{policy}-{dtype}.safetensors"));
    gshard(&[
        "export",
        "moe-layer",
        "--groups",
        "8",
        "--group-size",
        "16",
        "--experts",
        "8",
        "--model-dim",
        "16",
        "--hidden-dim",
        "32",
        "--capacity",
        "4",
        "--policy",
        policy,
        "--dtype",
        dtype,
        "-o",
        prog.to_str().unwrap(),
    ]);
    gshard(&[
        "init",
        prog.to_str().unwrap(),
        "--out",
        inputs.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    (prog, inputs)
}

#[test]
fn mpi_moe_layer_equals_in_process_bitwise() {
    if !mpi_ready("mpi_moe_layer_equals_in_process_bitwise") {
        return;
    }
    let dir = tmp("moe");
    for (policy, dtype) in [("random", "f32"), ("all", "f64")] {
        let (prog, inputs) = export_moe(&dir, policy, dtype);
        let a = dir.join(format!("inprocess-{policy}.safetensors"));
        let b = dir.join(format!("mpi-{policy}.safetensors"));
        let p = prog.to_str().unwrap();
        let i = inputs.to_str().unwrap();
        gshard(&[
            "run",
            p,
            "--inputs",
            i,
            "--devices",
            "4",
            "--out",
            a.to_str().unwrap(),
        ]);
        let mut c = mpirun(4);
        c.args([
            "run",
            p,
            "--inputs",
            i,
            "--devices",
            "4",
            "--backend",
            "mpi",
        ])
        .args(["--out", b.to_str().unwrap()]);
        let out = ok(
            &run(c, Duration::from_secs(300), "mpirun run"),
            "mpirun run",
        );
        assert!(out.contains("as 4 MPI ranks"), "{out}");
        assert_bitwise_equal(&a, &b);
    }
    // The same over TCP on loopback, as between machines (no shared-memory transport).
    let (prog, inputs) = export_moe(&dir, "random", "f32");
    let tcp = dir.join("tcp.safetensors");
    let mut c = mpirun(4);
    c.env("OMPI_MCA_btl", "tcp,self")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .args([
            "run",
            prog.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
        ])
        .args(["--backend", "mpi", "--out", tcp.to_str().unwrap()]);
    ok(
        &run(c, Duration::from_secs(300), "mpirun over tcp"),
        "mpirun over tcp",
    );
    assert_bitwise_equal(&dir.join("inprocess-random.safetensors"), &tcp);
}

#[test]
fn mpi_conv_halo_exchange_equals_in_process_bitwise() {
    if !mpi_ready("mpi_conv_halo_exchange_equals_in_process_bitwise") {
        return;
    }
    let dir = tmp("conv");
    let prog = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/conv_halo.gsir");
    let p = prog.to_str().unwrap();
    let inputs = dir.join("in.safetensors");
    let i = inputs.to_str().unwrap();
    gshard(&["init", p, "--out", i]);
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    gshard(&["run", p, "--inputs", i, "--out", a.to_str().unwrap()]);
    let mut c = mpirun(4);
    c.args(["run", p, "--inputs", i, "--backend", "mpi", "--out"])
        .arg(&b);
    ok(
        &run(c, Duration::from_secs(120), "mpirun conv"),
        "mpirun conv",
    );
    assert_bitwise_equal(&a, &b);
}

#[test]
fn an_error_on_the_ranks_ends_the_job_with_a_message() {
    if !mpi_ready("an_error_on_the_ranks_ends_the_job_with_a_message") {
        return;
    }
    let dir = tmp("error");
    let (p, _) = export_moe(&dir, "all", "f32");
    let mut c = mpirun(2);
    c.args(["run", p.to_str().unwrap(), "--inputs"])
        .arg(dir.join("missing.safetensors"))
        .args(["--backend", "mpi"]);
    let out = run(
        c,
        Duration::from_secs(60),
        "mpirun with a missing input file",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("of 2: ") && stderr.contains("missing.safetensors"),
        "{stderr}"
    );
}

/// A two-language word-for-word corpus in the on-disk format (`split origin english source`).
fn write_corpus(dir: &Path) {
    let words = [
        ("one", "eins", "un"),
        ("two", "zwei", "deux"),
        ("three", "drei", "trois"),
        ("red", "rot", "rouge"),
        ("blue", "blau", "bleu"),
        ("cat", "Katze", "chat"),
        ("dog", "Hund", "chien"),
    ];
    let par = dir.join("parallel");
    std::fs::create_dir_all(&par).unwrap();
    let (mut de, mut fr) = (String::new(), String::new());
    let mut x: u64 = 7;
    for i in 0..600 {
        let mut pick = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            words[(x >> 33) as usize % words.len()]
        };
        let ws = [pick(), pick(), pick()];
        let en: Vec<&str> = ws.iter().map(|w| w.0).collect();
        let split = if i % 10 == 0 { "dev" } else { "train" };
        for (out, side) in [(&mut de, 1), (&mut fr, 2)] {
            let src: Vec<&str> = ws
                .iter()
                .map(|w| if side == 1 { w.1 } else { w.2 })
                .collect();
            out.push_str(&format!(
                "{split}\ttest\t{}\t{}\n",
                en.join(" "),
                src.join(" ")
            ));
        }
    }
    std::fs::write(par.join("de.tsv"), de).unwrap();
    std::fs::write(par.join("fr.tsv"), fr).unwrap();
}

fn tiny_config(dir: &Path, data: &Path, steps: u64) -> PathBuf {
    let path = dir.join("tiny.toml");
    std::fs::write(
        &path,
        format!(
            r#"steps = {steps}
log_every = 1
eval_every = 0
checkpoint_every = 5

[mesh]
data = 2
expert = 2

[data]
dir = "{}"
batch_size = 8
max_len = 8
dev_size = 8
vocab_size = 300
min_english_words = 1

[model]
model_dim = 16
heads = 2
head_dim = 8
ffn_dim = 32
enc_layers = 1
dec_layers = 1
moe_every = 1
experts = 4
group_size = 16
"#,
            data.display()
        ),
    )
    .unwrap();
    path
}

fn losses(run: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
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
fn mpi_training_equals_in_process_bitwise() {
    if !mpi_ready("mpi_training_equals_in_process_bitwise") {
        return;
    }
    let dir = tmp("train");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 5);
    let (a, b) = (dir.join("inprocess"), dir.join("mpi"));
    let cfg_s = cfg.to_str().unwrap();
    gshard(&["train", "--config", cfg_s, "--out", a.to_str().unwrap()]);
    let trace = dir.join("mpi-trace.json");
    let mut c = mpirun(4);
    c.args(["train", "--config", cfg_s, "--backend", "mpi", "--out"])
        .arg(&b)
        .arg("--profile")
        .arg(&trace);
    let out = ok(
        &run(c, Duration::from_secs(600), "mpirun train"),
        "mpirun train",
    );
    assert!(out.contains("trained 5 steps on 4 devices"), "{out}");
    let la = losses(&a);
    assert_eq!(la.len(), 5, "{la:?}");
    assert_eq!(la, losses(&b), "loss curves differ between backends");
    // Every rank wrote its own shard file: the same bytes as the in-process devices'.
    assert_same_files(&a.join("checkpoint"), &b.join("checkpoint"));
    // Rank 0 wrote one trace holding every rank's device track.
    assert_eq!(trace_devices(&trace), vec![0, 1, 2, 3]);
    for f in ["dev.hyp", "tokenizer.json", "config.toml"] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
    }
}

/// Tensor parallelism and weight-update sharding over MPI: `--mesh data=2,model=2` with the
/// weights stored split over `data` trains bit for bit as in one process.
#[test]
fn mpi_training_with_a_model_axis_equals_in_process_bitwise() {
    if !mpi_ready("mpi_training_with_a_model_axis_equals_in_process_bitwise") {
        return;
    }
    let dir = tmp("train-model");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 3);
    let (a, b) = (dir.join("inprocess"), dir.join("mpi"));
    let cfg_s = cfg.to_str().unwrap();
    let mesh = ["--mesh", "data=2,model=2", "--shard-weights", "data"];
    let mut args = vec!["train", "--config", cfg_s, "--out", a.to_str().unwrap()];
    args.extend(mesh);
    gshard(&args);
    let mut c = mpirun(4);
    c.args(["train", "--config", cfg_s, "--backend", "mpi"])
        .args(mesh)
        .arg("--out")
        .arg(&b);
    let out = ok(
        &run(
            c,
            Duration::from_secs(600),
            "mpirun train --mesh data=2,model=2",
        ),
        "mpirun train --mesh data=2,model=2",
    );
    assert!(out.contains("x model=2"), "{out}");
    let la = losses(&a);
    assert_eq!(la.len(), 3, "{la:?}");
    assert_eq!(la, losses(&b), "loss curves differ between backends");
    assert_same_files(&a.join("checkpoint"), &b.join("checkpoint"));
}

/// Two directories hold the same files with the same bytes.
/// Overlap over MPI: with `--overlap 2` each rank starts its chunks' all-to-alls on its
/// communication thread and computes meanwhile; the bits are the in-process run's (and its
/// losses those of k = 1).
#[test]
fn mpi_training_with_overlap_equals_in_process_bitwise() {
    if !mpi_ready("mpi_training_with_overlap_equals_in_process_bitwise") {
        return;
    }
    let dir = tmp("train-overlap");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 3);
    let (a, a2, b) = (dir.join("k1"), dir.join("k2"), dir.join("mpi"));
    let cfg_s = cfg.to_str().unwrap();
    gshard(&["train", "--config", cfg_s, "--out", a.to_str().unwrap()]);
    let (a2s, o) = (a2.to_str().unwrap(), ["--overlap", "2"]);
    gshard(&["train", "--config", cfg_s, "--out", a2s, o[0], o[1]]);
    let mut c = mpirun(4);
    c.args(["train", "--config", cfg_s, "--backend", "mpi", o[0], o[1]])
        .arg("--out")
        .arg(&b);
    ok(
        &run(c, Duration::from_secs(600), "mpirun train --overlap 2"),
        "mpirun train --overlap 2",
    );
    let la = losses(&a);
    assert_eq!(la.len(), 3, "{la:?}");
    assert_eq!(la, losses(&b), "loss curves differ with overlap over MPI");
    // The checkpoint (whose manifest records `overlap = 2`) as the in-process one's.
    assert_same_files(&a2.join("checkpoint"), &b.join("checkpoint"));
}

fn assert_same_files(a: &Path, b: &Path) {
    let list = |d: &Path| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let (x, y) = (list(a), list(b));
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&x), names(&y), "different files");
    for (f, g) in x.iter().zip(&y) {
        assert!(f.1 == g.1, "{} differs", f.0);
    }
}

/// A checkpoint saved by 4 MPI ranks (each its own shard file) resumes in one process on 8
/// devices: the weights load bitwise, and the next step's loss is the uninterrupted run's
/// within f32 tolerance.
#[test]
fn mpi_checkpoint_resumes_on_8_in_process_devices() {
    if !mpi_ready("mpi_checkpoint_resumes_on_8_in_process_devices") {
        return;
    }
    let dir = tmp("ckpt");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 3);
    // Groups of 8 tokens: 8 groups, which divide over 4 devices and over 8.
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("group_size = 16", "group_size = 8");
    std::fs::write(&cfg, text).unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let (full, cut) = (dir.join("full"), dir.join("cut"));
    gshard(&[
        "train",
        "--config",
        cfg_s,
        "--out",
        full.to_str().unwrap(),
        "--steps",
        "4",
    ]);
    let mut c = mpirun(4);
    c.args(["train", "--config", cfg_s, "--backend", "mpi", "--out"])
        .arg(&cut);
    ok(
        &run(c, Duration::from_secs(600), "mpirun train"),
        "mpirun train",
    );
    let files = std::fs::read_dir(cut.join("checkpoint")).unwrap().count();
    assert_eq!(files, 5, "4 shard files and the manifest");
    // Resharded onto 8 devices by the tool, the state is bitwise the one saved.
    let wide = dir.join("wide");
    gshard(&[
        "checkpoint",
        "reshard",
        cut.to_str().unwrap(),
        "--mesh",
        "data=2,expert=4",
        "--out",
        wide.to_str().unwrap(),
    ]);
    let (x, y) = (dir.join("x.safetensors"), dir.join("y.safetensors"));
    for (from, to) in [(&cut, &x), (&wide, &y)] {
        gshard(&[
            "checkpoint",
            "consolidate",
            from.to_str().unwrap(),
            "--out",
            to.to_str().unwrap(),
        ]);
    }
    assert_bitwise_equal(&x, &y);
    // The run resumed in one process on 8 devices.
    gshard(&[
        "train",
        "--out",
        cut.to_str().unwrap(),
        "--resume",
        "--mesh",
        "data=2,expert=4",
        "--steps",
        "4",
        "--data",
        data.to_str().unwrap(),
    ]);
    let (a, b) = (losses(&full), losses(&cut));
    assert_eq!(a.len(), 4);
    assert_eq!(&a[..3], &b[..3]);
    let (la, lb) = (f64::from_bits(a[3].1), f64::from_bits(b[3].1));
    assert!(
        (la - lb).abs() <= 1e-5 * la.abs().max(1.0),
        "step 4: {lb} resumed on 8 devices vs {la}"
    );
}

/// The device tracks (tids) of a Chrome trace's complete events; checks each has a duration.
fn trace_devices(path: &Path) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut tids: Vec<u64> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .inspect(|e| assert!(e["dur"].as_f64().is_some(), "{e}"))
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    tids.sort_unstable();
    tids.dedup();
    tids
}

#[test]
fn train_profile_writes_one_track_per_device() {
    let dir = tmp("profile");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 4);
    let trace = dir.join("trace.json");
    let out = gshard(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        dir.join("run").to_str().unwrap(),
        "--profile",
        trace.to_str().unwrap(),
        "--profile-steps",
        "2",
    ]);
    assert!(out.contains("wrote a Chrome trace of 2 steps"), "{out}");
    assert_eq!(trace_devices(&trace), vec![0, 1, 2, 3]);
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.contains("all_to_all"),
        "the MoE all-to-alls are traced"
    );
}

/// Pids of the processes whose parent is `parent` (from /proc).
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_killed_rank_ends_the_job_within_30_s() {
    if !mpi_ready("a_killed_rank_ends_the_job_within_30_s") {
        return;
    }
    let dir = tmp("kill");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 100_000);
    let run_dir = dir.join("run");
    let mut c = mpirun(4);
    c.args([
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--backend",
        "mpi",
        "--out",
    ])
    .arg(&run_dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    // Wait until training runs (rank 0 logs steps), then kill one rank that is not rank 0.
    let t0 = Instant::now();
    while losses_so_far(&run_dir) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "training never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ranks: Vec<u32> = children(child.id())
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("gshard"))
        })
        .collect();
    assert_eq!(ranks.len(), 4, "expected 4 rank processes under mpirun");
    let victim = *ranks.iter().max().unwrap();
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let (out, _) = wait(
        child,
        Duration::from_secs(60),
        "mpirun after a rank was killed",
    );
    let took = killed.elapsed();
    eprintln!("the job ended {took:?} after rank pid {victim} was killed");
    assert!(!out.status.success(), "the job must fail when a rank dies");
    assert!(
        took < Duration::from_secs(30),
        "the job took {took:?} to end after a rank died"
    );
}

/// One rank killed (SIGKILL) at random moments of a run that saves every step: each time
/// the directory holds a complete checkpoint, which verifies and resumes in one process.
#[test]
fn a_rank_killed_while_saving_leaves_a_complete_checkpoint() {
    if !mpi_ready("a_rank_killed_while_saving_leaves_a_complete_checkpoint") {
        return;
    }
    let dir = tmp("kill-save");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 100_000);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("checkpoint_every = 5", "checkpoint_every = 1");
    std::fs::write(&cfg, text).unwrap();
    let run_dir = dir.join("run");
    let mut seed = Instant::now().elapsed().as_nanos() as u64 ^ u64::from(std::process::id());
    let mut last = 0;
    for round in 0..4 {
        let mut c = mpirun(4);
        c.args([
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--backend",
            "mpi",
            if last > 0 { "--resume" } else { "--overwrite" },
            "--out",
        ])
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = c.spawn().unwrap();
        let t0 = Instant::now();
        let start = losses_so_far(&run_dir);
        while losses_so_far(&run_dir) < start + 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(240),
                "training never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis((seed >> 33) % 300));
        let ranks: Vec<u32> = children(child.id())
            .into_iter()
            .filter(|&p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.contains("gshard"))
            })
            .collect();
        let victim = ranks[(seed >> 40) as usize % ranks.len().max(1)];
        Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status()
            .unwrap();
        wait(
            child,
            Duration::from_secs(60),
            "mpirun after a rank was killed",
        );
        let ck = run_dir.join("checkpoint");
        assert!(
            ck.join("manifest.json").exists(),
            "round {round}: no checkpoint"
        );
        let out = gshard(&["checkpoint", "verify", ck.to_str().unwrap()]);
        assert!(out.contains(": ok"), "round {round}: {out}");
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ck.join("manifest.json")).unwrap()).unwrap();
        let step = m["step"].as_u64().unwrap();
        assert!(step >= last, "round {round}: step {step} after {last}");
        last = step;
    }
    // It resumes in one process (4 devices), one step on.
    let next = (last + 1).to_string();
    gshard(&[
        "train",
        "--out",
        run_dir.to_str().unwrap(),
        "--resume",
        "--steps",
        &next,
        "--data",
        data.to_str().unwrap(),
    ]);
}

fn losses_so_far(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_hung_rank_ends_the_job_by_the_watchdog() {
    if !mpi_ready("a_hung_rank_ends_the_job_by_the_watchdog") {
        return;
    }
    let dir = tmp("hang");
    let data = dir.join("data");
    write_corpus(&data);
    let cfg = tiny_config(&dir, &data, 100_000);
    let mut c = mpirun(4);
    c.env("GSHARD_TEST_HANG", "2:3")
        .args([
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--backend",
            "mpi",
        ])
        .args(["--peer-timeout", "5", "--out"])
        .arg(dir.join("run"));
    let t0 = Instant::now();
    let out = run(c, Duration::from_secs(240), "mpirun with a hung rank");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("waited more than 5 s for its peers"),
        "{stderr}"
    );
    // Start-up (corpus, tokenizer, partitioning) is included; the hang itself costs 5 s.
    assert!(
        t0.elapsed() < Duration::from_secs(200),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn ranks_with_different_programs_are_refused() {
    if !mpi_ready("ranks_with_different_programs_are_refused") {
        return;
    }
    let dir = tmp("mismatch");
    let (p1, i1) = export_moe(&dir, "all", "f32");
    let (p2, _) = export_moe(&dir, "random", "f32");
    let mut c = mpirun(2);
    c.args([
        "run",
        p1.to_str().unwrap(),
        "--inputs",
        i1.to_str().unwrap(),
    ])
    .args(["--backend", "mpi", ":", "-np", "2", bin(), "run"])
    .args([p2.to_str().unwrap(), "--inputs", i1.to_str().unwrap()])
    .args(["--backend", "mpi"]);
    let out = run(c, Duration::from_secs(120), "mpirun with two programs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rank(s) 2, 3 have a different partitioned program or mesh than rank 0"),
        "{stderr}"
    );
}

#[test]
fn a_mesh_that_does_not_match_the_ranks_is_refused() {
    if !mpi_ready("a_mesh_that_does_not_match_the_ranks_is_refused") {
        return;
    }
    let dir = tmp("ranks");
    let (p, i) = export_moe(&dir, "all", "f32");
    let mut c = mpirun(2);
    c.args(["run", p.to_str().unwrap(), "--inputs", i.to_str().unwrap()])
        .args(["--devices", "4", "--backend", "mpi"]);
    let out = run(c, Duration::from_secs(120), "mpirun -np 2 with 4 devices");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("has 4 devices but mpirun started 2 ranks"),
        "{stderr}"
    );
}

/// A compression setting on a collective it does not apply to, or over an axis the mesh
/// lacks, is a one-line error naming the setting.
#[test]
fn bad_compression_settings_are_refused() {
    if !mpi_ready("bad_compression_settings_are_refused") {
        return;
    }
    for (setting, says) in [
        ("all-reduce:fp8", "fp8 applies to all-to-alls only"),
        ("all-to-all@expert", "the mesh has no axis `expert`"),
        ("all-gather", "use all-to-all or all-reduce"),
    ] {
        let mut c = mpirun(2);
        c.args([
            "bench",
            "collectives",
            "--backend",
            "mpi",
            "--ops",
            "all-to-all",
        ])
        .args(["--bytes", "4096", "--iters", "1", "--compress", setting]);
        let out = run(c, Duration::from_secs(120), "bench with a bad --compress");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{setting}");
        // The ranks' own line (`error: rank 0 of 2: ...`), not Open MPI's abort banner
        // ("with errorcode 2."), which may reach stderr first.
        let line = stderr
            .lines()
            .find(|l| l.contains("error: "))
            .unwrap_or_default();
        assert!(
            line.contains(says) && line.contains(setting),
            "{setting}: {stderr}"
        );
    }
}

#[test]
fn bench_collectives_reports_bandwidth_for_both_backends() {
    let line = gshard(&[
        "bench",
        "collectives",
        "--devices",
        "4",
        "--bytes",
        "65536",
        "--iters",
        "3",
        "--json",
    ]);
    check_bench(&line, "inprocess");
    if !mpi_ready("bench_collectives_reports_bandwidth_for_both_backends (mpi part)") {
        return;
    }
    let mut c = mpirun(4);
    c.args([
        "bench",
        "collectives",
        "--backend",
        "mpi",
        "--bytes",
        "65536",
    ])
    .args(["--iters", "3", "--json"]);
    let out = ok(
        &run(c, Duration::from_secs(120), "mpirun bench"),
        "mpirun bench",
    );
    check_bench(&out, "mpi");
}

fn check_bench(out: &str, backend: &str) {
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for (row, op, wire) in [
        (&rows[0], "all-to-all", 65536 * 3 / 4),
        (&rows[1], "all-reduce", 2 * 65536 * 3 / 4),
    ] {
        assert_eq!(row["backend"], backend);
        assert_eq!(row["op"], op);
        assert_eq!(row["devices"], 4);
        assert_eq!(row["wire_bytes_per_device"], wire);
        assert!(row["gb_per_s_per_device"].as_f64().unwrap() > 0.0, "{row}");
    }
}
