//! Peak memory of saving and loading a sharded checkpoint of a 1 GiB state, as the process's
//! high-water mark (`VmHWM` in /proc/self/status). Run in release, one phase per process
//! (the mark never falls):
//!
//! ```text
//! cargo run --release -p train --example checkpoint_memory -- save /tmp/ck
//! cargo run --release -p train --example checkpoint_memory -- load /tmp/ck
//! ```
//!
//! `save` builds the state of 8 devices (mesh data=2 x expert=4) of one f32 tensor of
//! 8192 x 32768 (1 GiB) split over both axes plus a small replicated one, and saves it;
//! `load` reads it onto 4 devices (data=4: each device 256 MiB, from parts of two saved
//! shards). Each prints the state's size and the mark before and after.

use ir::{DType, Mesh, Sharding, Type};
use runtime::{HostTensor, InProcess};
use spmd::IoLayout;
use std::borrow::Cow;
use std::path::Path;
use train::checkpoint::{self, CheckpointError, SaveRequest, ShardedReader};

const ROWS: usize = 8192;
const COLS: usize = 32768;

/// The process's peak resident memory so far, in bytes.
fn peak() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
}

fn layouts(split_cols: bool) -> Vec<IoLayout> {
    let big = if split_cols {
        Sharding::from_dims(&[&["data"][..], &["expert"][..]])
    } else {
        Sharding::from_dims(&[&["data"][..], &[][..]])
    };
    vec![
        IoLayout {
            name: "w".into(),
            global: Type::new(DType::F32, vec![ROWS, COLS]),
            sharding: big,
        },
        IoLayout {
            name: "b".into(),
            global: Type::new(DType::F32, vec![COLS]),
            sharding: Sharding::replicated(1),
        },
    ]
}

/// The value of element `(r, c)` of `name` (so a load can be checked).
fn value(name: &str, r: usize, c: usize) -> f32 {
    let k = if name == "w" { 1.0 } else { 2.0 };
    k * ((r * 31 + c * 7) % 1000) as f32
}

fn save(dir: &Path) -> Result<(), CheckpointError> {
    let mesh = Mesh::new(&[("data", 2), ("expert", 4)]).expect("a mesh");
    let layouts = layouts(true);
    let before = peak();
    let state: Vec<Vec<HostTensor>> = (0..mesh.num_devices())
        .map(|pos| {
            layouts
                .iter()
                .map(|l| {
                    let block = driver::block(l, &mesh, pos);
                    let shape: Vec<usize> = block.iter().map(|b| b.len).collect();
                    let n: usize = shape.iter().product();
                    let cols = *shape.last().unwrap_or(&1);
                    let values = (0..n)
                        .map(|i| {
                            let (r, c) = if block.len() == 2 {
                                (block[0].offset + i / cols, block[1].offset + i % cols)
                            } else {
                                (0, block[0].offset + i)
                            };
                            value(&l.name, r, c)
                        })
                        .collect();
                    HostTensor::from_f32(shape, values)
                })
                .collect()
        })
        .collect();
    let bytes: usize = state.iter().flatten().map(|t| t.size_bytes()).sum();
    let with_state = peak();
    let comm = InProcess::new(mesh.num_devices());
    let req = SaveRequest {
        dir,
        step: 1,
        generation: 1,
        config: "",
        mesh: &mesh,
        layouts: &layouts,
        crash_at: None,
    };
    let get = |j: usize, l: &IoLayout| -> Result<Cow<'_, HostTensor>, CheckpointError> {
        let i = layouts.iter().position(|x| x.name == l.name).unwrap_or(0);
        Ok(Cow::Borrowed(&state[j][i]))
    };
    let t0 = std::time::Instant::now();
    let m = checkpoint::save_sharded(&req, &comm, &get)?;
    let secs = t0.elapsed().as_secs_f64();
    let after = peak();
    println!(
        "save: state {} on 8 devices, {} written in {secs:.1} s; peak before the state {}, with it {}, after the save {} (the save added {})",
        mib(bytes as u64),
        mib(m.total_bytes()),
        mib(before),
        mib(with_state),
        mib(after),
        mib(after - with_state)
    );
    Ok(())
}

fn load(dir: &Path) -> Result<(), CheckpointError> {
    let mesh = Mesh::new(&[("data", 4)]).expect("a mesh");
    let layouts = layouts(false);
    let before = peak();
    let reader = ShardedReader::open(dir)?;
    let t0 = std::time::Instant::now();
    let mut state = Vec::new();
    let mut bytes = 0;
    for pos in 0..mesh.num_devices() {
        for l in &layouts {
            let block = driver::block(l, &mesh, pos);
            let t = reader.read_block(&l.name, &block)?;
            bytes += t.size_bytes();
            // Spot checks against the values saved.
            let v = t.as_f32().unwrap_or(&[]);
            let cols = *t.ty.shape.last().unwrap_or(&1);
            for i in [0, v.len() / 2, v.len().saturating_sub(1)] {
                let (r, c) = if block.len() == 2 {
                    (block[0].offset + i / cols, i % cols)
                } else {
                    (0, i)
                };
                assert_eq!(v[i], value(&l.name, r, c), "{} at {i}", l.name);
            }
            state.push(t);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = peak();
    println!(
        "load: state {} on 4 devices read in {secs:.1} s; peak before {}, after the load {} (above the state: {})",
        mib(bytes as u64),
        mib(before),
        mib(after),
        mib(after.saturating_sub(before + bytes as u64))
    );
    drop(state);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(
        args.get(2)
            .map_or("/tmp/gshard-checkpoint-memory", String::as_str),
    );
    let r = match args.get(1).map(String::as_str) {
        Some("save") => {
            let _ = std::fs::remove_dir_all(dir);
            save(dir)
        }
        Some("load") => load(dir),
        _ => {
            eprintln!("usage: checkpoint_memory save|load [DIR]");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
