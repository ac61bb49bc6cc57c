//! Inputs that cannot crash the binary, and messages that say what is wrong: each case of
//! bad configs, files and flags ends in one `error:` line that names the thing and the fix
//! (exit code 2), never a panic, an abort or a misleading hint.

mod common;

use common::*;

/// `gshard train` on the tiny corpus with `extra` TOML appended to the tiny config.
fn train_with(tag: &str, extra: &str) -> std::process::Output {
    let d = tiny_setup(tag, "");
    // Appended settings go into the tables they name, so write the whole file anew.
    let cfg = merge(TINY, extra);
    std::fs::write(d.path("run.toml"), cfg).unwrap();
    gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run",
        ],
        &d.0,
    )
}

/// `base` with the `table.key = value` lines of `extra` set in their tables (replacing a
/// line of the same key there, else added to the table).
fn merge(base: &str, extra: &str) -> String {
    let mut lines: Vec<String> = base.lines().map(str::to_string).collect();
    for setting in extra.lines().filter(|l| !l.trim().is_empty()) {
        let (path, value) = setting.split_once('=').unwrap();
        let (table, key) = path.trim().rsplit_once('.').unwrap_or(("", path.trim()));
        let kv = format!("{key} = {}", value.trim());
        // The table's lines: after its header (or from the top) to the next header.
        let start = if table.is_empty() {
            0
        } else {
            match lines.iter().position(|l| *l == format!("[{table}]")) {
                Some(i) => i + 1,
                None => {
                    lines.push(format!("[{table}]"));
                    lines.len()
                }
            }
        };
        let end = (start..lines.len())
            .find(|&i| lines[i].starts_with('['))
            .unwrap_or(lines.len());
        match (start..end).find(|&i| lines[i].split('=').next().unwrap().trim() == key) {
            Some(i) => lines[i] = kv,
            None => lines.insert(start, kv),
        }
    }
    lines.join("\n") + "\n"
}

#[test]
fn config_values_out_of_range_are_one_line_errors() {
    for (i, (setting, needles)) in [
        (
            "model.capacity_factor = -1.0",
            &["model.capacity_factor", "-1"][..],
        ),
        (
            "model.capacity_factor = nan",
            &["model.capacity_factor", "NaN"],
        ),
        (
            "model.capacity_factor = inf",
            &["model.capacity_factor", "inf"],
        ),
        (
            "data.batch_size = 0",
            &["data.batch_size = 0", "at least one"],
        ),
        ("data.max_langs = 0", &["data.max_langs = 0", "from 1"]),
        ("data.dev_size = 0", &["data.dev_size = 0", "from 1"]),
        (
            "data.vocab_size = 100000000",
            &["data.vocab_size = 100000000"],
        ),
        ("eval.beam = 0", &["eval.beam = 0", "greedy"]),
        ("nonfinite_limit = 0", &["nonfinite_limit = 0"]),
        ("mesh.expert = 10000000", &["more than", "devices"]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = train_with(&format!("range{i}"), setting);
        assert_fails(&out, needles);
    }
}

#[test]
fn a_model_too_big_for_this_host_is_refused_before_it_allocates() {
    let out = train_with(
        "toobig",
        "model.model_dim = 1000000\nmodel.ffn_dim = 1000000",
    );
    assert_fails(
        &out,
        &[
            "needs about",
            "TiB",
            "available",
            "biggest tensors",
            "--max-memory",
        ],
    );
    // --max-memory sets the limit.
    let d = tiny_setup("maxmem", "");
    let out = gshard(
        &[
            "train",
            "--config",
            "run.toml",
            "--data",
            "data",
            "--out",
            "run",
            "--max-memory",
            "1M",
        ],
        &d.0,
    );
    assert_fails(&out, &["needs about", "--max-memory allows 1.0 MiB"]);
}

#[test]
fn a_zero_capacity_factor_warns() {
    let d = tiny_setup("cf0", "");
    std::fs::write(
        d.path("run.toml"),
        merge(TINY, "model.capacity_factor = 0.0\nsteps = 1"),
    )
    .unwrap();
    let out = gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run",
        ],
        &d.0,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: model.capacity_factor = 0") && l.contains("dropped")),
        "{err}"
    );
}

#[test]
fn a_partial_learning_rate_table_keeps_the_main_jobs_other_settings() {
    let d = tiny_setup("lr", "");
    std::fs::write(
        d.path("run.toml"),
        format!("{TINY}\n[optimizer.lr]\nbase = 0.5\n"),
    )
    .unwrap();
    let out = gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run", "--steps", "1",
        ],
        &d.0,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(d.path("run/config.toml")).unwrap();
    let cfg = train::config::TrainConfig::from_toml(&written, "config.toml").unwrap();
    let lr = cfg.optimizer.lr();
    assert_eq!(
        *lr,
        train::optim::LrSchedule::Rsqrt {
            base: 0.5,
            warmup_steps: 100,
            linear_warmup: false,
            cooldown: 0.3,
        }
    );
}

#[test]
fn an_empty_corpus_directory_suggests_the_data_directory() {
    let d = TempDir::new("emptycorpus");
    std::fs::create_dir_all(d.path("data/parallel")).unwrap();
    let out = gshard(&["train", "--data", "data", "--out", "run"], &d.0);
    assert_fails(&out, &["gshard data --out data`"]);
    assert!(!last_err_line(&out).contains("--out data/parallel"));
}

#[test]
fn eval_translate_and_files_refuse_bad_values_with_the_file_named() {
    let d = tiny_setup("evalbad", "");
    let out = gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run", "--steps", "1",
        ],
        &d.0,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        &["eval", "--run", "run", "--limit", "0"][..],
        &[
            "translate",
            "--run",
            "run",
            "--lang",
            "de",
            "--beam",
            "0",
            "eins",
        ],
    ] {
        let out = gshard(args, &d.0);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("0 is not in 1.."), "{args:?}: {err}");
    }
    std::fs::write(d.path("run/tokenizer.json"), "{ garbage").unwrap();
    let out = gshard(&["translate", "--run", "run", "--lang", "de", "eins"], &d.0);
    assert_fails(&out, &["tokenizer.json", "not a usable tokenizer"]);
}

#[test]
fn safetensors_errors_say_their_cause_once() {
    let d = TempDir::new("st-once");
    std::fs::write(
        d.path("p.gsir"),
        "%x = f32[2] parameter(\"x\")\n%y = f32[2] add(%x, %x)\n",
    )
    .unwrap();
    std::fs::write(d.path("in.safetensors"), b"abc").unwrap();
    let out = gshard(&["run", "p.gsir", "--inputs", "in.safetensors"], &d.0);
    assert_fails(&out, &["in.safetensors"]);
    let line = last_err_line(&out);
    let words: Vec<&str> = line.split(": ").collect();
    let mut dedup = words.clone();
    dedup.dedup();
    assert_eq!(words, dedup, "a cause repeats itself: {line}");
}

#[test]
fn run_out_to_a_directory_is_refused_and_leaves_nothing() {
    let d = TempDir::new("run-out-dir");
    std::fs::write(
        d.path("p.gsir"),
        "%x = f32[2] parameter(\"x\")\n%y = f32[2] add(%x, %x)\n",
    )
    .unwrap();
    let out = gshard(&["init", "p.gsir", "--out", "in.safetensors"], &d.0);
    assert!(out.status.success());
    std::fs::create_dir_all(d.path("outdir")).unwrap();
    let out = gshard(
        &[
            "run",
            "p.gsir",
            "--inputs",
            "in.safetensors",
            "--out",
            "outdir",
        ],
        &d.0,
    );
    assert_fails(&out, &["outdir is a directory", "outdir/out.safetensors"]);
    let names: Vec<String> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".tmp")), "{names:?}");
}

#[test]
fn fmt_write_keeps_names_and_comments_or_refuses() {
    let d = TempDir::new("fmt-write");
    let src = "# doubles x\n%x = f32[2] parameter(\"x\")\n%y = f32[2]   add(%x, %x)\n";
    std::fs::write(d.path("p.gsir"), src).unwrap();
    let out = gshard(&["fmt", "p.gsir", "--write"], &d.0);
    assert_fails(&out, &["p.gsir", "not rewritten", "comments", "line 1"]);
    assert_eq!(std::fs::read_to_string(d.path("p.gsir")).unwrap(), src);
    let src = "%x = f32[2] parameter(\"x\")\n%y = f32[2]   add(%x, %x)\n";
    std::fs::write(d.path("p.gsir"), src).unwrap();
    let out = gshard(&["fmt", "p.gsir", "--write"], &d.0);
    assert_fails(&out, &["rename its values", "`%x` becomes `%0`"]);
    assert_eq!(std::fs::read_to_string(d.path("p.gsir")).unwrap(), src);
    // A canonical text with canonical names is rewritten (here: unchanged).
    let out = gshard(&["fmt", "p.gsir"], &d.0);
    let canonical = String::from_utf8_lossy(&out.stdout).into_owned();
    std::fs::write(d.path("c.gsir"), canonical.replace(" add", "   add")).unwrap();
    let out = gshard(&["fmt", "c.gsir", "--write"], &d.0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(d.path("c.gsir")).unwrap(),
        canonical
    );
}

#[test]
fn gelu_tanh_is_spelled_either_way() {
    let d = TempDir::new("gelu");
    for spelling in ["gelu_tanh", "gelu-tanh"] {
        let out = gshard(
            &[
                "export",
                "moe-layer",
                "--groups",
                "2",
                "--group-size",
                "8",
                "--experts",
                "2",
                "--model-dim",
                "4",
                "--hidden-dim",
                "8",
                "--capacity",
                "4",
                "--activation",
                spelling,
                "-o",
                "m.gsir",
            ],
            &d.0,
        );
        assert!(
            out.status.success(),
            "{spelling}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cfg = train::config::TrainConfig::from_toml("[model]\nactivation = \"gelu-tanh\"\n", "c")
        .unwrap();
    assert_eq!(cfg.model.activation, "gelu-tanh");
}

#[test]
fn init_and_run_of_a_program_too_big_for_this_host_are_refused() {
    let d = TempDir::new("huge-program");
    // 4 TiB: one f32 input of 2^40 elements.
    std::fs::write(
        d.path("huge.gsir"),
        "%x = f32[1099511627776] parameter(\"x\")\n%y = f32[1099511627776] add(%x, %x)\n",
    )
    .unwrap();
    let out = gshard(&["init", "huge.gsir", "--out", "in.safetensors"], &d.0);
    assert_fails(&out, &["needs about", "TiB", "`x` f32[1099511627776]"]);
    let out = gshard(&["run", "huge.gsir"], &d.0);
    assert_fails(&out, &["needs about", "TiB"]);
    let out = gshard(&["run", "huge.gsir", "--devices", "8"], &d.0);
    assert_fails(&out, &["needs about", "8 device(s)"]);
}

#[test]
fn more_devices_than_one_process_can_run_is_refused() {
    let d = TempDir::new("many-devices");
    std::fs::write(
        d.path("p.gsir"),
        "%x = f32[16] parameter(\"x\")\n%y = f32[16] add(%x, %x)\n",
    )
    .unwrap();
    let out = gshard(&["init", "p.gsir", "--out", "in.safetensors"], &d.0);
    assert!(out.status.success());
    let out = gshard(
        &[
            "run",
            "p.gsir",
            "--inputs",
            "in.safetensors",
            "--devices",
            "10000000",
        ],
        &d.0,
    );
    assert_fails(&out, &["10000000 devices", "at most 4096", "MPI"]);
    // A valid config for 8192 devices (a batch row and a group per device).
    let d = tiny_setup("many-devices-train", "");
    std::fs::write(
        d.path("run.toml"),
        merge(
            TINY,
            "data.batch_size = 8192\nmodel.group_size = 8\nmesh.data = 8192\nmesh.expert = 1",
        ),
    )
    .unwrap();
    let out = gshard(
        &[
            "train", "--config", "run.toml", "--data", "data", "--out", "run",
        ],
        &d.0,
    );
    assert_fails(&out, &["8192 devices", "at most 4096"]);
}

#[test]
fn a_sixty_thousand_op_chain_runs() {
    let d = TempDir::new("deep-chain");
    let mut src = String::from("%0 = f32[4] parameter(\"x\")\n");
    for i in 1..=60_000 {
        let op = if i % 2 == 0 { "neg" } else { "abs" };
        src.push_str(&format!("%{i} = f32[4] {op}(%{})\n", i - 1));
    }
    std::fs::write(d.path("deep.gsir"), src).unwrap();
    let out = gshard(&["init", "deep.gsir", "--out", "in.safetensors"], &d.0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for extra in [&[][..], &["--reference"], &["--devices", "2"]] {
        let mut args = vec!["run", "deep.gsir", "--inputs", "in.safetensors"];
        args.extend_from_slice(extra);
        let out = gshard(&args, &d.0);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_command_lines_mesh_applies_before_the_config_is_checked() {
    // 64 tokens a batch in groups of 16: 4 groups, which do not divide over 4 x 2 devices.
    let d = tiny_setup("mesh-first", "");
    let cfg = TINY.replace("data = 1\nexpert = 2", "data = 4\nexpert = 2");
    std::fs::write(d.path("run.toml"), cfg).unwrap();
    let train = |mesh: &[&str]| {
        let mut args = vec![
            "train", "--config", "run.toml", "--data", "data", "--out", "run",
        ];
        args.extend_from_slice(&["--steps", "1", "--overwrite"]);
        args.extend_from_slice(mesh);
        gshard(&args, &d.0)
    };
    assert_fails(&train(&[]), &["group_size = 16", "8 devices"]);
    let out = train(&["--mesh", "data=1,expert=2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
