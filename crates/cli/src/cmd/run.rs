//! `gshard run`: execute a program on named inputs and write every named output; with
//! `--devices`/`--mesh`, partition it and run it on that many devices in this process
//! (outputs are assembled back to full tensors, so the numbers match the one-device run).
//! Both paths run the native executor (`runtime::exec`); `--reference` forces the reference
//! interpreter (the oracle) instead, and `--profile FILE` writes a Chrome trace (Perfetto)
//! with one track per device.
//!
//! `mpirun -np N gshard run PROGRAM --backend mpi` runs the same partitioned program with one
//! device per rank (mesh: `--mesh`/`--devices`, else the program's own resized to N ranks if
//! it has one axis, else one axis `x` of N); every rank checks
//! that all ranks partitioned the same program, computes its shard, and rank 0 gathers the
//! outputs, prints them and writes the files (`--profile` merges every rank's track).

use crate::backend::{self, BackendArgs, Mpi};
use crate::files;
use crate::mesh_args::MeshArgs;
use anyhow::{bail, Context, Result};
use runtime::Communicator;
use runtime::HostTensor;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Program in text form (.gsir).
    program: PathBuf,
    /// Safetensors file holding the parameters by name (extra tensors are ignored).
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Where to write every named output (safetensors).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    mesh: MeshArgs,
    /// Run with the reference interpreter (slow, obviously correct) instead of the executor.
    #[arg(long, conflicts_with = "profile")]
    reference: bool,
    /// Write per-op and per-collective timings as Chrome trace JSON (one track per device).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// The memory this process may use (e.g. `16GiB`); default: what the host has
    /// available. A program whose planned peak needs more is refused before it runs.
    #[arg(long, value_name = "SIZE", value_parser = files::parse_size)]
    max_memory: Option<u64>,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn main(a: Args) -> Result<()> {
    let b = a.backend.clone();
    backend::with_backend(&b, |mpi| run(a, mpi))
}

fn run(a: Args, mpi: Mpi) -> Result<()> {
    let p = files::read_program(&a.program)?;
    let inputs = match &a.inputs {
        Some(path) => files::read_tensors(path)?,
        None => HashMap::new(),
    };
    let ctx = || format!("running {}", a.program.display());
    let what = format!("running {}", a.program.display());
    // The inputs are held as read, and again as each device's shards.
    let input_bytes: u64 = inputs.values().map(|t| t.ty.size_bytes() as u64).sum();
    let mut profiler = a.profile.as_ref().map(|_| runtime::Profiler::new());
    let root = backend::is_root(&mpi);
    let outputs = if let Some(comm) = &mpi {
        if a.reference {
            bail!("--reference runs the oracle in one process; drop --backend mpi");
        }
        // No mesh flag: a program without a mesh, or with one axis, gets one device per rank.
        let keep = a.mesh.given()
            || p.mesh
                .as_ref()
                .is_some_and(|m| m.axes.len() > 1 || m.num_devices() == comm.size());
        let mesh_args = if keep {
            a.mesh.clone()
        } else {
            MeshArgs {
                devices: Some(comm.size()),
                mesh: None,
            }
        };
        let p = mesh_args.apply(&p)?;
        let part =
            spmd::compile(&p).with_context(|| format!("partitioning {}", a.program.display()))?;
        let mesh = part.program.mesh.clone().expect("partitioned");
        let n = mesh.num_devices();
        if n != comm.size() {
            bail!(
                "the mesh {mesh} has {n} devices but mpirun started {} ranks; launch `mpirun -np {n}` or pass a --mesh with {} devices",
                comm.size(),
                comm.size()
            );
        }
        runtime::comm::check_consistent(
            comm.as_ref(),
            "partitioned program or mesh",
            &backend::fingerprint(&part.program),
        )?;
        files::check_memory(
            &what,
            &part.program,
            comm.local_positions().len(),
            input_bytes,
            a.max_memory,
        )?;
        // Created after the check (a barrier), so every rank's clock starts together.
        if a.profile.is_some() {
            profiler = Some(runtime::Profiler::new());
        }
        let mine =
            driver::shard_inputs_for(&part, &inputs, &comm.local_positions()).with_context(ctx)?;
        let r =
            runtime::run_devices_profiled(&part.program, comm.as_ref(), &mine, profiler.as_ref())
                .with_context(ctx)?;
        let all = runtime::comm::gather_positions(comm.as_ref(), &r.outputs, n)?;
        let peak = comm
            .all_gather_bytes((r.peak_bytes_per_device as u64).to_le_bytes().to_vec())?
            .iter()
            .filter_map(|b| b.as_slice().try_into().ok().map(u64::from_le_bytes))
            .max()
            .unwrap_or(0);
        if let (Some(path), Some(prof)) = (&a.profile, profiler.take()) {
            let traces = comm.all_gather_bytes(prof.chrome_trace().into_bytes())?;
            if root {
                files::write_atomic(path, merge_traces(&traces)?.as_bytes())?;
                println!("wrote a Chrome trace of {n} ranks to {}", path.display());
            }
        }
        if root {
            println!(
                "ran on {n} devices (mesh {mesh}) as {} MPI ranks; peak {} per device",
                comm.size(),
                crate::cmd::inspect::human_bytes(peak as usize)
            );
        }
        driver::assemble_outputs(&part, &all)
    } else if a.mesh.given() || p.mesh.is_some() {
        let p = a.mesh.apply(&p)?;
        let part =
            spmd::compile(&p).with_context(|| format!("partitioning {}", a.program.display()))?;
        let mesh = part.program.mesh.as_ref().expect("partitioned");
        train::memory::check_in_process_devices(mesh.num_devices(), "the mesh")
            .map_err(anyhow::Error::msg)?;
        files::check_memory(
            &what,
            &part.program,
            mesh.num_devices(),
            input_bytes,
            a.max_memory,
        )?;
        let per_dev = driver::shard_inputs(&part, &inputs).with_context(ctx)?;
        let (outs, peak) = if a.reference {
            (
                runtime::run_spmd(&part.program, &per_dev).with_context(ctx)?,
                None,
            )
        } else {
            let comm = runtime::InProcess::new(mesh.num_devices());
            let r =
                runtime::run_devices_profiled(&part.program, &comm, &per_dev, profiler.as_ref())
                    .with_context(ctx)?;
            (r.outputs, Some(r.peak_bytes_per_device))
        };
        println!(
            "ran on {} devices (mesh {mesh}){}",
            mesh.num_devices(),
            peak.map_or(" with the reference interpreter".into(), |b| format!(
                "; peak {} per device",
                crate::cmd::inspect::human_bytes(b)
            ))
        );
        driver::assemble_outputs(&part, &outs)
    } else if a.reference {
        files::check_memory(&what, &p, 1, input_bytes, a.max_memory)?;
        runtime::reference::run(&p, &inputs).with_context(ctx)?
    } else {
        files::check_memory(&what, &p, 1, input_bytes, a.max_memory)?;
        let comm = runtime::InProcess::new(1);
        let mut r = runtime::run_devices_profiled(&p, &comm, &[inputs], profiler.as_ref())
            .with_context(ctx)?;
        r.outputs.remove(0)
    };
    if let (Some(path), Some(prof)) = (&a.profile, &profiler) {
        files::write_atomic(path, prof.chrome_trace().as_bytes())?;
        println!("wrote a Chrome trace to {}", path.display());
    }
    if !root {
        return Ok(());
    }
    let ordered: Vec<(String, &HostTensor)> = p
        .outputs
        .iter()
        .map(|(n, _)| (n.clone(), &outputs[n]))
        .collect();
    for (name, t) in &ordered {
        println!("{}", summary(name, t));
    }
    if let Some(out) = &a.out {
        files::write_tensors(out, &ordered)?;
        println!("wrote {} outputs to {}", ordered.len(), out.display());
    }
    Ok(())
}

/// One Chrome trace from every rank's (each holds its own device's track).
fn merge_traces(traces: &[Vec<u8>]) -> Result<String> {
    let texts: Vec<String> = traces
        .iter()
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    runtime::merge_chrome_traces(&refs).context("a rank's trace is malformed")
}

/// One line per output: name, type, and the values (all of them when few, else statistics).
fn summary(name: &str, t: &HostTensor) -> String {
    let v = t.to_f64_vec();
    if v.len() <= 6 {
        let vals: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
        return format!("{name:<12} {:<16} [{}]", t.ty.to_string(), vals.join(", "));
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!(
        "{name:<12} {:<16} min {min:.6}  max {max:.6}  mean {mean:.6}",
        t.ty.to_string()
    )
}
