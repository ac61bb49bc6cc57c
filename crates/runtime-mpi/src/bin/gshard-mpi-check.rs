//! `gshard-mpi-check`: run under `mpirun -np 4`, it performs every collective kind over
//! every axis set of the mesh [a=2, b=2] (and [x=4]), for several dtypes, split/concat dims
//! and shapes, through the MPI communicator, and compares each rank's result bit for bit
//! with what the in-process communicator computes for the same position (every rank builds
//! all four operands, which are a pure function of the case and the position). Prints one
//! line per mismatch and exits 1 if there was any; rank 0 prints a summary.
//!
//! `--all-to-all two-level` runs all-to-alls by the two-level schedule, and `--hosts N`
//! treats the ranks as N hosts (as the `gshard` flags of the same names do). With
//! `--compress all-to-all,all-reduce` (or `all-to-all:fp8`, as `gshard --compress` takes)
//! those kinds of f32 collectives are checked against the error bounds of
//! `runtime_mpi::compress` instead of bit for bit (the summary counts the
//! results that differ from the exact ones, within the bounds).

use ir::{CollectiveKind, DType, Mesh, Op, ReduceOp, Type};
use runtime::{Communicator, HostTensor, InProcess};
use runtime_mpi::compress::{
    Codec, Kind, ALL_REDUCE_BOUND, ALL_TO_ALL_BOUND, FP8_OF_AMAX, FP8_RELATIVE,
};

/// A deterministic operand for `(case, pos)`: small integers (so sums are exact in every
/// dtype but still order-sensitive through rounding at bf16) and some negative zeros.
fn operand(case: usize, pos: usize, ty: &Type) -> HostTensor {
    let n = ty.num_elements();
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let h = (i * 2654435761 + pos * 40503 + case * 9973) % 1000;
            (h as f64 - 500.0) / 7.0
        })
        .collect();
    HostTensor::from_f64_values(ty.clone(), &v)
}

/// The options from argv, or a one-line error.
fn options() -> Result<runtime_mpi::Options, String> {
    let mut opts = runtime_mpi::Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match (a.as_str(), v.as_str()) {
            ("--all-to-all", "flat") => opts.all_to_all = runtime_mpi::AllToAllAlgo::Flat,
            ("--all-to-all", "two-level") => opts.all_to_all = runtime_mpi::AllToAllAlgo::TwoLevel,
            ("--compress", list) => {
                opts.compress = runtime_mpi::Compress::parse(&list.split(',').collect::<Vec<_>>())?
            }
            ("--hosts", n) => {
                opts.hosts = runtime_mpi::HostLayout::Blocks(
                    n.parse()
                        .map_err(|_| format!("--hosts {n}: give a whole number"))?,
                )
            }
            _ => {
                return Err(format!(
                    "unknown option {a} {v}: use --all-to-all flat|two-level or --hosts N"
                ))
            }
        }
    }
    Ok(opts)
}

/// How far a compressed result may be from the exact one.
#[derive(Clone, Copy)]
enum Bound {
    /// Relative to each element (bf16 all-to-all).
    Relative,
    /// Relative to each element plus a share of the largest magnitude sent (fp8
    /// all-to-all, whose per-block amax is at most the operands' largest).
    RelativeAndAmax,
    /// Relative to the sum of the operands' magnitudes (all-reduce).
    OfMagnitudes,
}

/// `t` with every element's magnitude.
fn magnitudes(t: &HostTensor) -> HostTensor {
    let v: Vec<f64> = t.to_f64_vec().iter().map(|x| x.abs()).collect();
    HostTensor::from_f64_values(t.ty.clone(), &v)
}

/// The `--compress` kinds (argv is parsed again; [`options`] already validated it).
fn opts_compress() -> runtime_mpi::Compress {
    options().map(|o| o.compress).unwrap_or_default()
}

fn main() {
    let opts = options().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let comm = match runtime_mpi::init(opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let rank = comm.rank();
    if comm.size() != 4 {
        eprintln!("error: run with mpirun -np 4 (got {} ranks)", comm.size());
        runtime_mpi::abort(2);
    }
    let meshes = [
        Mesh::new(&[("a", 2), ("b", 2)]).expect("mesh"),
        Mesh::new(&[("x", 4)]).expect("mesh"),
    ];
    let axis_sets: [&[&str]; 5] = [&["a"], &["b"], &["a", "b"], &["b", "a"], &["x"]];
    let shapes: [&[usize]; 3] = [&[8], &[4, 6], &[2, 4, 4]];
    let dtypes = [DType::F32, DType::F64, DType::BF16, DType::I32];
    let compress = opts_compress();
    let reference = InProcess::new(4);
    let mut inexact = 0usize;
    let (mut cases, mut bad) = (0usize, 0usize);
    for mesh in &meshes {
        // Rules naming an axis are for meshes that have it (others would refuse them).
        let names: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
        if compress.check_axes(&names).is_err() {
            continue;
        }
        for axes in axis_sets {
            if !axes.iter().all(|a| mesh.axis_size(a).is_some()) {
                continue;
            }
            let axes: Vec<String> = axes.iter().map(|s| s.to_string()).collect();
            let k = mesh.size_of(&axes);
            for shape in shapes {
                for dtype in dtypes {
                    let ty = Type::new(dtype, shape.to_vec());
                    let mut ops = vec![
                        Op::all_reduce(ReduceOp::Sum, axes.clone()),
                        Op::all_reduce(ReduceOp::Max, axes.clone()),
                        Op::collective_permute(
                            axes.clone(),
                            (0..k).map(|i| (i, (i + 1) % k)).take(k - 1).collect(),
                        ),
                    ];
                    for d in 0..shape.len() {
                        ops.push(Op::all_gather(d, axes.clone()));
                        if shape[d] % k == 0 {
                            ops.push(Op::reduce_scatter(ReduceOp::Sum, d, axes.clone()));
                            for c in 0..shape.len() {
                                ops.push(Op::all_to_all(d, c, axes.clone()));
                            }
                        }
                    }
                    for op in ops {
                        cases += 1;
                        let all: Vec<HostTensor> = (0..4).map(|p| operand(cases, p, &ty)).collect();
                        let want = reference
                            .collective(0, &op, mesh, all.clone())
                            .expect("in-process collective");
                        let got = comm
                            .collective(0, &op, mesh, vec![all[rank].clone()])
                            .expect("MPI collective");
                        let (w, g) = (&want[rank], &got[0]);
                        let kind = op.as_collective().map(|c| &c.kind);
                        let bound = match kind {
                            Some(CollectiveKind::AllToAll { .. }) => {
                                match compress.codec(Kind::AllToAll, &axes) {
                                    Some(Codec::Bf16) => Some(Bound::Relative),
                                    Some(Codec::Fp8) => Some(Bound::RelativeAndAmax),
                                    None => None,
                                }
                            }
                            Some(CollectiveKind::AllReduce { .. }) => compress
                                .codec(Kind::AllReduce, &axes)
                                .map(|_| Bound::OfMagnitudes),
                            _ => None,
                        }
                        .filter(|_| dtype == DType::F32);
                        let same = w.ty == g.ty && w.data.to_bytes() == g.data.to_bytes();
                        let ok = match bound {
                            _ if same => true,
                            None => false,
                            Some(b) => {
                                inexact += 1;
                                let amax = all
                                    .iter()
                                    .flat_map(|t| t.to_f64_vec())
                                    .fold(0f64, |m, v| m.max(v.abs()));
                                let scale = match b {
                                    Bound::Relative | Bound::RelativeAndAmax => w.to_f64_vec(),
                                    Bound::OfMagnitudes => {
                                        let abs: Vec<HostTensor> =
                                            all.iter().map(magnitudes).collect();
                                        reference
                                            .collective(0, &op, mesh, abs)
                                            .expect("in-process collective")[rank]
                                            .to_f64_vec()
                                    }
                                };
                                let (k, floor) = match b {
                                    Bound::Relative => (ALL_TO_ALL_BOUND, 0.0),
                                    Bound::RelativeAndAmax => (FP8_RELATIVE, FP8_OF_AMAX * amax),
                                    Bound::OfMagnitudes => (ALL_REDUCE_BOUND, 0.0),
                                };
                                w.ty == g.ty
                                    && w.to_f64_vec()
                                        .iter()
                                        .zip(g.to_f64_vec())
                                        .zip(scale)
                                        .all(|((a, b), s)| (a - b).abs() <= k * s.abs() + floor)
                            }
                        };
                        if !ok {
                            bad += 1;
                            eprintln!(
                                "rank {rank}: {} over {axes:?} on {mesh} with {ty}: got {} {:?}, want {} {:?}",
                                op.name(),
                                g.ty,
                                &g.to_f64_vec()[..g.num_elements().min(8)],
                                w.ty,
                                &w.to_f64_vec()[..w.num_elements().min(8)]
                            );
                        }
                    }
                }
            }
        }
    }
    let all_bad = comm
        .all_gather_bytes((bad as u64).to_le_bytes().to_vec())
        .expect("gather");
    let total: u64 = all_bad
        .iter()
        .map(|b| u64::from_le_bytes(b.as_slice().try_into().unwrap_or([0; 8])))
        .sum();
    if rank == 0 {
        println!(
            "{cases} collectives per rank checked; {inexact} compressed results inexact within their bounds on rank 0; {total} mismatches"
        );
    }
    drop(comm);
    std::process::exit(if bad == 0 { 0 } else { 1 });
}
