//! `gshard plan` on GShard's 600B model (2,048 devices, TPU v3): the binary, run as a child
//! process, plans it within 2 GB of memory (its peak resident set, from the kernel's rusage
//! of the child), and its JSON report has the paper's parameter count within 7 %, one
//! expert per device and an all-to-all over the expert axis; with `--remat layer` it fits a
//! 16 GiB core, and a bad policy is a one-line error; `--png` writes a valid PNG;
//! `--search` ranks the layouts that fit, fastest first, and says what memory would. Time is
//! not asserted here (the README gives the release binary's); the per-device program's size
//! against the device count is `crates/plan/tests/plan.rs`.

use std::io::Read;
use std::process::{Command, Stdio};

/// Run `gshard ARGS` to its end: (exit code, stdout, stderr, peak resident set in bytes).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by libc::wait4, which also gives its rusage"
)]
fn run_measured(args: &[&str]) -> (i32, String, String, u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of that plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own unreaped child (std's `Child` is never waited on, so nothing
    // else reaps it), and both pointers are to live, writable locals of the right types.
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    // Linux gives the high-water mark in KiB.
    let peak = usage.ru_maxrss as u64 * 1024;
    (code, stdout, stderr, peak)
}

#[test]
fn planning_the_600b_model_on_2048_devices_takes_under_2_gb_and_counts_its_parameters() {
    let (code, stdout, stderr, peak) = run_measured(&["plan", "--preset", "gshard-600b", "--json"]);
    assert_eq!(code, 0, "gshard plan failed: {stderr}");
    assert!(
        peak > 0 && peak <= 2_000_000_000,
        "planning took {peak} bytes of memory (at most 2 GB)"
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let preset = plan::Preset::find("gshard-600b").unwrap();
    let params = r["params"].as_f64().unwrap();
    let ratio = params / preset.paper_params;
    assert!(
        (0.93..=1.07).contains(&ratio),
        "{params} parameters against the paper's {}",
        preset.paper_params
    );
    assert_eq!(r["devices"], 2048);
    assert_eq!(r["hardware"], "tpu-v3");
    assert!(r["step_seconds"].as_f64().unwrap() > 0.0);
    let collectives = r["collective_bytes"].as_array().unwrap();
    assert!(
        collectives
            .iter()
            .any(|c| c["kind"] == "all_to_all" && c["axes"] == "expert"),
        "{collectives:?}"
    );
}

#[test]
fn the_600b_model_fits_a_tpu_v3_core_with_layer_rematerialisation() {
    let (code, stdout, stderr, _) = run_measured(&[
        "plan",
        "--preset",
        "gshard-600b",
        "--remat",
        "layer",
        "--json",
    ]);
    assert_eq!(code, 0, "gshard plan failed: {stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(r["fits"], true, "{}", r["resident_bytes_per_device"]);
    assert!(r["advice"].as_array().unwrap().is_empty());
    let (code, _, stderr, _) = run_measured(&["plan", "--preset", "gshard-600b", "--remat", "x"]);
    assert_eq!(code, 2);
    assert!(
        stderr.trim().lines().count() == 1 && stderr.contains("layer"),
        "{stderr}"
    );
}

#[test]
fn png_draws_the_breakdowns_as_a_valid_png() {
    let dir = std::env::temp_dir().join(format!("gshard-plan-png-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.png");
    let (code, stdout, stderr, _) = run_measured(&[
        "plan",
        "--hardware",
        "tpu-v3",
        "--png",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "gshard plan --png failed: {stderr}");
    assert!(stdout.contains("step time"), "{stdout}");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // The first chunk is the 13-byte IHDR with the image's width and height.
    assert_eq!(&bytes[8..16], b"\0\0\0\x0dIHDR");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((width, height), (1120, 460));
    let (code, _, stderr, _) = run_measured(&["plan", "--png", "/nonexistent/dir/plan.png"]);
    assert_eq!(code, 2);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("create it"), "{stderr}");
}

#[test]
fn search_ranks_the_layouts_that_fit_fastest_first() {
    let search = |memory: &str, top: &str| {
        run_measured(&[
            "plan",
            "--search",
            "--devices",
            "8",
            "--memory",
            memory,
            "--top",
            top,
            "--json",
        ])
    };
    let (code, stdout, stderr, _) = search("16GiB", "5");
    assert_eq!(code, 0, "gshard plan --search failed: {stderr}");
    let all: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(all.len(), 5);
    let f = |c: &serde_json::Value, k: &str| c[k].as_f64().unwrap();
    for c in &all {
        let n = f(c, "data") * f(c, "expert") * f(c, "model");
        assert_eq!(n, 8.0, "{c}");
        assert!(c["why"].as_str().unwrap().contains("step"), "{c}");
    }
    assert!(
        all.windows(2)
            .all(|w| f(&w[0], "step_seconds") <= f(&w[1], "step_seconds")),
        "not fastest first: {stdout}"
    );
    // A limit between the smallest and the largest layout keeps only those under it.
    let sizes: Vec<f64> = all
        .iter()
        .map(|c| f(c, "resident_bytes_per_device"))
        .collect();
    let limit = sizes.iter().cloned().fold(f64::MAX, f64::min).ceil() as u64;
    let (code, stdout, stderr, _) = search(&limit.to_string(), "100");
    assert_eq!(code, 0, "gshard plan --search failed: {stderr}");
    let fitting: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert!(!fitting.is_empty());
    for c in &fitting {
        assert!(f(c, "resident_bytes_per_device") <= limit as f64, "{c}");
    }
    // Nothing fits: one line that says how much would.
    let (code, _, stderr, _) = search("1MiB", "5");
    assert_eq!(code, 2);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("raise --memory to at least"), "{stderr}");
}
