//! `plan::plan` on GShard's models: parameter counts against the paper's Table 1, a plan
//! whose per-device program does not grow with the device count, one-line errors for bad
//! input, and the time model's shape.

use plan::hardware::Hardware;
use plan::{plan, preset_config, PlanError, PlanOptions, Preset};

fn tpu() -> PlanOptions {
    PlanOptions::new(Hardware::built_in("tpu-v3").unwrap(), "test")
}

#[test]
fn smallest_table1_model_has_the_papers_parameter_count_and_fits_a_tpu_v3_core() {
    let p = Preset::find("gshard-128e-12l").unwrap();
    let r = plan(&p.config(), &tpu()).unwrap();
    let ratio = r.params as f64 / p.paper_params;
    assert!(
        (0.93..=1.07).contains(&ratio),
        "{} vs {}",
        r.params,
        p.paper_params
    );
    assert_eq!(r.devices, 128);
    assert_eq!(r.breakdown.total(), r.peak_bytes_per_device);
    assert!(r.step_seconds > 0.0 && r.mfu > 0.0 && r.mfu < 1.0, "{r:?}");
    assert!(r.flops_by_family.contains_key("matmul"));
    assert!(r
        .collective_bytes
        .iter()
        .any(|c| c.kind == "all_to_all" && c.axes == "expert"));
    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "params",
        "peak_bytes_per_device",
        "breakdown",
        "flops_per_device",
        "collective_bytes",
        "step_seconds",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
}

#[test]
fn the_per_device_program_does_not_grow_from_2_to_2048_devices() {
    let mut cfg = preset_config("gshard-2048e-12l").unwrap();
    let at = |cfg: &train::config::TrainConfig| plan(cfg, &tpu()).unwrap();
    cfg.mesh.expert = 2048;
    let wide = at(&cfg);
    cfg.mesh.expert = 2;
    let narrow = at(&cfg);
    let ratio = wide.instructions as f64 / narrow.instructions as f64;
    assert!(
        (1.0 / 1.2..=1.2).contains(&ratio),
        "{} vs {}",
        wide.instructions,
        narrow.instructions
    );
    let ratio = wide.plan_steps as f64 / narrow.plan_steps as f64;
    assert!((1.0 / 1.2..=1.2).contains(&ratio));
    assert_eq!(wide.params, narrow.params);
    // One expert per device at 2048 devices, 1024 per device at 2: more memory.
    assert!(narrow.peak_bytes_per_device > wide.peak_bytes_per_device);
}

#[test]
fn bad_input_is_a_one_line_error_naming_the_fix() {
    let e = preset_config("gshard-7e").unwrap_err();
    assert!(matches!(e, PlanError::UnknownPreset { .. }));
    let msg = e.to_string();
    assert!(msg.contains("gshard-600b") && !msg.contains('\n'), "{msg}");
    let e = Hardware::built_in("tpu-v9").unwrap_err().to_string();
    assert!(
        e.contains("tpu-v3") && e.contains(".toml") && !e.contains('\n'),
        "{e}"
    );
    let mut cfg = preset_config("gshard-128e-12l").unwrap();
    cfg.mesh.expert = 3;
    let e = plan(&cfg, &tpu()).unwrap_err().to_string();
    assert!(e.contains("use a multiple") && !e.contains('\n'), "{e}");
    let e = Hardware::from_toml("name = 1", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("hardware profile x.toml") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn every_built_in_profile_parses() {
    for (name, _) in plan::hardware::BUILT_IN {
        let h = Hardware::built_in(name).unwrap();
        assert_eq!(h.name, name);
    }
}

#[test]
fn mfu_of_in_process_devices_counts_every_devices_matmuls() {
    // The built-in `this-cpu` file as written (unmeasured): deterministic rates.
    let hw = Hardware::built_in("this-cpu").unwrap();
    assert!(hw.device.shared_by_devices);
    let opts = PlanOptions::new(hw.clone(), "test");
    let mut cfg = train::config::TrainConfig::default();
    let mut at = |data: usize, expert: usize| {
        cfg.mesh.data = data;
        cfg.mesh.expert = expert;
        plan(&cfg, &opts).unwrap()
    };
    let one = at(1, 1);
    let eight = at(2, 4);
    let matmul = *eight.flops_by_family.get("matmul").unwrap() as f64;
    let expected = 8.0 * matmul / (eight.step_seconds * hw.device.peak_flops.f32);
    assert!(
        (eight.mfu - expected).abs() <= 1e-9 * expected,
        "{}",
        eight.mfu
    );
    // The same model's work on one machine: about the same utilisation, not an eighth.
    let ratio = eight.mfu / one.mfu;
    assert!((0.5..=2.0).contains(&ratio), "{} vs {}", eight.mfu, one.mfu);
}

/// A measured rate of fused elementwise chains prices that family by its bytes at the
/// rate (never above the memory bandwidth) and leaves every other family as it was.
#[test]
fn elementwise_chains_are_priced_at_their_own_rate() {
    let hw = Hardware::built_in("this-cpu").unwrap();
    assert_eq!(
        hw.device.elementwise_bytes_per_s, 0.0,
        "the file leaves it to the probe"
    );
    let cfg = train::config::TrainConfig::default();
    let at = |hw: &Hardware| plan(&cfg, &PlanOptions::new(hw.clone(), "test")).unwrap();
    let base = at(&hw);
    let mut slow = hw.clone();
    slow.device.elementwise_bytes_per_s = hw.device.memory_bytes_per_s / 4.0;
    let quarter = at(&slow);
    let family = |r: &plan::Report, f: &str| r.time.compute.get(f).copied().unwrap_or(0.0);
    for f in ["matmul", "reduction", "layout", "indexing", "dispatch"] {
        assert_eq!(family(&base, f), family(&quarter, f), "{f}");
    }
    let (e0, e1) = (
        family(&base, "elementwise"),
        family(&quarter, "elementwise"),
    );
    assert!(e1 > 3.0 * e0 && e1 <= 4.0 * e0 + 1e-12, "{e0} -> {e1}");
    let mut fast = hw.clone();
    fast.device.elementwise_bytes_per_s = hw.device.memory_bytes_per_s * 4.0;
    assert_eq!(
        family(&at(&fast), "elementwise"),
        e0,
        "capped at the memory bandwidth"
    );
    let text = include_str!("../hardware/this-cpu.toml")
        .replace("[device]", "[device]\nelementwise_bytes_per_s = -1.0");
    let e = Hardware::from_toml(&text, "bad.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bad.toml") && e.contains("elementwise_bytes_per_s"),
        "{e}"
    );
}

/// The communication options: compression scales only the bandwidth part of the f32
/// all-to-alls (bf16 at most halves them, fp8 cuts more), overlap hides at most the smaller
/// of the all-to-alls and the expert work, and two-level needs islands to change anything.
#[test]
fn communication_options_follow_their_bytes_and_the_overlap_bound() {
    let cfg = train::config::TrainConfig::default();
    let r = plan(&cfg, &tpu()).unwrap();
    let row = |name: &str| {
        r.comm_options
            .iter()
            .find(|c| c.option.starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {:?}", r.comm_options))
    };
    let base = row("as planned");
    assert!((base.step_seconds - r.step_seconds).abs() <= 1e-9 * r.step_seconds);
    assert!(base.all_to_all_seconds > 0.0, "{base:?}");
    let (bf16, fp8) = (row("all-to-all bf16"), row("all-to-all fp8"));
    assert!(bf16.all_to_all_seconds < base.all_to_all_seconds);
    assert!(bf16.all_to_all_seconds >= base.all_to_all_seconds / 2.0);
    assert!(fp8.all_to_all_seconds < bf16.all_to_all_seconds);
    assert!(row("all-reduce bf16").all_reduce_seconds < base.all_reduce_seconds);
    let rest = base.step_seconds - base.all_to_all_seconds - base.all_reduce_seconds;
    for k in [2.0, 4.0] {
        let o = row(&format!("overlap {k}"));
        assert!(o.hidden_seconds > 0.0, "{o:?}");
        assert!(o.hidden_seconds <= o.all_to_all_seconds * (k - 1.0) / k + 1e-12);
        assert!(o.hidden_seconds <= r.time.expert_seconds * (k - 1.0) / k + 1e-12);
        let want = rest + o.all_to_all_seconds + o.all_reduce_seconds - o.hidden_seconds;
        assert!((o.step_seconds - want).abs() <= 1e-9 * want, "{o:?}");
    }
    assert!(row("two-level").note.contains("no islands"));
    // On islands of 8 GPUs the config's devices share one island: nothing to combine.
    let h100 = PlanOptions::new(Hardware::built_in("h100-80gb").unwrap(), "test");
    let r = plan(&cfg, &h100).unwrap();
    let two = r.comm_options.last().unwrap();
    assert!(two.note.contains("one island"), "{two:?}");
}
