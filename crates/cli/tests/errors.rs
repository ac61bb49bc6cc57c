//! Bad input never panics: each case is one line on stderr naming the thing, exit code 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gshard(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// Assert exit code 2 and a single `error:` line containing every `needle`.
fn assert_error(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` missing from: {err}");
    }
}

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("gshard-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[test]
fn malformed_program_reports_line_and_column() {
    let d = TempDir::new("malformed");
    std::fs::write(
        d.0.join("bad.gsir"),
        "%x = f32[2] parameter(\"x\")\n%y = f32[2] frobnicate(%x)\n",
    )
    .unwrap();
    let out = gshard(&["run", "bad.gsir"], &d.0);
    assert_error(&out, &["bad.gsir", "line 2", "column", "frobnicate"]);
}

#[test]
fn missing_parameter_is_named() {
    let d = TempDir::new("missing");
    std::fs::write(
        d.0.join("p.gsir"),
        "%q = f32[2] parameter(\"q\")\noutput \"z\" = %q\n",
    )
    .unwrap();
    let inputs = root().join("examples/mlp_inputs.safetensors");
    let out = gshard(
        &["run", "p.gsir", "--inputs", inputs.to_str().unwrap()],
        &d.0,
    );
    assert_error(&out, &["`q`", "f32[2]", "missing"]);
}

#[test]
fn mistyped_parameter_is_named() {
    let d = TempDir::new("mistyped");
    std::fs::write(
        d.0.join("p.gsir"),
        "%x = f32[3,3] parameter(\"x\")\noutput \"x\" = %x\n",
    )
    .unwrap();
    let inputs = root().join("examples/mlp_inputs.safetensors");
    let out = gshard(
        &["run", "p.gsir", "--inputs", inputs.to_str().unwrap()],
        &d.0,
    );
    assert_error(&out, &["`x`", "f32[3,3]", "f32[4,3]"]);
}

#[test]
fn corrupt_and_truncated_safetensors_are_rejected() {
    let d = TempDir::new("corrupt");
    let good = std::fs::read(root().join("examples/mlp_inputs.safetensors")).unwrap();
    std::fs::write(d.0.join("trunc.safetensors"), &good[..good.len() / 2]).unwrap();
    std::fs::write(
        d.0.join("garbage.safetensors"),
        b"this is not a safetensors file at all",
    )
    .unwrap();
    let prog = root().join("examples/mlp.gsir");
    for f in ["trunc.safetensors", "garbage.safetensors"] {
        let out = gshard(&["run", prog.to_str().unwrap(), "--inputs", f], &d.0);
        assert_error(&out, &[f, "safetensors"]);
    }
    let out = gshard(
        &[
            "run",
            prog.to_str().unwrap(),
            "--inputs",
            "nope.safetensors",
        ],
        &d.0,
    );
    assert_error(&out, &["nope.safetensors"]);
}

#[test]
fn fmt_check_and_missing_file() {
    let d = TempDir::new("fmt");
    let out = gshard(&["fmt", "absent.gsir"], &d.0);
    assert_error(&out, &["absent.gsir"]);
    std::fs::write(
        d.0.join("p.gsir"),
        "%x = f32[2] parameter(\"x\")   # comment\noutput \"x\" = %x\n",
    )
    .unwrap();
    let out = gshard(&["fmt", "--check", "p.gsir"], &d.0);
    assert_error(&out, &["canonical"]);
    // `--write` would drop the comment: refused, the file unchanged.
    let out = gshard(&["fmt", "--write", "p.gsir"], &d.0);
    assert_error(&out, &["comments"]);
    std::fs::write(
        d.0.join("p.gsir"),
        "%0 = f32[2] parameter(\"x\")\noutput   \"x\" = %0\n",
    )
    .unwrap();
    let out = gshard(&["fmt", "--write", "p.gsir"], &d.0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = gshard(&["fmt", "--check", "p.gsir"], &d.0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
