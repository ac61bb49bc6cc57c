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

use half::bf16;
use ir::{
    BinaryOp, Builder, CompareOp, DType, DotDims, Literal, Mesh, Op, Program, ReduceOp, RngDist,
    Type, UnaryOp, Value,
};
use proptest::prelude::*;
use runtime::{Executable, HostTensor, InProcess, Profiler};
use std::collections::HashMap;

mod common;
use common::cases;

/// A small deterministic generator driven by the proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn shape(&mut self, max_rank: usize, max_dim: usize) -> Vec<usize> {
        let r = self.below(max_rank + 1);
        (0..r).map(|_| 1 + self.below(max_dim)).collect()
    }
    /// A value of `dtype`; `special` mixes in zeros, -0, infinities and NaN for floats and
    /// extreme values for i32.
    fn value(&mut self, dtype: DType, special: bool) -> f64 {
        match dtype {
            DType::Bool => self.below(2) as f64,
            DType::I32 => {
                if special && self.below(8) == 0 {
                    self.pick(&[i32::MIN as f64, i32::MAX as f64, -1.0, 0.0])
                } else {
                    self.below(13) as f64 - 6.0
                }
            }
            DType::F32 | DType::F64 | DType::BF16 => {
                if special && self.below(10) == 0 {
                    self.pick(&[0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e30])
                } else {
                    (self.unit() * 2.0 - 1.0) * self.pick(&[1.0, 3.0, 0.01, 100.0])
                }
            }
        }
    }
    fn tensor(&mut self, ty: &Type, special: bool) -> HostTensor {
        let v: Vec<f64> = (0..ty.num_elements())
            .map(|_| self.value(ty.dtype, special))
            .collect();
        HostTensor::from_f64_values(ty.clone(), &v)
    }
}

fn run_both(
    p: &Program,
    ins: &HashMap<String, HostTensor>,
) -> (HashMap<String, HostTensor>, HashMap<String, HostTensor>) {
    let want =
        runtime::run(p, ins).unwrap_or_else(|e| panic!("reference: {e}\n{}", ir::text::print(p)));
    let got = Executable::new(p)
        .and_then(|e| e.run(&InProcess::new(1), std::slice::from_ref(ins), None))
        .unwrap_or_else(|e| panic!("executor: {e}\n{}", ir::text::print(p)))
        .outputs
        .remove(0);
    (got, want)
}

/// Run `p` on one device through the executor with a profiler: its outputs and the profile.
fn run_profiled(
    p: &Program,
    ins: &HashMap<String, HostTensor>,
) -> (HashMap<String, HostTensor>, Profiler) {
    let prof = Profiler::new();
    let out = Executable::new(p)
        .unwrap()
        .run(&InProcess::new(1), std::slice::from_ref(ins), Some(&prof))
        .unwrap()
        .outputs
        .remove(0);
    (out, prof)
}

/// Named inputs from f64 values, each converted to its type.
fn f64_inputs<const N: usize>(items: [(&str, Type, Vec<f64>); N]) -> HashMap<String, HostTensor> {
    items
        .into_iter()
        .map(|(n, ty, vals)| (n.to_string(), HostTensor::from_f64_values(ty, &vals)))
        .collect()
}

/// An f32 tensor type of shape `d`.
fn f32_type(d: &[usize]) -> Type {
    Type::new(DType::F32, d.to_vec())
}

/// A dot batched over dim 0 of both operands, contracting lhs dim `lc` with rhs dim `rc`.
fn batched(lc: usize, rc: usize) -> DotDims {
    DotDims::new(vec![0], vec![0], vec![lc], vec![rc])
}

fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
}

fn assert_exact(
    p: &Program,
    got: &HashMap<String, HostTensor>,
    want: &HashMap<String, HostTensor>,
) {
    for (name, w) in want {
        let g = &got[name];
        assert_eq!(g.ty, w.ty, "{name}");
        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(
                same(*a, b),
                "{name}[{i}]: executor {a:e} vs reference {b:e}\n{}",
                ir::text::print(p)
            );
        }
    }
}

/// `|got - want| <= tol * bound + slack * |want|` elementwise (NaN matches NaN).
fn assert_bounded(
    name: &str,
    got: &HostTensor,
    want: &HostTensor,
    bound: &HostTensor,
    tol: f64,
    slack: f64,
) {
    assert_eq!(got.ty, want.ty, "{name}");
    for (i, ((a, b), c)) in got
        .to_f64_vec()
        .iter()
        .zip(want.to_f64_vec())
        .zip(bound.to_f64_vec())
        .enumerate()
    {
        let ok = same(*a, b) || (a - b).abs() <= tol * c.abs() + slack * b.abs() + 1e-300;
        assert!(
            ok,
            "{name}[{i}]: executor {a:e} vs reference {b:e} (bound {c:e})"
        );
    }
}

fn float_dtypes() -> [DType; 3] {
    [DType::F32, DType::F64, DType::BF16]
}

/// The ops of a family that take float operands, from the op set itself (a new op joins
/// the random programs without a list to update).
fn float_ops<T: Copy>(all: &[T], op: impl Fn(T) -> Op, arity: usize) -> Vec<T> {
    let f32s = Type::new(DType::F32, vec![2]);
    let operands = vec![&f32s; arity];
    all.iter()
        .copied()
        .filter(|&x| ir::infer_type(&op(x), &operands, None, None).is_ok())
        .collect()
}

/// A random chain of elementwise ops over two parameters of one float dtype, with splat
/// constants, broadcasts of a smaller parameter, iota + compare + select and conversions
/// mixed in; several intermediates are outputs (so some values are materialised and some
/// fused).
fn elementwise_program(rng: &mut Rng) -> (Program, HashMap<String, HostTensor>) {
    let unary = float_ops(&UnaryOp::ALL, Op::Unary, 1);
    let binary = float_ops(&BinaryOp::ALL, Op::Binary, 2);
    let dt = rng.pick(&float_dtypes());
    let shape = rng.shape(3, 5);
    let ty = Type::new(dt, shape.clone());
    let b = Builder::new();
    let x = b.param("x", ty.clone());
    let y = b.param("y", ty.clone());
    // A parameter broadcast along a random subset of dims.
    let keep: Vec<usize> = (0..shape.len()).filter(|_| rng.below(2) == 0).collect();
    let small_ty = Type::new(dt, keep.iter().map(|&d| shape[d]).collect::<Vec<_>>());
    let z = b.param("z", small_ty.clone());
    let zb = b.emit(
        Op::Broadcast { dims: keep.clone() },
        &[&z],
        Some(ty.clone()),
    );
    let mut pool: Vec<Value> = vec![x.clone(), y.clone(), zb];
    let steps = 2 + rng.below(8);
    for s in 0..steps {
        let a = pool[rng.below(pool.len())].clone();
        let c = pool[rng.below(pool.len())].clone();
        let v = match rng.below(10) {
            0 | 1 => b.emit(Op::Unary(rng.pick(&unary)), &[&a], None),
            2..=4 => b.emit(Op::Binary(rng.pick(&binary)), &[&a, &c], None),
            5 => {
                let k = b.splat(rng.value(dt, false), ty.clone());
                b.emit(Op::Binary(rng.pick(&binary)), &[&a, &k], None)
            }
            6 => {
                let p = b.emit(Op::Compare(rng.pick(&CompareOp::ALL)), &[&a, &c], None);
                b.emit(Op::Select, &[&p, &c, &a], None)
            }
            7 => {
                let to = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::I32, DType::Bool]);
                let t = b.emit(Op::Convert, &[&a], Some(ty.with_dtype(to)));
                b.emit(Op::Convert, &[&t], Some(ty.clone()))
            }
            8 => {
                // A compare read only as 0/1 values (evaluated inside the convert).
                let p = b.emit(Op::Compare(rng.pick(&CompareOp::ALL)), &[&a, &c], None);
                b.emit(Op::Convert, &[&p], Some(ty.clone()))
            }
            _ => {
                if shape.is_empty() {
                    a.neg()
                } else {
                    let d = rng.below(shape.len());
                    let io = b.iota(ty.clone(), d);
                    let p = b.emit(Op::Compare(CompareOp::Lt), &[&io, &a], None);
                    b.emit(Op::Select, &[&p, &a, &io], None)
                }
            }
        };
        let v = if rng.below(4) == 0 {
            let r = b.emit(
                Op::Reshape,
                &[&v],
                Some(Type::new(dt, vec![ty.num_elements()])),
            );
            b.emit(Op::Reshape, &[&r], Some(ty.clone()))
        } else {
            v
        };
        if rng.below(3) == 0 {
            b.output(&format!("o{s}"), &v);
        }
        pool.push(v);
    }
    b.output("out", pool.last().unwrap());
    let p = b.finish();
    let ins: HashMap<String, HostTensor> = [("x", &ty), ("y", &ty), ("z", &small_ty)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), rng.tensor(t, true)))
        .collect();
    (p, ins)
}

/// Random i32 / bool elementwise ops, comparisons, selects and conversions among all dtypes.
fn int_program(rng: &mut Rng) -> (Program, HashMap<String, HostTensor>) {
    let shape = rng.shape(2, 6);
    let it = Type::new(DType::I32, shape.clone());
    let bt = Type::new(DType::Bool, shape.clone());
    let b = Builder::new();
    let x = b.param("x", it.clone());
    let y = b.param("y", it.clone());
    let m = b.param("m", bt.clone());
    let ints = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::And,
        BinaryOp::Or,
    ];
    let mut iv = vec![x.clone(), y.clone()];
    let mut bv = vec![m.clone()];
    for s in 0..6 {
        let a = iv[rng.below(iv.len())].clone();
        let c = iv[rng.below(iv.len())].clone();
        match rng.below(7) {
            0 => iv.push(b.emit(
                Op::Unary(rng.pick(&[UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Not])),
                &[&a],
                None,
            )),
            1 | 2 => iv.push(b.emit(Op::Binary(rng.pick(&ints)), &[&a, &c], None)),
            3 => bv.push(b.emit(Op::Compare(rng.pick(&CompareOp::ALL)), &[&a, &c], None)),
            4 => {
                let p = bv[rng.below(bv.len())].clone();
                let q = bv[rng.below(bv.len())].clone();
                let op = rng.pick(&[BinaryOp::And, BinaryOp::Or]);
                let r = b.emit(Op::Binary(op), &[&p, &q], None);
                bv.push(b.emit(Op::Unary(UnaryOp::Not), &[&r], None));
            }
            5 => {
                let p = bv[rng.below(bv.len())].clone();
                iv.push(b.emit(Op::Select, &[&p, &a, &c], None));
            }
            _ => {
                let to = rng.pick(&[DType::F32, DType::F64, DType::BF16, DType::Bool]);
                let t = b.emit(Op::Convert, &[&a], Some(it.with_dtype(to)));
                b.output(&format!("conv{s}"), &t);
                iv.push(b.emit(Op::Convert, &[&t], Some(it.clone())));
            }
        }
    }
    b.output("i", iv.last().unwrap());
    b.output("b", bv.last().unwrap());
    let p = b.finish();
    let ins = [("x", &it), ("y", &it), ("m", &bt)]
        .into_iter()
        .map(|(n, t)| (n.to_string(), rng.tensor(t, true)))
        .collect();
    (p, ins)
}

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

/// One random input `x` of type `ty` per device.
fn x_per_device(rng: &mut Rng, ty: &Type, devices: usize) -> Vec<HashMap<String, HostTensor>> {
    (0..devices)
        .map(|_| {
            [("x".to_string(), rng.tensor(ty, false))]
                .into_iter()
                .collect()
        })
        .collect()
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
