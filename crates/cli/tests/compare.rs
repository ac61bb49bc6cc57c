//! `gshard compare` on a tiny corpus: every model (dense, flat MoE, hierarchical MoE) is
//! trained once per seed in a directory of its own, and the table gives mean ± standard
//! deviation over the seeds, the parameters and FLOPs per token, and its verdict on which
//! differences exceed their error bars.

mod common;

use common::*;

#[test]
fn compare_trains_every_model_with_every_seed_and_prints_error_bars() {
    let d = tiny_setup("compare", "");
    let out = gshard(
        &[
            "compare",
            "--config",
            "run.toml",
            "--data",
            "data",
            "--steps",
            "2",
            "--seeds",
            "2",
            "--experts",
            "0,4,2x2",
            "--out",
            "cmp",
        ],
        &d.0,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (model, seed) in [("dense", 1), ("dense", 2), ("moe4", 2), ("moe2x2", 1)] {
        let dir = d.path(&format!("cmp/{model}/seed{seed}"));
        assert!(dir.join("metrics.jsonl").is_file(), "{}", dir.display());
    }
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    let cells = |name: &str| -> Vec<String> {
        let line = rows
            .iter()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row {name}: {stdout}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    let (dense, moe, hier) = (cells("dense"), cells("moe4"), cells("moe2x2"));
    assert_eq!(hier[2], "4 (2 groups of 2)");
    // More experts of the same size: more parameters, about the same work per token.
    let params = |c: &[String]| c[3].parse::<usize>().unwrap();
    assert!(params(&moe) > params(&dense) && params(&hier) > params(&dense));
    let flops = |c: &[String]| c[4].parse::<f64>().unwrap();
    assert!(flops(&dense) > 0.0 && flops(&moe) > 0.0);
    // Dev loss as mean ± std over two seeds; two different seeds give different losses.
    let (mean, std) = dense[5].split_once(" ± ").unwrap();
    assert!(mean.parse::<f64>().unwrap() > 0.0);
    assert!(std.parse::<f64>().unwrap() > 0.0, "{}", dense[5]);
    assert!(stdout.contains("over 2 seed(s)"), "{stdout}");
    assert!(
        stdout.contains("differences larger than their error bars"),
        "{stdout}"
    );

    // Bad input: one line naming the flag.
    let bad = gshard(&["compare", "--experts", "8y"], &d.0);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--experts") && err.contains("8x8"), "{err}");
}
