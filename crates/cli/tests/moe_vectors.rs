//! `gshard export moe-layer` + `gshard run` reproduce every JAX vector file in
//! `$GSHARD_MOE_VECTORS`, or else ../shared/testdata/moe-top2 (CI's copy), as
//! `bench/jax/vectors.py` writes them (floats at rtol/atol 1e-5 in f32 and 1e-10 in f64,
//! routing exactly), on one device and partitioned over `expert=2` and `expert=4` where the
//! shapes divide. Skips with a notice when there is no such directory.

use runtime::HostTensor;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gshard(args: &[&str]) {
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
}

fn read(path: &Path) -> (HashMap<String, HostTensor>, HashMap<String, String>) {
    let (ts, meta) = runtime::io::read_safetensors(&std::fs::read(path).unwrap()).unwrap();
    (ts.into_iter().collect(), meta.unwrap_or_default())
}

fn meta_num(meta: &HashMap<String, String>, k: &str) -> String {
    meta.get(k)
        .unwrap_or_else(|| panic!("metadata {k}"))
        .trim_matches('"')
        .to_string()
}

#[test]
fn moe_layer_matches_jax_vectors() {
    let dir = std::env::var_os("GSHARD_MOE_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/testdata/moe-top2"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!(
            "NOTICE: {} is absent; skipping the JAX vector comparison",
            dir.display()
        );
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vector files in {}", dir.display());
    let tmp = std::env::temp_dir().join(format!("gshard-moe-vectors-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut checked = 0;
    for file in &files {
        let (want, meta) = read(file);
        let get = |k: &str| meta_num(&meta, k);
        let (g, e): (usize, usize) = (get("G").parse().unwrap(), get("E").parse().unwrap());
        let dtype = get("dtype");
        let prog = tmp.join(format!(
            "{}.gsir",
            file.file_stem().unwrap().to_string_lossy()
        ));
        let prog_s = prog.to_str().unwrap();
        let (gs, s, m, h, c, pol, act) = (
            get("G"),
            get("S"),
            get("M"),
            get("H"),
            get("C"),
            get("policy"),
            get("activation"),
        );
        let thr = match get("threshold").as_str() {
            "null" => "0.5".to_string(),
            t => t.to_string(),
        };
        gshard(&[
            "export",
            "moe-layer",
            "--groups",
            &gs,
            "--group-size",
            &s,
            "--experts",
            &get("E"),
            "--model-dim",
            &m,
            "--hidden-dim",
            &h,
            "--capacity",
            &c,
            "--policy",
            &pol,
            "--threshold",
            &thr,
            "--activation",
            &act.replace('_', "-"),
            "--dtype",
            &dtype,
            "-o",
            prog_s,
        ]);
        let tol = if dtype == "f64" { 1e-10 } else { 1e-5 };
        for d in [1usize, 2, 4] {
            if g % d != 0 || e % d != 0 {
                continue;
            }
            let out = tmp.join(format!("out{d}.safetensors"));
            let mesh = format!("expert={d}");
            gshard(&[
                "run",
                prog_s,
                "--inputs",
                file.to_str().unwrap(),
                "--mesh",
                &mesh,
                "--out",
                out.to_str().unwrap(),
            ]);
            let (got, _) = read(&out);
            let mut compared = 0;
            for (name, w) in &want {
                let Some(gv) = got.get(name) else { continue };
                compared += 1;
                assert_eq!(gv.ty, w.ty, "{}: {name} on {mesh}", file.display());
                let exact = !w.dtype().is_float() || ["dispatch"].contains(&name.as_str());
                for (i, (a, b)) in gv.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                    let ok = if exact {
                        *a == b
                    } else {
                        (a - b).abs() <= tol + tol * b.abs()
                    };
                    assert!(
                        ok,
                        "{}: {name}[{i}] = {a}, JAX {b} (mesh {mesh})",
                        file.display()
                    );
                }
            }
            // The routing, the expert buffers, the outputs and the gradients: all compared.
            assert!(
                compared >= 17,
                "{}: only {compared} tensors compared",
                file.display()
            );
            checked += 1;
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
    assert!(
        checked >= files.len(),
        "checked {checked} runs for {} files",
        files.len()
    );
}
