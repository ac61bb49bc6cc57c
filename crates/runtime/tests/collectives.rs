//! Collectives and device-dependent ops through `runtime::run_spmd` on meshes [x=2], [x=4]
//! and [a=2, b=2] (XLA's semantics), plus their single-device behaviour in `runtime::run`;
//! the byte encoding transports use, and the process-level helpers with one process.

mod common;

// Large buffers on cache lines, as in the `gshard` binary (the streamed copies need them).
#[global_allocator]
static ALLOC: runtime::LineAligned = runtime::LineAligned;

use common::inputs;
use ir::{Builder, DType, Mesh, Op, ReduceOp, Type};
use runtime::{run, run_spmd, HostTensor, RuntimeError};
use std::collections::HashMap;

fn axes(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Build `y = op(x)` for `x: f32[shape]` on `mesh`.
fn one_op(mesh: &str, shape: &[usize], op: Op) -> ir::Program {
    let b = Builder::with_mesh(Mesh::parse_spec(mesh).unwrap());
    let x = b.param("x", Type::new(DType::F32, shape.to_vec()));
    let y = b.emit(op, &[&x], None);
    b.output("y", &y);
    b.finish()
}

/// Run on every device with `x` = `f(pos)` and return each device's `y`.
fn spmd(p: &ir::Program, shape: &[usize], f: impl Fn(usize) -> Vec<f32>) -> Vec<HostTensor> {
    let n = p.mesh.as_ref().unwrap().num_devices();
    let ins: Vec<HashMap<String, HostTensor>> = (0..n)
        .map(|d| inputs(vec![("x", HostTensor::from_f32(shape.to_vec(), f(d)))]))
        .collect();
    run_spmd(p, &ins)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|mut m| m.remove("y").unwrap())
        .collect()
}

#[test]
fn all_reduce_sum_max_min_on_x2() {
    for (op, want) in [
        (ReduceOp::Sum, [11.0, -18.0]),
        (ReduceOp::Max, [10.0, -2.0]),
        (ReduceOp::Min, [1.0, -16.0]),
    ] {
        let p = one_op("x=2", &[2], Op::all_reduce(op, axes(&["x"])));
        let ys = spmd(&p, &[2], |d| {
            if d == 0 {
                vec![1.0, -2.0]
            } else {
                vec![10.0, -16.0]
            }
        });
        for y in ys {
            assert_eq!(y.to_f64_vec(), want.to_vec(), "{op:?}");
        }
    }
}

#[test]
fn all_gather_on_x4_along_each_dim() {
    let p = one_op("x=4", &[1, 2], Op::all_gather(0, axes(&["x"])));
    let ys = spmd(&p, &[1, 2], |d| vec![d as f32, 10.0 + d as f32]);
    for y in &ys {
        assert_eq!(y.shape(), &[4, 2]);
        assert_eq!(y.to_f64_vec(), vec![0., 10., 1., 11., 2., 12., 3., 13.]);
    }
    let p = one_op("x=4", &[1, 2], Op::all_gather(1, axes(&["x"])));
    let ys = spmd(&p, &[1, 2], |d| vec![d as f32, 10.0 + d as f32]);
    for y in &ys {
        assert_eq!(y.shape(), &[1, 8]);
        assert_eq!(y.to_f64_vec(), vec![0., 10., 1., 11., 2., 12., 3., 13.]);
    }
}

#[test]
fn reduce_scatter_on_x2() {
    let p = one_op(
        "x=2",
        &[4],
        Op::reduce_scatter(ReduceOp::Sum, 0, axes(&["x"])),
    );
    let ys = spmd(&p, &[4], |d| {
        (0..4).map(|i| (i + 1) as f32 * (d + 1) as f32).collect()
    });
    // Sum = 3 * [1, 2, 3, 4]; rank 0 keeps [3, 6], rank 1 keeps [9, 12].
    assert_eq!(ys[0].to_f64_vec(), vec![3., 6.]);
    assert_eq!(ys[1].to_f64_vec(), vec![9., 12.]);
}

#[test]
fn reduce_scatter_max_on_x4_dim1() {
    let p = one_op(
        "x=4",
        &[1, 4],
        Op::reduce_scatter(ReduceOp::Max, 1, axes(&["x"])),
    );
    // Device d holds [d, -d, 2d % 5, 3 - d].
    let ys = spmd(&p, &[1, 4], |d| {
        let d = d as f32;
        vec![d, -d, (2.0 * d) % 5.0, 3.0 - d]
    });
    // Max over devices: [3, 0, 4, 3].
    let want = [3., 0., 4., 3.];
    for (r, y) in ys.iter().enumerate() {
        assert_eq!(y.shape(), &[1, 1]);
        assert_eq!(y.to_f64_vec(), vec![want[r]]);
    }
}

#[test]
fn all_to_all_spec_example() {
    // XLA's example: 4 ranks, f32[4,16], split 1, concat 0 -> f32[16,4].
    let p = one_op("x=4", &[4, 16], Op::all_to_all(1, 0, axes(&["x"])));
    let val = |d: usize, i: usize, j: usize| (1000 * d + 16 * i + j) as f32;
    let ys = spmd(&p, &[4, 16], |d| {
        (0..64).map(|e| val(d, e / 16, e % 16)).collect()
    });
    for (r, y) in ys.iter().enumerate() {
        assert_eq!(y.shape(), &[16, 4]);
        let v = y.to_f64_vec();
        // Row 4 s + i, col c of rank r = block r (cols 4r..4r+4) of source rank s, row i.
        for s in 0..4 {
            for i in 0..4 {
                for c in 0..4 {
                    assert_eq!(v[(4 * s + i) * 4 + c], val(s, i, 4 * r + c) as f64);
                }
            }
        }
    }
}

#[test]
fn all_to_all_same_split_and_concat_dim() {
    let p = one_op("x=2", &[4], Op::all_to_all(0, 0, axes(&["x"])));
    let ys = spmd(&p, &[4], |d| (0..4).map(|i| (10 * d + i) as f32).collect());
    assert_eq!(ys[0].to_f64_vec(), vec![0., 1., 10., 11.]);
    assert_eq!(ys[1].to_f64_vec(), vec![2., 3., 12., 13.]);
}

#[test]
fn collective_permute_shift_gives_zeros_to_non_receivers() {
    let p = one_op(
        "x=4",
        &[2],
        Op::collective_permute(axes(&["x"]), vec![(0, 1), (1, 2), (2, 3)]),
    );
    let ys = spmd(&p, &[2], |d| vec![d as f32 + 1.0, -(d as f32) - 1.0]);
    assert_eq!(ys[0].to_f64_vec(), vec![0., 0.]);
    assert_eq!(ys[1].to_f64_vec(), vec![1., -1.]);
    assert_eq!(ys[2].to_f64_vec(), vec![2., -2.]);
    assert_eq!(ys[3].to_f64_vec(), vec![3., -3.]);
}

#[test]
fn collective_permute_cycle_within_groups_of_2x2() {
    // Along axis b: groups {0,1} and {2,3}; swap ranks 0 <-> 1 in each.
    let p = one_op(
        "a=2,b=2",
        &[1],
        Op::collective_permute(axes(&["b"]), vec![(0, 1), (1, 0)]),
    );
    let ys = spmd(&p, &[1], |d| vec![d as f32]);
    let got: Vec<f64> = ys.iter().map(|y| y.to_f64_vec()[0]).collect();
    assert_eq!(got, vec![1., 0., 3., 2.]);
}

#[test]
fn all_reduce_along_one_axis_of_2x2() {
    // Positions: (a, b) -> 2a + b. Along a: {0,2}, {1,3}. Along b: {0,1}, {2,3}.
    let f = |d: usize| vec![1u32.wrapping_shl(d as u32) as f32];
    let p = one_op("a=2,b=2", &[1], Op::all_reduce(ReduceOp::Sum, axes(&["a"])));
    let got: Vec<f64> = spmd(&p, &[1], f)
        .iter()
        .map(|y| y.to_f64_vec()[0])
        .collect();
    assert_eq!(got, vec![5., 10., 5., 10.]);
    let p = one_op("a=2,b=2", &[1], Op::all_reduce(ReduceOp::Sum, axes(&["b"])));
    let got: Vec<f64> = spmd(&p, &[1], f)
        .iter()
        .map(|y| y.to_f64_vec()[0])
        .collect();
    assert_eq!(got, vec![3., 3., 12., 12.]);
    let p = one_op(
        "a=2,b=2",
        &[1],
        Op::all_reduce(ReduceOp::Sum, axes(&["a", "b"])),
    );
    let got: Vec<f64> = spmd(&p, &[1], f)
        .iter()
        .map(|y| y.to_f64_vec()[0])
        .collect();
    assert_eq!(got, vec![15.; 4]);
}

#[test]
fn all_gather_rank_order_follows_listed_axes() {
    // Over (a, b) ranks are 2a + b = position; over (b, a) ranks are 2b + a.
    for (ax, want) in [
        (vec!["a", "b"], vec![0., 1., 2., 3.]),
        (vec!["b", "a"], vec![0., 2., 1., 3.]),
        (vec!["a"], vec![]),
    ] {
        let p = one_op("a=2,b=2", &[1], Op::all_gather(0, axes(&ax)));
        let ys = spmd(&p, &[1], |d| vec![d as f32]);
        if ax == ["a"] {
            // Groups {0,2} and {1,3}.
            assert_eq!(ys[0].to_f64_vec(), vec![0., 2.]);
            assert_eq!(ys[1].to_f64_vec(), vec![1., 3.]);
            assert_eq!(ys[2].to_f64_vec(), vec![0., 2.]);
            assert_eq!(ys[3].to_f64_vec(), vec![1., 3.]);
        } else {
            for y in &ys {
                assert_eq!(y.to_f64_vec(), want);
            }
        }
    }
}

#[test]
fn all_to_all_along_b_of_2x2() {
    let p = one_op("a=2,b=2", &[2], Op::all_to_all(0, 0, axes(&["b"])));
    let ys = spmd(&p, &[2], |d| vec![10.0 * d as f32, 10.0 * d as f32 + 1.0]);
    // Group {0,1}: rank 0 gets [x0[0], x1[0]] = [0, 10]; rank 1 gets [1, 11].
    assert_eq!(ys[0].to_f64_vec(), vec![0., 10.]);
    assert_eq!(ys[1].to_f64_vec(), vec![1., 11.]);
    assert_eq!(ys[2].to_f64_vec(), vec![20., 30.]);
    assert_eq!(ys[3].to_f64_vec(), vec![21., 31.]);
}

#[test]
fn partition_id_is_the_mesh_position() {
    let b = Builder::with_mesh(Mesh::parse_spec("a=2,b=2").unwrap());
    b.output("pid", &b.partition_id());
    let p = b.finish();
    let outs = run_spmd(&p, &vec![HashMap::new(); 4]).unwrap();
    let got: Vec<i32> = outs.iter().map(|m| m["pid"].as_i32().unwrap()[0]).collect();
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[test]
fn integer_all_reduce_wraps() {
    let b = Builder::with_mesh(Mesh::parse_spec("x=2").unwrap());
    let x = b.param("x", Type::new(DType::I32, vec![1]));
    let y = b.emit(Op::all_reduce(ReduceOp::Sum, axes(&["x"])), &[&x], None);
    b.output("y", &y);
    let p = b.finish();
    let ins = vec![
        inputs(vec![("x", HostTensor::from_i32(vec![1], vec![i32::MAX]))]),
        inputs(vec![("x", HostTensor::from_i32(vec![1], vec![2]))]),
    ];
    let outs = run_spmd(&p, &ins).unwrap();
    assert_eq!(outs[1]["y"].as_i32(), Some(&[i32::MIN + 1][..]));
}

#[test]
fn run_allows_collectives_over_size_one_axes() {
    let p = one_op("a=1,b=3", &[2], Op::all_reduce(ReduceOp::Sum, axes(&["a"])));
    let r = run(
        &p,
        &inputs(vec![("x", HostTensor::from_f32(vec![2], vec![1., 2.]))]),
    )
    .unwrap();
    assert_eq!(r["y"].to_f64_vec(), vec![1., 2.]);
    let p = one_op("x=1", &[2], Op::all_gather(0, axes(&["x"])));
    let r = run(
        &p,
        &inputs(vec![("x", HostTensor::from_f32(vec![2], vec![1., 2.]))]),
    )
    .unwrap();
    assert_eq!(r["y"].to_f64_vec(), vec![1., 2.]);
}

#[test]
fn run_rejects_collectives_over_real_axes() {
    let p = one_op("x=2", &[2], Op::all_reduce(ReduceOp::Sum, axes(&["x"])));
    let e = run(
        &p,
        &inputs(vec![("x", HostTensor::from_f32(vec![2], vec![1., 2.]))]),
    )
    .unwrap_err();
    assert!(
        matches!(e, RuntimeError::CollectiveOnOneDevice { size: 2, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("run_spmd"), "{e}");
}

#[test]
fn run_spmd_checks_the_device_count() {
    let p = one_op("x=4", &[2], Op::all_reduce(ReduceOp::Sum, axes(&["x"])));
    let e = run_spmd(&p, &vec![HashMap::new(); 3]).unwrap_err();
    assert_eq!(
        e,
        RuntimeError::DeviceCount {
            expected: 4,
            got: 3
        }
    );
    assert!(e.to_string().contains("4 devices"), "{e}");
}

#[test]
fn run_spmd_names_the_device_of_a_missing_input() {
    let p = one_op("x=2", &[2], Op::all_reduce(ReduceOp::Sum, axes(&["x"])));
    let ins = vec![
        inputs(vec![("x", HostTensor::from_f32(vec![2], vec![1., 2.]))]),
        HashMap::new(),
    ];
    let e = run_spmd(&p, &ins).unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::MissingInput {
                device: Some(1),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("device 1"), "{e}");
}

#[test]
fn run_spmd_without_a_mesh_is_one_device() {
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F32, vec![1]));
    b.output("y", &x.add(1.0));
    let p = b.finish();
    let outs = run_spmd(
        &p,
        &[inputs(vec![("x", HostTensor::from_f32(vec![1], vec![1.]))])],
    )
    .unwrap();
    assert_eq!(outs.len(), 1);
    assert_eq!(outs[0]["y"].to_f64_vec(), vec![2.]);
}

#[test]
fn collective_without_mesh_is_an_error() {
    // Assemble by hand: the builder would refuse.
    let mut p = ir::Program::new();
    let x = p.push(ir::Instr {
        op: Op::Parameter { name: "x".into() },
        operands: vec![],
        ty: Type::new(DType::F32, vec![2]),
        sharding: None,
        scope: ir::ScopeId::ROOT,
    });
    let y = p.push(ir::Instr {
        op: Op::all_reduce(ReduceOp::Sum, axes(&["x"])),
        operands: vec![x],
        ty: Type::new(DType::F32, vec![2]),
        sharding: None,
        scope: ir::ScopeId::ROOT,
    });
    p.outputs.push(("y".into(), y));
    let ins = inputs(vec![("x", HostTensor::from_f32(vec![2], vec![1., 2.]))]);
    let e = run(&p, &ins).unwrap_err();
    assert!(matches!(e, RuntimeError::NoMesh { index: 1, .. }), "{e}");
    let e = run_spmd(&p, &[ins]).unwrap_err();
    assert!(matches!(e, RuntimeError::NoMesh { .. }), "{e}");
}

#[test]
fn data_bytes_round_trip_every_dtype() {
    use runtime::Data;
    let cases = [
        Data::F32(vec![1.5, -0.0, f32::NAN, f32::INFINITY]),
        Data::F64(vec![1e300, -2.5]),
        Data::BF16(vec![half::bf16::from_f32(3.0), half::bf16::MIN]),
        Data::I32(vec![i32::MIN, 7, -1]),
        Data::Bool(vec![true, false, true]),
        Data::F32(vec![]),
    ];
    for d in cases {
        let back = Data::from_bytes(d.dtype(), &d.to_bytes()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{d:?}"));
    }
    assert!(Data::from_bytes(ir::DType::F32, &[0, 1, 2]).is_none());
}

#[test]
fn one_process_gathers_its_own_positions_and_agrees_with_itself() {
    use runtime::comm::{check_consistent, gather_positions};
    let comm = runtime::InProcess::new(2);
    let local: Vec<HashMap<String, runtime::HostTensor>> = (0..2)
        .map(|p| HashMap::from([("x".to_string(), runtime::HostTensor::scalar_f32(p as f32))]))
        .collect();
    let all = gather_positions(&comm, &local, 2).unwrap();
    assert_eq!(&all[..], &local[..]);
    check_consistent(&comm, "program", b"abc").unwrap();
}

/// A dot summed over the devices and then transposed (a weight's gradient): the executor
/// writes the dot in the transpose's layout, sums that, and takes the sum as the
/// transpose (an alias, no transpose pass). The values must be the reference's, on every
/// device; distinct operands per device and integer values keep every sum exact.
#[test]
fn dot_all_reduce_transpose_sums_in_the_transposed_layout() {
    use ir::DotDims;
    use runtime::{Executable, InProcess, Profiler};
    let b = ir::Builder::with_mesh(Mesh::parse_spec("x=4").unwrap());
    let a = b.param("a", Type::new(DType::F32, vec![3, 5]));
    let w = b.param("w", Type::new(DType::F32, vec![5, 2]));
    let d = a.dot_general(
        &w,
        DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
        },
    );
    let r = b.emit(Op::all_reduce(ReduceOp::Sum, axes(&["x"])), &[&d], None);
    let t = r.transpose(&[1, 0]);
    b.output("t", &t);
    let p = b.finish();
    let ins: Vec<HashMap<String, HostTensor>> = (0..4)
        .map(|dev| {
            let f = |n: usize, s: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| ((i * 7 + dev * 3 + s) % 11) as f32 - 5.0)
                    .collect()
            };
            inputs(vec![
                ("a", HostTensor::from_f32(vec![3, 5], f(15, 1))),
                ("w", HostTensor::from_f32(vec![5, 2], f(10, 2))),
            ])
        })
        .collect();
    let want = run_spmd(&p, &ins).unwrap();
    let prof = Profiler::new();
    let got = Executable::new(&p)
        .unwrap()
        .run(&InProcess::new(4), &ins, Some(&prof))
        .unwrap();
    for (dev, (g, w)) in got.outputs.iter().zip(&want).enumerate() {
        assert_eq!(g["t"].shape(), &[2, 3]);
        assert_eq!(g["t"].to_f64_vec(), w["t"].to_f64_vec(), "device {dev}");
    }
    let events = prof.events();
    let cat = |prefix: &str| -> Vec<&'static str> {
        events
            .iter()
            .filter(|e| e.name.starts_with(prefix))
            .map(|e| e.cat)
            .collect()
    };
    assert_eq!(cat("transpose"), vec!["alias"; 4], "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.name.starts_with("dot_general") && e.name.contains("+transpose")),
        "{events:?}"
    );
}

/// All-to-alls whose blocks are runs of whole cache lines (streamed to the receivers with
/// non-temporal stores where the CPU has AVX-512; this binary aligns large buffers to
/// lines as the `gshard` binary does) give the reference's bits: the senders placing their
/// blocks (the executor, in process) and the collective pass (the executor's reference
/// kernels), each against the reference interpreter.
#[test]
fn all_to_all_of_whole_lines_is_the_reference() {
    use runtime::{ExecOptions, Executable, InProcess};
    let shape = [4usize, 64, 128];
    let b = ir::Builder::with_mesh(Mesh::parse_spec("x=4").unwrap());
    let x = b.param("x", Type::new(DType::F32, shape.to_vec()));
    let y = b.emit(Op::all_to_all(0, 1, axes(&["x"])), &[&x], None);
    // A reader, so that the result is placed by the senders before its round.
    let z = y.transpose(&[1, 0, 2]);
    b.output("z", &z);
    let p = b.finish();
    let n: usize = shape.iter().product();
    let ins: Vec<HashMap<String, HostTensor>> = (0..4)
        .map(|d| {
            let v: Vec<f32> = (0..n).map(|i| (i * 4 + d) as f32 * 0.25).collect();
            inputs(vec![("x", HostTensor::from_f32(shape.to_vec(), v))])
        })
        .collect();
    let want = run_spmd(&p, &ins).unwrap();
    for options in [ExecOptions::native(), ExecOptions::reference()] {
        let got = Executable::with_options(&p, options)
            .unwrap()
            .run(&InProcess::new(4), &ins, None)
            .unwrap();
        for (dev, (g, w)) in got.outputs.iter().zip(&want).enumerate() {
            let same = g["z"]
                .to_f64_vec()
                .iter()
                .zip(w["z"].to_f64_vec())
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "device {dev}, passes {:?}", options.passes);
        }
    }
}

/// Thousands of in-process devices on a few threads: a device task that ends while others
/// run keeps its thread busy running them, and must not nest a wait per task (4096 nested
/// waits overflowed a thread's stack). Every device gets the sum.
#[test]
fn thousands_of_devices_run_to_the_end() {
    use runtime::{Executable, InProcess};
    let n = 4096;
    let p = one_op(
        &format!("x={n}"),
        &[4],
        Op::all_reduce(ReduceOp::Sum, axes(&["x"])),
    );
    let ins: Vec<HashMap<String, HostTensor>> = (0..n)
        .map(|d| {
            inputs(vec![(
                "x",
                HostTensor::from_f32(vec![4], vec![d as f32; 4]),
            )])
        })
        .collect();
    let exe = Executable::new(&p).unwrap();
    for _ in 0..2 {
        let got = exe.run(&InProcess::new(n), &ins, None).unwrap();
        let want = (n * (n - 1) / 2) as f64;
        for (dev, o) in got.outputs.iter().enumerate() {
            assert_eq!(o["y"].to_f64_vec(), vec![want; 4], "device {dev}");
        }
    }
}

/// Several callers running in-process executables on the one rayon pool at once, each run
/// with kernels large enough to split over the pool's threads (a batch of GEMMs, a fused
/// group of 256K elements) between two all-to-alls: every run finishes (a watchdog fails
/// the test instead of letting it hang) with the values of a run alone.
#[test]
fn concurrent_split_runs_finish_and_agree() {
    use ir::DotDims;
    use runtime::{Executable, InProcess};
    let b = ir::Builder::with_mesh(Mesh::parse_spec("x=4").unwrap());
    let x = b.param("x", Type::new(DType::F32, vec![4, 128, 128]));
    let w = b.param("w", Type::new(DType::F32, vec![4, 128, 128]));
    let a2a = |v: &ir::Value| b.emit(Op::all_to_all(0, 0, axes(&["x"])), &[v], None);
    let xs = a2a(&x);
    let h = xs.dot_general(
        &w,
        DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
        },
    );
    let hh = b.emit(Op::Binary(ir::BinaryOp::Mul), &[&h, &h], None);
    let y = a2a(&hh);
    b.output("y", &y);
    let p = b.finish();
    let ins: Vec<HashMap<String, HostTensor>> = (0..4)
        .map(|d| {
            let v = |s: usize| -> Vec<f32> {
                (0..4 * 128 * 128)
                    .map(|i| ((i * 13 + d * 7 + s) % 17) as f32 / 16.0 - 0.5)
                    .collect()
            };
            inputs(vec![
                ("x", HostTensor::from_f32(vec![4, 128, 128], v(1))),
                ("w", HostTensor::from_f32(vec![4, 128, 128], v(2))),
            ])
        })
        .collect();
    let alone = Executable::new(&p)
        .unwrap()
        .run(&InProcess::new(4), &ins, None)
        .unwrap()
        .outputs;
    let (tx, rx) = std::sync::mpsc::channel();
    let callers = 4;
    std::thread::scope(|s| {
        for _ in 0..callers {
            let tx = tx.clone();
            let (p, ins, alone) = (&p, &ins, &alone);
            s.spawn(move || {
                let exe = Executable::new(p).unwrap();
                for _ in 0..15 {
                    let outs = exe.run(&InProcess::new(4), ins, None).unwrap().outputs;
                    for (got, want) in outs.iter().zip(alone) {
                        assert_eq!(got["y"].to_f64_vec(), want["y"].to_f64_vec());
                    }
                }
                tx.send(()).unwrap();
            });
        }
        for k in 0..callers {
            rx.recv_timeout(std::time::Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{k} of {callers} callers finished in 120 s"));
        }
    });
}
