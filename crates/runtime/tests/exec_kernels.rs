//! Every executor kernel against the reference interpreter (the oracle), property-tested
//! over random shapes, dtypes and values: one small program per case, run by
//! `runtime::reference::run` and by the executor (`Executable` on `InProcess`).
//!
//! Tolerances: data movement, integer and bool ops, comparisons, conversions, the RNG and
//! every elementwise float op are **exact** (NaN matches NaN). Sums (reduce, cumsum,
//! scatter-add, all-reduce) accumulate in f64 like the reference: within `1e-6 * sum |x|`.
//! Contractions accumulate in f32 (bf16 widened): within `1e-5 * sum |x_i y_i|` for f32,
//! `1e-12` for f64, and one bf16 ulp (`2^-7` relative) plus that for bf16, where the bound
//! `sum |x_i y_i|` is computed by the reference on `|x|`, `|y|`.
//!
//! Cases per property: 48, or `PROPTEST_CASES`.

use ir::{Builder, DType, DotDims, Literal, Op, ReduceOp, RngDist, Type, Value};
use proptest::prelude::*;
use runtime::HostTensor;
use std::collections::HashMap;

mod common;
use common::cases;
use common::oracle::{
    assert_bounded, assert_exact, elementwise_program, float_dtypes, int_program, run_both, Rng,
};

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn elementwise_chains_are_exact(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let (p, ins) = elementwise_program(&mut rng);
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }

    #[test]
    fn int_and_bool_ops_are_exact(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let (p, ins) = int_program(&mut rng);
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }

    #[test]
    fn dot_general_matches_within_accumulation_tolerance(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::I32]);
        let (nb, nc, nl, nr) = (rng.below(3), rng.below(3), rng.below(3), rng.below(3));
        let size = |rng: &mut Rng| 1 + rng.below(if dt == DType::I32 { 4 } else { 9 });
        let bs: Vec<usize> = (0..nb).map(|_| size(&mut rng)).collect();
        let cs: Vec<usize> = (0..nc).map(|_| size(&mut rng)).collect();
        // Roles of each operand dim, then a random dim order.
        let mut lroles: Vec<(char, usize)> = (0..nb).map(|i| ('b', i)).chain((0..nc).map(|i| ('c', i))).chain((0..nl).map(|i| ('f', i))).collect();
        let mut rroles: Vec<(char, usize)> = (0..nb).map(|i| ('b', i)).chain((0..nc).map(|i| ('c', i))).chain((0..nr).map(|i| ('f', i))).collect();
        for roles in [&mut lroles, &mut rroles] {
            for i in (1..roles.len()).rev() {
                let j = rng.below(i + 1);
                roles.swap(i, j);
            }
        }
        let lf: Vec<usize> = (0..nl).map(|_| size(&mut rng)).collect();
        let rf: Vec<usize> = (0..nr).map(|_| size(&mut rng)).collect();
        let dims_of = |roles: &[(char, usize)], f: &[usize]| -> Vec<usize> {
            roles.iter().map(|&(r, i)| match r { 'b' => bs[i], 'c' => cs[i], _ => f[i] }).collect()
        };
        let pos = |roles: &[(char, usize)], r: char, i: usize| roles.iter().position(|&x| x == (r, i)).unwrap();
        let dd = DotDims {
            lhs_batch: (0..nb).map(|i| pos(&lroles, 'b', i)).collect(),
            rhs_batch: (0..nb).map(|i| pos(&rroles, 'b', i)).collect(),
            lhs_contract: (0..nc).map(|i| pos(&lroles, 'c', i)).collect(),
            rhs_contract: (0..nc).map(|i| pos(&rroles, 'c', i)).collect(),
        };
        let lt = Type::new(dt, dims_of(&lroles, &lf));
        let rt = Type::new(dt, dims_of(&rroles, &rf));
        let b = Builder::new();
        let l = b.param("l", lt.clone());
        let r = b.param("r", rt.clone());
        let d = b.emit(Op::DotGeneral(dd.clone()), &[&l, &r], None);
        // Half the time a transpose follows (fused into the dot's output layout).
        let rank = d.rank();
        let mut perm: Vec<usize> = (0..rank).collect();
        if rng.below(2) == 0 {
            for i in (1..rank).rev() { let j = rng.below(i + 1); perm.swap(i, j); }
        }
        b.output("d", &b.emit(Op::Transpose { perm: perm.clone() }, &[&d], None));
        let p = b.finish();
        // Sometimes make the lhs one-hot-ish (exercises the sparse paths on larger dots).
        let mut lv = rng.tensor(&lt, false);
        if rng.below(3) == 0 && dt != DType::I32 {
            let v: Vec<f64> = (0..lt.num_elements()).map(|_| if rng.below(12) == 0 { rng.value(dt, false) } else { 0.0 }).collect();
            lv = HostTensor::from_f64_values(lt.clone(), &v);
        }
        let ins: HashMap<String, HostTensor> = [("l".to_string(), lv), ("r".to_string(), rng.tensor(&rt, false))].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        if dt == DType::I32 {
            assert_exact(&p, &got, &want);
        } else {
            // The bound sum |x_i y_i|, by the reference in f64.
            let bb = Builder::new();
            let (l2, r2) = (bb.param("l", lt.with_dtype(DType::F64)), bb.param("r", rt.with_dtype(DType::F64)));
            let d2 = bb.emit(Op::DotGeneral(dd), &[&l2.abs(), &r2.abs()], None);
            bb.output("d", &bb.emit(Op::Transpose { perm }, &[&d2], None));
            let abs_ins = ins.iter().map(|(k, v)| (k.clone(), v.convert(DType::F64))).collect();
            let bound = runtime::run(&bb.finish(), &abs_ins).unwrap();
            let (tol, slack) = match dt { DType::F32 => (1e-5, 0.0), DType::F64 => (1e-12, 0.0), _ => (1e-5, 2f64.powi(-7)) };
            assert_bounded("dot", &got["d"], &want["d"], &bound["d"], tol, slack);
        }
    }

    /// 1-3 spatial dims, paddings beyond the kernel reach, and sizes where windows overhang.
    #[test]
    fn conv_matches_within_accumulation_tolerance(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::I32]);
        let k = 1 + rng.below(3);
        let mut xs = vec![rng.below(3)];
        let mut ks = Vec::new();
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for _ in 0..k {
            let (s, kk) = (rng.below(6), 1 + rng.below(3));
            let l = rng.below(4);
            xs.push(s);
            ks.push(kk);
            lo.push(l);
            hi.push(rng.below(4).max((kk + 1).saturating_sub(l + s + 1)));
        }
        let cin = rng.below(4);
        xs.push(cin);
        ks.extend([cin, rng.below(5)]);
        let (xt, kt) = (Type::new(dt, xs), Type::new(dt, ks));
        let b = Builder::new();
        let x = b.param("x", xt.clone());
        let w = b.param("w", kt.clone());
        b.output("y", &x.conv(&w, &lo, &hi));
        let p = b.finish();
        let ins: HashMap<String, HostTensor> = [("x".to_string(), rng.tensor(&xt, false)), ("w".to_string(), rng.tensor(&kt, false))].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        if dt == DType::I32 {
            assert_exact(&p, &got, &want);
        } else {
            let bb = Builder::new();
            let (x2, w2) = (bb.param("x", xt.with_dtype(DType::F64)), bb.param("w", kt.with_dtype(DType::F64)));
            bb.output("y", &x2.abs().conv(&w2.abs(), &lo, &hi));
            let abs_ins = ins.iter().map(|(k, v)| (k.clone(), v.convert(DType::F64))).collect();
            let bound = runtime::run(&bb.finish(), &abs_ins).unwrap();
            let (tol, slack) = match dt { DType::F32 => (1e-5, 0.0), DType::F64 => (1e-12, 0.0), _ => (1e-5, 2f64.powi(-7)) };
            assert_bounded("conv", &got["y"], &want["y"], &bound["y"], tol, slack);
        }
    }

    #[test]
    fn data_movement_is_exact(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&DType::ALL);
        let shape = { let mut s = rng.shape(4, 5); if s.is_empty() { s.push(3); } s };
        let ty = Type::new(dt, shape.clone());
        let r = shape.len();
        let b = Builder::new();
        let x = b.param("x", ty.clone());
        // transpose
        let mut perm: Vec<usize> = (0..r).collect();
        for i in (1..r).rev() { let j = rng.below(i + 1); perm.swap(i, j); }
        b.output("transpose", &b.emit(Op::Transpose { perm }, &[&x], None));
        // broadcast into a bigger shape
        let mut out_shape = Vec::new();
        let mut dims = Vec::new();
        for &n in &shape {
            if rng.below(2) == 0 { out_shape.push(1 + rng.below(3)); }
            dims.push(out_shape.len());
            out_shape.push(n);
        }
        if rng.below(2) == 0 { out_shape.push(2); }
        b.output("broadcast", &b.emit(Op::Broadcast { dims }, &[&x], Some(ty.with_shape(out_shape))));
        // slice, dynamic slice (starts may be out of range: clamped), dynamic update slice
        let start: Vec<usize> = shape.iter().map(|&n| rng.below(n)).collect();
        let limit: Vec<usize> = shape.iter().zip(&start).map(|(&n, &s)| s + 1 + rng.below(n - s)).collect();
        b.output("slice", &b.emit(Op::Slice { start: start.clone(), limit: limit.clone() }, &[&x], None));
        let sizes: Vec<usize> = limit.iter().zip(&start).map(|(l, s)| l - s).collect();
        let starts: Vec<Value> = (0..r).map(|_| b.scalar(rng.below(9) as f64 - 3.0, DType::I32)).collect();
        let sref: Vec<&Value> = starts.iter().collect();
        let mut ops: Vec<&Value> = vec![&x];
        ops.extend(sref.iter().copied());
        let ds = b.emit(Op::DynamicSlice { sizes: sizes.clone() }, &ops, None);
        b.output("dynamic_slice", &ds);
        let u = b.param("u", ty.with_shape(sizes.clone()));
        let mut ops: Vec<&Value> = vec![&x, &u];
        ops.extend(sref.iter().copied());
        b.output("dus", &b.emit(Op::DynamicUpdateSlice, &ops, None));
        // pad, concatenate, reshape
        let low: Vec<usize> = (0..r).map(|_| rng.below(3)).collect();
        let high: Vec<usize> = (0..r).map(|_| rng.below(3)).collect();
        let pv = b.scalar(rng.value(dt, false), dt);
        b.output("pad", &b.emit(Op::Pad { low, high }, &[&x, &pv], None));
        let d = rng.below(r);
        b.output("concat", &b.emit(Op::Concatenate { dim: d }, &[&x, &ds.clone(), &x].iter().filter(|v| v.shape().iter().enumerate().all(|(i, &n)| i == d || n == shape[i])).copied().collect::<Vec<_>>(), None));
        b.output("reshape", &b.emit(Op::Reshape, &[&x], Some(ty.with_shape(vec![ty.num_elements()]))));
        let rdims: Vec<usize> = (0..r).filter(|_| rng.below(2) == 0).collect();
        b.output("reverse", &b.emit(Op::Reverse { dims: rdims }, &[&x], None));
        // iota and constants
        if dt != DType::Bool {
            b.output("iota", &b.emit(Op::Iota { dim: rng.below(r) }, &[], Some(ty.clone())));
        }
        let dense: Vec<f64> = (0..ty.num_elements()).map(|_| rng.value(dt, false)).collect();
        b.output("dense", &b.emit(Op::Constant { value: Literal::Dense(dense) }, &[], Some(ty.clone())));
        b.output("splat", &b.emit(Op::Constant { value: Literal::Splat(rng.value(dt, false)) }, &[], Some(ty.clone())));
        let p = b.finish();
        let ins = [("x".to_string(), rng.tensor(&ty, true)), ("u".to_string(), rng.tensor(&ty.with_shape(sizes), true))].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }

    #[test]
    fn gather_and_scatter_add_match(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::I32]);
        let xshape = { let mut s = rng.shape(3, 4); if s.is_empty() { s.push(4); } s };
        let axis = rng.below(xshape.len());
        let batch_dims = rng.below(axis + 1);
        let mut ishape: Vec<usize> = xshape[..batch_dims].to_vec();
        ishape.extend((0..rng.below(3)).map(|_| 1 + rng.below(4)));
        let xt = Type::new(dt, xshape.clone());
        let itype = Type::new(DType::I32, ishape.clone());
        let b = Builder::new();
        let x = b.param("x", xt.clone());
        let idx = b.param("idx", itype.clone());
        let g = b.emit(Op::Gather { axis, batch_dims }, &[&x, &idx], None);
        b.output("gather", &g);
        let upd = b.param("upd", g.ty());
        b.output("scatter", &b.emit(Op::ScatterAdd { axis, batch_dims }, &[&x, &idx, &upd], None));
        let p = b.finish();
        let n = xshape[axis] as f64;
        let iv: Vec<f64> = (0..itype.num_elements()).map(|_| (rng.unit() * (n + 3.0)).floor() - 1.0).collect();
        let ins: HashMap<String, HostTensor> = [
            ("x".to_string(), rng.tensor(&xt, false)),
            ("idx".to_string(), HostTensor::from_f64_values(itype, &iv)),
            ("upd".to_string(), rng.tensor(&g.ty(), false)),
        ].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }

    #[test]
    fn reductions_match(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::I32]);
        let shape = { let mut s = rng.shape(4, 6); if s.is_empty() { s.push(5); } s };
        let ty = Type::new(dt, shape.clone());
        let r = shape.len();
        let dims: Vec<usize> = (0..r).filter(|_| rng.below(2) == 0).collect();
        let b = Builder::new();
        let x = b.param("x", ty.clone());
        for op in ReduceOp::ALL {
            b.output(op.name(), &b.emit(Op::Reduce { op, dims: dims.clone() }, &[&x], None));
        }
        let d = rng.below(r);
        for (ex, rev) in [(false, false), (true, false), (false, true), (true, true)] {
            b.output(&format!("cumsum{ex}{rev}"), &b.emit(Op::Cumsum { dim: d, exclusive: ex, reverse: rev }, &[&x], None));
        }
        b.output("argmax", &b.emit(Op::Argmax { dim: d }, &[&x], None));
        let p = b.finish();
        // Few distinct values, so argmax sees ties; special values only for max/min paths.
        let special = rng.below(2) == 0;
        let v: Vec<f64> = (0..ty.num_elements()).map(|_| if rng.below(3) == 0 { rng.value(dt, special) } else { (rng.below(5) as f64) - 2.0 }).collect();
        let ins: HashMap<String, HostTensor> = [("x".to_string(), HostTensor::from_f64_values(ty.clone(), &v))].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        // Bounds: the same sums over |x| by the reference, a NaN counted as 0 (a NaN makes
        // its row's total NaN, which the max below would drop, while the partial sums
        // before it stay finite and may round differently).
        let bb = Builder::new();
        let xa = bb.param("x", ty.with_dtype(DType::F64)).abs();
        bb.output("sum", &bb.emit(Op::Reduce { op: ReduceOp::Sum, dims: dims.clone() }, &[&xa], None));
        bb.output("cum", &bb.emit(Op::Reduce { op: ReduceOp::Sum, dims: vec![d] }, &[&xa], None));
        let abs_ins = ins.iter().map(|(k, v)| {
            let vals: Vec<f64> = v.to_f64_vec().iter().map(|&a| if a.is_nan() { 0.0 } else { a }).collect();
            (k.clone(), HostTensor::from_f64_values(ty.with_dtype(DType::F64), &vals))
        }).collect();
        let bound = runtime::run(&bb.finish(), &abs_ins).unwrap();
        for (name, w) in &want {
            let g = &got[name];
            if dt == DType::I32 || name == "max" || name == "min" || name == "argmax" || name == "sum" || !name.contains("true") {
                assert_exact(&p, &[(name.clone(), g.clone())].into_iter().collect(), &[(name.clone(), w.clone())].into_iter().collect());
            } else {
                // Reverse cumsums add in the opposite order: f64 rounding only.
                let bnd = HostTensor::from_f64(w.shape().to_vec(), vec![bound["cum"].to_f64_vec().iter().cloned().fold(0.0, f64::max); w.num_elements()]);
                let slack = if dt == DType::BF16 { 2f64.powi(-7) } else { 0.0 };
                assert_bounded(name, g, w, &bnd, 1e-6, slack);
            }
        }
    }

    /// Max/min/sum/argmax along contiguous rows long enough for the lane folds (and, now and
    /// then, large enough to be split over the pool), f32 with special values (NaN, -0, +0,
    /// infinities) and i32 with extremes (wrapping sums), in rows of every length around
    /// the lane width.
    #[test]
    fn row_reductions_match(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&[DType::F32, DType::I32]);
        let n = 1 + rng.below(70);
        let rows = if rng.below(4) == 0 { 65536 / n + 1 + rng.below(64) } else { 1 + rng.below(40) };
        let ty = Type::new(dt, vec![rows, n]);
        let b = Builder::new();
        let x = b.param("x", ty.clone());
        for op in ReduceOp::ALL {
            b.output(op.name(), &b.emit(Op::Reduce { op, dims: vec![1] }, &[&x], None));
        }
        b.output("argmax", &b.emit(Op::Argmax { dim: 1 }, &[&x], None));
        b.output("all_max", &b.emit(Op::Reduce { op: ReduceOp::Max, dims: vec![0, 1] }, &[&x], None));
        let p = b.finish();
        // Per row: sometimes only specials, sometimes only zeros and negatives, else mixed.
        let v: Vec<f64> = (0..rows).flat_map(|_| {
            let mode = rng.below(4);
            let row: Vec<f64> = (0..n).map(|_| match (mode, dt) {
                (0, DType::F32) => rng.pick(&[0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN]),
                (0, _) => rng.pick(&[i32::MIN as f64, i32::MAX as f64, 0.0]),
                (1, _) => rng.pick(&[0.0f64, -0.0, -1.0, -2.0]),
                _ => rng.value(dt, true),
            }).collect();
            row
        }).collect();
        let ins: HashMap<String, HostTensor> = [("x".to_string(), HostTensor::from_f64_values(ty, &v))].into_iter().collect();
        let (got, want) = run_both(&p, &ins);
        assert_exact(&p, &got, &want);
    }

    #[test]
    fn rng_is_exact(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let dt = rng.pick(&float_dtypes());
        let global = { let mut s = rng.shape(3, 6); if s.is_empty() { s.push(7); } s };
        let local: Vec<usize> = global.iter().map(|&n| 1 + rng.below(n)).collect();
        let b = Builder::new();
        let s = b.scalar((rng.next() % 1000) as f64, DType::I32);
        let offs: Vec<Value> = global.iter().zip(&local).map(|(&g, &l)| b.scalar(rng.below(g - l + 1) as f64, DType::I32)).collect();
        let mut ops: Vec<&Value> = vec![&s];
        ops.extend(offs.iter());
        for dist in [RngDist::Uniform, RngDist::Normal] {
            let v = b.emit(Op::Rng { dist, stream: rng.next() >> 20, global_shape: global.clone() }, &ops, Some(Type::new(dt, local.clone())));
            b.output(dist.name(), &v);
        }
        let p = b.finish();
        let (got, want) = run_both(&p, &HashMap::new());
        assert_exact(&p, &got, &want);
    }
}
