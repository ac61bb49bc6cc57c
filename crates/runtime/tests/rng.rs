//! The `rng` op through the interpreter: Philox known answers, determinism, shard
//! invariance (offsets and partition-id arithmetic reproduce slices of the unsharded tensor),
//! and distribution sanity.

mod common;

use common::{inputs, run1};
use ir::{Builder, DType, Mesh, Op, RngDist, Type, Value};
use runtime::rng::{philox4x32_10, random_bits, sample};
use runtime::{run_spmd, HostTensor};
use std::collections::HashMap;

#[test]
fn philox_known_answer_vectors() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([0xffffffff; 4], [0xffffffff; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
}

#[test]
fn counter_and_key_mapping() {
    let seed = -5i32;
    let stream = (7u64 << 32) | 3;
    let index = (9u64 << 32) | 11;
    assert_eq!(
        random_bits(seed, stream, index),
        philox4x32_10([11, 9, 7, 0], [seed as u32, 3])
    );
    let bits = philox4x32_10([11, 9, 7, 0], [seed as u32, 3]);
    let want = (bits[0] >> 8) as f64 / 16_777_216.0;
    assert_eq!(
        sample(RngDist::Uniform, DType::F64, seed, stream, index),
        want
    );
}

fn rng_program(dist: RngDist, dtype: DType, shape: &[usize]) -> ir::Program {
    let b = Builder::new();
    let seed = b.param("seed", Type::scalar(DType::I32));
    b.output("r", &b.rng(dist, &seed, Type::new(dtype, shape.to_vec())));
    b.finish()
}

fn draw(dist: RngDist, dtype: DType, shape: &[usize], seed: i32) -> Vec<f64> {
    let p = rng_program(dist, dtype, shape);
    run1(&p, vec![("seed", HostTensor::scalar_i32(seed))])["r"].to_f64_vec()
}

#[test]
fn rng_is_deterministic_and_seed_and_stream_dependent() {
    let a = draw(RngDist::Uniform, DType::F32, &[64], 1);
    assert_eq!(a, draw(RngDist::Uniform, DType::F32, &[64], 1));
    assert_ne!(a, draw(RngDist::Uniform, DType::F32, &[64], 2));
    // Two rng ops of one program get different streams.
    let b = Builder::new();
    let seed = b.param("seed", Type::scalar(DType::I32));
    let ty = Type::new(DType::F32, vec![64]);
    b.output("r0", &b.rng(RngDist::Uniform, &seed, ty.clone()));
    b.output("r1", &b.rng(RngDist::Uniform, &seed, ty));
    let p = b.finish();
    let r = run1(&p, vec![("seed", HostTensor::scalar_i32(1))]);
    assert_eq!(r["r0"].to_f64_vec(), a);
    assert_ne!(r["r0"].to_f64_vec(), r["r1"].to_f64_vec());
}

/// An rng over global shape [8, 6] producing the [4, 3] block at `offsets`.
fn block(b: &Builder, dist: RngDist, dtype: DType, seed: &Value, off: [&Value; 2]) -> Value {
    b.emit(
        Op::Rng {
            dist,
            stream: 0,
            global_shape: vec![8, 6],
        },
        &[seed, off[0], off[1]],
        Some(Type::new(dtype, vec![4, 3])),
    )
}

#[test]
fn rng_with_offsets_equals_the_slice_of_the_unsharded_tensor() {
    for dist in [RngDist::Uniform, RngDist::Normal] {
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            let full = draw(dist, dtype, &[8, 6], 42);
            for (r0, c0) in [(0, 0), (0, 3), (4, 0), (4, 3), (2, 1)] {
                let b = Builder::new();
                let seed = b.param("seed", Type::scalar(DType::I32));
                let o0 = b.scalar(r0 as f64, DType::I32);
                let o1 = b.scalar(c0 as f64, DType::I32);
                b.output("r", &block(&b, dist, dtype, &seed, [&o0, &o1]));
                let p = b.finish();
                let got = run1(&p, vec![("seed", HostTensor::scalar_i32(42))])["r"].to_f64_vec();
                for i in 0..4 {
                    for j in 0..3 {
                        assert_eq!(
                            got[i * 3 + j],
                            full[(r0 + i) * 6 + c0 + j],
                            "{dist:?} {dtype:?} block ({r0},{c0}) element ({i},{j})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sharded_rng_on_a_2x2_mesh_reassembles_the_unsharded_tensor() {
    // Offsets computed from partition_id as a partitioner would: (pid / 2 * 4, pid % 2 * 3).
    let full = draw(RngDist::Normal, DType::F32, &[8, 6], 7);
    let b = Builder::with_mesh(Mesh::parse_spec("a=2,b=2").unwrap());
    let seed = b.param("seed", Type::scalar(DType::I32));
    let pid = b.partition_id();
    let o0 = pid.div(2.0).mul(4.0);
    let o1 = pid.rem(2.0).mul(3.0);
    b.output(
        "r",
        &block(&b, RngDist::Normal, DType::F32, &seed, [&o0, &o1]),
    );
    let p = b.finish();
    let ins: Vec<HashMap<String, HostTensor>> = (0..4)
        .map(|_| inputs(vec![("seed", HostTensor::scalar_i32(7))]))
        .collect();
    let outs = run_spmd(&p, &ins).unwrap();
    for (pos, o) in outs.iter().enumerate() {
        let (r0, c0) = (pos / 2 * 4, pos % 2 * 3);
        let got = o["r"].to_f64_vec();
        for i in 0..4 {
            for j in 0..3 {
                assert_eq!(got[i * 3 + j], full[(r0 + i) * 6 + c0 + j]);
            }
        }
    }
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

#[test]
fn uniform_is_in_unit_interval_with_the_right_moments() {
    for dtype in [DType::F32, DType::BF16] {
        let v = draw(RngDist::Uniform, dtype, &[200, 500], 3);
        assert!(v.iter().all(|&u| (0.0..1.0).contains(&u)), "{dtype:?}");
        let (m, var) = mean_var(&v);
        assert!((m - 0.5).abs() < 0.005, "{dtype:?} mean {m}");
        assert!((var - 1.0 / 12.0).abs() < 0.003, "{dtype:?} var {var}");
    }
}

#[test]
fn normal_has_mean_zero_and_variance_one() {
    let v = draw(RngDist::Normal, DType::F32, &[200, 500], 11);
    assert!(v.iter().all(|x| x.is_finite()));
    let (m, var) = mean_var(&v);
    assert!(m.abs() < 0.015, "mean {m}");
    assert!((var - 1.0).abs() < 0.025, "var {var}");
    // About 68.3% of the mass within one standard deviation.
    let within = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / v.len() as f64;
    assert!((within - 0.6827).abs() < 0.01, "{within}");
}

/// The executor's batched generator (`layout::random`: Philox on sixteen counters at once,
/// one index computation per row run) against the per-element rule `rng::sample`, bit for
/// bit: every dtype and distribution, rows shorter and longer than a lane block and than a
/// task chunk, a scalar, offsets that wrap (negative, past the shape: the padding of an
/// uneven shard), indices across 2^32 (counter word 1) and streams above 2^32 (word 2).
#[test]
fn batched_generator_is_the_per_element_rule() {
    use runtime::kernels::layout::random;
    use runtime::rng::linear_index;
    use runtime::Data;
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<i64>)> = vec![
        (vec![], vec![], vec![]),
        (vec![5], vec![5], vec![0]),
        (vec![40], vec![17], vec![23]),
        (vec![8, 6], vec![4, 3], vec![4, 3]),
        (vec![3, 7, 33], vec![2, 5, 31], vec![1, 2, 2]),
        (vec![9, 4099], vec![3, 4099], vec![5, 0]),
        (vec![6, 10], vec![4, 7], vec![-2, 5]),
        (
            vec![1 << 20, 1 << 13],
            vec![2, 40],
            vec![(1 << 19) - 1, 8170],
        ),
    ];
    for (global, local, offsets) in cases {
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            for dist in [RngDist::Uniform, RngDist::Normal] {
                for (seed, stream) in [(7, 3u64), (-5, (9u64 << 32) | 1)] {
                    let n: usize = local.iter().product();
                    let mut out = match dtype {
                        DType::F32 => Data::F32(vec![0.0; n]),
                        DType::F64 => Data::F64(vec![0.0; n]),
                        _ => Data::BF16(vec![half::bf16::ZERO; n]),
                    };
                    random(dist, stream, &global, seed, &offsets, &local, &mut out);
                    let got = HostTensor {
                        ty: Type::new(dtype, local.clone()),
                        data: out,
                    }
                    .to_f64_vec();
                    let st = ir::strides(&local);
                    for (i, &g) in got.iter().enumerate() {
                        let coords: Vec<i64> = (0..local.len())
                            .map(|d| ((i / st[d]) % local[d]) as i64 + offsets[d])
                            .collect();
                        let want =
                            sample(dist, dtype, seed, stream, linear_index(&global, &coords));
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{global:?} {local:?} {offsets:?} {dtype:?} {dist:?} element {i}"
                        );
                    }
                }
            }
        }
    }
}
