//! The executor-against-oracle harness shared by `exec_kernels`, `exec_sparse` and
//! `exec_steps`: a seeded generator of values and programs, runs of one program by the
//! reference interpreter and by the executor, and the exact and bounded comparisons.
#![allow(dead_code)]

use ir::{BinaryOp, Builder, CompareOp, DType, DotDims, Op, Program, Type, UnaryOp, Value};
use runtime::{Executable, HostTensor, InProcess, Profiler};
use std::collections::HashMap;

/// A small deterministic generator driven by the proptest seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    pub fn shape(&mut self, max_rank: usize, max_dim: usize) -> Vec<usize> {
        let r = self.below(max_rank + 1);
        (0..r).map(|_| 1 + self.below(max_dim)).collect()
    }
    /// A value of `dtype`; `special` mixes in zeros, -0, infinities and NaN for floats and
    /// extreme values for i32.
    pub fn value(&mut self, dtype: DType, special: bool) -> f64 {
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
    pub fn tensor(&mut self, ty: &Type, special: bool) -> HostTensor {
        let v: Vec<f64> = (0..ty.num_elements())
            .map(|_| self.value(ty.dtype, special))
            .collect();
        HostTensor::from_f64_values(ty.clone(), &v)
    }
}

pub fn run_both(
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
pub fn run_profiled(
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
pub fn f64_inputs<const N: usize>(
    items: [(&str, Type, Vec<f64>); N],
) -> HashMap<String, HostTensor> {
    items
        .into_iter()
        .map(|(n, ty, vals)| (n.to_string(), HostTensor::from_f64_values(ty, &vals)))
        .collect()
}

/// An f32 tensor type of shape `d`.
pub fn f32_type(d: &[usize]) -> Type {
    Type::new(DType::F32, d.to_vec())
}

/// A dot batched over dim 0 of both operands, contracting lhs dim `lc` with rhs dim `rc`.
pub fn batched(lc: usize, rc: usize) -> DotDims {
    DotDims::new(vec![0], vec![0], vec![lc], vec![rc])
}

pub fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
}

pub fn assert_exact(
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
pub fn assert_bounded(
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

pub fn float_dtypes() -> [DType; 3] {
    [DType::F32, DType::F64, DType::BF16]
}

/// The ops of a family that take float operands, from the op set itself (a new op joins
/// the random programs without a list to update).
pub fn float_ops<T: Copy>(all: &[T], op: impl Fn(T) -> Op, arity: usize) -> Vec<T> {
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
pub fn elementwise_program(rng: &mut Rng) -> (Program, HashMap<String, HostTensor>) {
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
pub fn int_program(rng: &mut Rng) -> (Program, HashMap<String, HostTensor>) {
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

/// One random input `x` of type `ty` per device.
pub fn x_per_device(rng: &mut Rng, ty: &Type, devices: usize) -> Vec<HashMap<String, HostTensor>> {
    (0..devices)
        .map(|_| {
            [("x".to_string(), rng.tensor(ty, false))]
                .into_iter()
                .collect()
        })
        .collect()
}
