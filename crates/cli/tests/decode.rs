//! `gshard translate` and `gshard eval` on a trained tiny run: sentences from the command
//! line or one per stdin line (one translation per line), the same translations with
//! `--decode full` (the whole-model re-decode) as with the default incremental decoder, and
//! the test split's loss and BLEU.

mod common;

use common::{gshard, tiny_setup};
use std::io::Write;
use std::process::{Command, Stdio};

/// `gshard translate` with `stdin` on its standard input: (exit success, stdout, stderr).
fn translate_stdin(args: &[&str], stdin: &str, cwd: &std::path::Path) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gshard"))
        .arg("translate")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn translate_reads_stdin_and_both_decoders_agree_and_eval_reads_the_test_split() {
    let d = tiny_setup("decode", "");
    let out = gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run", "--steps", "30",
        ],
        &d.0,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = "eins zwei rot\nblau Hund\n\ndrei Katze vier fünf\n";
    for beam in ["1", "2"] {
        let mut outputs = Vec::new();
        for decode in ["incremental", "full"] {
            let args = [
                "--run", "run", "--lang", "de", "--beam", beam, "--decode", decode,
            ];
            let (ok, stdout, stderr) = translate_stdin(&args, lines, &d.0);
            assert!(ok, "beam {beam}, {decode}: {stderr}");
            assert_eq!(
                stdout.lines().count(),
                lines.lines().count(),
                "beam {beam}, {decode}: one translation per input line: {stdout:?}"
            );
            outputs.push(stdout);
        }
        assert_eq!(outputs[0], outputs[1], "beam {beam}");
        // The same sentences as arguments translate the same way.
        let mut args = vec!["translate", "--run", "run", "--lang", "de", "--beam", beam];
        args.extend(lines.lines());
        let out = gshard(&args, &d.0);
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), outputs[0]);
    }
    let out = gshard(
        &["eval", "--run", "run", "--split", "test", "--limit", "20"],
        &d.0,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(test split"), "{stdout}");
    assert!(stdout.contains("loss "), "{stdout}");
}
