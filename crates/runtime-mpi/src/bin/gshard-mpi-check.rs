//! `gshard-mpi-check`: run under `mpirun -np 4`, it performs every collective kind over
//! every axis set of the mesh [a=2, b=2] (and [x=4]), for several dtypes, split/concat dims
//! and shapes, through the MPI communicator, and compares each rank's result bit for bit
//! with what the in-process communicator computes for the same position (every rank builds
//! all four operands, which are a pure function of the case and the position). Prints one
//! line per mismatch and exits 1 if there was any; rank 0 prints a summary.

use ir::{DType, Mesh, Op, ReduceOp, Type};
use runtime::{Communicator, HostTensor, InProcess};

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

fn main() {
    let comm = match runtime_mpi::init(runtime_mpi::Options::default()) {
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
    let reference = InProcess::new(4);
    let (mut cases, mut bad) = (0usize, 0usize);
    for mesh in &meshes {
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
                        if w.ty != g.ty || w.data.to_bytes() != g.data.to_bytes() {
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
        println!("{cases} collectives per rank checked; {total} mismatches");
    }
    drop(comm);
    std::process::exit(if bad == 0 { 0 } else { 1 });
}
