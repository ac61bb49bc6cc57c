//! `plan::search`: the default config's layouts on 8 devices come back fastest first and
//! within the memory limit; a limit no layout fits is a one-line error naming the smallest
//! footprint found and the fix; `--memory` sizes parse; a config that marks checkpoint
//! regions also searches `remat = "marked"`.

use plan::hardware::Hardware;
use plan::search::{layouts, parse_bytes, search, SearchError, SearchOptions};
use plan::PlanOptions;
use train::config::TrainConfig;

/// The `this-cpu` profile as its file writes it (not measured: the same figures every run).
fn this_cpu() -> PlanOptions {
    PlanOptions::new(Hardware::built_in("this-cpu").unwrap(), "test")
}

#[test]
fn the_default_config_on_8_devices_ranks_fitting_layouts_by_step_time() {
    let limit = 21 << 20;
    let s = SearchOptions {
        devices: 8,
        memory_bytes: limit,
        top: 1000,
    };
    let found = search(&TrainConfig::default(), &this_cpu(), &s).unwrap();
    let c = &found.candidates;
    assert!(c.len() >= 6, "{} fit", c.len());
    assert_eq!(c.len(), found.fitting);
    // Some layouts need more than 21 MiB (no weight sharding, no remat on data=8).
    assert!(found.fitting < found.planned, "{found:?}");
    assert!(c.windows(2).all(|w| w[0].step_seconds <= w[1].step_seconds));
    for x in c {
        assert!(x.resident_bytes_per_device <= limit, "{x:?}");
        assert_eq!(x.data * x.expert * x.model, 8);
        assert!(x.step_seconds > 0.0 && !x.why.contains('\n'), "{x:?}");
    }
    let top = search(
        &TrainConfig::default(),
        &this_cpu(),
        &SearchOptions { top: 5, ..s },
    )
    .unwrap();
    assert_eq!(top.candidates.len(), 5);
    assert_eq!(top.candidates[0].mesh, c[0].mesh);
}

#[test]
fn a_limit_nothing_fits_is_a_one_line_error_naming_the_smallest_peak_and_the_fix() {
    let s = SearchOptions {
        devices: 2,
        memory_bytes: 1 << 20,
        top: 5,
    };
    let e = search(&TrainConfig::default(), &this_cpu(), &s).unwrap_err();
    assert!(matches!(e, SearchError::NoneFits { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("smallest found needs")
            && msg.contains("MiB")
            && msg.contains("--memory")
            && !msg.contains('\n'),
        "{msg}"
    );
}

#[test]
fn marked_is_searched_when_the_config_marks_sublayers() {
    let remats = |c: &TrainConfig| {
        let mut r: Vec<String> = layouts(c, 2).into_iter().map(|c| c.model.remat).collect();
        r.sort();
        r.dedup();
        r
    };
    let mut cfg = TrainConfig::default();
    assert_eq!(remats(&cfg), ["dots", "layer", "none"]);
    cfg.model.checkpoint = vec!["ffn".into()];
    assert_eq!(remats(&cfg), ["dots", "layer", "marked", "none"]);
    // A marked layout is valid wherever its twin without remat is.
    for c in layouts(&cfg, 2) {
        let mut twin = c.clone();
        twin.model.remat = "none".into();
        assert_eq!(
            c.validate().is_ok(),
            twin.validate().is_ok(),
            "{}",
            c.model.remat
        );
    }
}

#[test]
fn memory_sizes_parse_in_decimal_and_binary_units() {
    assert_eq!(parse_bytes("16GiB"), Ok(16 << 30));
    assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
    assert_eq!(parse_bytes("4096"), Ok(4096));
    let e = parse_bytes("lots").unwrap_err();
    assert!(e.contains("16GiB") && !e.contains('\n'), "{e}");
}
