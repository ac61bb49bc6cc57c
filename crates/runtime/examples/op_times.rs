//! Per-op times of a program run many times on hot data: the floor an op's in-situ time
//! (from `gshard bench moe-layer --profile`) is compared with, to tell a slow kernel from a
//! cold operand.
//!
//! Usage: `cargo run --release -p runtime --example op_times -- PROGRAM.gsir [RUNS]`.
//! The program is in text form on a one-device mesh (or none); every parameter must be f32
//! and gets uniform values in `[-0.5, 0.5)`. Cut a piece out of a per-device program
//! (`--program-out`) and declare the values it reads as parameters. Prints the fastest and
//! the median time of each op over the runs (the first three are left out as warm-up), on
//! the calling thread's rayon pool (`taskset -c 0` for one thread).

use runtime::{Executable, HostTensor, InProcess, Profiler};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Tensor buffers on cache-line boundaries, as in the `gshard` binary.
#[global_allocator]
static ALLOC: runtime::LineAligned = runtime::LineAligned;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        return Err("usage: op_times PROGRAM.gsir [RUNS]".into());
    };
    let runs: usize = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("RUNS {s:?}: {e}"))?,
        None => 200,
    };
    let src = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let program = ir::text::parse(&src).map_err(|e| format!("{path}: {e:?}"))?;
    let exe = Executable::new(&program)?;
    let mut inputs = HashMap::new();
    let mut state = 12345u32;
    for instr in &program.instrs {
        if let ir::Op::Parameter { name } = &instr.op {
            if instr.ty.dtype != ir::DType::F32 {
                return Err(format!(
                    "parameter {name:?} is {:?}; only f32 ones are filled",
                    instr.ty.dtype
                )
                .into());
            }
            let n: usize = instr.ty.shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as f32 / u32::MAX as f32 - 0.5
                })
                .collect();
            let t = HostTensor::from_f32(instr.ty.shape.clone(), values);
            inputs.insert(name.clone(), Arc::new(t));
        }
    }
    let inputs = vec![inputs];
    let comm = InProcess::new(1);
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in 0..runs + 3 {
        let prof = Profiler::new();
        let res = exe.run_shared(&comm, &inputs, Some(&prof))?;
        // Outputs back to the pools, as repeated steps do (else each run faults in pages).
        exe.recycle(res.outputs);
        if run >= 3 {
            for e in prof.events() {
                times.entry(e.name).or_default().push(e.dur_us);
            }
        }
    }
    let mut rows: Vec<(f64, f64, String)> = times
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            (v[0], v[v.len() / 2], name)
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("{:>10} {:>10}  op", "min us", "median us");
    for (min, median, name) in rows {
        println!("{min:10.1} {median:10.1}  {name}");
    }
    Ok(())
}
