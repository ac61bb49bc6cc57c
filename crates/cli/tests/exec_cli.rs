//! The executor through the binary: `gshard bench moe-layer --json` prints one JSON object
//! with the benchmark fields (collective bytes equal to the analytic all-to-all count),
//! `gshard bench probe --json` the cores' probe rates, `gshard bench gemm --json` each
//! product's share of the FMA peak (and a clear error for a malformed shape), and
//! `gshard run --profile` writes a Chrome trace with one track per device.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gshard(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this CPU runs the FMA probe and the GEMM micro-kernel (AVX2 and FMA).
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn bench_probe_prints_both_rates_where_the_cpu_runs_them() {
    let v: serde_json::Value =
        serde_json::from_str(gshard(&["bench", "probe", "--json"]).trim()).unwrap();
    for k in ["core_fma_gflops", "core_gemm_gflops"] {
        let g = v.get(k).unwrap_or_else(|| panic!("{k} is reported: {v}"));
        match g.as_f64() {
            Some(g) => assert!(has_fma() && g > 0.0 && g.is_finite(), "{v}"),
            None => assert!(!has_fma() && g.is_null(), "{v}"),
        }
    }
    assert!(v["threads"].as_u64().is_some_and(|t| t >= 1), "{v}");
    // The clock: a positive figure on x86-64, null elsewhere.
    match v["core_clock_ghz"].as_f64() {
        Some(c) => assert!(
            cfg!(target_arch = "x86_64") && c > 0.0 && c.is_finite(),
            "{v}"
        ),
        None => assert!(!cfg!(target_arch = "x86_64") && v["core_clock_ghz"].is_null()),
    }
    // The text form names every probe.
    let text = gshard(&["bench", "probe"]);
    assert!(
        text.contains("FMA") && text.contains("GEMM") && text.contains("clock"),
        "{text}"
    );
}

#[test]
fn bench_gemm_prints_each_products_share_of_the_peak() {
    let args = [
        "bench",
        "gemm",
        "--shapes",
        "24x40x16,t30x20x50",
        "--pairs",
        "3",
        "--burst-ms",
        "1",
        "--json",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !has_fma() {
        // No kernel to measure: an error that says why, not a panic.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("AVX2"), "{err}");
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (v, (shape, t)) in rows.iter().zip([("24x40x16", false), ("t30x20x50", true)]) {
        assert_eq!(v["shape"], shape, "{v}");
        assert_eq!(v["a_transposed"], t, "{v}");
        let share = v["share_of_peak"].as_f64().unwrap();
        assert!(share > 0.0 && share < 2.0, "{v}");
        assert!(v["share_q1"].as_f64().unwrap() <= share, "{v}");
        assert!(v["share_q3"].as_f64().unwrap() >= share, "{v}");
        assert!(v["gemm_gflops"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["sampled_error"].as_f64().unwrap() < 1e-4, "{v}");
        assert_eq!(v["pairs"], 3, "{v}");
        // The clock and the peak's flops per cycle: numbers on x86-64, null elsewhere.
        for key in ["clock_ghz", "peak_flops_per_cycle"] {
            match v[key].as_f64() {
                Some(x) => assert!(x > 0.0 && x.is_finite(), "{v}"),
                None => assert!(v[key].is_null() && !cfg!(target_arch = "x86_64"), "{v}"),
            }
        }
    }
    assert_eq!(rows[1]["m"], 30, "t30x20x50 is m = 30");
    assert_eq!(rows[1]["k"], 50, "t30x20x50 is k = 50");
    // A malformed shape names the entry and the form expected; one too large to allocate
    // is refused by name, not attempted.
    for (shape, says) in [("64x0x64", "MxNxK"), ("1000000x1000000x1000000", "GiB")] {
        let out = Command::new(env!("CARGO_BIN_EXE_gshard"))
            .args(["bench", "gemm", "--shapes", shape])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let named = err.contains(&format!("{shape:?}"));
        assert!(
            !out.status.success() && named && err.contains(says),
            "{err}"
        );
    }
}

#[test]
fn bench_moe_layer_prints_one_json_object() {
    let shape = [
        "--groups",
        "4",
        "--group-size",
        "8",
        "--experts",
        "4",
        "--model-dim",
        "8",
        "--hidden-dim",
        "16",
        "--capacity",
        "2",
    ];
    for d in ["1", "2"] {
        let mut args = vec!["bench", "moe-layer"];
        args.extend(shape);
        args.extend(["--devices", d, "--steps", "2", "--warmup", "1", "--json"]);
        let v: serde_json::Value = serde_json::from_str(gshard(&args).trim()).unwrap();
        for k in [
            "step_seconds",
            "gflops",
            "peak_bytes_per_device",
            "collective_bytes",
            "partition_seconds",
        ] {
            assert!(v[k].as_f64().is_some(), "{k} missing: {v}");
        }
        // FLOPs as the JAX harness counts them, x3 for forward + backward.
        let (g, s, e, m, h, c) = (4.0, 8.0, 4.0, 8.0, 16.0, 2.0);
        let fwd = 2.0 * g * s * m * e + 4.0 * g * s * e * c * m + 4.0 * e * g * c * m * h;
        assert!(
            (v["gflop"].as_f64().unwrap() - 3.0 * fwd / 1e9).abs() < 1e-12,
            "{v}"
        );
        assert_eq!(v["all_to_all_bytes"], v["all_to_all_bytes_analytic"], "{v}");
        // The core's FMA rate around the timed steps: always reported, a positive figure
        // where the CPU has AVX2 and FMA, null elsewhere.
        let fma = v
            .get("core_fma_gflops")
            .expect("core_fma_gflops is reported");
        let has_fma = has_fma();
        match fma.as_f64() {
            Some(g) => assert!(has_fma && g > 0.0, "{v}"),
            None => assert!(!has_fma && fma.is_null(), "{v}"),
        }
        // The GEMM micro-kernel's rate on operands in cache: likewise, where the kernel
        // runs (AVX2 and FMA).
        let gemm = v
            .get("core_gemm_gflops")
            .expect("core_gemm_gflops is reported");
        match gemm.as_f64() {
            Some(g) => assert!(has_fma && g > 0.0, "{v}"),
            None => assert!(!has_fma && gemm.is_null(), "{v}"),
        }
        // The clock around the timed steps, on x86-64.
        let clock = v.get("core_clock_ghz").expect("core_clock_ghz is reported");
        match clock.as_f64() {
            Some(c) => assert!(cfg!(target_arch = "x86_64") && c > 0.0, "{v}"),
            None => assert!(!cfg!(target_arch = "x86_64") && clock.is_null(), "{v}"),
        }
        if d == "2" {
            // 4 all-to-alls, each moving half of the f32 E*G*C*M tensor across devices.
            assert_eq!(v["all_to_all_bytes"], 4 * (4 * 4 * 2 * 8 * 4) / 2);
            // The aux-loss and over-capacity all-reduces meet the all-to-alls in rounds.
            let rounds = v["collective_rounds"].as_u64().unwrap();
            assert!((1..=3).contains(&rounds), "{v}");
        }
        // By default the loss and the four gradients, as the JAX harness's `jax.grad`;
        // `--outputs all` keeps every named value of the exported program alive as well.
        assert_eq!(v["outputs"], "grads", "{v}");
        assert_eq!(v["program_outputs"], 5, "{v}");
        args.extend(["--outputs", "all"]);
        let all: serde_json::Value = serde_json::from_str(gshard(&args).trim()).unwrap();
        assert!(all["program_outputs"].as_u64().unwrap() > 5, "{all}");
        assert!(
            all["peak_bytes_per_device"].as_u64() >= v["peak_bytes_per_device"].as_u64(),
            "{all} vs {v}"
        );
    }
}

#[test]
fn run_profile_writes_a_chrome_trace_per_device() {
    let dir = std::env::temp_dir().join(format!("gshard-exec-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let t = trace.to_str().unwrap();
    gshard(&[
        "run",
        "examples/mlp_dp.gsir",
        "--inputs",
        "examples/mlp_inputs.safetensors",
        "--devices",
        "2",
        "--profile",
        t,
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    for d in 0..2u64 {
        assert!(
            evs.iter().any(|e| e["ph"] == "X" && e["tid"] == d),
            "device {d}"
        );
        assert!(evs
            .iter()
            .any(|e| e["ph"] == "M" && e["tid"] == d && e["name"] == "thread_name"));
    }
    // The single-device path runs the executor too, and `--reference` the oracle.
    gshard(&[
        "run",
        "examples/mlp.gsir",
        "--inputs",
        "examples/mlp_inputs.safetensors",
        "--profile",
        t,
    ]);
    gshard(&[
        "run",
        "examples/mlp.gsir",
        "--inputs",
        "examples/mlp_inputs.safetensors",
        "--reference",
    ]);
    std::fs::remove_dir_all(&dir).ok();
}
