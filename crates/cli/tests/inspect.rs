//! `gshard inspect` explains a partitioned program: `--why` flags the full gather that a
//! bad annotation causes and names the fix; `--json` gives every collective of the exported
//! MoE layer its scope and cause; `--draw` writes a value's layout as a PNG; the exported
//! training step round-trips through text with its scopes and every collective has a cause.

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

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-inspect-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn why_flags_the_gather_a_bad_annotation_causes() {
    let out = gshard(&[
        "inspect",
        "examples/bad_annotation.gsir",
        "--why",
        "--no-program",
    ]);
    assert!(out.contains("## mlp/layer0: 1 collectives"), "{out}");
    assert!(
        out.contains(
            "! involuntary full gather of f32[64,64] (16.00 KiB): the annotation {data, _} of \
             %1 parameter \"w\" at mlp/layer0 splits it; annotate %1 {_, _} (at mlp/layer0) \
             to avoid it"
        ),
        "{out}"
    );
    assert!(
        out.contains("serves %2 dot_general: operand 1 (%1)"),
        "{out}"
    );
    // The summary by scope: per device, the dot (2 * 256 * 64 * 64) and the ReLU (256 * 64).
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("mlp/layer0 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("2.11 M"), "{row}");
}

#[test]
fn json_gives_every_collective_of_the_moe_layer_a_scope_and_a_cause() {
    let dir = tmp("moe");
    let prog = dir.join("moe.gsir");
    let p = prog.to_str().unwrap();
    gshard(&[
        "export",
        "moe-layer",
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
        "4",
        "-o",
        p,
    ]);
    let v: serde_json::Value = serde_json::from_str(&gshard(&[
        "inspect",
        p,
        "--mesh",
        "expert=4",
        "--json",
        "--no-program",
    ]))
    .unwrap();
    let colls = v["collectives"].as_array().unwrap();
    assert!(!colls.is_empty());
    let mut a2a = Vec::new();
    for c in colls {
        let scope = c["scope"].as_str().unwrap();
        assert!(scope.starts_with("moe/") || scope == "loss", "{c}");
        assert!(c["cause"].is_object(), "{c}");
        assert!(c["cause"]["serves"].is_u64(), "{c}");
        assert!(
            !c["cause"]["required"].as_array().unwrap().is_empty(),
            "{c}"
        );
        if c["kind"] == "all-to-all" {
            a2a.push((scope.to_string(), c["grad"].as_bool().unwrap()));
        }
    }
    a2a.sort();
    let want: Vec<(String, bool)> = ["moe/combine", "moe/dispatch"]
        .iter()
        .flat_map(|s| [(s.to_string(), false), (s.to_string(), true)])
        .collect();
    assert_eq!(a2a, want);
    let rows = v["summary"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["scope"] == "moe"), "{rows:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn draw_writes_the_layout_of_a_parameter() {
    let dir = tmp("draw");
    let png = dir.join("w.png");
    let out = gshard(&[
        "inspect",
        "examples/bad_annotation.gsir",
        "--draw",
        "w",
        "--out",
        png.to_str().unwrap(),
    ]);
    assert!(
        out.contains("w f32[64,64] {data, _} on mesh [data=4]"),
        "{out}"
    );
    for k in 0..4 {
        assert!(
            out.contains(&format!("tile [{k},0] on devices {k}\n")),
            "{out}"
        );
    }
    assert_eq!(&std::fs::read(&png).unwrap()[1..4], b"PNG");
    let err = Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(["inspect", "examples/bad_annotation.gsir", "--draw", "nope"])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(err.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&err.stderr).contains("no parameter or output named `nope`"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_exported_training_step_explains_every_collective() {
    let dir = tmp("step");
    let prog = dir.join("step.gsir");
    let p = prog.to_str().unwrap();
    gshard(&["export", "train-step", "--vocab", "256", "-o", p]);
    let text = std::fs::read_to_string(&prog).unwrap();
    assert!(
        text.contains("\"decoder/layer1/moe/dispatch\" grad"),
        "scopes are printed"
    );
    let out = gshard(&["inspect", p, "--why", "--no-program"]);
    assert!(out.contains("# why each collective: "), "{out}");
    assert!(!out.contains("cause unknown"), "{out}");
    // No collective sits at the top level (a cause's chain may still start at a data input,
    // which is created outside any scope).
    assert!(!out.contains("## (top level)"), "{out}");
    for line in out.lines().filter(|l| l.starts_with("  %")) {
        assert!(!line.contains("at (top level)"), "{line}");
    }
    assert!(out.contains("## decoder/layer1: "), "{out}");
    assert!(out.contains("## optimizer/"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
