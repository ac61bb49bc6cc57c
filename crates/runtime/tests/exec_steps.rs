//! The executor's step kinds and scheduling against the reference interpreter:
//! collectives (exact, every kind, through `Communicator::collective` alone), collective
//! rounds, fused chains and their allocations, the profile's trace, partitioned halo
//! programs, dot epilogues, aliases, row-blocked reductions, folded transposes, sums of
//! products and short trailing broadcasts.

use half::bf16;
use ir::{Builder, DType, DotDims, Literal, Mesh, Op, Program, ReduceOp, Type};
use runtime::{Executable, HostTensor, InProcess, Profiler};
use std::collections::HashMap;

mod common;
use common::oracle::{
    assert_bounded, assert_exact, f32_type, run_both, run_profiled, same, x_per_device, Rng,
};

/// The in-process backend through `Communicator::collective` alone: other methods keep
/// the trait's defaults (as a backend that implements only that would).
struct OnlyCollective(InProcess);

impl runtime::Communicator for OnlyCollective {
    fn local_positions(&self) -> Vec<usize> {
        self.0.local_positions()
    }

    fn collective(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, runtime::comm::CommError> {
        self.0.collective(index, op, mesh, local)
    }
}

/// Every collective on meshes [x=4] and [a=2, b=2] against `reference::run_spmd`, exactly;
/// all-to-alls whose only reader is a transpose too (the executor has them write the
/// transposed layout).
#[test]
fn collectives_match_the_reference_exactly() {
    for (spec, axes) in [
        ("x=4", vec!["x"]),
        ("a=2,b=2", vec!["b"]),
        ("a=2,b=2", vec!["a", "b"]),
    ] {
        let mesh = Mesh::parse_spec(spec).unwrap();
        let axes: Vec<String> = axes.iter().map(|s| s.to_string()).collect();
        let k = mesh.size_of(&axes);
        for dt in [DType::F32, DType::F64, DType::BF16, DType::I32] {
            // Large enough (>= 16Ki elements) that the in-process backend keeps operands
            // for reuse as later results, which must then be overwritten entirely.
            let ty = Type::new(dt, vec![4, k * 2, 2100]);
            let b = Builder::with_mesh(mesh.clone());
            let x = b.param("x", ty.clone());
            for op in ReduceOp::ALL {
                b.output(
                    &format!("ar_{}", op.name()),
                    &b.emit(Op::all_reduce(op, axes.clone()), &[&x], None),
                );
                b.output(
                    &format!("rs_{}", op.name()),
                    &b.emit(Op::reduce_scatter(op, 1, axes.clone()), &[&x], None),
                );
            }
            b.output("ag", &b.emit(Op::all_gather(2, axes.clone()), &[&x], None));
            b.output(
                "a2a",
                &b.emit(Op::all_to_all(1, 0, axes.clone()), &[&x], None),
            );
            b.output(
                "a2a_same",
                &b.emit(Op::all_to_all(1, 1, axes.clone()), &[&x], None),
            );
            // All-to-alls read only by a transpose: written in the transposed layout (the
            // first two; the third moves the last dim, and stays a separate transpose).
            for (name, split_dim, concat_dim, perm) in [
                ("a2a_t", 1, 0, vec![1, 0, 2]),
                ("a2a_t2", 0, 1, vec![1, 0, 2]),
                ("a2a_t3", 0, 2, vec![2, 0, 1]),
            ] {
                let a = b.emit(
                    Op::all_to_all(split_dim, concat_dim, axes.clone()),
                    &[&x],
                    None,
                );
                b.output(name, &b.emit(Op::Transpose { perm }, &[&a], None));
            }
            let pairs: Vec<(usize, usize)> = (0..k.saturating_sub(1)).map(|r| (r, r + 1)).collect();
            b.output(
                "perm",
                &b.emit(Op::collective_permute(axes.clone(), pairs), &[&x], None),
            );
            let pid = b.partition_id();
            b.output("pid", &pid);
            let p = b.finish();
            let mut rng = Rng(dt as u64 + 3);
            let exe = Executable::new(&p).unwrap();
            let comm = InProcess::new(mesh.num_devices());
            let plain = OnlyCollective(InProcess::new(mesh.num_devices()));
            // Twice on one backend (the second run's results land in kept buffers), then on
            // a backend with only `collective` (the trait's transposing default, no shared
            // memory: the all-to-alls run between segments), profiled.
            for run in 0..3 {
                let ins = x_per_device(&mut rng, &ty, mesh.num_devices());
                let want = runtime::run_spmd(&p, &ins).unwrap();
                let prof = Profiler::new();
                let r = if run == 0 {
                    exe.run(&comm, &ins, None).unwrap()
                } else if run == 1 {
                    // Sharing memory, each sender places its all-to-all blocks in the
                    // receivers' results from its own task: one send per all-to-all.
                    let r = exe.run(&comm, &ins, Some(&prof)).unwrap();
                    let sends = prof
                        .events()
                        .into_iter()
                        .filter(|e| e.device == 0 && e.cat == "send")
                        .count();
                    assert_eq!(sends, 5, "{spec} {dt}: all-to-alls placed by their senders");
                    r
                } else {
                    let r = exe.run(&plain, &ins, Some(&prof)).unwrap();
                    let folded = prof
                        .events()
                        .into_iter()
                        .filter(|e| e.device == 0 && e.name.contains("+transpose"))
                        .count();
                    assert_eq!(folded, 2, "{spec} {dt}: folded all-to-alls");
                    r
                };
                for (d, (g, w)) in r.outputs.iter().zip(&want).enumerate() {
                    for (name, wt) in w {
                        let gt = &g[name];
                        assert_eq!(gt.ty, wt.ty, "{spec} {dt} {name} device {d}");
                        for (a, bv) in gt.to_f64_vec().iter().zip(wt.to_f64_vec()) {
                            assert!(
                                same(*a, bv),
                                "{spec} {dt} {name} device {d} run {run}: {a} vs {bv}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Small collectives (scalars, norms: under 4096 elements) wait for the next round, so
/// those whose operands are ready together share one barrier whatever their place in the
/// program: `ar(x)`, a local step on it, `ar` of that, then an independent `ar(exp(x))`
/// listed last runs in the first round. Two rounds, not three, and the values are the
/// reference's. Large collectives keep their program places (the peak stays program
/// order's): the same program on a large `x` takes three rounds, with the same values.
#[test]
fn independent_collectives_share_a_round() {
    let mesh = Mesh::parse_spec("x=4").unwrap();
    let ar = |v: &ir::Value, b: &Builder| {
        b.emit(
            Op::all_reduce(ReduceOp::Sum, vec!["x".to_string()]),
            &[v],
            None,
        )
    };
    for (shape, rounds) in [(vec![4, 8], 2), (vec![64, 128], 3)] {
        let ty = Type::new(DType::F32, shape);
        let b = Builder::with_mesh(mesh.clone());
        let x = b.param("x", ty.clone());
        let a = ar(&x, &b);
        let y = a.mul(&x);
        let by = ar(&y, &b);
        let d = ar(&x.exp(), &b);
        b.output("e", &by.add(&d));
        b.output("d", &d);
        let p = b.finish();
        let exe = Executable::new(&p).unwrap();
        assert_eq!(exe.collective_rounds(), rounds, "{:?}", ty.shape);
        let mut rng = Rng(11);
        let ins = x_per_device(&mut rng, &ty, 4);
        let want = runtime::run_spmd(&p, &ins).unwrap();
        let got = exe.run(&InProcess::new(4), &ins, None).unwrap();
        for (g, w) in got.outputs.iter().zip(&want) {
            for name in ["e", "d"] {
                assert_eq!(g[name].to_f64_vec(), w[name].to_f64_vec(), "{name}");
            }
        }
    }
}

/// A chain of elementwise ops is one fused pass: nothing but the parameters and the output
/// is ever live, and a dying input is overwritten in place.
#[test]
fn fused_chains_allocate_only_their_result() {
    let ty = Type::new(DType::F32, vec![64, 1024]);
    let b = Builder::new();
    let x = b.param("x", ty.clone());
    let y = x.mul(2.0).add(1.0).exp().tanh().sub(&x).max(0.0);
    let t = y.transpose(&[1, 0]);
    b.output("out", &t.mul(3.0).add(&t));
    let p = b.finish();
    let exe = Executable::new(&p).unwrap();
    let (groups, ops) = exe.fusion_stats();
    assert_eq!(groups, 2, "two fused groups around the transpose");
    assert!(ops >= 8, "{ops}");
    let mut rng = Rng(5);
    let ins: HashMap<String, HostTensor> = [("x".to_string(), rng.tensor(&ty, false))]
        .into_iter()
        .collect();
    let r = exe
        .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
        .unwrap();
    // x dies in the first group; y and t are live at the transpose; the last group writes
    // over t (it dies there), so the output needs no new buffer.
    assert_eq!(r.peak_bytes_per_device, 2 * ty.size_bytes());
    let want = runtime::run(&p, &ins).unwrap();
    assert_exact(&p, &r.outputs[0], &want);
}

/// The profiler's Chrome trace parses as JSON with one named track per device and complete
/// events on each.
#[test]
fn profile_is_chrome_trace_json_with_one_track_per_device() {
    let path = format!(
        "{}/tests/data/moe_relu_all.gsir",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut p = ir::text::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    p.mesh = Some(Mesh::new(&[("expert", 2)]).unwrap());
    let part = spmd::compile(&p).unwrap();
    let mut rng = Rng(1);
    let ins: Vec<HashMap<String, HostTensor>> = (0..2)
        .map(|_| {
            part.program
                .params()
                .into_iter()
                .map(|(n, v)| (n.to_string(), rng.tensor(part.program.ty(v), false)))
                .collect()
        })
        .collect();
    let prof = Profiler::new();
    runtime::run_devices_profiled(&part.program, &InProcess::new(2), &ins, Some(&prof)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&prof.chrome_trace()).unwrap();
    let evs = json["traceEvents"].as_array().unwrap();
    for d in 0..2u64 {
        assert!(evs.iter().any(|e| e["ph"] == "M"
            && e["name"] == "thread_name"
            && e["tid"] == d
            && e["args"]["name"] == format!("device {d}")));
        let xs: Vec<&serde_json::Value> = evs
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == d)
            .collect();
        assert!(xs.len() > 50, "device {d}: {} events", xs.len());
        assert!(xs
            .iter()
            .all(|e| e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0));
        assert!(xs
            .iter()
            .any(|e| e["cat"] == "collective"
                && e["name"].as_str().unwrap().starts_with("all_to_all")));
        assert!(xs.iter().any(|e| e["cat"] == "dot"));
    }
    let tids: std::collections::BTreeSet<u64> =
        evs.iter().filter_map(|e| e["tid"].as_u64()).collect();
    assert_eq!(tids.len(), 2);
    let _ = bf16::ONE;
}

/// A partitioned conv whose spatial dim is split (halo exchange: slices, collective-permutes,
/// concatenation, per-device dynamic slices by partition id, the local conv) and a reversed
/// split dim (a mirroring permute) on the executor over `InProcess` vs the reference's
/// `run_spmd`, every device with its own inputs.
#[test]
fn partitioned_halo_programs_match_the_reference() {
    // SAME (tiles line up), VALID with output tiles shorter than input tiles (per-device
    // windows), one-sided padding.
    for (spec, len, lo, hi) in [("x=4", 16, 1, 1), ("x=4", 10, 0, 0), ("a=2,b=2", 8, 2, 0)] {
        let mesh = Mesh::parse_spec(spec).unwrap();
        let axis = mesh.axes[0].name.clone();
        let b = Builder::with_mesh(mesh.clone());
        let f64t = |s: &[usize]| Type::new(DType::F64, s.to_vec());
        let x = sharding::split(&b.param("x", f64t(&[2, len, 3])), 1, &axis).unwrap();
        let w = b.param("w", f64t(&[3, 3, 4]));
        let y = x.conv(&w, &[lo], &[hi]).reverse(&[1]);
        b.output("y", &y);
        b.output("loss", &y.mul(&y).sum_all());
        let part = spmd::compile(&b.finish()).unwrap().program;
        let has = |name: &str| part.instrs.iter().any(|i| i.op.name() == name);
        assert!(has("collective_permute"), "{}", ir::text::print(&part));
        assert_eq!(
            has("dynamic_slice"),
            len == 10,
            "{}",
            ir::text::print(&part)
        );
        let mut rng = Rng(7);
        let ins: Vec<HashMap<String, HostTensor>> = (0..mesh.num_devices())
            .map(|_| {
                part.params()
                    .into_iter()
                    .map(|(name, v)| (name.to_string(), rng.tensor(part.ty(v), false)))
                    .collect()
            })
            .collect();
        let want = runtime::run_spmd(&part, &ins).unwrap();
        let got = Executable::new(&part)
            .unwrap()
            .run(&InProcess::new(mesh.num_devices()), &ins, None)
            .unwrap()
            .outputs;
        for (d, (g, w)) in got.iter().zip(&want).enumerate() {
            for (name, wt) in w {
                let (gv, wv) = (g[name].to_f64_vec(), wt.to_f64_vec());
                for (a, b) in gv.iter().zip(&wv) {
                    assert!(
                        (a - b).abs() <= 1e-9 * (1.0 + b.abs()),
                        "{spec} device {d} {name}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// A dot whose elementwise consumer runs as the GEMM's per-entry epilogue gives the values
/// of the two ops run apart: the ReLU after an up-projection (the dot's result also read by
/// a later mask, so both are materialised) and a scale-and-shift after a down-projection
/// (read by nothing else, so the group runs in place over it); dense GEMMs split over the
/// pool and, with a one-hot-ish lhs, the sparse path (epilogue afterwards).
#[test]
fn dot_epilogues_match_the_ops_run_apart() {
    let (e, t, m, h) = (8, 16, 32, 64);
    let ty = |d: &[usize]| Type::new(DType::F32, d.to_vec());
    let batched = |lc: usize| DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contract: vec![lc],
        rhs_contract: vec![1],
    };
    let b = Builder::new();
    let x = b.param("x", ty(&[e, t, m]));
    let w = b.param("w", ty(&[e, m, h]));
    let v = b.param("v", ty(&[e, h, m]));
    let u = b.param("u", ty(&[e, t, h]));
    let c = b.param("c", ty(&[e, t, m]));
    // A per-column bias: a broadcast leaf whose value depends on the element's position
    // (the epilogue runs on row strips at their own offsets).
    let bias = b.param("bias", ty(&[m]));
    let bias_b = b.emit(
        Op::Broadcast { dims: vec![2] },
        &[&bias],
        Some(ty(&[e, t, m])),
    );
    let pre = x.dot_general(&w, batched(2));
    let act = pre.max(0.0);
    let mask = pre.eq(&act).select(&u, 0.0);
    let y = act
        .dot_general(&v, batched(2))
        .mul(3.0)
        .add(&c)
        .add(&bias_b);
    // A kept dot whose epilogue reads it as the second operand of a non-commutative op.
    let pre2 = c.dot_general(&w, batched(2));
    let rsub = u.sub(&pre2);
    b.output("pre", &pre);
    b.output("act", &act);
    b.output("mask", &mask);
    b.output("y", &y);
    b.output("pre2", &pre2);
    b.output("rsub", &rsub);
    let p = b.finish();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for sparse in [false, true] {
        let mut rng = Rng(if sparse { 11 } else { 7 });
        let mut ins: HashMap<String, HostTensor> = ["x", "w", "v", "u", "c", "bias"]
            .iter()
            .map(|&n| (n.to_string(), rng.tensor(p.ty(p.param(n).unwrap()), false)))
            .collect();
        if sparse {
            let xt = ty(&[e, t, m]);
            let vals: Vec<f64> = (0..xt.num_elements())
                .map(|_| if rng.below(20) == 0 { rng.unit() } else { 0.0 })
                .collect();
            ins.insert("x".into(), HostTensor::from_f64_values(xt, &vals));
        }
        let prof = Profiler::new();
        let got = pool.install(|| {
            runtime::run_devices_profiled(&p, &InProcess::new(1), &[ins.clone()], Some(&prof))
                .unwrap()
                .outputs
                .remove(0)
        });
        let trace = prof.chrome_trace();
        assert_eq!(
            trace.matches("+fused").count(),
            3,
            "every dot takes an epilogue"
        );
        assert_eq!(trace.contains("SparseLhs"), sparse, "the path taken");
        // The epilogues against the same ops applied to the executor's own dot results.
        let f = |n: &str| got[n].to_f64_vec();
        let (pre, act, mask) = (f("pre"), f("act"), f("mask"));
        let uu = ins["u"].to_f64_vec();
        for i in 0..pre.len() {
            let a = (pre[i] as f32).max(0.0);
            assert!(same(act[i], a as f64), "act[{i}]");
            let mk = if pre[i] == act[i] { uu[i] as f32 } else { 0.0 };
            assert!(same(mask[i], mk as f64), "mask[{i}]");
        }
        let (pre2, rsub) = (f("pre2"), f("rsub"));
        for i in 0..pre2.len() {
            let r = uu[i] as f32 - pre2[i] as f32;
            assert!(same(rsub[i], r as f64), "rsub[{i}]");
        }
        // The down-projection's result is not materialised: against the reference, within
        // the contraction tolerance (its bound by the reference on |act| |v|, times 3).
        let bb = Builder::new();
        let (a2, v2) = (bb.param("a", ty(&[e, t, h])), bb.param("v", ty(&[e, h, m])));
        bb.output("y", &a2.abs().dot_general(&v2.abs(), batched(2)).mul(3.0));
        let bound_ins: HashMap<String, HostTensor> = [
            ("a".to_string(), got["act"].clone()),
            ("v".to_string(), ins["v"].clone()),
        ]
        .into_iter()
        .collect();
        let bound = runtime::run(&bb.finish(), &bound_ins).unwrap();
        // `act` may differ from the reference's by the up-projection's rounding: compare y
        // with the reference run on the executor's `act`.
        let br = Builder::new();
        let (a3, v3, c3, bias3) = (
            br.param("a", ty(&[e, t, h])),
            br.param("v", ty(&[e, h, m])),
            br.param("c", ty(&[e, t, m])),
            br.param("bias", ty(&[m])),
        );
        let bias3 = br.emit(
            Op::Broadcast { dims: vec![2] },
            &[&bias3],
            Some(ty(&[e, t, m])),
        );
        br.output(
            "y",
            &a3.dot_general(&v3, batched(2))
                .mul(3.0)
                .add(&c3)
                .add(&bias3),
        );
        let mut y_ins = bound_ins.clone();
        y_ins.insert("c".into(), ins["c"].clone());
        y_ins.insert("bias".into(), ins["bias"].clone());
        let want_y = runtime::run(&br.finish(), &y_ins).unwrap();
        assert_bounded("y", &got["y"], &want_y["y"], &bound["y"], 1e-5, 1e-6);
    }
}

/// `x * 1` (a gradient seeded with ones) costs no pass over memory: the result shares `x`'s
/// buffer, with `x`'s values (NaN and -0 included).
#[test]
fn multiplying_by_a_splat_one_is_an_alias() {
    let ty = Type::new(DType::F32, vec![4, 8]);
    let b = Builder::new();
    let x = b.param("x", ty.clone());
    let one = b.emit(
        Op::Constant {
            value: Literal::Splat(1.0),
        },
        &[],
        Some(Type::new(DType::F32, vec![])),
    );
    let ones = b.emit(Op::Broadcast { dims: vec![] }, &[&one], Some(ty.clone()));
    b.output("y", &ones.mul(&x));
    b.output("z", &x.mul(&ones).add(&x));
    let p = b.finish();
    let exe = Executable::new(&p).unwrap();
    assert_eq!(exe.fusion_stats(), (1, 1), "only the add is left");
    let mut rng = Rng(3);
    let mut xs = rng.tensor(&ty, true).to_f64_vec();
    xs[0] = f64::NAN;
    xs[1] = -0.0;
    let ins: HashMap<String, HostTensor> =
        [("x".to_string(), HostTensor::from_f64_values(ty, &xs))]
            .into_iter()
            .collect();
    let r = exe
        .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
        .unwrap();
    assert_exact(&p, &r.outputs[0], &runtime::run(&p, &ins).unwrap());
}

/// Reductions of trailing dims fold several rows at once (one add chain per row,
/// interleaved); each row's terms still come in order, so every op's values equal the
/// reference's exactly: whole blocks of rows, the rows left over, and (for contrast) an
/// outer reduced dim, which takes the row-by-row walk. Values of mixed magnitudes, so a
/// different order would round differently.
#[test]
fn row_blocked_reductions_are_exact() {
    let mut rng = Rng(17);
    for (shape, dims) in [
        (vec![9usize, 3, 20], vec![2usize]),
        (vec![2, 5, 4, 32], vec![2, 3]),
        (vec![64, 17], vec![1]),
        (vec![3, 4, 20], vec![0, 2]),
    ] {
        for dt in [DType::F32, DType::F64, DType::BF16] {
            let ty = Type::new(dt, shape.clone());
            let b = Builder::new();
            let x = b.param("x", ty.clone());
            for op in ReduceOp::ALL {
                let r = b.emit(
                    Op::Reduce {
                        op,
                        dims: dims.clone(),
                    },
                    &[&x],
                    None,
                );
                b.output(op.name(), &r);
            }
            let p = b.finish();
            let v: Vec<f64> = (0..ty.num_elements())
                .map(|_| (rng.unit() - 0.5) * 10f64.powi(rng.below(12) as i32 - 6))
                .collect();
            let ins: HashMap<String, HostTensor> =
                [("x".to_string(), HostTensor::from_f64_values(ty.clone(), &v))]
                    .into_iter()
                    .collect();
            let (got, want) = run_both(&p, &ins);
            assert_exact(&p, &got, &want);
        }
    }
}

/// On a one-device mesh the partitioner leaves collectives over groups of one between a dot
/// and the transpose of its result (the MoE backward's `dot -> reduce_scatter -> transpose`).
/// They are identities, so the transpose is still written by the dot itself: one step, and
/// the values of the same program without the collective (the reference's within the dot
/// tolerance).
#[test]
fn a_transpose_fuses_into_its_dot_through_trivial_collectives() {
    let mesh = Mesh::parse_spec("x=1").unwrap();
    let axes = vec!["x".to_string()];
    let (lt, rt) = (
        Type::new(DType::F32, vec![3, 20, 24]),
        Type::new(DType::F32, vec![3, 24, 28]),
    );
    let dd = DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contract: vec![2],
        rhs_contract: vec![1],
    };
    let build = |trivial: &[Op]| {
        let b = Builder::with_mesh(mesh.clone());
        let (l, r) = (b.param("l", lt.clone()), b.param("r", rt.clone()));
        let mut d = b.emit(Op::DotGeneral(dd.clone()), &[&l, &r], None);
        for op in trivial {
            d = b.emit(op.clone(), &[&d], None);
        }
        b.output(
            "t",
            &b.emit(
                Op::Transpose {
                    perm: vec![2, 0, 1],
                },
                &[&d],
                None,
            ),
        );
        b.finish()
    };
    let mut rng = Rng(11);
    let ins: HashMap<String, HostTensor> = [
        ("l".to_string(), rng.tensor(&lt, false)),
        ("r".to_string(), rng.tensor(&rt, false)),
    ]
    .into_iter()
    .collect();
    let run = |p: &Program| {
        let (out, prof) = run_profiled(p, &ins);
        let names: Vec<String> = prof.events().into_iter().map(|e| e.name).collect();
        (out, names)
    };
    let (plain, _) = run(&build(&[]));
    let chains = [
        vec![Op::reduce_scatter(ReduceOp::Sum, 1, axes.clone())],
        vec![
            Op::all_reduce(ReduceOp::Sum, axes.clone()),
            Op::all_gather(2, axes.clone()),
        ],
    ];
    for chain in chains {
        let p = build(&chain);
        let (got, names) = run(&p);
        let dots: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("dot_general"))
            .collect();
        assert_eq!(dots.len(), 1, "{names:?}");
        assert!(dots[0].contains("+transpose"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with("transpose")),
            "{names:?}"
        );
        assert_exact(&p, &got, &plain);
        let want = runtime::run(&p, &ins).unwrap();
        let (g, w) = (got["t"].to_f64_vec(), want["t"].to_f64_vec());
        for (a, b) in g.iter().zip(&w) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

/// A sum over every dim of a product `x * y` read by nothing else runs as one pass that
/// never writes the product, with the bits of the multiply and the f64 sum run apart
/// (signed zeros, NaN and infinities among the values); a product also read elsewhere, or
/// summed over some dims only, keeps its group.
#[test]
fn sums_of_products_fold_the_multiply() {
    let ty = f32_type(&[4, 8, 16]);
    let b = Builder::new();
    let x = b.param("x", ty.clone());
    let y = b.param("y", ty.clone());
    b.output("loss", &x.mul(&y).sum_all());
    let shared = y.mul(&x);
    b.output("kept", &shared.sum_all());
    b.output("also", &shared.add(&x));
    b.output("rows", &x.mul(&y).sum(&[2]));
    let p = b.finish();
    let exe = Executable::new(&p).unwrap();
    let labels: Vec<String> = {
        let prof = Profiler::new();
        let mut rng = Rng(5);
        let ins: HashMap<String, HostTensor> = [("x", &ty), ("y", &ty)]
            .into_iter()
            .map(|(n, t)| (n.to_string(), rng.tensor(t, false)))
            .collect();
        exe.run(&InProcess::new(1), std::slice::from_ref(&ins), Some(&prof))
            .unwrap();
        prof.events().iter().map(|e| e.name.clone()).collect()
    };
    assert_eq!(
        labels.iter().filter(|l| l.contains("+product")).count(),
        1,
        "only the loss folds its product: {labels:?}"
    );
    for seed in 0..8 {
        let mut rng = Rng(seed);
        let ins: HashMap<String, HostTensor> = [("x", &ty), ("y", &ty)]
            .into_iter()
            .map(|(n, t)| (n.to_string(), rng.tensor(t, seed % 2 == 1)))
            .collect();
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }
}

/// Broadcasts that repeat each value over a short trailing dim (the one-hot masks'
/// `[G,S,E] -> [G,S,E,C]`), alone and with a broadcast middle dim between the operand's
/// dims (so the walk restarts its run of source values at an offset), over chunk boundaries
/// and partial rows: the same values as the reference, in every short width the fused walk
/// specialises (2, 3, 4, 8) and one it does not (5).
#[test]
fn short_trailing_broadcasts_match_the_reference() {
    for c in [2usize, 3, 4, 5, 8] {
        for (dt, n) in [(DType::F32, 37usize), (DType::F64, 300), (DType::I32, 300)] {
            let full = Type::new(dt, vec![3, n, c]);
            let wide = Type::new(dt, vec![3, 2, n, c]);
            let b = Builder::new();
            let a = b.param("a", Type::new(dt, vec![3, n]));
            let y = b.param("y", full.clone());
            let z = b.param("z", wide.clone());
            // Consecutive values, each repeated `c` times.
            let rep = b.emit(
                Op::Broadcast { dims: vec![0, 1] },
                &[&a],
                Some(full.clone()),
            );
            // The same values again for each of two middle rows.
            let mid = b.emit(
                Op::Broadcast { dims: vec![0, 2] },
                &[&a],
                Some(wide.clone()),
            );
            b.output("rep", &rep.mul(&y));
            b.output("mid", &mid.add(&z));
            let p = b.finish();
            let mut rng = Rng(c as u64 * 31 + n as u64);
            let ins: HashMap<String, HostTensor> = [
                ("a", Type::new(dt, vec![3, n])),
                ("y", full.clone()),
                ("z", wide.clone()),
            ]
            .into_iter()
            .map(|(name, ty)| (name.to_string(), rng.tensor(&ty, false)))
            .collect();
            let (got, want) = run_both(&p, &ins);
            assert_exact(&p, &got, &want);
        }
    }
}
