//! The executor's sparse paths against the reference interpreter: one-hot MoE einsums,
//! masked dots and their sums, ReLU-sparse and coded-ReLU dots, and values released to
//! their support. Each must take its path (checked through the profile) and give the
//! dense reference's bits, or stay within the contraction bound of `exec_kernels`.

use ir::{Builder, DType, DotDims, Op, Program, ReduceOp, Type};
use runtime::{Executable, HostTensor, InProcess, Profiler};
use std::collections::HashMap;

mod common;
use common::oracle::{assert_bounded, batched, f32_type, f64_inputs, run_profiled, same, Rng};

/// The one-hot MoE einsums large enough for the sparse paths: dispatch `GSEC,GSM->EGCM`
/// (sparse lhs), combine `GSEC,EGCM->GSM` (sparse lhs; its rhs, whose strides do not
/// merge, read in place), and the backward `EGCM,GSEC->GMS`-like products (sparse rhs);
/// each must take the sparse path and equal the dense reference; a NaN in the dense operand
/// forces the dense path.
#[test]
fn one_hot_einsums_take_the_sparse_path_and_match() {
    let (g, s, e, c, m) = (2usize, 32, 8, 4, 64);
    let mut rng = Rng(11);
    // Dispatch: each token to <= 2 (expert, slot) pairs.
    let mut comb = vec![0.0; g * s * e * c];
    for gi in 0..g {
        for si in 0..s {
            for _ in 0..2 {
                let (ei, ci) = (rng.below(e), rng.below(c));
                comb[((gi * s + si) * e + ei) * c + ci] = rng.unit();
            }
        }
    }
    let gsec = Type::new(DType::F32, vec![g, s, e, c]);
    let b = Builder::new();
    let comb_v = b.param("combine", gsec.clone());
    let x = b.param("x", Type::new(DType::F32, vec![g, s, m]));
    let eo = b.param("eo", Type::new(DType::F32, vec![e, g, c, m]));
    let dy = b.param("dy", Type::new(DType::F32, vec![g, s, m]));
    let dispatch = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![0], vec![1], vec![1])),
        &[&comb_v, &x],
        None,
    );
    let combine = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![1], vec![2, 3], vec![0, 2])),
        &[&comb_v, &eo],
        None,
    );
    let eo_t = b.emit(
        Op::Transpose {
            perm: vec![1, 0, 2, 3],
        },
        &[&eo],
        None,
    );
    let back = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3])),
        &[&eo_t, &comb_v],
        None,
    );
    let back2 = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![0], vec![1], vec![1])),
        &[&dy, &comb_v],
        None,
    );
    // The dense operand's contracting dims do not merge (a copy for the GEMM; read in place
    // by the sparse path).
    let back3 = b.emit(
        Op::DotGeneral(DotDims::new(vec![1], vec![0], vec![0, 2], vec![2, 3])),
        &[&eo, &comb_v],
        None,
    );
    // The same two backward products written transposed, as the MoE backward does: the
    // result's rows become contiguous (one slice update per non-zero).
    let back_d = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3])),
        &[&eo_t, &comb_v],
        None,
    );
    let back_t = b.emit(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[&back_d],
        None,
    );
    let back2_d = b.emit(
        Op::DotGeneral(DotDims::new(vec![0], vec![0], vec![1], vec![1])),
        &[&dy, &comb_v],
        None,
    );
    let back2_t = b.emit(
        Op::Transpose {
            perm: vec![2, 0, 3, 1],
        },
        &[&back2_d],
        None,
    );
    b.output("dispatch", &dispatch);
    b.output("combine", &combine);
    b.output("back", &back);
    b.output("back2", &back2);
    b.output("back3", &back3);
    b.output("back_t", &back_t);
    b.output("back2_t", &back2_t);
    let p = b.finish();
    let mut ins: HashMap<String, HostTensor> = HashMap::new();
    ins.insert("combine".into(), HostTensor::from_f64_values(gsec, &comb));
    for (n, shape) in [
        ("x", vec![g, s, m]),
        ("eo", vec![e, g, c, m]),
        ("dy", vec![g, s, m]),
    ] {
        ins.insert(n.into(), rng.tensor(&Type::new(DType::F32, shape), false));
    }
    let want = runtime::run(&p, &ins).unwrap();
    let (got, prof) = run_profiled(&p, &ins);
    for name in [
        "dispatch", "combine", "back", "back2", "back3", "back_t", "back2_t",
    ] {
        let w = &want[name];
        let scale = w.to_f64_vec().iter().fold(0.0f64, |a, v| a.max(v.abs()));
        let bound = HostTensor::from_f64(w.shape().to_vec(), vec![scale * 4.0; w.num_elements()]);
        assert_bounded(name, &got[name], w, &bound, 1e-6, 1e-6);
    }
    let dot_details = |prof: &Profiler| -> Vec<String> {
        prof.events()
            .into_iter()
            .filter(|e| e.cat == "dot")
            .map(|e| e.detail)
            .collect()
    };
    let paths = dot_details(&prof);
    assert_eq!(paths.len(), 7, "{paths:?}");
    assert!(paths[0].starts_with("SparseLhs"), "{paths:?}");
    assert!(paths[1].starts_with("SparseLhs"), "{paths:?}");
    assert!(paths[2].starts_with("SparseRhs"), "{paths:?}");
    assert!(paths[3].starts_with("SparseRhs"), "{paths:?}");
    assert!(paths[4].starts_with("SparseRhs"), "{paths:?}");
    assert!(paths[5].starts_with("SparseRhs"), "{paths:?}");
    assert!(paths[6].starts_with("SparseRhs"), "{paths:?}");
    // The sparse walks read the dense operand through its strides, never a copy, and the
    // profile says so (the combine's and `back3`'s dense operands do not merge).
    assert!(paths.iter().all(|d| !d.contains("copied")), "{paths:?}");
    // With a NaN in the combine's dense operand, its GEMM reads a permuted copy, named.
    let mut bad = ins.clone();
    let mut eos = ins["eo"].to_f64_vec();
    eos[3] = f64::NAN;
    bad.insert(
        "eo".into(),
        HostTensor::from_f64_values(ins["eo"].ty.clone(), &eos),
    );
    let (_, prof) = run_profiled(&p, &bad);
    let combine_detail = dot_details(&prof)
        .get(1)
        .cloned()
        .expect("the combine's event");
    assert!(
        combine_detail.starts_with("gemm Dense") && combine_detail.contains("(rhs copied)"),
        "{combine_detail}"
    );
    // A NaN in the dense operand: the dense path, and the NaNs the reference produces.
    let mut xs = ins["x"].to_f64_vec();
    xs[5] = f64::NAN;
    ins.insert(
        "x".into(),
        HostTensor::from_f64_values(ins["x"].ty.clone(), &xs),
    );
    let want = runtime::run(&p, &ins).unwrap();
    let got = Executable::new(&p)
        .unwrap()
        .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
        .unwrap()
        .outputs
        .remove(0);
    let (a, w) = (got["dispatch"].to_f64_vec(), want["dispatch"].to_f64_vec());
    assert_eq!(
        a.iter().filter(|v| v.is_nan()).count(),
        w.iter().filter(|v| v.is_nan()).count()
    );
}

/// The MoE layer's one-hot products as the layer writes them: the dispatch reads the mask
/// `convert(combine != 0)`, the combine and its gradient the combine weights, the
/// dispatch's gradient the mask. Every product equals the reference, with `-0` and NaN
/// among the weights (NaN is a non-zero of both; `-0` of neither), in three settings:
/// - the mask read by the two dots alone: it is never computed, both dots read the
///   weights as an indicator, on their sparse paths;
/// - the mask an output too, or read by an elementwise group too: it is computed, and
///   found to share the weights' support (one pass over them for all four products);
/// - the weights dense (every slot taken): the dots read a 0/1 copy on the dense path.
#[test]
fn a_mask_of_the_combine_weights_is_read_through_their_support() {
    for (mask_out, squared, per_row) in [
        (false, false, 2),
        (true, false, 2),
        (false, true, 2),
        (false, false, 0),
    ] {
        one_hot_products(mask_out, squared, per_row);
    }
}

/// [`a_mask_of_the_combine_weights_is_read_through_their_support`]: `per_row` non-zero
/// weights per token (0: all of them), the mask an output with `mask_out`, and also read
/// by a multiply (`mask * mask`, an output) with `squared`.
fn one_hot_products(mask_out: bool, squared: bool, per_row: usize) {
    let (g, s, e, c, m) = (2usize, 64, 8, 4, 32);
    let mut rng = Rng(5);
    let mut comb = vec![0.0; g * s * e * c];
    let weight = |rng: &mut Rng| match rng.below(40) {
        0 => -0.0,
        1 => f64::NAN,
        _ => rng.unit(),
    };
    for row in 0..g * s {
        if per_row == 0 {
            for slot in 0..e * c {
                comb[row * e * c + slot] = weight(&mut rng);
            }
        }
        for _ in 0..per_row {
            comb[row * e * c + rng.below(e * c)] = weight(&mut rng);
        }
    }
    let gsec = Type::new(DType::F32, vec![g, s, e, c]);
    let b = Builder::new();
    let comb_v = b.param("combine", gsec.clone());
    let x = b.param("x", Type::new(DType::F32, vec![g, s, m]));
    let eo = b.param("eo", Type::new(DType::F32, vec![e, g, c, m]));
    let dx = b.param("dx", Type::new(DType::F32, vec![g, e, c, m]));
    let zero = b.splat(0.0, gsec.clone());
    let mask = comb_v.ne(&zero).convert(DType::F32);
    let dispatch = mask.dot_general(&x, DotDims::new(vec![0], vec![0], vec![1], vec![1]));
    let dims = DotDims::new(vec![0], vec![1], vec![2, 3], vec![0, 2]);
    let combine = comb_v.dot_general(&eo, dims);
    let comb_grad = x.dot_general(&comb_v, DotDims::new(vec![0], vec![0], vec![1], vec![1]));
    let dims = DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3]);
    let dispatch_grad = dx.dot_general(&mask, dims);
    b.output("dispatch", &dispatch);
    b.output("combine", &combine);
    b.output("comb_grad", &comb_grad);
    b.output("dispatch_grad", &dispatch_grad);
    let mut names = vec!["dispatch", "combine", "comb_grad", "dispatch_grad"];
    if mask_out {
        b.output("mask", &mask);
        names.push("mask");
    }
    if squared {
        let sq = mask.mul(&mask);
        b.output("squared", &sq);
        names.push("squared");
    }
    let p = b.finish();
    let exe = Executable::new(&p).unwrap();
    let (shared, indicators) = if mask_out || squared { (1, 0) } else { (0, 2) };
    let case = format!("mask output {mask_out}, squared {squared}, {per_row} per row");
    assert_eq!(
        exe.shared_supports(),
        shared,
        "{case}: the mask shares the weights' support"
    );
    assert_eq!(
        exe.indicator_reads(),
        indicators,
        "{case}: dots read the weights as the mask"
    );
    let mut ins: HashMap<String, HostTensor> = HashMap::new();
    ins.insert("combine".into(), HostTensor::from_f64_values(gsec, &comb));
    for (n, shape) in [
        ("x", vec![g, s, m]),
        ("eo", vec![e, g, c, m]),
        ("dx", vec![g, e, c, m]),
    ] {
        ins.insert(n.into(), rng.tensor(&Type::new(DType::F32, shape), false));
    }
    let want = runtime::run(&p, &ins).unwrap();
    let (got, prof) = run_profiled(&p, &ins);
    for name in names {
        let w = &want[name];
        let scale = w
            .to_f64_vec()
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |a, v| a.max(v.abs()));
        let bound = HostTensor::from_f64(w.shape().to_vec(), vec![scale * 4.0; w.num_elements()]);
        assert_bounded(
            &format!("{case}: {name}"),
            &got[name],
            w,
            &bound,
            1e-6,
            1e-6,
        );
    }
    let paths: Vec<String> = prof
        .events()
        .into_iter()
        .filter(|e| e.cat == "dot")
        .map(|e| e.detail)
        .collect();
    assert_eq!(paths.len(), 4, "{case}: {paths:?}");
    let sparse = paths.iter().filter(|d| d.starts_with("Sparse")).count();
    assert_eq!(
        sparse,
        if per_row == 0 { 0 } else { 4 },
        "{case}: {paths:?}"
    );
    // The dense path says it multiplied the indicator's 0/1 copy.
    let copied = paths
        .iter()
        .filter(|d| d.contains("indicator copied"))
        .count();
    let dropped = !(mask_out || squared);
    let want = if dropped && per_row == 0 { 2 } else { 0 };
    assert_eq!(copied, want, "{case}: {paths:?}");
}

/// The MoE combine weights' gradient product `[G, S, M] x [E, G, C, M] -> [G, S, E, C]` of
/// parameters `x` and `y` (batch `G`, contracting `M`), and `[G, S, E, C]` mask parameters
/// named `masks`, declared before the dot (a masked dot needs its masks to exist by then).
fn combine_grad_dot(
    b: &Builder,
    (g, s, e, c, m): (usize, usize, usize, usize, usize),
    masks: &[&str],
) -> (ir::Value, Vec<ir::Value>) {
    let ty = |d: &[usize]| Type::new(DType::F32, d.to_vec());
    let x = b.param("x", ty(&[g, s, m]));
    let y = b.param("y", ty(&[e, g, c, m]));
    let masks = masks
        .iter()
        .map(|n| b.param(n, ty(&[g, s, e, c])))
        .collect();
    let d = x.dot_general(
        &y,
        DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![1],
            lhs_contract: vec![2],
            rhs_contract: vec![3],
        },
    );
    (d, masks)
}

/// A dot used only through `dot * mask` summed (the MoE combine weights' gradient) is
/// computed where the masks are non-zero: the sums equal the reference's, and the dense
/// product runs instead whenever skipping could change them: masks not sparse, a
/// non-finite operand (the NaN from `inf * 0` must reach the sums), or operands large
/// enough for a skipped value to overflow.
#[test]
fn masked_dots_give_the_sums_of_the_dense_product() {
    let (g, s, e, c, m) = (2, 64, 8, 4, 32);
    let ty = |d: &[usize]| Type::new(DType::F32, d.to_vec());
    let b = Builder::new();
    let (d, ms) = combine_grad_dot(&b, (g, s, e, c, m), &["m1", "m2"]);
    let (m1, m2) = (ms[0].clone(), ms[1].clone());
    let sum = |v: &ir::Value| {
        b.emit(
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: vec![2, 3],
            },
            &[v],
            None,
        )
    };
    b.output("r1", &sum(&d.mul(&m1)));
    b.output("r2", &sum(&d.mul(&m2)));
    let p = b.finish();
    // The same sums with the product also an output: a plain dense dot, multiply and
    // reduce, which the masked sums' dense fallback must equal bit for bit.
    let apart = {
        let mut q = p.clone();
        q.outputs.push(("d".to_string(), d.id));
        q
    };
    let mut rng = Rng(5);
    // One (e, c) per token in each mask (a few tokens dropped: all zeros).
    let one_hot = |rng: &mut Rng| {
        let mut v = vec![0.0; g * s * e * c];
        for t in 0..g * s {
            if rng.below(8) != 0 {
                v[t * e * c + rng.below(e * c)] = rng.unit() - 0.5;
            }
        }
        HostTensor::from_f64_values(ty(&[g, s, e, c]), &v)
    };
    let base: HashMap<String, HostTensor> = [
        ("x".to_string(), rng.tensor(&ty(&[g, s, m]), false)),
        ("y".to_string(), rng.tensor(&ty(&[e, g, c, m]), false)),
        ("m1".to_string(), one_hot(&mut rng)),
        ("m2".to_string(), one_hot(&mut rng)),
    ]
    .into_iter()
    .collect();
    let dense_masks = {
        let mut ins = base.clone();
        ins.insert("m1".into(), rng.tensor(&ty(&[g, s, e, c]), false));
        ins
    };
    // `base` with one element of `x` replaced.
    let x_with = |at: usize, v: f64| {
        let mut ins = base.clone();
        let mut xv = ins["x"].to_f64_vec();
        xv[at] = v;
        ins.insert("x".into(), HostTensor::from_f64_values(ty(&[g, s, m]), &xv));
        ins
    };
    let with_inf = x_with(5 * m + 3, f64::INFINITY);
    // A NaN in the row of a token that both masks drop: the dense product's NaN reaches
    // its sums through `NaN * 0`.
    let with_nan = {
        let mut ins = x_with(7 * m + 1, f64::NAN);
        for k in ["m1", "m2"] {
            let mut mv = ins[k].to_f64_vec();
            mv[7 * e * c..8 * e * c].fill(0.0);
            ins.insert(
                k.into(),
                HostTensor::from_f64_values(ty(&[g, s, e, c]), &mv),
            );
        }
        ins
    };
    let huge = {
        let mut ins = base.clone();
        let yv: Vec<f64> = ins["y"].to_f64_vec().iter().map(|v| v * 1e37).collect();
        ins.insert(
            "y".into(),
            HostTensor::from_f64_values(ty(&[e, g, c, m]), &yv),
        );
        ins
    };
    let exe = Executable::new(&p).unwrap();
    // Both masks are read by nothing but the sums: released as soon as loaded, where
    // their supports are found, the sums (and the dense fallback) read those instead.
    assert_eq!(exe.sparse_releases(), 2);
    assert_eq!(Executable::new(&apart).unwrap().sparse_releases(), 0);
    for (case, ins, masked) in [
        ("one-hot masks", &base, true),
        ("dense masks", &dense_masks, false),
        ("an inf in x", &with_inf, false),
        ("a NaN in x", &with_nan, false),
        ("overflow possible", &huge, false),
    ] {
        let prof = Profiler::new();
        let got = exe
            .run(&InProcess::new(1), std::slice::from_ref(ins), Some(&prof))
            .unwrap()
            .outputs
            .remove(0);
        let trace = prof.chrome_trace();
        assert_eq!(trace.contains("Masked"), masked, "{case}: the path taken");
        assert!(
            trace.contains("+sums"),
            "{case}: the sums come from the dot step"
        );
        if !masked {
            let plain = Executable::new(&apart)
                .unwrap()
                .run(&InProcess::new(1), std::slice::from_ref(ins), None)
                .unwrap()
                .outputs
                .remove(0);
            for r in ["r1", "r2"] {
                let (a, b) = (got[r].to_f64_vec(), plain[r].to_f64_vec());
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{case}: {r} differs from the dense dot, multiply and sum"
                );
            }
        }
        let want = runtime::run(&p, ins).unwrap();
        // The sums of |terms| bound the rounding of a float sum.
        let abs_ins: HashMap<String, HostTensor> = ins
            .iter()
            .map(|(k, t)| {
                let v: Vec<f64> = t.to_f64_vec().iter().map(|x| x.abs()).collect();
                (k.clone(), HostTensor::from_f64_values(t.ty.clone(), &v))
            })
            .collect();
        let bound = runtime::run(&p, &abs_ins).unwrap();
        for r in ["r1", "r2"] {
            let (gv, wv, bv) = (
                got[r].to_f64_vec(),
                want[r].to_f64_vec(),
                bound[r].to_f64_vec(),
            );
            for (i, ((&a, &w), &bd)) in gv.iter().zip(&wv).zip(&bv).enumerate() {
                let ok = (a.is_nan() && w.is_nan()) || a == w || (a - w).abs() <= 1e-5 * (1.0 + bd);
                assert!(ok, "{case}: {r}[{i}] = {a}, reference {w}");
            }
        }
        // Token 5 meets the inf in every (e, c), token 7 the NaN: NaN in both sums.
        let nan_token = match case {
            "an inf in x" => Some(5),
            "a NaN in x" => Some(7),
            _ => None,
        };
        if let Some(t) = nan_token {
            assert!(got["r1"].to_f64_vec()[t].is_nan() && got["r2"].to_f64_vec()[t].is_nan());
        }
    }
}

/// A masked product summed over only part of its column dims keeps its product (the sums
/// step needs every column summed): the masked dot runs alone, the multiply and the
/// reduction apart, and the values match the reference.
#[test]
fn masked_dots_summed_over_part_of_their_columns_keep_the_product() {
    let (g, s, e, c, m) = (2, 32, 8, 4, 16);
    let ty = |d: &[usize]| Type::new(DType::F32, d.to_vec());
    let b = Builder::new();
    let (d, ms) = combine_grad_dot(&b, (g, s, e, c, m), &["mask"]);
    let mask = ms[0].clone();
    let r = b.emit(
        Op::Reduce {
            op: ReduceOp::Sum,
            dims: vec![3],
        },
        &[&d.mul(&mask)],
        None,
    );
    b.output("r", &r);
    let p = b.finish();
    let mut rng = Rng(9);
    let mut mv = vec![0.0; g * s * e * c];
    for t in 0..g * s {
        mv[t * e * c + rng.below(e * c)] = rng.unit() + 0.5;
    }
    let ins: HashMap<String, HostTensor> = [
        ("x".to_string(), rng.tensor(&ty(&[g, s, m]), false)),
        ("y".to_string(), rng.tensor(&ty(&[e, g, c, m]), false)),
        (
            "mask".to_string(),
            HostTensor::from_f64_values(ty(&[g, s, e, c]), &mv),
        ),
    ]
    .into_iter()
    .collect();
    let (got, prof) = run_profiled(&p, &ins);
    let trace = prof.chrome_trace();
    assert!(trace.contains("Masked"), "the masked path is taken");
    assert!(
        !trace.contains("+sums"),
        "no sums step for a partial reduction"
    );
    let want = runtime::run(&p, &ins).unwrap();
    for (a, w) in got["r"].to_f64_vec().iter().zip(want["r"].to_f64_vec()) {
        // One product per token: its rounding only.
        assert!((a - w).abs() <= 1e-5 * (1.0 + w.abs()), "{a} vs {w}");
    }
}

/// An expert FFN's down-projection reads a ReLU output, and the input gradient reads the
/// ReLU-masked gradient: row-major lhs operands about half zeros. Where the CPU has AVX2
/// their GEMMs take the row-sparse path, which must give the dense GEMM's bits (NaN in the
/// lhs, an inf in the rhs, contractions over two `KC` blocks and under one column group
/// included) and match the reference within the contraction tolerance. The executor runs
/// the default kernels; the dense bits are the dot kernel's with the row-sparse path
/// forbidden (`GemmOptions::sparse_a`).
#[test]
fn relu_sparse_dots_give_the_dense_bits() {
    use runtime::kernels::dot::{DotCall, DotPlan, Operand};
    use runtime::kernels::sgemm::{self, GemmOptions};
    use runtime::Data;
    let (e, t, m, h) = (2, 96, 64, 320);
    let build = |abs: bool| {
        let b = Builder::new();
        let act = b.param("act", f32_type(&[e, t, h]));
        let gm = b.param("gm", f32_type(&[e, t, h]));
        let v = b.param("v", f32_type(&[e, h, m]));
        let w = b.param("w", f32_type(&[e, m, h]));
        let f = |x: &ir::Value| if abs { x.abs() } else { x.clone() };
        // y = act · v (the down-projection), dx = gm · w^T (the input gradient).
        b.output("y", &f(&act).dot_general(&f(&v), batched(2, 1)));
        b.output("dx", &f(&gm).dot_general(&f(&w), batched(2, 2)));
        b.finish()
    };
    let p = build(false);
    let mut rng = Rng(23);
    let half_zero = |rng: &mut Rng, n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                if rng.below(2) == 0 {
                    0.0
                } else {
                    rng.unit() * 2.0 - 1.0
                }
            })
            .collect()
    };
    let mut act = half_zero(&mut rng, e * t * h);
    act[7 * h + 3] = f64::NAN;
    let gm = half_zero(&mut rng, e * t * h);
    let mut v: Vec<f64> = (0..e * h * m).map(|_| rng.unit() - 0.5).collect();
    // In the second batch entry's last block of steps: that block is multiplied densely.
    v[(h + h - 2) * m + 5] = f64::INFINITY;
    let w: Vec<f64> = (0..e * m * h).map(|_| rng.unit() - 0.5).collect();
    let ins = f64_inputs([
        ("act", f32_type(&[e, t, h]), act),
        ("gm", f32_type(&[e, t, h]), gm),
        ("v", f32_type(&[e, h, m]), v),
        ("w", f32_type(&[e, m, h]), w),
    ]);
    // One pool thread: every GEMM runs whole on it (a split over many threads could put
    // each part under the path's size threshold), and its counter is read there.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    // The executor, with the default kernels: the row-sparse path where the CPU has it.
    let (sparse, blocks) = pool.install(|| {
        let before = sgemm::sparse_blocks_run_here();
        let out = Executable::new(&p)
            .unwrap()
            .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
            .unwrap()
            .outputs
            .remove(0);
        (out, sgemm::sparse_blocks_run_here() - before)
    });
    // The same two products through the dot kernel, the row-sparse path forbidden, then
    // allowed: `(name, values)` of each, and the blocks the row-sparse path multiplied.
    let products = |opts: GemmOptions| {
        pool.install(|| {
            let before = sgemm::sparse_blocks_run_here();
            let outs: Vec<(&str, Vec<f64>)> = [("y", "act", "v", 1), ("dx", "gm", "w", 2)]
                .into_iter()
                .map(|(name, l, r, rc)| {
                    let (l, r) = (&ins[l], &ins[r]);
                    let plan = DotPlan::new(l.shape(), r.shape(), &batched(2, rc));
                    let mut out = Data::F32(vec![0.0; plan.b * plan.m * plan.n]);
                    let call = DotCall {
                        opts,
                        ..DotCall::new(
                            &plan,
                            Operand::new(l.shape(), &l.data),
                            Operand::new(r.shape(), &r.data),
                        )
                    };
                    call.run(&mut out);
                    (name, out.to_f64_vec())
                })
                .collect();
            (outs, sgemm::sparse_blocks_run_here() - before)
        })
    };
    let dense_only = GemmOptions {
        sparse_a: false,
        ..GemmOptions::default()
    };
    let (dense, none) = products(dense_only);
    let (allowed, allowed_blocks) = products(GemmOptions::default());
    assert_eq!(none, 0);
    if sgemm::sparse_available() {
        assert!(blocks > 0, "the row-sparse path did not run");
        assert!(
            allowed_blocks > 0,
            "the row-sparse path did not run in the kernel"
        );
    } else {
        eprintln!("note: no AVX2 and FMA here, so both runs took the dense GEMM");
    }
    for ((name, d), (_, a)) in dense.iter().zip(&allowed) {
        let s = sparse[*name].to_f64_vec();
        for (i, ((x, y), z)) in d.iter().zip(&s).zip(a).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{name}[{i}]: dense {x:e} vs the executor's row-sparse {y:e}"
            );
            assert!(
                x.to_bits() == z.to_bits() || (x.is_nan() && z.is_nan()),
                "{name}[{i}]: dense {x:e} vs row-sparse {z:e}"
            );
        }
    }
    let want = runtime::run(&p, &ins).unwrap();
    let bound = runtime::run(&build(true), &ins).unwrap();
    for name in ["y", "dx"] {
        assert_bounded(name, &sparse[name], &want[name], &bound[name], 1e-5, 1e-6);
    }
}

/// A ReLU between two dots whose pre-activation is otherwise read only by compares with zero
/// (its derivative, on either side, every compare) is computed coded and the pre-activation
/// not kept: every output is bit for bit what the executor gives when the pre-activation is
/// kept (an output of the program, which rules the coding out), over exact zeros, negative
/// and positive pre-activations and a NaN; a ReLU read by something other than a dot is not
/// coded.
#[test]
fn coded_relus_give_the_bits_of_kept_pre_activations() {
    let (e, t, m, h) = (2, 48, 32, 96);
    // `keep_a`: `a` is an output too; `relu_elsewhere`: the ReLU is also read by a multiply.
    let build = |keep_a: bool, relu_elsewhere: bool| {
        let b = Builder::new();
        let x = b.param("x", f32_type(&[e, t, m]));
        let wi = b.param("wi", f32_type(&[e, m, h]));
        let wo = b.param("wo", f32_type(&[e, h, m]));
        let dy = b.param("dy", f32_type(&[e, t, m]));
        let a = x.dot_general(&wi, batched(2, 1));
        let relu = a.max(0.0);
        b.output("y", &relu.dot_general(&wo, batched(2, 1)));
        let g = dy.dot_general(&wo, batched(2, 2));
        let c = |v: f64| b.splat(v, a.ty());
        let zero = c(0.0);
        let d = a
            .gt(0.0)
            .select(&c(1.0), &a.eq(0.0).select(&c(0.5), &zero))
            .add(&a.lt(0.0).select(&c(0.25), &zero))
            .add(&a.ge(0.0).select(&c(0.125), &zero))
            .add(&zero.le(&a).select(&c(1.0 / 16.0), &zero))
            .add(&zero.ne(&a).select(&c(1.0 / 32.0), &zero));
        let dh = g.mul(&d);
        b.output("dx", &dh.dot_general(&wi, batched(2, 2)));
        b.output("dwo", &relu.dot_general(&dy, batched(1, 1)));
        if keep_a {
            b.output("a", &a);
        }
        if relu_elsewhere {
            b.output("r2", &relu.mul(2.0));
        }
        b.finish()
    };
    let mut rng = Rng(31);
    let mut x: Vec<f64> = (0..e * t * m).map(|_| rng.unit() - 0.5).collect();
    // Whole zero rows (an empty capacity slot): zero pre-activations, `a == 0` exactly.
    for r in [3, 17, t + 5] {
        x[r * m..(r + 1) * m].iter_mut().for_each(|v| *v = 0.0);
    }
    x[9 * m + 4] = f64::NAN;
    let wi: Vec<f64> = (0..e * m * h).map(|_| rng.unit() - 0.5).collect();
    let wo: Vec<f64> = (0..e * h * m).map(|_| rng.unit() - 0.5).collect();
    let dy: Vec<f64> = (0..e * t * m).map(|_| rng.unit() - 0.5).collect();
    let ins = f64_inputs([
        ("x", f32_type(&[e, t, m]), x),
        ("wi", f32_type(&[e, m, h]), wi),
        ("wo", f32_type(&[e, h, m]), wo),
        ("dy", f32_type(&[e, t, m]), dy),
    ]);
    let run = |p: &Program| {
        let exe = Executable::new(p).unwrap();
        let r = exe
            .run(&InProcess::new(1), std::slice::from_ref(&ins), None)
            .unwrap();
        (exe.coded_relus(), r.outputs.into_iter().next().unwrap())
    };
    let (coded, got) = run(&build(false, false));
    let (kept, want) = run(&build(true, false));
    assert_eq!(
        (coded, kept),
        (1, 0),
        "coded ReLUs with and without `a` an output"
    );
    for name in ["y", "dx", "dwo"] {
        let (g, w) = (got[name].to_f64_vec(), want[name].to_f64_vec());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{name}[{i}]: coded {a:e} vs kept {b:e}"
            );
        }
    }
    // The derivative's every branch was taken (zeros, negatives, positives).
    let a = &want["a"].to_f64_vec();
    assert!(a.contains(&0.0) && a.iter().any(|&v| v < 0.0) && a.iter().any(|&v| v > 0.0));
    // Against the reference too (dots within their accumulation tolerance).
    let reference = runtime::run(&build(false, false), &ins).unwrap();
    for name in ["y", "dx", "dwo"] {
        for (a, b) in got[name]
            .to_f64_vec()
            .iter()
            .zip(reference[name].to_f64_vec())
        {
            assert!(
                same(*a, b) || (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{name}: {a} vs {b}"
            );
        }
    }
    let (elsewhere, _) = run(&build(false, true));
    assert_eq!(elsewhere, 0, "a ReLU read by a multiply keeps its +0s");
}

/// A sparse f32 value whose later readers are plain dots is released once a sparse
/// product has found its support (the MoE combine weights between the forward and the
/// backward pass): a later dot lists its terms from the support, or rebuilds it where its
/// path reads it densely (the other operand non-finite, or a NaN in the value itself).
/// Every case gives the bits of the same program with the value kept to the end (an
/// output as well), and the reference's values.
#[test]
fn a_value_released_to_its_support_gives_the_same_products() {
    let (n, m) = (64, 32);
    let ty = |d: &[usize]| Type::new(DType::F32, d.to_vec());
    let dd = DotDims::new(vec![], vec![], vec![1], vec![0]);
    let b = Builder::new();
    let wp = b.param("wp", ty(&[n, n]));
    let y = b.param("y", ty(&[n, m]));
    let x = b.param("x", ty(&[m, n]));
    // `w` computed (a buffer of its own), read by a dot (which finds its support), by an
    // elementwise op (its last dense reader), then by a second dot.
    let w = wp.neg();
    b.output("d1", &w.dot_general(&y, dd.clone()));
    b.output("e", &w.mul(&w));
    b.output("d2", &x.dot_general(&w, dd));
    let p = b.finish();
    let kept = {
        let mut q = p.clone();
        q.outputs.push(("w".to_string(), w.id));
        q
    };
    let exe = Executable::new(&p).unwrap();
    assert!(
        exe.sparse_releases() >= 1,
        "w is released after its last dense reader"
    );
    assert_eq!(Executable::new(&kept).unwrap().sparse_releases(), 0);
    let mut rng = Rng(11);
    // One non-zero per row of `w` (a one-hot combine weight).
    let mut wv = vec![0.0; n * n];
    for i in 0..n {
        wv[i * n + rng.below(n)] = rng.unit() - 0.5;
    }
    let base: HashMap<String, HostTensor> = [
        (
            "wp".to_string(),
            HostTensor::from_f64_values(ty(&[n, n]), &wv),
        ),
        ("y".to_string(), rng.tensor(&ty(&[n, m]), false)),
        ("x".to_string(), rng.tensor(&ty(&[m, n]), false)),
    ]
    .into_iter()
    .collect();
    let with = |k: &str, at: usize, v: f64| {
        let mut ins = base.clone();
        let mut xs = ins[k].to_f64_vec();
        xs[at] = v;
        let t = HostTensor::from_f64_values(ins[k].ty.clone(), &xs);
        ins.insert(k.to_string(), t);
        ins
    };
    let nz = wv.iter().position(|&v| v != 0.0).unwrap();
    // `x` with 16 non-zeros, none in column `nz / n` (the row of `w` with the NaN below):
    // `d2` would rather walk `x` than `w`, which is exact only if `w` is finite.
    let sparse_x = {
        let mut ins = with("wp", nz, f64::NAN);
        let mut xs = vec![0.0; m * n];
        for t in 0..16 {
            let (i, k) = (t * 2, (t * 7 + 1) % n);
            xs[i * n + if k == nz / n { (k + 1) % n } else { k }] = rng.unit() + 0.25;
        }
        ins.insert("x".into(), HostTensor::from_f64_values(ty(&[m, n]), &xs));
        ins
    };
    for (case, ins) in [
        ("finite", base.clone()),
        ("an inf in x", with("x", 3 * n + 5, f64::INFINITY)),
        ("a NaN in x", with("x", 7, f64::NAN)),
        ("a NaN in w", with("wp", nz, f64::NAN)),
        ("a sparse x and a NaN in w", sparse_x),
    ] {
        let run = |e: &Executable| {
            e.run(&InProcess::new(1), std::slice::from_ref(&ins), None)
                .unwrap()
                .outputs
                .remove(0)
        };
        let (got, want) = (run(&exe), run(&Executable::new(&kept).unwrap()));
        let reference = runtime::run(&p, &ins).unwrap();
        for o in ["d1", "e", "d2"] {
            let (g, w) = (got[o].to_f64_vec(), want[o].to_f64_vec());
            assert!(
                g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{case}: {o} differs from the run that keeps w"
            );
            for (i, (&a, &r)) in g.iter().zip(&reference[o].to_f64_vec()).enumerate() {
                let ok = (a.is_nan() && r.is_nan()) || a == r || (a - r).abs() <= 1e-5;
                assert!(ok, "{case}: {o}[{i}] = {a}, reference {r}");
            }
        }
    }
}
