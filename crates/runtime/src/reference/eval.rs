//! The rule table: one exhaustive `match` over [`Op`] (no wildcard arm), each arm a call
//! to one small helper below. Every instruction is evaluated on all devices at once: local
//! ops map over devices, collectives work across each replica group's buffers.
//!
//! Choices where `op.rs` leaves freedom (scalar ones are in `scalar.rs`):
//! - `gather`: an index `< 0` or `>= dim` yields zeros; `scatter_add` drops it.
//! - `dynamic_slice` / `dynamic_update_slice`: each start clamps into `[0, dim - size]`.
//! - `argmax`: ties go to the lowest index; NaN counts as the maximum (the first NaN wins);
//!   an empty dim gives 0.
//! - `cumsum`: inclusive `out[i] = sum x[0..=i]`; exclusive `sum x[0..i]`; reverse inclusive
//!   `sum x[i..n]`; reverse exclusive `sum x[i+1..n]`. Each output is accumulated in f64 and
//!   rounded once (i32 wraps).
//! - `reduce`, `dot_general`, `conv`, `scatter_add` and the reducing collectives accumulate
//!   floats in f64 and round once; summation order is row-major / rank order.

use super::collective;
use super::scalar;
use super::val::{concat, sub_offsets, Val};
use super::{Ctx, RuntimeError};
use crate::rng;
use ir::{DType, DotDims, Instr, Literal, Op, ReduceOp, RngDist, Type};

/// Evaluate instruction `index` on every device; `args[d]` are device `d`'s operands.
pub fn eval(
    index: usize,
    ins: &Instr,
    args: &[Vec<&Val>],
    cx: &Ctx,
) -> Result<Vec<Val>, RuntimeError> {
    let ty = &ins.ty;
    let each = |f: &dyn Fn(usize, &[&Val]) -> Val| -> Result<Vec<Val>, RuntimeError> {
        Ok(args.iter().enumerate().map(|(d, a)| f(d, a)).collect())
    };
    let groups = |axes: &[String]| cx.groups(index, &ins.op, axes);
    match &ins.op {
        Op::Parameter { name } => (0..args.len()).map(|d| cx.param(d, name, ty)).collect(),
        Op::Constant { value } => each(&|_, _| constant(value, ty)),
        Op::Iota { dim } => each(&|_, _| Val::from_fn(ty, |i| i[*dim] as f64)),
        Op::Unary(u) => each(&|_, a| map(a[0], ty, |x| scalar::unary(*u, a[0].dtype(), x))),
        Op::Binary(b) => each(&|_, a| {
            zip(a[0], a[1], ty, |x, y| {
                scalar::binary(*b, a[0].dtype(), x, y)
            })
        }),
        Op::Compare(c) => each(&|_, a| zip(a[0], a[1], ty, |x, y| scalar::compare(*c, x, y))),
        Op::Select => each(&|_, a| select(a[0], a[1], a[2])),
        // Val::new rounds to the result dtype, which is exactly the convert rule.
        Op::Convert | Op::StopGradient | Op::Copy | Op::Reshape => {
            each(&|_, a| Val::new(ty, a[0].v.clone()))
        }
        Op::Broadcast { dims } => each(&|_, a| broadcast(a[0], dims, ty)),
        Op::Transpose { perm } => each(&|_, a| transpose(a[0], perm, ty)),
        Op::Slice { start, .. } => each(&|_, a| window(a[0], start, ty)),
        Op::DynamicSlice { sizes } => {
            each(&|_, a| window(a[0], &clamped_starts(a[0].shape(), sizes, &a[1..]), ty))
        }
        Op::DynamicUpdateSlice => each(&|_, a| dynamic_update_slice(a[0], a[1], &a[2..])),
        Op::Pad { low, .. } => each(&|_, a| pad(a[0], a[1].scalar(), low, ty)),
        Op::Concatenate { dim } => each(&|_, a| concat(a, *dim)),
        Op::Reduce { op, dims } => each(&|_, a| reduce(a[0], *op, dims, ty)),
        Op::DotGeneral(dd) => each(&|_, a| dot_general(a[0], a[1], dd, ty)),
        Op::Conv { pad_lo, .. } => each(&|_, a| conv(a[0], a[1], pad_lo, ty)),
        Op::Reverse { dims } => each(&|_, a| reverse(a[0], dims)),
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => each(&|_, a| cumsum(a[0], *dim, *exclusive, *reverse)),
        Op::Argmax { dim } => each(&|_, a| argmax(a[0], *dim, ty)),
        Op::Gather { axis, batch_dims } => each(&|_, a| gather(a[0], a[1], *axis, *batch_dims, ty)),
        Op::ScatterAdd { axis, batch_dims } => {
            each(&|_, a| scatter_add(a[0], a[1], a[2], *axis, *batch_dims))
        }
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => each(&|_, a| random(*dist, *stream, global_shape, a, ty)),
        Op::PartitionId => each(&|d, _| Val::new(ty, vec![d as f64])),
        Op::Collective(c) => Ok(collective::run(&groups(&c.axes)?, args, &c.kind)),
    }
}

fn constant(value: &Literal, ty: &Type) -> Val {
    match value {
        Literal::Splat(x) => Val::new(ty, vec![*x; ty.num_elements()]),
        Literal::Dense(xs) => Val::new(ty, xs.clone()),
    }
}

fn map(x: &Val, ty: &Type, f: impl Fn(f64) -> f64) -> Val {
    Val::new(ty, x.v.iter().map(|&a| f(a)).collect())
}

fn zip(x: &Val, y: &Val, ty: &Type, f: impl Fn(f64, f64) -> f64) -> Val {
    Val::new(ty, x.v.iter().zip(&y.v).map(|(&a, &b)| f(a, b)).collect())
}

fn select(p: &Val, t: &Val, f: &Val) -> Val {
    let v = (0..p.v.len())
        .map(|e| if p.v[e] != 0.0 { t.v[e] } else { f.v[e] })
        .collect();
    Val::new(&t.ty, v)
}

/// Operand dim `k` is result dim `dims[k]`.
fn broadcast(x: &Val, dims: &[usize], ty: &Type) -> Val {
    let mut src = vec![0; dims.len()];
    Val::from_fn(ty, |o| {
        for (k, &d) in dims.iter().enumerate() {
            src[k] = o[d];
        }
        x.at(&src)
    })
}

/// Result dim `i` is operand dim `perm[i]`.
fn transpose(x: &Val, perm: &[usize], ty: &Type) -> Val {
    let mut src = vec![0; perm.len()];
    Val::from_fn(ty, |o| {
        for (i, &p) in perm.iter().enumerate() {
            src[p] = o[i];
        }
        x.at(&src)
    })
}

/// The window of shape `ty.shape` starting at `start` (slice and dynamic_slice).
fn window(x: &Val, start: &[usize], ty: &Type) -> Val {
    let mut src = vec![0; start.len()];
    Val::from_fn(ty, |o| {
        for d in 0..start.len() {
            src[d] = o[d] + start[d];
        }
        x.at(&src)
    })
}

/// i32 starts, each clamped into `[0, dim - size]`.
fn clamped_starts(shape: &[usize], sizes: &[usize], starts: &[&Val]) -> Vec<usize> {
    (0..shape.len())
        .map(|d| {
            let hi = (shape[d] - sizes[d]) as i64;
            (starts[d].scalar() as i64).clamp(0, hi) as usize
        })
        .collect()
}

fn dynamic_update_slice(x: &Val, u: &Val, starts: &[&Val]) -> Val {
    let start = clamped_starts(x.shape(), u.shape(), starts);
    let mut src = vec![0; start.len()];
    Val::from_fn(&x.ty, |o| {
        let mut inside = true;
        for d in 0..start.len() {
            inside &= o[d] >= start[d] && o[d] < start[d] + u.shape()[d];
            src[d] = o[d].wrapping_sub(start[d]);
        }
        if inside {
            u.at(&src)
        } else {
            x.at(o)
        }
    })
}

/// Element `o` is `x[o - low]` where that is inside `x`, else the padding value.
fn pad(x: &Val, value: f64, low: &[usize], ty: &Type) -> Val {
    let mut src = vec![0; low.len()];
    Val::from_fn(ty, |o| {
        for d in 0..low.len() {
            if o[d] < low[d] || o[d] - low[d] >= x.shape()[d] {
                return value;
            }
            src[d] = o[d] - low[d];
        }
        x.at(&src)
    })
}

fn reduce(x: &Val, op: ReduceOp, dims: &[usize], ty: &Type) -> Val {
    let kept: Vec<usize> = (0..x.ty.rank()).filter(|d| !dims.contains(d)).collect();
    let sizes: Vec<usize> = dims.iter().map(|&d| x.shape()[d]).collect();
    let inner = sub_offsets(&x.strides, dims, &sizes);
    Val::from_fn(ty, |o| {
        let base: usize = kept.iter().zip(o).map(|(&d, &i)| i * x.strides[d]).sum();
        scalar::reduce(op, x.dtype(), inner.iter().map(|&r| x.v[base + r]))
    })
}

/// Result index = (batch, lhs free, rhs free); sums over every contracting multi-index.
fn dot_general(l: &Val, r: &Val, dd: &DotDims, ty: &Type) -> Val {
    let (lf, rf) = (dd.lhs_free(l.ty.rank()), dd.rhs_free(r.ty.rank()));
    let (nb, nlf) = (dd.lhs_batch.len(), lf.len());
    let sizes: Vec<usize> = dd.lhs_contract.iter().map(|&d| l.shape()[d]).collect();
    let lc = sub_offsets(&l.strides, &dd.lhs_contract, &sizes);
    let rc = sub_offsets(&r.strides, &dd.rhs_contract, &sizes);
    Val::from_fn(ty, |o| {
        let (b, rest) = o.split_at(nb);
        let (li, ri) = rest.split_at(nlf);
        let off = |dims: &[usize], idx: &[usize], strides: &[usize]| -> usize {
            dims.iter().zip(idx).map(|(&d, &i)| i * strides[d]).sum()
        };
        let lb = off(&dd.lhs_batch, b, &l.strides) + off(&lf, li, &l.strides);
        let rb = off(&dd.rhs_batch, b, &r.strides) + off(&rf, ri, &r.strides);
        let pairs = lc
            .iter()
            .zip(&rc)
            .map(|(&a, &c)| (l.v[lb + a], r.v[rb + c]));
        scalar::dot(l.dtype(), pairs)
    })
}

/// `out[n, o, co] = sum_{j, ci} x[n, o + j - pad_lo, ci] * w[j, ci, co]`, the window
/// `(j, ci)` in row-major order; outside `x` the lhs reads 0 (and `0 * w` is still added, so
/// a non-finite weight poisons every output, as with explicit zero padding).
fn conv(x: &Val, w: &Val, pad_lo: &[usize], ty: &Type) -> Val {
    let k = pad_lo.len();
    let window = &w.shape()[..=k];
    let (mut xi, mut wi) = (vec![0; k + 2], vec![0; k + 2]);
    Val::from_fn(ty, |o| {
        let mut terms = Vec::with_capacity(window.iter().product());
        super::val::for_each_index(window, |j| {
            xi[0] = o[0];
            xi[k + 1] = j[k];
            let mut inside = true;
            for i in 0..k {
                let p = (o[1 + i] + j[i]).wrapping_sub(pad_lo[i]);
                inside &= o[1 + i] + j[i] >= pad_lo[i] && p < x.shape()[1 + i];
                xi[1 + i] = p;
            }
            wi[..=k].copy_from_slice(j);
            wi[k + 1] = o[k + 1];
            terms.push((if inside { x.at(&xi) } else { 0.0 }, w.at(&wi)));
        });
        scalar::dot(x.dtype(), terms.into_iter())
    })
}

/// `out[i] = x[i with i_d -> n_d - 1 - i_d for d in dims]`.
fn reverse(x: &Val, dims: &[usize]) -> Val {
    let mut src = vec![0; x.ty.rank()];
    Val::from_fn(&x.ty, |o| {
        src.copy_from_slice(o);
        for &d in dims {
            src[d] = x.shape()[d] - 1 - o[d];
        }
        x.at(&src)
    })
}

fn cumsum(x: &Val, dim: usize, exclusive: bool, reverse: bool) -> Val {
    let n = x.shape()[dim];
    let mut src = vec![0; x.ty.rank()];
    Val::from_fn(&x.ty, |o| {
        let i = o[dim];
        let range = match (exclusive, reverse) {
            (false, false) => 0..i + 1,
            (true, false) => 0..i,
            (false, true) => i..n,
            (true, true) => i + 1..n,
        };
        src.copy_from_slice(o);
        let vals: Vec<f64> = range
            .map(|j| {
                src[dim] = j;
                x.at(&src)
            })
            .collect();
        scalar::reduce(ReduceOp::Sum, x.dtype(), vals.into_iter())
    })
}

fn argmax(x: &Val, dim: usize, ty: &Type) -> Val {
    let mut src = vec![0; x.ty.rank()];
    Val::from_fn(ty, |o| {
        src[..dim].copy_from_slice(&o[..dim]);
        src[dim + 1..].copy_from_slice(&o[dim..]);
        let mut best: Option<(usize, f64)> = None;
        for j in 0..x.shape()[dim] {
            src[dim] = j;
            let v = x.at(&src);
            best = match best {
                Some((_, b)) if b.is_nan() || !(v.is_nan() || v > b) => best,
                Some(_) | None => Some((j, v)),
            };
        }
        best.map_or(0.0, |(j, _)| j as f64)
    })
}

/// The operand index that gather result index `o` reads (`None` if the index is out of
/// range). Result dims are `x[..axis] ++ idx[batch_dims..] ++ x[axis+1..]`; the first
/// `batch_dims` dims are shared by `x` and `idx`.
fn gather_source(
    x: &Val,
    idx: &Val,
    axis: usize,
    batch_dims: usize,
    o: &[usize],
) -> Option<Vec<usize>> {
    let ni = idx.ty.rank() - batch_dims;
    let mut ii = o[..batch_dims].to_vec();
    ii.extend_from_slice(&o[axis..axis + ni]);
    let j = idx.at(&ii) as i64;
    if j < 0 || j >= x.shape()[axis] as i64 {
        return None;
    }
    let mut xi = o[..axis].to_vec();
    xi.push(j as usize);
    xi.extend_from_slice(&o[axis + ni..]);
    Some(xi)
}

fn gather(x: &Val, idx: &Val, axis: usize, batch_dims: usize, ty: &Type) -> Val {
    Val::from_fn(ty, |o| {
        gather_source(x, idx, axis, batch_dims, o).map_or(0.0, |xi| x.at(&xi))
    })
}

/// `base` plus every update added at the position gather would read it from.
fn scatter_add(base: &Val, idx: &Val, upd: &Val, axis: usize, batch_dims: usize) -> Val {
    let mut acc = base.v.clone();
    super::val::for_each_index(upd.shape(), |o| {
        if let Some(xi) = gather_source(base, idx, axis, batch_dims, o) {
            let (t, u) = (base.offset(&xi), upd.at(o));
            acc[t] = if base.dtype() == DType::I32 {
                (acc[t] as i32).wrapping_add(u as i32) as f64
            } else {
                acc[t] + u
            };
        }
    });
    Val::new(&base.ty, acc)
}

/// Operands: the i32 seed, then optional i32 offsets into `global_shape` (see `rng.rs`).
fn random(dist: RngDist, stream: u64, global_shape: &[usize], a: &[&Val], ty: &Type) -> Val {
    let seed = a[0].scalar() as i32;
    let offsets: Vec<i64> = (0..global_shape.len())
        .map(|d| a.get(d + 1).map_or(0, |o| o.scalar() as i64))
        .collect();
    let mut g = vec![0i64; global_shape.len()];
    Val::from_fn(ty, |o| {
        for d in 0..g.len() {
            g[d] = o[d] as i64 + offsets[d];
        }
        let index = rng::linear_index(global_shape, &g);
        rng::sample(dist, ty.dtype, seed, stream, index)
    })
}
