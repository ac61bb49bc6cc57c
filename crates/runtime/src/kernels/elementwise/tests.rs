//! Unit tests of the fused elementwise kernels: the coded ReLU, the one-pass ReLU
//! kernels against the chunk interpreter, and the iota chunks.

use super::interp::run_range_impl;
use super::lanes::LaneMut;
use super::leaves::iota_chunk;
use super::relu::{relu_code, relu_grad_of, relu_in_place_of, Relu};
use super::select::compare;
use super::*;
use crate::kernels::reduce::fmax32;
use ir::{BinaryOp, CompareOp};

/// One value of every class of f32 the ReLU kernels must treat as the interpreter does:
/// signed zeros, normals, subnormals, infinities and NaNs of both signs.
const SPECIALS: [f32; 10] = [
    0.0,
    -0.0,
    1.5,
    -1.5,
    1e-45,
    -1e-45,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    -f32::NAN,
];

/// A coded ReLU equals `max(x, 0)` as a value, and its decode compares with zero (either
/// side, every compare) exactly as `x` does, for every class of f32.
#[test]
fn coded_relus_compare_like_their_input() {
    let xs: Vec<f32> = SPECIALS
        .into_iter()
        .chain([f32::MIN_POSITIVE, -f32::MIN_POSITIVE])
        .collect();
    let n = xs.len();
    let f = Fused {
        len: n,
        nodes: vec![
            (Node::Input(0), DType::F32),
            (Node::ReluCode(0), DType::F32),
            (Node::ReluDecode(1), DType::F32),
        ],
        n_inputs: 1,
    };
    let code = Fused {
        nodes: f.nodes[..2].to_vec(),
        ..f.clone()
    };
    let input = Data::F32(xs.clone());
    let (mut h, mut d) = (Data::F32(vec![0.0; n]), Data::F32(vec![0.0; n]));
    run_fused(&code, &[&input], &mut h);
    run_fused(&f, &[&input], &mut d);
    let (Data::F32(h), Data::F32(d)) = (h, d) else {
        unreachable!()
    };
    for i in 0..n {
        let (x, h, d) = (xs[i], h[i], d[i]);
        let relu = fmax32(x, 0.0);
        assert!(
            (relu.is_nan() && h.is_nan()) || relu == h,
            "code({x}) = {h}, max = {relu}"
        );
        assert_eq!(h.is_sign_negative() && h == 0.0, x < 0.0, "code({x}) = {h}");
        for c in CompareOp::ALL {
            // The group's own compare kernel, on one element.
            let cmp = |a: f32, b: f32| {
                let mut o = [false];
                compare(c, &[a], &[b], &mut o);
                o[0]
            };
            assert_eq!(cmp(d, 0.0), cmp(x, 0.0), "{c:?}({x}, 0) via {d}");
            assert_eq!(cmp(0.0, d), cmp(0.0, x), "{c:?}(0, {x}) via {d}");
        }
    }
}

/// The ReLU-gradient group `g * select(d > 0, 1, select(d == 0, 0.5, 0))`: its one-pass
/// kernel is taken (coded `d` or not, the product in either order, the gradient read
/// from an input, in place or from a GEMM's values) and gives the interpreter's bits on
/// every class of f32 in both operands; a group that differs in one compare is left to
/// the interpreter.
#[test]
fn relu_gradients_take_one_pass_with_the_interpreters_bits() {
    let specials = SPECIALS;
    // Every (g, d) pair of specials, then ordinary values; past one chunk, and not a
    // whole number of chunks.
    let n = 3 * CHUNK + 37;
    let mut seed = 12345u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    };
    let (mut gs, mut ds) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let k = specials.len();
        let (g, d) = if i < k * k {
            (specials[i / k], specials[i % k])
        } else {
            (next(), next())
        };
        gs.push(g);
        ds.push(d);
    }
    let group = |coded: bool, g_first: bool, gt: CompareOp| {
        let mut nodes = vec![(Node::Input(0), DType::F32), (Node::Input(1), DType::F32)];
        let d = if coded {
            nodes.push((Node::ReluDecode(1), DType::F32));
            2
        } else {
            1
        };
        let z = nodes.len();
        nodes.push((Node::Splat(0.0), DType::F32));
        nodes.push((Node::Compare(gt, d, z), DType::Bool));
        nodes.push((Node::Compare(CompareOp::Eq, d, z), DType::Bool));
        nodes.push((Node::Splat(0.5), DType::F32));
        nodes.push((Node::Select(z + 2, z + 3, z), DType::F32));
        nodes.push((Node::Splat(1.0), DType::F32));
        nodes.push((Node::Select(z + 1, z + 5, z + 4), DType::F32));
        let (a, b) = if g_first { (0, z + 6) } else { (z + 6, 0) };
        nodes.push((Node::Binary(BinaryOp::Mul, a, b), DType::F32));
        Fused {
            len: n,
            nodes,
            n_inputs: 2,
        }
    };
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for coded in [false, true] {
        // A coded ReLU holds `-0` where the pre-activation was negative.
        let d_vals: Vec<f32> = if coded {
            ds.iter().map(|&x| relu_code(x)).collect()
        } else {
            ds.clone()
        };
        let (g, d) = (Data::F32(gs.clone()), Data::F32(d_vals));
        for g_first in [true, false] {
            let f = group(coded, g_first, CompareOp::Gt);
            let r = relu_grad_of(&f).expect("the ReLU gradient is recognised");
            assert_eq!((r.g, r.d, r.coded), (0, 1, coded));
            // The interpreter, chunk by chunk, node by node.
            let mut want = vec![0.0f32; n];
            run_range_impl(&f, &[&g, &d], 0, &mut want, None, None);
            // Read from an input.
            let mut out = Data::F32(vec![7.0; n]);
            run_fused(&f, &[&g, &d], &mut out);
            let Data::F32(got) = &out else { unreachable!() };
            assert_eq!(bits(got), bits(&want), "coded {coded}, g first {g_first}");
            // In place, over the output (a GEMM epilogue), and from the GEMM's values.
            let mut got = gs.clone();
            run_fused_part(&f, &[&g, &d], 0, &mut got, 0, None);
            assert_eq!(bits(&got), bits(&want), "in place");
            let mut got = vec![7.0f32; n - 5];
            run_fused_part(&f, &[&g, &d], 5, &mut got, 0, Some(&gs[5..]));
            assert_eq!(bits(&got), bits(&want[5..]), "from the GEMM's values");
        }
        assert_eq!(relu_grad_of(&group(coded, true, CompareOp::Ge)), None);
    }
}

/// A ReLU epilogue (`max(x, +0)` of the in-place input, either operand order, or its
/// coded form) takes one pass with the interpreter's bits on every class of f32 (NaNs
/// of both signs, `-0`, infinities, subnormals), in place and from a GEMM's values;
/// `max(x, -0)`, a non-zero constant, or an input that is not the in-place one stay
/// with the interpreter.
#[test]
fn relu_epilogues_take_one_pass_with_the_interpreters_bits() {
    let specials = SPECIALS;
    let n = 2 * CHUNK + 11;
    let xs: Vec<f32> = (0..n)
        .map(|i| specials.get(i).copied().unwrap_or((i as f32 * 0.37).sin()))
        .collect();
    let group = |x_first: bool, zero: f64| {
        let nodes = if x_first {
            vec![
                (Node::Input(0), DType::F32),
                (Node::Splat(zero), DType::F32),
                (Node::Binary(BinaryOp::Max, 0, 1), DType::F32),
            ]
        } else {
            vec![
                (Node::Splat(zero), DType::F32),
                (Node::Input(0), DType::F32),
                (Node::Binary(BinaryOp::Max, 0, 1), DType::F32),
            ]
        };
        Fused {
            len: n,
            nodes,
            n_inputs: 1,
        }
    };
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let x = Data::F32(xs.clone());
    let coded = Fused {
        len: n,
        nodes: vec![
            (Node::Input(0), DType::F32),
            (Node::ReluCode(0), DType::F32),
        ],
        n_inputs: 1,
    };
    for form in [Relu::InputFirst, Relu::ZeroFirst, Relu::Coded] {
        let x_first = form == Relu::InputFirst;
        let f = if form == Relu::Coded {
            coded.clone()
        } else {
            group(x_first, 0.0)
        };
        assert_eq!(relu_in_place_of(&f, Some(0)), Some(form));
        assert_eq!(relu_in_place_of(&f, None), None, "not in place");
        let mut want = vec![0.0f32; n];
        run_range_impl(&f, &[&x], 0, &mut want, None, None);
        let mut got = xs.clone();
        run_fused_part(&f, &[&x], 0, &mut got, 0, None);
        assert_eq!(bits(&got), bits(&want), "in place, {form:?}");
        let mut got = vec![7.0f32; n - 3];
        run_fused_part(&f, &[&x], 3, &mut got, 0, Some(&xs[3..]));
        assert_eq!(
            bits(&got),
            bits(&want[3..]),
            "from the GEMM's values, {form:?}"
        );
        for other in [-0.0, 0.5] {
            assert_eq!(relu_in_place_of(&group(x_first, other), Some(0)), None);
        }
    }
}

/// Iota chunks written by runs equal `(start + i) / stride % size` at every chunk start
/// (mid-run, mid-period, wrapping), for counting (`stride == 1`) and repeating runs.
#[test]
fn iota_chunks_follow_the_index_rule() {
    for (stride, size) in [(1, 1), (1, 7), (1, 4000), (3, 5), (16, 2), (1000, 3)] {
        for start in [0, 1, 5, 999, 1024, 4001, 12345] {
            for n in [0, 1, 17, 1024] {
                let want: Vec<i32> = (0..n)
                    .map(|i| ((start + i) / stride % size) as i32)
                    .collect();
                let mut i = vec![-1i32; n];
                iota_chunk(stride, size, DType::I32, start, LaneMut::I(&mut i));
                assert_eq!(i, want, "stride {stride} size {size} start {start} n {n}");
                let mut f = vec![-1.0f32; n];
                iota_chunk(stride, size, DType::F32, start, LaneMut::F(&mut f));
                assert!(f.iter().zip(&want).all(|(&f, &w)| f == w as f32));
                let mut d = vec![-1.0f64; n];
                iota_chunk(stride, size, DType::F64, start, LaneMut::D(&mut d));
                assert!(d.iter().zip(&want).all(|(&d, &w)| d == w as f64));
                let mut b = vec![false; n];
                iota_chunk(stride, size, DType::Bool, start, LaneMut::B(&mut b));
                assert!(b.iter().zip(&want).all(|(&b, &w)| b == (w != 0)));
            }
        }
    }
}
