//! The builder API for model code: a [`Builder`] owns the program under construction and
//! hands out [`Value`] handles with methods (`x.dot(&w).relu()`), numpy-style broadcasting
//! for elementwise arithmetic, `einsum`, and the composite layers (softmax, norms, gelu,
//! one-hot, top-k) expressed over core ops.
//!
//! Shape errors here are programming errors in model code, so builder methods panic with a
//! message naming the op and the shapes (as burn argues); `try_emit` is the `Result` form
//! used by passes that must not panic.

use crate::dtype::{DType, Type};
use crate::error::ShapeError;
use crate::infer::infer_type;
use crate::mesh::{Mesh, Sharding};
use crate::op::{BinaryOp, CompareOp, DotDims, Literal, Op, ReduceOp, RngDist, UnaryOp};
use crate::program::{Instr, Program, ValueId};
use crate::scope::ScopeId;

mod scoped;
pub use scoped::ScopeGuard;
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
struct State {
    prog: Program,
    next_stream: u64,
    /// The scope new instructions get.
    scope: ScopeId,
}

/// Builds one [`Program`]. Cheap to clone (a shared handle).
#[derive(Clone, Default)]
pub struct Builder {
    st: Rc<RefCell<State>>,
}

/// A handle to a value of the program under construction.
#[derive(Clone)]
pub struct Value {
    pub id: ValueId,
    b: Builder,
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.id, self.ty())
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    /// A builder whose program shardings and collectives refer to `mesh`.
    pub fn with_mesh(mesh: Mesh) -> Builder {
        let b = Builder::new();
        b.st.borrow_mut().prog.mesh = Some(mesh);
        b
    }

    /// Continue building on an existing program (e.g. to append a backward pass).
    pub fn from_program(prog: Program) -> Builder {
        let next_stream = prog
            .instrs
            .iter()
            .filter_map(|i| {
                if let Op::Rng { stream, .. } = i.op {
                    Some(stream + 1)
                } else {
                    None
                }
            })
            .max()
            .unwrap_or(0);
        Builder {
            st: Rc::new(RefCell::new(State {
                prog,
                next_stream,
                scope: ScopeId::ROOT,
            })),
        }
    }

    pub fn mesh(&self) -> Option<Mesh> {
        self.st.borrow().prog.mesh.clone()
    }

    /// A handle to an existing value.
    pub fn value(&self, id: ValueId) -> Value {
        assert!(
            id.index() < self.st.borrow().prog.instrs.len(),
            "no value {id}"
        );
        Value {
            id,
            b: self.clone(),
        }
    }

    pub fn ty(&self, id: ValueId) -> Type {
        self.st.borrow().prog.instrs[id.index()].ty.clone()
    }

    /// The op and operands of the instruction that produced `id` (what rewrites that
    /// look at the code they emitted match on).
    pub fn op_of(&self, id: ValueId) -> (crate::Op, Vec<ValueId>) {
        let st = self.st.borrow();
        let ins = &st.prog.instrs[id.index()];
        (ins.op.clone(), ins.operands.clone())
    }

    /// A snapshot of the program so far.
    pub fn program(&self) -> Program {
        self.st.borrow().prog.clone()
    }

    /// The finished program.
    pub fn finish(self) -> Program {
        let p = self.program();
        debug_assert!(
            crate::verify(&p).is_ok(),
            "{}",
            crate::verify(&p).unwrap_err()
        );
        p
    }

    /// Append an op, checking its operand types; `declared` is the result type for ops
    /// that need one (see [`infer_type`]).
    pub fn try_emit(
        &self,
        op: Op,
        operands: &[&Value],
        declared: Option<Type>,
    ) -> Result<Value, ShapeError> {
        let mut st = self.st.borrow_mut();
        let tys: Vec<Type> = operands
            .iter()
            .map(|v| st.prog.instrs[v.id.index()].ty.clone())
            .collect();
        let refs: Vec<&Type> = tys.iter().collect();
        let ty = infer_type(&op, &refs, declared.as_ref(), st.prog.mesh.as_ref())?;
        let scope = st.scope;
        let id = st.prog.push(Instr {
            op,
            operands: operands.iter().map(|v| v.id).collect(),
            ty,
            sharding: None,
            scope,
        });
        Ok(Value {
            id,
            b: self.clone(),
        })
    }

    /// [`Builder::try_emit`] that panics on a shape error (model-building code).
    pub fn emit(&self, op: Op, operands: &[&Value], declared: Option<Type>) -> Value {
        match self.try_emit(op, operands, declared) {
            Ok(v) => v,
            Err(e) => panic!("shape error in model code: {e}"),
        }
    }

    pub fn param(&self, name: &str, ty: Type) -> Value {
        self.emit(
            Op::Parameter {
                name: name.to_string(),
            },
            &[],
            Some(ty),
        )
    }

    /// A constant filled with `v`.
    pub fn splat(&self, v: f64, ty: Type) -> Value {
        self.emit(
            Op::Constant {
                value: Literal::Splat(v),
            },
            &[],
            Some(ty),
        )
    }

    pub fn scalar(&self, v: f64, dtype: DType) -> Value {
        self.splat(v, Type::scalar(dtype))
    }

    pub fn constant(&self, data: Vec<f64>, ty: Type) -> Value {
        self.emit(
            Op::Constant {
                value: Literal::Dense(data),
            },
            &[],
            Some(ty),
        )
    }

    pub fn iota(&self, ty: Type, dim: usize) -> Value {
        self.emit(Op::Iota { dim }, &[], Some(ty))
    }

    pub fn partition_id(&self) -> Value {
        self.emit(Op::PartitionId, &[], None)
    }

    /// A fresh random tensor: each call gets its own stream id, so two calls with one seed
    /// give independent values.
    pub fn rng(&self, dist: RngDist, seed: &Value, ty: Type) -> Value {
        let stream = {
            let mut st = self.st.borrow_mut();
            st.next_stream += 1;
            st.next_stream - 1
        };
        self.emit(
            Op::Rng {
                dist,
                stream,
                global_shape: ty.shape.clone(),
            },
            &[seed],
            Some(ty),
        )
    }

    /// Name `v` as a program output.
    pub fn output(&self, name: &str, v: &Value) {
        self.st
            .borrow_mut()
            .prog
            .outputs
            .push((name.to_string(), v.id));
    }

    /// Concatenate along `dim`.
    pub fn concat(&self, vs: &[&Value], dim: usize) -> Value {
        self.emit(Op::Concatenate { dim }, vs, None)
    }

    /// `einsum("GSEC,GSM->EGCM", &[a, b])` with one or two operands, lowered to
    /// reduce / dot-general / transpose.
    pub fn einsum(&self, spec: &str, operands: &[&Value]) -> Value {
        einsum(self, spec, operands)
    }

    fn set_sharding(&self, id: ValueId, s: Option<Sharding>) {
        self.st.borrow_mut().prog.instrs[id.index()].sharding = s;
    }

    fn sharding(&self, id: ValueId) -> Option<Sharding> {
        self.st.borrow().prog.instrs[id.index()].sharding.clone()
    }
}

/// A scalar operand of an elementwise op: a value or a number.
pub enum Operand<'a> {
    V(&'a Value),
    N(f64),
}

impl<'a> From<&'a Value> for Operand<'a> {
    fn from(v: &'a Value) -> Self {
        Operand::V(v)
    }
}
impl From<f64> for Operand<'_> {
    fn from(v: f64) -> Self {
        Operand::N(v)
    }
}

/// Numpy broadcasting of two shapes (aligned on the right; size 1 stretches).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

impl Value {
    pub fn builder(&self) -> &Builder {
        &self.b
    }

    pub fn ty(&self) -> Type {
        self.b.ty(self.id)
    }

    /// The value of every element, if this is a splat constant ([`Program::splat_value`]).
    pub fn splat_value(&self) -> Option<f64> {
        self.b.st.borrow().prog.splat_value(self.id)
    }

    pub fn shape(&self) -> Vec<usize> {
        self.ty().shape
    }

    pub fn dtype(&self) -> DType {
        self.ty().dtype
    }

    pub fn rank(&self) -> usize {
        self.ty().rank()
    }

    /// Attach a sharding to this value's instruction (used by the annotation API).
    pub fn set_sharding(&self, s: Option<Sharding>) {
        self.b.set_sharding(self.id, s)
    }

    pub fn sharding(&self) -> Option<Sharding> {
        self.b.sharding(self.id)
    }

    fn un(&self, u: UnaryOp) -> Value {
        self.b.emit(Op::Unary(u), &[self], None)
    }

    pub fn neg(&self) -> Value {
        self.un(UnaryOp::Neg)
    }
    pub fn abs(&self) -> Value {
        self.un(UnaryOp::Abs)
    }
    pub fn sign(&self) -> Value {
        self.un(UnaryOp::Sign)
    }
    pub fn exp(&self) -> Value {
        self.un(UnaryOp::Exp)
    }
    pub fn log(&self) -> Value {
        self.un(UnaryOp::Log)
    }
    pub fn log1p(&self) -> Value {
        self.un(UnaryOp::Log1p)
    }
    pub fn sqrt(&self) -> Value {
        self.un(UnaryOp::Sqrt)
    }
    pub fn rsqrt(&self) -> Value {
        self.un(UnaryOp::Rsqrt)
    }
    pub fn tanh(&self) -> Value {
        self.un(UnaryOp::Tanh)
    }
    pub fn logistic(&self) -> Value {
        self.un(UnaryOp::Logistic)
    }
    pub fn erf(&self) -> Value {
        self.un(UnaryOp::Erf)
    }
    pub fn sin(&self) -> Value {
        self.un(UnaryOp::Sin)
    }
    pub fn cos(&self) -> Value {
        self.un(UnaryOp::Cos)
    }
    pub fn floor(&self) -> Value {
        self.un(UnaryOp::Floor)
    }
    pub fn not(&self) -> Value {
        self.un(UnaryOp::Not)
    }

    /// Bring `other` to a common shape with `self` (numpy rules) and return both.
    fn coerce<'a>(&self, other: impl Into<Operand<'a>>) -> (Value, Value) {
        match other.into() {
            Operand::N(n) => (self.clone(), self.b.splat(n, self.ty())),
            Operand::V(o) => {
                let (sa, sb) = (self.shape(), o.shape());
                let shape = broadcast_shapes(&sa, &sb).unwrap_or_else(|| {
                    panic!(
                        "shape error in model code: cannot broadcast {} with {}",
                        self.ty(),
                        o.ty()
                    )
                });
                (self.broadcast_to(&shape), o.broadcast_to(&shape))
            }
        }
    }

    fn bin<'a>(&self, op: BinaryOp, other: impl Into<Operand<'a>>) -> Value {
        let (a, b) = self.coerce(other);
        self.b.emit(Op::Binary(op), &[&a, &b], None)
    }

    pub fn add<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Add, o)
    }
    pub fn sub<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Sub, o)
    }
    pub fn mul<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Mul, o)
    }
    pub fn div<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Div, o)
    }
    pub fn rem<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Rem, o)
    }
    pub fn pow<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Pow, o)
    }
    pub fn max<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Max, o)
    }
    pub fn min<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Min, o)
    }
    pub fn and<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::And, o)
    }
    pub fn or<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.bin(BinaryOp::Or, o)
    }

    fn cmp<'a>(&self, op: CompareOp, other: impl Into<Operand<'a>>) -> Value {
        let (a, b) = self.coerce(other);
        self.b.emit(Op::Compare(op), &[&a, &b], None)
    }

    pub fn eq<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Eq, o)
    }
    pub fn ne<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Ne, o)
    }
    pub fn lt<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Lt, o)
    }
    pub fn le<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Le, o)
    }
    pub fn gt<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Gt, o)
    }
    pub fn ge<'a>(&self, o: impl Into<Operand<'a>>) -> Value {
        self.cmp(CompareOp::Ge, o)
    }

    /// `self ? t : f` elementwise (`self` is bool); all three broadcast together.
    pub fn select<'a, 'b>(&self, t: impl Into<Operand<'a>>, f: impl Into<Operand<'b>>) -> Value {
        let (t, f) = match (t.into(), f.into()) {
            (Operand::V(t), f) => t.coerce(f),
            (Operand::N(t), Operand::V(f)) => {
                let (f2, t2) = f.coerce(t);
                (t2, f2)
            }
            (Operand::N(_), Operand::N(_)) => panic!("select needs at least one value branch"),
        };
        let shape = broadcast_shapes(&self.shape(), &t.shape()).unwrap_or_else(|| {
            panic!(
                "shape error in model code: select predicate {} vs branches {}",
                self.ty(),
                t.ty()
            )
        });
        let (p, t, f) = (
            self.broadcast_to(&shape),
            t.broadcast_to(&shape),
            f.broadcast_to(&shape),
        );
        self.b.emit(Op::Select, &[&p, &t, &f], None)
    }

    pub fn convert(&self, dtype: DType) -> Value {
        if self.dtype() == dtype {
            return self.clone();
        }
        self.b
            .emit(Op::Convert, &[self], Some(self.ty().with_dtype(dtype)))
    }

    pub fn stop_gradient(&self) -> Value {
        self.b.emit(Op::StopGradient, &[self], None)
    }

    pub fn copy(&self) -> Value {
        self.b.emit(Op::Copy, &[self], None)
    }

    /// XLA-style broadcast: operand dim `i` goes to result dim `dims[i]`.
    pub fn broadcast_in_dim(&self, shape: &[usize], dims: &[usize]) -> Value {
        self.b.emit(
            Op::Broadcast {
                dims: dims.to_vec(),
            },
            &[self],
            Some(self.ty().with_shape(shape)),
        )
    }

    /// Numpy-style broadcast to `shape` (dims aligned on the right, size 1 stretches).
    pub fn broadcast_to(&self, shape: &[usize]) -> Value {
        let s = self.shape();
        if s == shape {
            return self.clone();
        }
        assert!(
            s.len() <= shape.len(),
            "shape error in model code: cannot broadcast {} to {shape:?}",
            self.ty()
        );
        let off = shape.len() - s.len();
        let mut kept_shape = Vec::new();
        let mut dims = Vec::new();
        for (i, &d) in s.iter().enumerate() {
            if d == shape[off + i] {
                kept_shape.push(d);
                dims.push(off + i);
            } else {
                assert!(
                    d == 1,
                    "shape error in model code: cannot broadcast {} to {shape:?}",
                    self.ty()
                );
            }
        }
        let x = if kept_shape.len() != s.len() {
            self.reshape(&kept_shape)
        } else {
            self.clone()
        };
        x.broadcast_in_dim(shape, &dims)
    }

    pub fn reshape(&self, shape: &[usize]) -> Value {
        if self.shape() == shape {
            return self.clone();
        }
        self.b
            .emit(Op::Reshape, &[self], Some(self.ty().with_shape(shape)))
    }

    pub fn transpose(&self, perm: &[usize]) -> Value {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return self.clone();
        }
        self.b.emit(
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[self],
            None,
        )
    }

    pub fn slice(&self, start: &[usize], limit: &[usize]) -> Value {
        self.b.emit(
            Op::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
            },
            &[self],
            None,
        )
    }

    /// Slice `[start, limit)` along one dim.
    pub fn slice_dim(&self, dim: usize, start: usize, limit: usize) -> Value {
        let mut s = vec![0; self.rank()];
        let mut l = self.shape();
        s[dim] = start;
        l[dim] = limit;
        self.slice(&s, &l)
    }

    pub fn dynamic_slice(&self, starts: &[&Value], sizes: &[usize]) -> Value {
        let mut ops = vec![self];
        ops.extend_from_slice(starts);
        self.b.emit(
            Op::DynamicSlice {
                sizes: sizes.to_vec(),
            },
            &ops,
            None,
        )
    }

    pub fn dynamic_update_slice(&self, update: &Value, starts: &[&Value]) -> Value {
        let mut ops = vec![self, update];
        ops.extend_from_slice(starts);
        self.b.emit(Op::DynamicUpdateSlice, &ops, None)
    }

    pub fn pad(&self, low: &[usize], high: &[usize], value: f64) -> Value {
        let v = self.b.scalar(value, self.dtype());
        self.b.emit(
            Op::Pad {
                low: low.to_vec(),
                high: high.to_vec(),
            },
            &[self, &v],
            None,
        )
    }

    pub fn reduce(&self, op: ReduceOp, dims: &[usize]) -> Value {
        if dims.is_empty() {
            return self.clone();
        }
        self.b.emit(
            Op::Reduce {
                op,
                dims: dims.to_vec(),
            },
            &[self],
            None,
        )
    }

    pub fn sum(&self, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Sum, dims)
    }

    pub fn sum_all(&self) -> Value {
        self.sum(&(0..self.rank()).collect::<Vec<_>>())
    }

    pub fn reduce_max(&self, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Max, dims)
    }

    pub fn reduce_min(&self, dims: &[usize]) -> Value {
        self.reduce(ReduceOp::Min, dims)
    }

    pub fn mean(&self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().map(|&d| self.shape()[d]).product();
        self.sum(dims).div(1.0_f64.max(n as f64))
    }

    pub fn mean_all(&self) -> Value {
        self.mean(&(0..self.rank()).collect::<Vec<_>>())
    }

    /// Sum over `dims`, keeping them as size-1 dims.
    pub fn sum_keepdims(&self, dims: &[usize]) -> Value {
        let s = self.sum(dims);
        s.reshape(&keep_shape(&self.shape(), dims))
    }

    pub fn max_keepdims(&self, dims: &[usize]) -> Value {
        let s = self.reduce_max(dims);
        s.reshape(&keep_shape(&self.shape(), dims))
    }

    pub fn dot_general(&self, rhs: &Value, dims: DotDims) -> Value {
        self.b.emit(Op::DotGeneral(dims), &[self, rhs], None)
    }

    /// Contract the last dim of `self` with dim 0 of `rhs` (no batch dims).
    pub fn matmul(&self, rhs: &Value) -> Value {
        let dims = DotDims {
            lhs_contract: vec![self.rank() - 1],
            rhs_contract: vec![0],
            ..Default::default()
        };
        self.dot_general(rhs, dims)
    }

    /// Convolution of `self` (`[N, S.., Cin]`) with `kernel` (`[K.., Cin, Cout]`), stride 1,
    /// zero padding `pad_lo` / `pad_hi` per spatial dim (see [`Op::Conv`]).
    pub fn conv(&self, kernel: &Value, pad_lo: &[usize], pad_hi: &[usize]) -> Value {
        self.b.emit(
            Op::Conv {
                pad_lo: pad_lo.to_vec(),
                pad_hi: pad_hi.to_vec(),
            },
            &[self, kernel],
            None,
        )
    }

    /// Convolution with SAME padding: the result has the spatial sizes of `self`
    /// (`K - 1` padding per dim, the extra element, if any, at the high end).
    pub fn conv_same(&self, kernel: &Value) -> Value {
        let k = self.rank().saturating_sub(2);
        let ks = kernel.shape();
        let lo: Vec<usize> = (0..k).map(|i| ks[i].saturating_sub(1) / 2).collect();
        let hi: Vec<usize> = (0..k).map(|i| ks[i].saturating_sub(1) - lo[i]).collect();
        self.conv(kernel, &lo, &hi)
    }

    /// Flip along `dims` (a no-op for none).
    pub fn reverse(&self, dims: &[usize]) -> Value {
        if dims.is_empty() {
            return self.clone();
        }
        self.b.emit(
            Op::Reverse {
                dims: dims.to_vec(),
            },
            &[self],
            None,
        )
    }

    pub fn cumsum(&self, dim: usize, exclusive: bool, reverse: bool) -> Value {
        self.b.emit(
            Op::Cumsum {
                dim,
                exclusive,
                reverse,
            },
            &[self],
            None,
        )
    }

    pub fn argmax(&self, dim: usize) -> Value {
        self.b.emit(Op::Argmax { dim }, &[self], None)
    }

    pub fn gather(&self, idx: &Value, axis: usize, batch_dims: usize) -> Value {
        self.b
            .emit(Op::Gather { axis, batch_dims }, &[self, idx], None)
    }

    pub fn scatter_add(
        &self,
        idx: &Value,
        updates: &Value,
        axis: usize,
        batch_dims: usize,
    ) -> Value {
        self.b.emit(
            Op::ScatterAdd { axis, batch_dims },
            &[self, idx, updates],
            None,
        )
    }

    // ---- composites (builder functions over core ops, not new ops) ----

    pub fn relu(&self) -> Value {
        self.max(0.0)
    }

    /// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    pub fn gelu_tanh(&self) -> Value {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let x3 = self.mul(self).mul(self);
        let inner = self.add(&x3.mul(0.044715)).mul(c);
        self.mul(0.5).mul(&inner.tanh().add(1.0))
    }

    /// Numerically stable softmax along `dim`.
    pub fn softmax(&self, dim: usize) -> Value {
        let m = self.max_keepdims(&[dim]).stop_gradient();
        let e = self.sub(&m).exp();
        e.div(&e.sum_keepdims(&[dim]))
    }

    /// `log(sum(exp(x)))` along `dim` (removed).
    pub fn logsumexp(&self, dim: usize) -> Value {
        let m = self.max_keepdims(&[dim]).stop_gradient();
        let s = self.sub(&m).exp().sum(&[dim]).log();
        s.add(&m.reshape(&s.shape()))
    }

    pub fn log_softmax(&self, dim: usize) -> Value {
        let m = self.max_keepdims(&[dim]).stop_gradient();
        let z = self.sub(&m);
        z.sub(&z.exp().sum_keepdims(&[dim]).log())
    }

    /// Layer norm over the last dim (no affine parameters; multiply/add them outside).
    pub fn layer_norm(&self, eps: f64) -> Value {
        let d = self.rank() - 1;
        let mu = self.mean(&[d]);
        let xc = self.sub(&mu.reshape(&keep_shape(&self.shape(), &[d])));
        let var = xc.mul(&xc).mean(&[d]);
        xc.mul(
            &var.add(eps)
                .rsqrt()
                .reshape(&keep_shape(&self.shape(), &[d])),
        )
    }

    /// Scale-free RMS norm over the last dim: `x * rsqrt(mean(x^2) + eps)`.
    pub fn rms_norm(&self, eps: f64) -> Value {
        let d = self.rank() - 1;
        let ms = self.mul(self).mean(&[d]);
        self.mul(
            &ms.add(eps)
                .rsqrt()
                .reshape(&keep_shape(&self.shape(), &[d])),
        )
    }

    /// One-hot of integer `self` over `depth` classes, as a new last dim.
    pub fn one_hot(&self, depth: usize, dtype: DType) -> Value {
        self.one_hot_mask(depth).convert(dtype)
    }

    /// The one-hot's mask (bool, `true` at each element's class) over `depth` classes, as a
    /// new last dim: for picking one class's value with [`Value::select`].
    pub fn one_hot_mask(&self, depth: usize) -> Value {
        let mut shape = self.shape();
        shape.push(depth);
        let iota = self
            .b
            .iota(Type::new(DType::I32, shape.clone()), shape.len() - 1);
        let idx = self
            .convert(DType::I32)
            .broadcast_in_dim(&shape, &(0..self.rank()).collect::<Vec<_>>());
        iota.eq(&idx)
    }

    /// Top-`k` along the last dim by repeated argmax (ties: lowest index first).
    /// Returns `(values [.., k], indices i32[.., k])`.
    pub fn top_k(&self, k: usize) -> (Value, Value) {
        let d = self.rank() - 1;
        let n = self.shape()[d];
        assert!(
            k >= 1 && k <= n,
            "top_k: k={k} out of range for {}",
            self.ty()
        );
        let mut keep = self.shape();
        keep[d] = 1;
        let mut cur = self.clone();
        let mut vals = Vec::new();
        let mut idxs = Vec::new();
        for _ in 0..k {
            let i = cur.argmax(d);
            let oh = i.one_hot(n, DType::Bool);
            let v = oh.select(self, 0.0).sum(&[d]);
            vals.push(v.reshape(&keep));
            idxs.push(i.reshape(&keep));
            cur = oh.select(f64::NEG_INFINITY, &cur);
        }
        let vr: Vec<&Value> = vals.iter().collect();
        let ir: Vec<&Value> = idxs.iter().collect();
        (self.b.concat(&vr, d), self.b.concat(&ir, d))
    }
}

fn keep_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &s)| if dims.contains(&i) { 1 } else { s })
        .collect()
}

macro_rules! impl_arith {
    ($tr:ident, $m:ident) => {
        impl std::ops::$tr<&Value> for &Value {
            type Output = Value;
            fn $m(self, o: &Value) -> Value {
                Value::$m(self, o)
            }
        }
        impl std::ops::$tr<Value> for Value {
            type Output = Value;
            fn $m(self, o: Value) -> Value {
                Value::$m(&self, &o)
            }
        }
        impl std::ops::$tr<&Value> for Value {
            type Output = Value;
            fn $m(self, o: &Value) -> Value {
                Value::$m(&self, o)
            }
        }
        impl std::ops::$tr<f64> for &Value {
            type Output = Value;
            fn $m(self, o: f64) -> Value {
                Value::$m(self, o)
            }
        }
        impl std::ops::$tr<f64> for Value {
            type Output = Value;
            fn $m(self, o: f64) -> Value {
                Value::$m(&self, o)
            }
        }
    };
}
impl_arith!(Add, add);
impl_arith!(Sub, sub);
impl_arith!(Mul, mul);
impl_arith!(Div, div);

impl std::ops::Neg for &Value {
    type Output = Value;
    fn neg(self) -> Value {
        Value::neg(self)
    }
}
impl std::ops::Neg for Value {
    type Output = Value;
    fn neg(self) -> Value {
        Value::neg(&self)
    }
}

/// Parse and lower an einsum spec over one or two operands.
fn einsum(b: &Builder, spec: &str, operands: &[&Value]) -> Value {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let fail = |why: &str| -> ! { panic!("einsum \"{spec}\": {why}") };
    let (lhs, out) = spec
        .split_once("->")
        .unwrap_or_else(|| fail("missing `->`"));
    let ins: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = out.chars().collect();
    if ins.len() != operands.len() || !(1..=2).contains(&ins.len()) {
        fail("needs one or two operands matching the spec");
    }
    for (t, v) in ins.iter().zip(operands) {
        if t.len() != v.rank() {
            fail(&format!(
                "term {:?} does not match operand {}",
                t.iter().collect::<String>(),
                v.ty()
            ));
        }
        let mut u = t.clone();
        u.sort_unstable();
        u.dedup();
        if u.len() != t.len() {
            fail("repeated letters within one operand are not supported");
        }
    }
    // Letters present in only one operand and absent from the output are summed first.
    let reduce_only = |t: &[char], other: &[char], v: &Value| -> (Vec<char>, Value) {
        let dims: Vec<usize> = (0..t.len())
            .filter(|&i| !out.contains(&t[i]) && !other.contains(&t[i]))
            .collect();
        let kept: Vec<char> = (0..t.len())
            .filter(|i| !dims.contains(i))
            .map(|i| t[i])
            .collect();
        (kept, v.sum(&dims))
    };
    let (term, val) = if ins.len() == 1 {
        reduce_only(&ins[0], &[], operands[0])
    } else {
        let (lt, lv) = reduce_only(&ins[0], &ins[1], operands[0]);
        let (rt, rv) = reduce_only(&ins[1], &ins[0], operands[1]);
        let mut dd = DotDims::default();
        let mut res: Vec<char> = Vec::new();
        for (i, c) in lt.iter().enumerate() {
            if let Some(j) = rt.iter().position(|x| x == c) {
                if lv.shape()[i] != rv.shape()[j] {
                    fail(&format!(
                        "letter {c} has sizes {} and {}",
                        lv.shape()[i],
                        rv.shape()[j]
                    ));
                }
                if out.contains(c) {
                    dd.lhs_batch.push(i);
                    dd.rhs_batch.push(j);
                    res.push(*c);
                } else {
                    dd.lhs_contract.push(i);
                    dd.rhs_contract.push(j);
                }
            }
        }
        res.extend(dd.lhs_free(lt.len()).iter().map(|&i| lt[i]));
        res.extend(dd.rhs_free(rt.len()).iter().map(|&j| rt[j]));
        (res, lv.dot_general(&rv, dd))
    };
    if term.len() != out.len() || out.iter().any(|c| !term.contains(c)) {
        fail("output letters must each appear in an input exactly once");
    }
    let perm: Vec<usize> = out
        .iter()
        .map(|c| term.iter().position(|x| x == c).unwrap())
        .collect();
    let _ = b;
    val.transpose(&perm)
}
