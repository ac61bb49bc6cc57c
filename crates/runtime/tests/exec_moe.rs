//! Whole programs through the executor against the reference interpreter: the GShard MoE
//! layer with its gradients (`gshard export moe-layer`, fixtures in `tests/data/`), on one
//! device and partitioned over `expert=2` and `expert=4` (propagate + partition, shard the
//! inputs, run, assemble), plus the executor in reference-kernel mode (same plan, oracle
//! kernels). Routing outputs must match exactly; floats within f32 / f64 tolerance.

use ir::{DType, Mesh, Program};
use runtime::{BlockDim, ExecOptions, Executable, HostTensor, InProcess};
use std::collections::HashMap;

fn fixture(name: &str) -> Program {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    ir::text::parse(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Deterministic pseudo-normal inputs for every parameter (noise in [0, 1)).
fn inputs(p: &Program, seed: u64) -> HashMap<String, HostTensor> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64) / ((1u64 << 53) as f64)
    };
    p.params()
        .into_iter()
        .map(|(name, v)| {
            let ty = p.ty(v).clone();
            let vals: Vec<f64> = (0..ty.num_elements())
                .map(|_| {
                    if name == "noise" {
                        next()
                    } else {
                        let g: f64 = (0..4).map(|_| next()).sum::<f64>() - 2.0;
                        if name == "wi" || name == "wo" {
                            g * 0.5
                        } else {
                            g
                        }
                    }
                })
                .collect();
            (name.to_string(), HostTensor::from_f64_values(ty, &vals))
        })
        .collect()
}

fn close(name: &str, got: &HostTensor, want: &HostTensor) {
    assert_eq!(got.ty, want.ty, "{name}");
    let (rtol, atol) = match want.dtype() {
        DType::F32 => (1e-4, 1e-5),
        DType::F64 => (1e-10, 1e-12),
        DType::BF16 => (2e-2, 2e-2),
        DType::I32 | DType::Bool => (0.0, 0.0),
    };
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!(
            (a - b).abs() <= atol + rtol * b.abs() || (a.is_nan() && b.is_nan()),
            "{name}[{i}]: executor {a} vs reference {b}"
        );
    }
}

fn check_all(label: &str, got: &HashMap<String, HostTensor>, want: &HashMap<String, HostTensor>) {
    assert_eq!(got.len(), want.len(), "{label}: output count");
    for (name, w) in want {
        close(&format!("{label}: {name}"), &got[name], w);
    }
}

fn shard(
    part: &spmd::Partitioned,
    ins: &HashMap<String, HostTensor>,
) -> Vec<HashMap<String, HostTensor>> {
    let mesh = part.program.mesh.as_ref().unwrap();
    (0..mesh.num_devices())
        .map(|pos| {
            part.params
                .iter()
                .map(|l| {
                    let b: Vec<BlockDim> =
                        spmd::shard_ranges(&l.global.shape, &l.sharding, mesh, pos)
                            .into_iter()
                            .map(|r| BlockDim {
                                offset: r.offset,
                                len: r.len,
                                padded: r.padded,
                            })
                            .collect();
                    (l.name.clone(), ins[&l.name].block(&b))
                })
                .collect()
        })
        .collect()
}

fn assemble(
    part: &spmd::Partitioned,
    outs: &[HashMap<String, HostTensor>],
) -> HashMap<String, HostTensor> {
    let mesh = part.program.mesh.as_ref().unwrap();
    part.outputs
        .iter()
        .map(|l| {
            let mut g = HostTensor::zeros(l.global.clone());
            for (pos, o) in outs.iter().enumerate() {
                if spmd::layout::is_canonical_holder(&l.sharding, mesh, pos) {
                    let b: Vec<BlockDim> =
                        spmd::shard_ranges(&l.global.shape, &l.sharding, mesh, pos)
                            .into_iter()
                            .map(|r| BlockDim {
                                offset: r.offset,
                                len: r.len,
                                padded: r.padded,
                            })
                            .collect();
                    g.set_block(&b, &o[&l.name]);
                }
            }
            (l.name.clone(), g)
        })
        .collect()
}

fn check_program(file: &str) {
    let p = fixture(file);
    let ins = inputs(&p, 7);
    let want = runtime::run(&p, &ins).unwrap();
    // One device, native kernels; twice on one Executable (buffers come from the pool).
    let exe = Executable::new(&p).unwrap();
    for round in 0..2 {
        let r = exe
            .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
            .unwrap();
        check_all(
            &format!("{file} 1 device round {round}"),
            &r.outputs[0],
            &want,
        );
        assert!(r.peak_bytes_per_device > 0);
        assert_eq!(r.collective_bytes, 0);
    }
    // Reference-kernel mode: same plan and buffers, oracle kernels.
    let r = Executable::with_options(&p, ExecOptions::reference())
        .unwrap()
        .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
        .unwrap();
    check_all(&format!("{file} reference kernels"), &r.outputs[0], &want);
    for d in [2usize, 4] {
        let mut q = p.clone();
        q.mesh = Some(Mesh::new(&[("expert", d)]).unwrap());
        let part = spmd::compile(&q).unwrap();
        let per_dev = shard(&part, &ins);
        let r = Executable::new(&part.program)
            .unwrap()
            .run(&InProcess::new(d), &per_dev, None)
            .unwrap();
        check_all(
            &format!("{file} {d} devices"),
            &assemble(&part, &r.outputs),
            &want,
        );
        let a2a = r
            .collectives
            .iter()
            .find(|c| c.kind == "all_to_all")
            .expect("all-to-alls");
        assert_eq!(a2a.count, 4, "{file}: 2 forward + 2 backward all-to-alls");
        // Analytic: (D-1)/D of the global E*G*C*M tensor per all-to-all.
        let egcm = p.ty(p.output("expert_inputs").unwrap()).size_bytes();
        assert_eq!(a2a.bytes, 4 * egcm * (d - 1) / d, "{file} {d} devices");
    }
}

#[test]
fn moe_relu_all_f32_matches_reference_on_1_2_4_devices() {
    check_program("moe_relu_all.gsir");
}

#[test]
fn moe_gelu_random_f32_matches_reference_on_1_2_4_devices() {
    check_program("moe_gelu_random.gsir");
}

#[test]
fn moe_relu_all_f64_matches_reference_on_1_2_4_devices() {
    check_program("moe_relu_all_f64.gsir");
}

/// Two callers running in-process executables on the one rayon pool at the same time
/// (tests in one process, a user's threads): the pool's threads, kept busy through each
/// run and waiting at its segments' ends, must let both runs finish, with the values each
/// run gives alone.
#[test]
fn concurrent_runs_on_one_pool_finish_and_agree() {
    let p = fixture("moe_relu_all.gsir");
    let ins = inputs(&p, 11);
    let mut q = p.clone();
    q.mesh = Some(Mesh::new(&[("expert", 4)]).unwrap());
    let part = spmd::compile(&q).unwrap();
    let per_dev = shard(&part, &ins);
    let exe = Executable::new(&part.program).unwrap();
    let alone = exe.run(&InProcess::new(4), &per_dev, None).unwrap().outputs;
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let exe = Executable::new(&part.program).unwrap();
                    (0..100)
                        .map(|_| exe.run(&InProcess::new(4), &per_dev, None).unwrap().outputs)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for r in runs {
            for outs in r.join().expect("a run panicked") {
                for (dev, (got, want)) in outs.iter().zip(&alone).enumerate() {
                    for (name, w) in want {
                        assert_eq!(
                            got[name].to_f64_vec(),
                            w.to_f64_vec(),
                            "{name} on device {dev}"
                        );
                    }
                }
            }
        }
    });
}
