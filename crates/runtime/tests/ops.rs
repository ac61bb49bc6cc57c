//! Hand-computed values for every non-collective op through `runtime::run` (the reference
//! interpreter), including the edge cases whose semantics the runtime fixes.

mod common;

use common::{assert_close, assert_same, out, run1};
use ir::{Builder, DType, DotDims, Op, ReduceOp, Type};
use runtime::HostTensor;

fn f32t(shape: &[usize]) -> Type {
    Type::new(DType::F32, shape.to_vec())
}

fn i32t(shape: &[usize]) -> Type {
    Type::new(DType::I32, shape.to_vec())
}

fn x_f32(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape.to_vec(), v.to_vec())
}

#[test]
fn constant_splat_and_dense() {
    let b = Builder::new();
    b.output("s", &b.splat(2.5, f32t(&[2, 2])));
    b.output("d", &b.constant(vec![1.0, -2.0, 3.0], i32t(&[3])));
    b.output("bf", &b.scalar(1.0 + 1.0 / 256.0, DType::BF16));
    let p = b.finish();
    let r = run1(&p, vec![]);
    assert_eq!(r["s"].as_f32(), Some(&[2.5f32; 4][..]));
    assert_eq!(r["d"].as_i32(), Some(&[1, -2, 3][..]));
    // 1 + 2^-8 is a tie between bf16 1 and 1 + 2^-7: to even.
    assert_eq!(r["bf"].to_f64_vec(), vec![1.0]);
}

#[test]
fn iota_along_each_dim() {
    let b = Builder::new();
    b.output("d0", &b.iota(f32t(&[2, 3]), 0));
    b.output("d1", &b.iota(i32t(&[2, 3]), 1));
    let p = b.finish();
    let r = run1(&p, vec![]);
    assert_eq!(r["d0"].to_f64_vec(), vec![0., 0., 0., 1., 1., 1.]);
    assert_eq!(r["d1"].as_i32(), Some(&[0, 1, 2, 0, 1, 2][..]));
}

/// A reference scalar function.
type Scalar = fn(f64) -> f64;

#[test]
fn unary_float_functions() {
    let xs = [0.5f64, -1.5, 2.0, 0.0];
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F64, vec![4]));
    let ops: Vec<(&str, ir::Value, Scalar)> = vec![
        ("neg", x.neg(), |v| -v),
        ("abs", x.abs(), f64::abs),
        ("exp", x.exp(), f64::exp),
        ("tanh", x.tanh(), f64::tanh),
        ("sin", x.sin(), f64::sin),
        ("cos", x.cos(), f64::cos),
        ("floor", x.floor(), f64::floor),
        ("log1p", x.abs().log1p(), |v| v.abs().ln_1p()),
        ("sqrt", x.abs().sqrt(), |v| v.abs().sqrt()),
    ];
    for (n, v, _) in &ops {
        b.output(n, v);
    }
    b.output("sign", &x.sign());
    b.output("log", &x.log());
    b.output("rsqrt", &x.rsqrt());
    b.output("logistic", &x.logistic());
    b.output("erf", &x.erf());
    let p = b.finish();
    let r = run1(&p, vec![("x", HostTensor::from_f64(vec![4], xs.to_vec()))]);
    for (n, _, f) in &ops {
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        assert_close(&r[*n].to_f64_vec(), &want, 1e-15);
    }
    assert_same(&r["sign"].to_f64_vec(), &[1.0, -1.0, 1.0, 0.0]);
    let log = r["log"].to_f64_vec();
    assert_close(&log[..3], &[0.5f64.ln(), f64::NAN, 2f64.ln()], 1e-15);
    assert_eq!(log[3], f64::NEG_INFINITY);
    let rs = r["rsqrt"].to_f64_vec();
    assert_close(&[rs[0], rs[2]], &[2f64.sqrt(), 0.5f64.sqrt()], 1e-15);
    assert_eq!(rs[3], f64::INFINITY);
    assert_close(
        &r["logistic"].to_f64_vec(),
        &[
            1.0 / (1.0 + (-0.5f64).exp()),
            1.0 / (1.0 + 1.5f64.exp()),
            1.0 / (1.0 + (-2f64).exp()),
            0.5,
        ],
        1e-15,
    );
    // erf reference values (Abramowitz & Stegun table 7.1 / high-precision tables).
    assert_close(
        &r["erf"].to_f64_vec(),
        &[
            0.520_499_877_813_046_5,
            -0.966_105_146_475_310_7,
            0.995_322_265_018_952_7,
            0.0,
        ],
        1e-15,
    );
}

#[test]
fn unary_results_round_to_f32_and_bf16() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[1]));
    b.output("e", &x.exp());
    b.output("ebf", &x.convert(DType::BF16).exp());
    let p = b.finish();
    let r = run1(&p, vec![("x", x_f32(&[1], &[1.0]))]);
    assert_eq!(r["e"].as_f32().unwrap()[0], std::f64::consts::E as f32);
    // e = 2.71828...; bf16 spacing at 2 is 2^-6: nearest is 2.71875.
    assert_eq!(r["ebf"].to_f64_vec(), vec![2.71875]);
}

#[test]
fn unary_int_and_bool() {
    let b = Builder::new();
    let i = b.param("i", i32t(&[4]));
    let t = b.param("t", Type::new(DType::Bool, vec![2]));
    b.output("neg", &i.neg());
    b.output("abs", &i.abs());
    b.output("sign", &i.sign());
    b.output("not", &i.not());
    b.output("bnot", &t.not());
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("i", HostTensor::from_i32(vec![4], vec![5, -3, 0, i32::MIN])),
            ("t", HostTensor::from_bool(vec![2], vec![true, false])),
        ],
    );
    assert_eq!(r["neg"].as_i32(), Some(&[-5, 3, 0, i32::MIN][..]));
    assert_eq!(r["abs"].as_i32(), Some(&[5, 3, 0, i32::MIN][..]));
    assert_eq!(r["sign"].as_i32(), Some(&[1, -1, 0, -1][..]));
    assert_eq!(r["not"].as_i32(), Some(&[!5, !-3, -1, i32::MAX][..]));
    assert_eq!(r["bnot"].as_bool(), Some(&[false, true][..]));
}

#[test]
fn binary_float() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[4]));
    let y = b.param("y", f32t(&[4]));
    for (n, v) in [
        ("add", x.add(&y)),
        ("sub", x.sub(&y)),
        ("mul", x.mul(&y)),
        ("div", x.div(&y)),
        ("rem", x.rem(&y)),
        ("pow", x.abs().pow(&y)),
        ("max", x.max(&y)),
        ("min", x.min(&y)),
    ] {
        b.output(n, &v);
    }
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[4], &[7.0, -7.0, 1.0, f32::NAN])),
            ("y", x_f32(&[4], &[2.0, 2.0, 3.0, 1.0])),
        ],
    );
    let g = |n: &str| r[n].to_f64_vec();
    assert_same(&g("add"), &[9.0, -5.0, 4.0, f64::NAN]);
    assert_same(&g("sub"), &[5.0, -9.0, -2.0, f64::NAN]);
    assert_same(&g("mul"), &[14.0, -14.0, 3.0, f64::NAN]);
    assert_same(&g("div"), &[3.5, -3.5, (1.0f32 / 3.0) as f64, f64::NAN]);
    assert_same(&g("rem"), &[1.0, -1.0, 1.0, f64::NAN]);
    assert_same(&g("pow"), &[49.0, 49.0, 1.0, f64::NAN]);
    assert_same(&g("max"), &[7.0, 2.0, 3.0, f64::NAN]);
    assert_same(&g("min"), &[2.0, -7.0, 1.0, f64::NAN]);
}

#[test]
fn binary_int_division_wrapping_and_bitwise() {
    let b = Builder::new();
    let x = b.param("x", i32t(&[6]));
    let y = b.param("y", i32t(&[6]));
    for (n, v) in [
        ("add", x.add(&y)),
        ("mul", x.mul(&y)),
        ("div", x.div(&y)),
        ("rem", x.rem(&y)),
        ("and", x.and(&y)),
        ("or", x.or(&y)),
        ("max", x.max(&y)),
    ] {
        b.output(n, &v);
    }
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            (
                "x",
                HostTensor::from_i32(vec![6], vec![7, -7, 7, -7, 5, i32::MAX]),
            ),
            ("y", HostTensor::from_i32(vec![6], vec![2, 2, -2, 0, 0, 2])),
        ],
    );
    let g = |n: &str| r[n].as_i32().unwrap().to_vec();
    assert_eq!(g("add"), vec![9, -5, 5, -7, 5, i32::MIN + 1]);
    assert_eq!(g("mul"), vec![14, -14, -14, 0, 0, -2]);
    assert_eq!(g("div"), vec![3, -3, -3, 0, 0, i32::MAX / 2]);
    assert_eq!(g("rem"), vec![1, -1, 1, 0, 0, 1]);
    assert_eq!(g("and"), vec![2, 0, 6, 0, 0, 2]);
    assert_eq!(g("or"), vec![7, -5, -1, -7, 5, i32::MAX]);
    assert_eq!(g("max"), vec![7, 2, 7, 0, 5, i32::MAX]);
}

#[test]
fn binary_bool_logic() {
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::Bool, vec![4]));
    let y = b.param("y", Type::new(DType::Bool, vec![4]));
    b.output("and", &x.and(&y));
    b.output("or", &x.or(&y));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            (
                "x",
                HostTensor::from_bool(vec![4], vec![true, true, false, false]),
            ),
            (
                "y",
                HostTensor::from_bool(vec![4], vec![true, false, true, false]),
            ),
        ],
    );
    assert_eq!(r["and"].as_bool(), Some(&[true, false, false, false][..]));
    assert_eq!(r["or"].as_bool(), Some(&[true, true, true, false][..]));
}

#[test]
fn compare_all_with_nan() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3]));
    let y = b.param("y", f32t(&[3]));
    for (n, v) in [
        ("eq", x.eq(&y)),
        ("ne", x.ne(&y)),
        ("lt", x.lt(&y)),
        ("le", x.le(&y)),
        ("gt", x.gt(&y)),
        ("ge", x.ge(&y)),
    ] {
        b.output(n, &v);
    }
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[3], &[1.0, 2.0, f32::NAN])),
            ("y", x_f32(&[3], &[2.0, 2.0, 1.0])),
        ],
    );
    let g = |n: &str| r[n].as_bool().unwrap().to_vec();
    assert_eq!(g("eq"), vec![false, true, false]);
    assert_eq!(g("ne"), vec![true, false, true]);
    assert_eq!(g("lt"), vec![true, false, false]);
    assert_eq!(g("le"), vec![true, true, false]);
    assert_eq!(g("gt"), vec![false, false, false]);
    assert_eq!(g("ge"), vec![false, true, false]);
}

#[test]
fn select_picks_by_predicate() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3]));
    b.output("y", &x.gt(0.0).select(&x, -1.0));
    let p = b.finish();
    assert_eq!(
        out(&p, vec![("x", x_f32(&[3], &[2.0, -3.0, 0.5]))], "y"),
        vec![2.0, -1.0, 0.5]
    );
}

#[test]
fn convert_edge_cases() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[6]));
    b.output("i", &x.convert(DType::I32));
    b.output("b", &x.convert(DType::Bool));
    b.output("f", &x.convert(DType::Bool).convert(DType::F32));
    let i = b.param("n", i32t(&[3]));
    b.output("bf", &i.convert(DType::BF16));
    b.output("f32", &i.convert(DType::F32));
    let d = b.param("d", Type::new(DType::F64, vec![1]));
    b.output("d32", &d.convert(DType::F32));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[6], &[2.7, -2.7, f32::NAN, 1e10, -1e10, 0.0])),
            (
                "n",
                HostTensor::from_i32(vec![3], vec![257, 16_777_217, -3]),
            ),
            ("d", HostTensor::from_f64(vec![1], vec![0.1])),
        ],
    );
    assert_eq!(
        r["i"].as_i32(),
        Some(&[2, -2, 0, i32::MAX, i32::MIN, 0][..])
    );
    assert_eq!(
        r["b"].as_bool(),
        Some(&[true, true, true, true, true, false][..])
    );
    assert_eq!(r["f"].to_f64_vec(), vec![1., 1., 1., 1., 1., 0.]);
    // bf16 has 8 significant bits: 257 is a tie between 256 and 258 -> even (256).
    assert_eq!(r["bf"].to_f64_vec(), vec![256.0, 16_777_216.0, -3.0]);
    assert_eq!(r["f32"].to_f64_vec(), vec![257.0, 16_777_216.0, -3.0]);
    assert_eq!(r["d32"].as_f32(), Some(&[0.1f32][..]));
}

#[test]
fn stop_gradient_and_copy_are_identity() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2]));
    b.output("s", &x.stop_gradient());
    b.output("c", &x.copy());
    let p = b.finish();
    let r = run1(&p, vec![("x", x_f32(&[2], &[1.5, -2.0]))]);
    assert_eq!(r["s"].to_f64_vec(), vec![1.5, -2.0]);
    assert_eq!(r["c"].to_f64_vec(), vec![1.5, -2.0]);
}

#[test]
fn broadcast_in_dim() {
    let b = Builder::new();
    let v = b.param("v", f32t(&[3]));
    let w = b.param("w", f32t(&[2]));
    let s = b.param("s", f32t(&[]));
    b.output("rows", &v.broadcast_in_dim(&[2, 3], &[1]));
    b.output("cols", &w.broadcast_in_dim(&[2, 3], &[0]));
    b.output("splat", &s.broadcast_in_dim(&[2, 2], &[]));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("v", x_f32(&[3], &[1., 2., 3.])),
            ("w", x_f32(&[2], &[10., 20.])),
            ("s", x_f32(&[], &[7.])),
        ],
    );
    assert_eq!(r["rows"].to_f64_vec(), vec![1., 2., 3., 1., 2., 3.]);
    assert_eq!(r["cols"].to_f64_vec(), vec![10., 10., 10., 20., 20., 20.]);
    assert_eq!(r["splat"].to_f64_vec(), vec![7.; 4]);
    assert_eq!(r["splat"].shape(), &[2, 2]);
}

#[test]
fn reshape_and_transpose() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 3]));
    b.output("r", &x.reshape(&[3, 2]));
    b.output("t", &x.transpose(&[1, 0]));
    let y = b.param("y", f32t(&[2, 3, 4]));
    b.output("t3", &y.transpose(&[2, 0, 1]));
    let p = b.finish();
    let yv: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("y", HostTensor::from_f32(vec![2, 3, 4], yv)),
        ],
    );
    assert_eq!(r["r"].shape(), &[3, 2]);
    assert_eq!(r["r"].to_f64_vec(), vec![1., 2., 3., 4., 5., 6.]);
    assert_eq!(r["t"].to_f64_vec(), vec![1., 4., 2., 5., 3., 6.]);
    // out[k, i, j] = y[i, j, k] = 12 i + 4 j + k.
    let t3 = r["t3"].to_f64_vec();
    assert_eq!(r["t3"].shape(), &[4, 2, 3]);
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                assert_eq!(t3[k * 6 + i * 3 + j], (12 * i + 4 * j + k) as f64);
            }
        }
    }
}

#[test]
fn static_slice() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3, 4]));
    b.output("s", &x.slice(&[1, 1], &[3, 3]));
    let p = b.finish();
    let xv: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let r = run1(&p, vec![("x", HostTensor::from_f32(vec![3, 4], xv))]);
    assert_eq!(r["s"].to_f64_vec(), vec![5., 6., 9., 10.]);
}

#[test]
fn dynamic_slice_clamps_starts() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[5]));
    let s = b.param("s", i32t(&[]));
    b.output("y", &x.dynamic_slice(&[&s], &[2]));
    let m = b.param("m", f32t(&[3, 3]));
    let r0 = b.param("r0", i32t(&[]));
    let c0 = b.param("c0", i32t(&[]));
    b.output("z", &m.dynamic_slice(&[&r0, &c0], &[2, 2]));
    let p = b.finish();
    let mv: Vec<f32> = (0..9).map(|i| i as f32).collect();
    let run = |start: i32, r: i32, c: i32| {
        run1(
            &p,
            vec![
                ("x", x_f32(&[5], &[0., 1., 2., 3., 4.])),
                ("s", HostTensor::scalar_i32(start)),
                ("m", HostTensor::from_f32(vec![3, 3], mv.clone())),
                ("r0", HostTensor::scalar_i32(r)),
                ("c0", HostTensor::scalar_i32(c)),
            ],
        )
    };
    assert_eq!(run(1, 0, 0)["y"].to_f64_vec(), vec![1., 2.]);
    assert_eq!(run(4, 0, 0)["y"].to_f64_vec(), vec![3., 4.]); // clamped to 3
    assert_eq!(run(-2, 0, 0)["y"].to_f64_vec(), vec![0., 1.]); // clamped to 0
    assert_eq!(run(0, 1, 1)["z"].to_f64_vec(), vec![4., 5., 7., 8.]);
    assert_eq!(run(0, 9, -9)["z"].to_f64_vec(), vec![3., 4., 6., 7.]);
}

#[test]
fn dynamic_update_slice_clamps_starts() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 4]));
    let u = b.param("u", f32t(&[1, 2]));
    let r0 = b.param("r0", i32t(&[]));
    let c0 = b.param("c0", i32t(&[]));
    b.output("y", &x.dynamic_update_slice(&u, &[&r0, &c0]));
    let p = b.finish();
    let run = |r: i32, c: i32| {
        out(
            &p,
            vec![
                ("x", HostTensor::from_f32(vec![2, 4], vec![0.0; 8])),
                ("u", x_f32(&[1, 2], &[7., 8.])),
                ("r0", HostTensor::scalar_i32(r)),
                ("c0", HostTensor::scalar_i32(c)),
            ],
            "y",
        )
    };
    assert_eq!(run(1, 1), vec![0., 0., 0., 0., 0., 7., 8., 0.]);
    assert_eq!(run(5, 3), vec![0., 0., 0., 0., 0., 0., 7., 8.]);
    assert_eq!(run(-1, -4), vec![7., 8., 0., 0., 0., 0., 0., 0.]);
}

#[test]
fn pad_low_and_high() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 2]));
    b.output("y", &x.pad(&[1, 0], &[0, 2], -1.0));
    let p = b.finish();
    let r = run1(&p, vec![("x", x_f32(&[2, 2], &[1., 2., 3., 4.]))]);
    assert_eq!(r["y"].shape(), &[3, 4]);
    assert_eq!(
        r["y"].to_f64_vec(),
        vec![-1., -1., -1., -1., 1., 2., -1., -1., 3., 4., -1., -1.]
    );
}

#[test]
fn concatenate_three() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 1]));
    let y = b.param("y", f32t(&[2, 2]));
    b.output("c", &b.concat(&[&x, &y, &x], 1));
    b.output("r", &b.concat(&[&y, &y], 0));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[2, 1], &[1., 2.])),
            ("y", x_f32(&[2, 2], &[3., 4., 5., 6.])),
        ],
    );
    assert_eq!(r["c"].to_f64_vec(), vec![1., 3., 4., 1., 2., 5., 6., 2.]);
    assert_eq!(r["r"].to_f64_vec(), vec![3., 4., 5., 6., 3., 4., 5., 6.]);
}

#[test]
fn reduce_sum_max_min_over_dims() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 3, 2]));
    b.output("sum02", &x.sum(&[0, 2]));
    b.output("max1", &x.reduce_max(&[1]));
    b.output("min_all", &x.reduce_min(&[0, 1, 2]));
    let i = b.param("i", i32t(&[2, 2]));
    b.output("imax", &i.reduce_max(&[1]));
    b.output("isum", &i.sum(&[0]));
    let p = b.finish();
    let xv: Vec<f32> = (0..12)
        .map(|v| (v as f32) * if v % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let r = run1(
        &p,
        vec![
            ("x", HostTensor::from_f32(vec![2, 3, 2], xv)),
            (
                "i",
                HostTensor::from_i32(vec![2, 2], vec![i32::MAX, 3, 1, -4]),
            ),
        ],
    );
    // x = [[[0,-1],[2,-3],[4,-5]], [[6,-7],[8,-9],[10,-11]]]
    assert_eq!(r["sum02"].to_f64_vec(), vec![-2., -2., -2.]);
    assert_eq!(r["max1"].to_f64_vec(), vec![4., -1., 10., -7.]);
    assert_eq!(r["min_all"].to_f64_vec(), vec![-11.]);
    assert_eq!(r["imax"].as_i32(), Some(&[i32::MAX, 1][..]));
    assert_eq!(r["isum"].as_i32(), Some(&[i32::MIN, -1][..])); // wraps
}

#[test]
fn reduce_over_empty_dim_gives_identity() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 0]));
    b.output("sum", &x.sum(&[1]));
    b.output("max", &x.reduce_max(&[1]));
    b.output("min", &x.reduce_min(&[1]));
    let i = b.param("i", i32t(&[0]));
    b.output("imax", &i.reduce_max(&[0]));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", HostTensor::from_f32(vec![2, 0], vec![])),
            ("i", HostTensor::from_i32(vec![0], vec![])),
        ],
    );
    assert_eq!(r["sum"].to_f64_vec(), vec![0., 0.]);
    assert_eq!(r["max"].to_f64_vec(), vec![f64::NEG_INFINITY; 2]);
    assert_eq!(r["min"].to_f64_vec(), vec![f64::INFINITY; 2]);
    assert_eq!(r["imax"].as_i32(), Some(&[i32::MIN][..]));
}

#[test]
fn reduce_max_propagates_nan() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3]));
    b.output("m", &x.reduce(ReduceOp::Max, &[0]));
    let p = b.finish();
    assert!(out(&p, vec![("x", x_f32(&[3], &[1., f32::NAN, 3.]))], "m")[0].is_nan());
}

#[test]
fn dot_general_matmul() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 3]));
    let w = b.param("w", f32t(&[3, 2]));
    b.output("y", &x.matmul(&w));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("w", x_f32(&[3, 2], &[7., 8., 9., 10., 11., 12.])),
        ],
    );
    assert_eq!(r["y"].to_f64_vec(), vec![58., 64., 139., 154.]);
}

#[test]
fn dot_general_with_batch_dims() {
    // lhs [b=2, m=2, k=2], rhs [b=2, k=2, n=1] -> [b, m, n].
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 2, 2]));
    let y = b.param("y", f32t(&[2, 2, 1]));
    let dd = DotDims {
        lhs_batch: vec![0],
        rhs_batch: vec![0],
        lhs_contract: vec![2],
        rhs_contract: vec![1],
    };
    b.output("z", &x.dot_general(&y, dd));
    // Batch dims not leading: lhs [k=3, b=2], rhs [b=2, k=3] -> [b].
    let u = b.param("u", f32t(&[3, 2]));
    let v = b.param("v", f32t(&[2, 3]));
    let dd2 = DotDims {
        lhs_batch: vec![1],
        rhs_batch: vec![0],
        lhs_contract: vec![0],
        rhs_contract: vec![1],
    };
    b.output("w", &u.dot_general(&v, dd2));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.])),
            ("y", x_f32(&[2, 2, 1], &[1., 10., 100., 1000.])),
            ("u", x_f32(&[3, 2], &[1., 2., 3., 4., 5., 6.])),
            ("v", x_f32(&[2, 3], &[1., 1., 1., 1., 10., 100.])),
        ],
    );
    assert_eq!(r["z"].shape(), &[2, 2, 1]);
    assert_eq!(r["z"].to_f64_vec(), vec![21., 43., 6500., 8700.]);
    // w[0] = 1+3+5 = 9; w[1] = 2*1 + 4*10 + 6*100 = 642.
    assert_eq!(r["w"].to_f64_vec(), vec![9., 642.]);
}

#[test]
fn dot_general_outer_product_and_i32() {
    let b = Builder::new();
    let x = b.param("x", i32t(&[2]));
    let y = b.param("y", i32t(&[3]));
    b.output("o", &x.dot_general(&y, DotDims::default()));
    let m = b.param("m", i32t(&[1, 2]));
    let n = b.param("n", i32t(&[2, 1]));
    b.output("ip", &m.matmul(&n));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", HostTensor::from_i32(vec![2], vec![1, 2])),
            ("y", HostTensor::from_i32(vec![3], vec![3, 4, 5])),
            ("m", HostTensor::from_i32(vec![1, 2], vec![65536, 1])),
            ("n", HostTensor::from_i32(vec![2, 1], vec![65536, 7])),
        ],
    );
    assert_eq!(r["o"].as_i32(), Some(&[3, 4, 5, 6, 8, 10][..]));
    assert_eq!(r["ip"].as_i32(), Some(&[7][..])); // 2^32 wraps to 0
}

#[test]
fn cumsum_variants() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[4]));
    b.output("inc", &x.cumsum(0, false, false));
    b.output("exc", &x.cumsum(0, true, false));
    b.output("rinc", &x.cumsum(0, false, true));
    b.output("rexc", &x.cumsum(0, true, true));
    let m = b.param("m", i32t(&[2, 2]));
    b.output("m0", &m.cumsum(0, false, false));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[4], &[1., 2., 3., 4.])),
            ("m", HostTensor::from_i32(vec![2, 2], vec![1, 2, 3, 4])),
        ],
    );
    assert_eq!(r["inc"].to_f64_vec(), vec![1., 3., 6., 10.]);
    assert_eq!(r["exc"].to_f64_vec(), vec![0., 1., 3., 6.]);
    assert_eq!(r["rinc"].to_f64_vec(), vec![10., 9., 7., 4.]);
    assert_eq!(r["rexc"].to_f64_vec(), vec![9., 7., 4., 0.]);
    assert_eq!(r["m0"].as_i32(), Some(&[1, 2, 4, 6][..]));
}

#[test]
fn argmax_ties_and_nan() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 4]));
    b.output("a1", &x.argmax(1));
    b.output("a0", &x.argmax(0));
    let p = b.finish();
    let r = run1(
        &p,
        vec![(
            "x",
            x_f32(&[2, 4], &[1., 3., 3., 2., 1., f32::NAN, 5., f32::NAN]),
        )],
    );
    assert_eq!(r["a1"].as_i32(), Some(&[1, 1][..]));
    assert_eq!(r["a0"].as_i32(), Some(&[0, 1, 1, 1][..]));
}

#[test]
fn gather_with_out_of_range_indices() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3, 2]));
    let i = b.param("i", i32t(&[2, 2]));
    b.output("g0", &x.gather(&i, 0, 0)); // [2, 2, 2]
    let j = b.param("j", i32t(&[3]));
    b.output("g1", &x.gather(&j, 1, 0)); // [3, 3]
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[3, 2], &[1., 2., 3., 4., 5., 6.])),
            ("i", HostTensor::from_i32(vec![2, 2], vec![2, 0, -1, 3])),
            ("j", HostTensor::from_i32(vec![3], vec![1, 2, 0])),
        ],
    );
    assert_eq!(r["g0"].shape(), &[2, 2, 2]);
    assert_eq!(r["g0"].to_f64_vec(), vec![5., 6., 1., 2., 0., 0., 0., 0.]);
    assert_eq!(r["g1"].shape(), &[3, 3]);
    assert_eq!(
        r["g1"].to_f64_vec(),
        vec![2., 0., 1., 4., 0., 3., 6., 0., 5.]
    );
}

#[test]
fn gather_with_batch_dims() {
    // x [b=2, n=3, d=2], idx [b=2, k=2], axis 1, batch_dims 1: out[b, k, d] = x[b, idx[b,k], d].
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 3, 2]));
    let i = b.param("i", i32t(&[2, 2]));
    b.output("g", &x.gather(&i, 1, 1));
    let p = b.finish();
    let xv: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let r = run1(
        &p,
        vec![
            ("x", HostTensor::from_f32(vec![2, 3, 2], xv)),
            ("i", HostTensor::from_i32(vec![2, 2], vec![2, 0, 1, 3])),
        ],
    );
    assert_eq!(r["g"].shape(), &[2, 2, 2]);
    assert_eq!(r["g"].to_f64_vec(), vec![4., 5., 0., 1., 8., 9., 0., 0.]);
}

#[test]
fn scatter_add_accumulates_and_drops_out_of_range() {
    let b = Builder::new();
    let base = b.param("base", f32t(&[3]));
    let i = b.param("i", i32t(&[5]));
    let u = b.param("u", f32t(&[5]));
    b.output("s", &base.scatter_add(&i, &u, 0, 0));
    // With batch dims: base [b=2, n=3], idx [b=2, k=2], upd [b=2, k=2].
    let base2 = b.param("base2", f32t(&[2, 3]));
    let i2 = b.param("i2", i32t(&[2, 2]));
    let u2 = b.param("u2", f32t(&[2, 2]));
    b.output("s2", &base2.scatter_add(&i2, &u2, 1, 1));
    let ib = b.param("ib", i32t(&[2]));
    let ii = b.param("ii", i32t(&[2]));
    let iu = b.param("iu", i32t(&[2]));
    b.output("si", &ib.scatter_add(&ii, &iu, 0, 0));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("base", x_f32(&[3], &[10., 20., 30.])),
            ("i", HostTensor::from_i32(vec![5], vec![0, 2, 0, 5, -1])),
            ("u", x_f32(&[5], &[1., 2., 3., 4., 5.])),
            ("base2", HostTensor::from_f32(vec![2, 3], vec![0.0; 6])),
            ("i2", HostTensor::from_i32(vec![2, 2], vec![1, 1, 0, 3])),
            ("u2", x_f32(&[2, 2], &[1., 2., 3., 4.])),
            ("ib", HostTensor::from_i32(vec![2], vec![i32::MAX, 0])),
            ("ii", HostTensor::from_i32(vec![2], vec![0, 0])),
            ("iu", HostTensor::from_i32(vec![2], vec![1, 1])),
        ],
    );
    assert_eq!(r["s"].to_f64_vec(), vec![14., 20., 32.]);
    assert_eq!(r["s2"].to_f64_vec(), vec![0., 3., 0., 3., 0., 0.]);
    assert_eq!(r["si"].as_i32(), Some(&[i32::MIN + 1, 0][..]));
}

#[test]
fn scatter_add_is_the_transpose_of_gather() {
    // <gather(x, i), u> == <x, scatter_add(0, i, u)> for any x, u.
    let b = Builder::new();
    let x = b.param("x", f32t(&[4, 3]));
    let i = b.param("i", i32t(&[5]));
    let u = b.param("u", f32t(&[4, 5]));
    let g = x.gather(&i, 1, 0);
    b.output("lhs", &g.mul(&u).sum_all());
    let z = b.splat(0.0, f32t(&[4, 3]));
    b.output("rhs", &x.mul(&z.scatter_add(&i, &u, 1, 0)).sum_all());
    let p = b.finish();
    let xv: Vec<f32> = (0..12).map(|v| (v as f32 * 0.37).sin()).collect();
    let uv: Vec<f32> = (0..20).map(|v| (v as f32 * 0.91).cos()).collect();
    let r = run1(
        &p,
        vec![
            ("x", HostTensor::from_f32(vec![4, 3], xv)),
            ("i", HostTensor::from_i32(vec![5], vec![2, 0, 2, 7, 1])),
            ("u", HostTensor::from_f32(vec![4, 5], uv)),
        ],
    );
    assert_close(&r["lhs"].to_f64_vec(), &r["rhs"].to_f64_vec(), 1e-6);
}

#[test]
fn partition_id_is_zero_on_one_device() {
    let b = Builder::new();
    b.output("pid", &b.partition_id());
    let p = b.finish();
    assert_eq!(run1(&p, vec![])["pid"].as_i32(), Some(&[0][..]));
}

#[test]
fn emitted_ops_match_their_builder_forms() {
    // Ops emitted directly with declared types (as passes do) behave like the builder's.
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 2]));
    let y = b.emit(Op::Reshape, &[&x], Some(f32t(&[4])));
    b.output("y", &y);
    let p = b.finish();
    assert_eq!(
        out(&p, vec![("x", x_f32(&[2, 2], &[1., 2., 3., 4.]))], "y"),
        vec![1., 2., 3., 4.]
    );
}

#[test]
fn conv_with_same_valid_and_asymmetric_padding() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[1, 4, 1]));
    let w = b.param("w", f32t(&[3, 1, 1]));
    b.output("same", &x.conv(&w, &[1], &[1]));
    b.output("valid", &x.conv(&w, &[0], &[0]));
    b.output("low", &x.conv(&w, &[2], &[0]));
    // Two input and three output features, a 1-wide kernel: a matmul per position.
    let c = b.param("c", f32t(&[1, 2, 2]));
    let k = b.param("k", f32t(&[1, 2, 3]));
    b.output("feat", &c.conv(&k, &[0], &[0]));
    // Two spatial dims.
    let y = b.param("y", f32t(&[1, 2, 2, 1]));
    let ones = b.splat(1.0, f32t(&[2, 2, 1, 1]));
    b.output("2d", &y.conv(&ones, &[1, 1], &[0, 0]));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[1, 4, 1], &[1., 2., 3., 4.])),
            ("w", x_f32(&[3, 1, 1], &[1., 10., 100.])),
            ("c", x_f32(&[1, 2, 2], &[1., 2., 3., 4.])),
            ("k", x_f32(&[1, 2, 3], &[1., 0., 1., 0., 1., 1.])),
            ("y", x_f32(&[1, 2, 2, 1], &[1., 2., 3., 4.])),
        ],
    );
    assert_eq!(r["same"].to_f64_vec(), vec![210., 321., 432., 43.]);
    assert_eq!(r["valid"].to_f64_vec(), vec![321., 432.]);
    assert_eq!(r["low"].to_f64_vec(), vec![100., 210., 321., 432.]);
    assert_eq!(r["feat"].to_f64_vec(), vec![1., 2., 3., 3., 4., 7.]);
    assert_eq!(r["2d"].to_f64_vec(), vec![1., 3., 4., 10.]);
}

#[test]
fn conv_padding_multiplies_zeros_into_the_kernel() {
    // The padding is explicit zeros: 0 * inf = NaN reaches the edge outputs.
    let b = Builder::new();
    let x = b.param("x", f32t(&[1, 2, 1]));
    let w = b.param("w", f32t(&[2, 1, 1]));
    b.output("y", &x.conv(&w, &[1], &[0]));
    let p = b.finish();
    let r = run1(
        &p,
        vec![
            ("x", x_f32(&[1, 2, 1], &[1., 2.])),
            ("w", x_f32(&[2, 1, 1], &[f32::INFINITY, 1.])),
        ],
    );
    let y = r["y"].to_f64_vec();
    assert!(y[0].is_nan() && y[1] == f64::INFINITY, "{y:?}");
}

#[test]
fn reverse_along_some_or_all_dims() {
    let b = Builder::new();
    let x = b.param("x", i32t(&[2, 3]));
    b.output("inner", &x.reverse(&[1]));
    b.output("both", &x.reverse(&[0, 1]));
    let p = b.finish();
    let r = run1(
        &p,
        vec![("x", HostTensor::from_i32([2, 3], vec![1, 2, 3, 4, 5, 6]))],
    );
    assert_eq!(r["inner"].as_i32(), Some(&[3, 2, 1, 6, 5, 4][..]));
    assert_eq!(r["both"].as_i32(), Some(&[6, 5, 4, 3, 2, 1][..]));
}
