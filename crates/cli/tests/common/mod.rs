//! Helpers for the CLI tests: a temporary directory, a tiny corpus on disk, a
//! tiny run config, running the binary, and launching ranks ([`mpi`]).

#![allow(dead_code)]

pub mod mpi;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("gshard-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// A corpus of word-by-word phrases in `DIR/parallel/{de,fr}.tsv` (French has more pairs,
/// so the corpus's language order differs from the alphabetical one).
pub fn tiny_corpus(dir: &Path) {
    let par = dir.join("parallel");
    std::fs::create_dir_all(&par).unwrap();
    let (mut de, mut fr) = (String::new(), String::new());
    for (i, p) in testkit::phrases::phrases(1200).iter().enumerate() {
        let split = match i % 20 {
            0 => "dev",
            1 => "test",
            _ => "train",
        };
        let line = |src: &str| format!("{split}\ttest\t{}\t{src}\n", p.en);
        if i % 3 != 0 {
            de.push_str(&line(&p.de));
        }
        fr.push_str(&line(&p.fr));
    }
    std::fs::write(par.join("de.tsv"), de).unwrap();
    std::fs::write(par.join("fr.tsv"), fr).unwrap();
}

/// A tiny model (1+1 layers, 4 experts on 2 devices) that trains in milliseconds a step.
pub const TINY: &str = r#"steps = 6
log_every = 1
eval_every = 0
checkpoint_every = 3

[mesh]
data = 1
expert = 2

[data]
batch_size = 8
max_len = 8
dev_size = 8
vocab_size = 300

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

[eval]
beam = 1
"#;

/// A directory with the tiny corpus in `data/` and `TINY` (plus `extra`) in `run.toml`.
pub fn tiny_setup(tag: &str, extra: &str) -> TempDir {
    let d = TempDir::new(tag);
    tiny_corpus(&d.path("data"));
    std::fs::write(d.path("run.toml"), format!("{TINY}{extra}")).unwrap();
    d
}

pub fn gshard(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// Start the binary with stderr piped.
pub fn spawn(args: &[&str], cwd: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gshard"))
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Read `child`'s stderr on a thread: lines arrive on the channel, the last of them when
/// the process ends.
pub fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let err = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Wait (up to a minute) for a line containing `needle`; the lines read so far.
pub fn wait_for(rx: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    return seen;
                }
            }
            Err(_) => panic!("no line with `{needle}` within a minute; got {seen:?}"),
        }
    }
}

/// Send `signal` (`INT`, `TERM`, `KILL`) to process `pid`.
pub fn kill(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid} failed");
}

/// The last line of stderr (the error line of a failed command).
pub fn last_err_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// Assert exit code 2 and a last stderr line `error: ...` containing every needle.
pub fn assert_fails(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    let line = last_err_line(out);
    assert!(line.starts_with("error: "), "{err}");
    for n in needles {
        assert!(line.contains(n), "`{n}` missing from: {line}");
    }
}

/// The step stored in a checkpoint (a sharded directory or a single file).
pub fn checkpoint_step(path: &Path) -> u64 {
    train::checkpoint::Source::open(path).unwrap().step()
}

/// Every file of a checkpoint directory with its bytes (a single file: itself).
pub fn checkpoint_bytes(path: &Path) -> Vec<(String, Vec<u8>)> {
    if !path.is_dir() {
        return vec![(String::new(), std::fs::read(path).unwrap())];
    }
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(path)
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
}
