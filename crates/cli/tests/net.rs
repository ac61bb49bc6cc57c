//! Communication between hosts (built with `--features mpi`): the two-level all-to-all, and
//! the multi-host test bed of `scripts/testbed`.
//!
//! Without a bed, `--hosts 2` declares 4 ranks on one machine to be 2 hosts: the two-level
//! all-to-all then sends one message per pair of hosts (2 per call instead of 8 at 2 × 2
//! ranks, 2 instead of 32 at 2 × 4), the same bytes, and a MoE layer gives bitwise the
//! outputs of one process. A host layout that does not fit the ranks is refused in one line.
//!
//! On the bed (root only: network namespaces), ranks on different hosts talk over TCP
//! across rate-limited veth links: the bytes counted on the links match what the
//! collectives report sending between hosts, a call takes at least the time the link needs
//! for those bytes, bf16 compression halves the bytes on the links, and hosts are found
//! from the ranks' machine names (each namespace has its own).
//!
//! These tests print a notice and pass when MPI or namespaces are missing, unless
//! `GSHARD_REQUIRE_MPI=1` (set by `.ci/run`) makes that a failure.

mod common;

use common::mpi::{mpi_ready, mpirun, ok, required, run};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_gshard")
}

/// The bench's JSON rows.
fn rows(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `bench collectives` arguments timing all-to-alls of `bytes` per device.
fn bench_args(bytes: usize, algo: &str, iters: usize) -> Vec<String> {
    [
        "bench",
        "collectives",
        "--backend",
        "mpi",
        "--ops",
        "all-to-all",
        "--bytes",
        &bytes.to_string(),
        "--iters",
        &iters.to_string(),
        "--warmup",
        "1",
        "--all-to-all",
        algo,
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn two_level_all_to_all_sends_one_message_per_host_pair() {
    if !mpi_ready("two_level_all_to_all_sends_one_message_per_host_pair") {
        return;
    }
    let bytes = 65536;
    for (ranks, hosts) in [(4, 2), (8, 2)] {
        let per = ranks / hosts;
        // Each rank sends 1/ranks of its operand to each rank on another host.
        let remote_bytes = ranks * (ranks - per) * (bytes / ranks);
        for (algo, messages) in [
            ("flat", ranks * (ranks - per)),
            ("two-level", hosts * (hosts - 1)),
        ] {
            let mut c = mpirun(ranks);
            c.args(bench_args(bytes, algo, 2))
                .args(["--hosts", &hosts.to_string()]);
            let out = ok(
                &run(c, Duration::from_secs(120), "bench collectives"),
                "bench collectives",
            );
            let r = &rows(&out)[0];
            assert_eq!(r["all_to_all"], algo, "{r}");
            assert_eq!(
                r["inter_host_messages_per_call"].as_f64(),
                Some(messages as f64),
                "{ranks} ranks on {hosts} hosts, {algo}: {r}"
            );
            assert_eq!(
                r["inter_host_bytes_per_call"].as_f64(),
                Some(remote_bytes as f64),
                "{r}"
            );
        }
    }
}

#[test]
fn a_host_layout_that_does_not_fit_the_ranks_is_refused() {
    if !mpi_ready("a_host_layout_that_does_not_fit_the_ranks_is_refused") {
        return;
    }
    let mut c = mpirun(4);
    c.args(bench_args(4096, "two-level", 1))
        .args(["--hosts", "3"]);
    let out = run(c, Duration::from_secs(60), "bench collectives --hosts 3");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("--hosts 3"))
        .unwrap_or_else(|| panic!("no line names --hosts 3:\n{err}"));
    assert!(line.contains("divides 4"), "{line}");
    // In one process the flags have nothing to act on.
    let out = Command::new(bin())
        .args(["bench", "collectives", "--all-to-all", "two-level"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend mpi"));
}

/// Exports a small MoE layer (8 experts over 4 devices) with inputs; returns their paths.
fn moe(dir: &Path) -> (String, String) {
    let prog = dir.join("moe.gsir");
    let inputs = dir.join("moe.safetensors");
    let p = prog.to_str().unwrap().to_string();
    let i = inputs.to_str().unwrap().to_string();
    let export = [
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
        "-o",
        &p,
    ];
    ok(
        &Command::new(bin()).args(export).output().unwrap(),
        "gshard export",
    );
    ok(
        &Command::new(bin())
            .args(["init", &p, "--out", &i, "--seed", "5"])
            .output()
            .unwrap(),
        "gshard init",
    );
    (p, i)
}

/// Raw bytes of every tensor of a safetensors file, by name.
fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let (ts, _) = runtime::read_safetensors(&std::fs::read(path).unwrap()).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = ts
        .into_iter()
        .map(|(n, t)| (n, t.data.to_bytes()))
        .collect();
    v.sort();
    v
}

/// A scratch directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("gshard-net-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn moe_layer_with_two_level_all_to_all_equals_in_process_bitwise() {
    if !mpi_ready("moe_layer_with_two_level_all_to_all_equals_in_process_bitwise") {
        return;
    }
    let dir = Scratch::new("moe");
    let (p, i) = moe(&dir.0);
    let want = dir.0.join("one.safetensors");
    let got = dir.0.join("two-level.safetensors");
    ok(
        &Command::new(bin())
            .args(["run", &p, "--inputs", &i, "--devices", "4", "--out"])
            .arg(&want)
            .output()
            .unwrap(),
        "gshard run --devices 4",
    );
    let mut c = mpirun(4);
    c.args(["run", &p, "--inputs", &i, "--backend", "mpi"])
        .args(["--all-to-all", "two-level", "--hosts", "2", "--out"])
        .arg(&got);
    ok(
        &run(c, Duration::from_secs(300), "mpirun gshard run"),
        "mpirun gshard run",
    );
    let (a, b) = (tensors(&want), tensors(&got));
    assert!(!a.is_empty());
    assert!(
        a == b,
        "outputs differ between one process and two-level MPI"
    );
}

/// A test bed of `scripts/testbed`, removed when dropped.
struct Bed {
    name: String,
}

fn testbed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testbed")
}

impl Bed {
    /// Brings up a bed of `hosts` hosts with links of `rate`, or says why it cannot (and
    /// fails under `GSHARD_REQUIRE_MPI=1`).
    fn up(test: &str, hosts: usize, rate: &str) -> Option<Bed> {
        if !mpi_ready(test) {
            return None;
        }
        let name = format!("gsb{}{}", std::process::id(), test.len());
        let out = Command::new(testbed())
            .args(["up", "--name", &name, "--hosts", &hosts.to_string()])
            .args(["--rate", rate])
            .output()
            .unwrap();
        let bed = Bed { name };
        if out.status.success() {
            return Some(bed);
        }
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert!(
            !required(),
            "GSHARD_REQUIRE_MPI=1 but the test bed cannot be created: {why}"
        );
        eprintln!("skipping {test}: no test bed here ({why})");
        None
    }

    /// `scripts/testbed mpirun` of `gshard args`, `per_host` ranks on each host.
    fn mpirun(&self, per_host: usize, args: &[String]) -> Command {
        let mut c = Command::new(testbed());
        c.args(["mpirun", "--name", &self.name, "--per-host"])
            .arg(per_host.to_string())
            .arg("--")
            .arg(bin())
            .args(args);
        c
    }

    /// Bytes sent by each host on its link.
    fn sent(&self) -> Vec<u64> {
        let out = ok(
            &Command::new(testbed())
                .args(["bytes", "--name", &self.name])
                .output()
                .unwrap(),
            "testbed bytes",
        );
        out.lines()
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new(testbed())
            .args(["down", "--name", &self.name])
            .output();
    }
}

#[test]
fn testbed_traffic_crosses_the_limited_links() {
    let Some(bed) = Bed::up("testbed_traffic_crosses_the_limited_links", 2, "400mbit") else {
        return;
    };
    let (bytes, iters) = (4 << 20, 3);
    let runs = [
        ("flat", None),
        ("two-level", None),
        ("two-level", Some("all-to-all")),
        ("flat", Some("all-to-all:fp8")),
    ];
    for (algo, compress) in runs {
        let before = bed.sent();
        let mut args = bench_args(bytes, algo, iters);
        if let Some(c) = compress {
            args.extend(["--compress".into(), c.into()]);
        }
        let out = ok(
            &run(
                bed.mpirun(2, &args),
                Duration::from_secs(120),
                "bench collectives on the bed",
            ),
            "bench collectives on the bed",
        );
        let after = bed.sent();
        let r = &rows(&out)[0];
        // 4 ranks, 2 per host: each rank sends half its operand to the other host (as
        // bf16, half the bytes; as fp8, one byte per element and a 4-byte scale per 128).
        let per_call = r["inter_host_bytes_per_call"].as_f64().unwrap();
        let f32_bytes = (4 * bytes / 2) as f64;
        let ratio = match compress {
            None => 1.0,
            Some("all-to-all") => 0.5,
            _ => (128.0 + 4.0) / 512.0,
        };
        assert_eq!(per_call, f32_bytes * ratio, "{r}");
        let messages = r["inter_host_messages_per_call"].as_f64().unwrap();
        assert_eq!(messages, if algo == "flat" { 8.0 } else { 2.0 }, "{r}");
        // Warm-up and timed calls, each host sending half of them; the links also carry
        // headers, acknowledgements, and MPI's start-up and result exchanges.
        let payload = per_call / 2.0 * (iters + 1) as f64;
        for (h, (a, b)) in before.iter().zip(&after).enumerate() {
            let sent = (b - a) as f64;
            assert!(
                sent >= payload && sent <= payload * 1.1 + 1e6,
                "{algo}: host {h} sent {sent} bytes on its link for {payload} bytes of payload"
            );
        }
        // 4 MiB leave each host per call (2 MiB as bf16): at 400 Mbit/s, 84 ms (42 ms).
        let floor = per_call / 2.0 * 8.0 / 400e6;
        let t = r["seconds"].as_f64().unwrap();
        assert!(
            t > 0.9 * floor,
            "{algo}: a call took {t} s, under the link's {floor} s: traffic bypassed the link"
        );
    }
}

#[test]
fn testbed_hosts_come_from_machine_names() {
    let Some(bed) = Bed::up("testbed_hosts_come_from_machine_names", 2, "1gbit") else {
        return;
    };
    let dir = Scratch::new("bed-moe");
    let (p, i) = moe(&dir.0);
    let want = dir.0.join("one.safetensors");
    let got = dir.0.join("bed.safetensors");
    ok(
        &Command::new(bin())
            .args(["run", &p, "--inputs", &i, "--devices", "4", "--out"])
            .arg(&want)
            .output()
            .unwrap(),
        "gshard run --devices 4",
    );
    let args: Vec<String> = ["run", &p, "--inputs", &i, "--backend", "mpi"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--all-to-all".into(),
            "two-level".into(),
            "--out".into(),
            got.to_str().unwrap().into(),
        ])
        .collect();
    ok(
        &run(
            bed.mpirun(2, &args),
            Duration::from_secs(300),
            "mpirun gshard run on the bed",
        ),
        "mpirun gshard run on the bed",
    );
    assert!(tensors(&want) == tensors(&got), "outputs differ on the bed");
    // Without --hosts the bench finds the 2 hosts by name: 2 messages per call.
    let out = ok(
        &run(
            bed.mpirun(2, &bench_args(65536, "two-level", 2)),
            Duration::from_secs(60),
            "bench collectives on the bed",
        ),
        "bench collectives on the bed",
    );
    assert_eq!(rows(&out)[0]["inter_host_messages_per_call"], 2.0);
}
