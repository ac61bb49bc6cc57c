//! `gshard bench collectives`: all-to-all and all-reduce bandwidth of a backend, through the
//! same `Communicator::collective` call the executor makes.
//!
//! Each device holds an f32 operand of `--bytes`; one collective over all devices (1-D mesh
//! `x=N`) is timed per iteration, the median after warm-up is reported. With `--backend mpi`
//! (under `mpirun -np N`) each iteration's time is the slowest rank's. Bandwidth is per
//! device: the bytes one device sends to the others ([`ir::Op::wire_bytes`]: (N-1)/N of the
//! operand for all-to-all, 2(N-1)/N for all-reduce) over the time, plus the "algorithm
//! bandwidth" (operand bytes over time), the figure NCCL-style tools print.
//!
//! With MPI, each row also counts what the timed calls sent between hosts, summed over the
//! ranks, per call: messages and payload bytes (`--all-to-all two-level` makes fewer
//! messages of the same bytes; hosts as `--hosts` or the ranks' machine names say).

use crate::backend::{self, BackendArgs, Mpi};
use anyhow::{bail, Result};
use ir::{DType, Mesh, Op, ReduceOp, Type};
use runtime::{Communicator, HostTensor, InProcess};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct CollectiveBenchArgs {
    /// Devices (in-process backend; with `--backend mpi` the device count is the rank count).
    #[arg(long, default_value_t = 4)]
    devices: usize,
    /// Operand sizes per device in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1048576,16777216")]
    bytes: Vec<usize>,
    /// Collectives to time, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "all-to-all,all-reduce"
    )]
    ops: Vec<BenchOp>,
    /// Timed iterations per size and collective (the median is reported).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

/// A collective the bench times.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BenchOp {
    AllToAll,
    AllReduce,
}

pub fn main(a: CollectiveBenchArgs) -> Result<()> {
    let b = a.backend.clone();
    backend::with_backend(&b, |mpi| bench(&a, mpi))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(a: &CollectiveBenchArgs, mpi: Mpi) -> Result<()> {
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    let (comm, name): (Arc<dyn Communicator>, &str) = match &mpi {
        Some(c) => (c.clone(), "mpi"),
        None => {
            if a.devices == 0 {
                bail!("--devices must be at least 1");
            }
            (Arc::new(InProcess::new(a.devices)), "inprocess")
        }
    };
    let n = match &mpi {
        Some(c) => c.size(),
        None => a.devices,
    };
    let root = backend::is_root(&mpi);
    let mesh = Mesh::new(&[("x", n)])?;
    let axes = vec!["x".to_string()];
    let ops: Vec<Op> = a
        .ops
        .iter()
        .map(|o| match o {
            BenchOp::AllToAll => Op::all_to_all(0, 0, axes.clone()),
            BenchOp::AllReduce => Op::all_reduce(ReduceOp::Sum, axes.clone()),
        })
        .collect();
    for &bytes in &a.bytes {
        // Whole f32 elements, divisible by the device count.
        let elems = (bytes / 4 / n).max(1) * n;
        let ty = Type::new(DType::F32, vec![elems]);
        for op in &ops {
            let mut times = Vec::with_capacity(a.iters);
            let mut before = runtime_mpi::Traffic::default();
            for it in 0..a.warmup + a.iters {
                if it == a.warmup {
                    before = traffic(&mpi);
                }
                let local: Vec<HostTensor> = comm
                    .local_positions()
                    .iter()
                    .map(|&p| HostTensor::from_f32(vec![elems], vec![p as f32 + 0.5; elems]))
                    .collect();
                let t0 = Instant::now();
                let out = comm.collective(0, op, &mesh, local)?;
                let dt = t0.elapsed().as_secs_f64();
                drop(out);
                if it >= a.warmup {
                    times.push(dt);
                }
            }
            let sent = traffic(&mpi);
            let mine_sent = [
                sent.inter_host_messages - before.inter_host_messages,
                sent.inter_host_bytes - before.inter_host_bytes,
            ];
            let all_sent =
                comm.all_gather_bytes(mine_sent.iter().flat_map(|v| v.to_le_bytes()).collect())?;
            let total = |i: usize| -> u64 {
                all_sent
                    .iter()
                    .filter_map(|b| b.get(8 * i..8 * i + 8))
                    .filter_map(|b| b.try_into().ok().map(u64::from_le_bytes))
                    .sum::<u64>()
            };
            let per_call = |i: usize| total(i) as f64 / a.iters as f64;
            let (messages, inter_bytes) = (per_call(0), per_call(1));
            // Per iteration, the slowest process.
            let mine: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
            let all = comm.all_gather_bytes(mine)?;
            let slowest: Vec<f64> = (0..times.len())
                .map(|i| {
                    all.iter()
                        .filter_map(|b| b.get(8 * i..8 * i + 8))
                        .filter_map(|b| b.try_into().ok().map(f64::from_le_bytes))
                        .fold(0.0, f64::max)
                })
                .collect();
            let t = median(slowest);
            let operand = ty.size_bytes();
            let wire = op.wire_bytes(operand, n);
            if root {
                let kind = op.name().replace('_', "-");
                if a.json {
                    println!(
                        "{}",
                        json!({
                            "backend": name, "op": kind, "devices": n, "bytes": operand,
                            "seconds": t, "wire_bytes_per_device": wire,
                            "gb_per_s_per_device": wire as f64 / t / 1e9,
                            "algbw_gb_per_s": operand as f64 / t / 1e9,
                            "all_to_all": a.backend.all_to_all_name(),
                            "compress": a.backend.compress_names(),
                            "inter_host_messages_per_call": messages,
                            "inter_host_bytes_per_call": inter_bytes,
                        })
                    );
                } else {
                    println!(
                        "{name:<9} {kind:<10} {n:>3} devices  {:>10} per device  {:>9.3} ms  {:>7.2} GB/s sent per device  (algbw {:.2} GB/s){}",
                        crate::cmd::inspect::human_bytes(operand),
                        t * 1e3,
                        wire as f64 / t / 1e9,
                        operand as f64 / t / 1e9,
                        if mpi.is_some() {
                            format!(
                                "  between hosts per call: {messages} messages, {}",
                                crate::cmd::inspect::human_bytes(inter_bytes as usize)
                            )
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
    }
    Ok(())
}

/// What this process has sent to other hosts so far (nothing in-process).
fn traffic(mpi: &Mpi) -> runtime_mpi::Traffic {
    mpi.as_ref().map(|c| c.traffic()).unwrap_or_default()
}
