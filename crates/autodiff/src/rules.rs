//! The VJP table: for every op, the cotangents of its operands given the cotangent `g` of
//! its result, emitted as ordinary IR through the builder.
//!
//! One exhaustive `match` over [`Op`] with no wildcard arm, so a new op fails to compile here
//! until someone decides its rule. `None` means "no gradient flows into this operand" (indices,
//! predicates, seeds, piecewise-constant functions); the driver treats it as zero and emits
//! nothing for it. Rules may emit cotangents that the driver ends up not needing; `grad`
//! removes such dead backward code afterwards, so rules stay simple and total.

use ir::{
    BinaryOp, Builder, Collective, CollectiveKind, DotDims, Instr, Op, ReduceOp, UnaryOp, Value,
};

/// Cotangents of `instr`'s operands (one entry per operand, `None` = no gradient).
///
/// `operands` are handles to the instruction's operands, `out` to its result and `g` is the
/// (float) cotangent of the result, of the result's type. Every `Some` cotangent has the type
/// of its operand.
pub fn vjp(
    b: &Builder,
    instr: &Instr,
    operands: &[Value],
    out: &Value,
    g: &Value,
) -> Vec<Option<Value>> {
    let ops = operands;
    let n = ops.len();
    let cts: Vec<Option<Value>> = match &instr.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::PartitionId => vec![],
        Op::Unary(u) => vec![unary(*u, &ops[0], out, g)],
        Op::Binary(op) => binary(b, *op, &ops[0], &ops[1], out, g),
        Op::Compare(_) => vec![None, None],
        Op::Select => {
            let p = &ops[0];
            vec![None, Some(p.select(g, 0.0)), Some(p.select(0.0, g))]
        }
        // Float -> float converts the cotangent back; a cast from int/bool (a mask) is a
        // constant as far as gradients go.
        Op::Convert => vec![is_float(&ops[0]).then(|| g.convert(ops[0].dtype()))],
        Op::StopGradient => vec![None],
        Op::Copy => vec![Some(g.clone())],
        Op::Broadcast { dims } => {
            let new: Vec<usize> = (0..out.rank()).filter(|d| !dims.contains(d)).collect();
            vec![Some(g.sum(&new))]
        }
        Op::Reshape => vec![Some(g.reshape(&ops[0].shape()))],
        Op::Transpose { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.transpose(&inv))]
        }
        Op::Slice { start, limit } => {
            let high: Vec<usize> = ops[0]
                .shape()
                .iter()
                .zip(limit)
                .map(|(n, l)| n - l)
                .collect();
            vec![Some(g.pad(start, &high, 0.0))]
        }
        Op::DynamicSlice { .. } => {
            // Both directions clamp the starts the same way, so the window matches.
            let starts: Vec<&Value> = ops[1..].iter().collect();
            let x = zeros(b, &ops[0]).dynamic_update_slice(g, &starts);
            with_none(Some(x), n - 1)
        }
        Op::DynamicUpdateSlice => {
            let starts: Vec<&Value> = ops[2..].iter().collect();
            let x = g.dynamic_update_slice(&zeros(b, &ops[1]), &starts);
            let u = g.dynamic_slice(&starts, &ops[1].shape());
            let mut cts = vec![Some(x), Some(u)];
            cts.extend(std::iter::repeat_n(None, n - 2));
            cts
        }
        Op::Pad { low, .. } => {
            let limit: Vec<usize> = low.iter().zip(ops[0].shape()).map(|(l, n)| l + n).collect();
            let inner = g.slice(low, &limit);
            let pad_value = g.sum_all().sub(&inner.sum_all());
            vec![Some(inner), Some(pad_value)]
        }
        Op::Concatenate { dim } => {
            let mut off = 0;
            ops.iter()
                .map(|o| {
                    let len = o.shape()[*dim];
                    off += len;
                    Some(g.slice_dim(*dim, off - len, off))
                })
                .collect()
        }
        Op::Reduce { op, dims } => vec![Some(reduce(*op, dims, &ops[0], out, g))],
        Op::DotGeneral(dd) => dot_general(dd, &ops[0], &ops[1], g),
        Op::Conv { pad_lo, pad_hi } => conv(b, pad_lo, pad_hi, &ops[0], &ops[1], g),
        Op::Reverse { dims } => vec![Some(g.reverse(dims))],
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => vec![Some(g.cumsum(*dim, *exclusive, !reverse))],
        Op::Argmax { .. } => vec![None],
        Op::Gather { axis, batch_dims } => {
            let x = zeros(b, &ops[0]).scatter_add(&ops[1], g, *axis, *batch_dims);
            vec![Some(x), None]
        }
        Op::ScatterAdd { axis, batch_dims } => {
            let u = g.gather(&ops[1], *axis, *batch_dims);
            vec![Some(g.clone()), None, Some(u)]
        }
        Op::Rng { .. } => vec![None; n],
        Op::Collective(Collective { kind, axes }) => {
            // The transpose of each collective, on the cotangent.
            let emit = |op: Op, v: &Value| b.emit(op, &[v], None);
            let gather = |v: &Value, dim: usize| emit(Op::all_gather(dim, axes.clone()), v);
            let sum = |v: &Value| all_reduce_sum(b, axes, v);
            match kind {
                CollectiveKind::AllReduce { op } => match op {
                    ReduceOp::Sum => vec![Some(sum(g))],
                    // Chooser rule across devices: the summed cotangent is split equally
                    // among the devices whose value equals the result.
                    ReduceOp::Max | ReduceOp::Min => {
                        let ind = ops[0].eq(out).convert(g.dtype());
                        vec![Some(ind.mul(&sum(g)).div(&sum(&ind)))]
                    }
                },
                CollectiveKind::AllGather { dim } => {
                    let op = Op::reduce_scatter(ReduceOp::Sum, *dim, axes.clone());
                    vec![Some(emit(op, g))]
                }
                CollectiveKind::ReduceScatter { op, dim } => match op {
                    ReduceOp::Sum => vec![Some(gather(g, *dim))],
                    // As for all_reduce, on the full (gathered) result.
                    ReduceOp::Max | ReduceOp::Min => {
                        let ind = ops[0].eq(&gather(out, *dim)).convert(g.dtype());
                        let count = all_reduce_sum(b, axes, &ind);
                        vec![Some(ind.mul(&gather(g, *dim)).div(&count))]
                    }
                },
                CollectiveKind::AllToAll {
                    split_dim,
                    concat_dim,
                } => {
                    let op = Op::all_to_all(*concat_dim, *split_dim, axes.clone());
                    vec![Some(emit(op, g))]
                }
                CollectiveKind::Permute { pairs } => {
                    let back = pairs.iter().map(|&(s, d)| (d, s)).collect();
                    vec![Some(emit(Op::collective_permute(axes.clone(), back), g))]
                }
            }
        }
    };
    // Integer and bool operands never carry a gradient, whatever the rule above says.
    cts.into_iter()
        .zip(ops)
        .map(|(c, o)| c.filter(|_| is_float(o)))
        .collect()
}

fn is_float(v: &Value) -> bool {
    v.dtype().is_float()
}

fn zeros(b: &Builder, like: &Value) -> Value {
    b.splat(0.0, like.ty())
}

/// `first` followed by `n` `None`s.
fn with_none(first: Option<Value>, n: usize) -> Vec<Option<Value>> {
    std::iter::once(first)
        .chain(std::iter::repeat_n(None, n))
        .collect()
}

fn all_reduce_sum(b: &Builder, axes: &[String], v: &Value) -> Value {
    b.emit(Op::all_reduce(ReduceOp::Sum, axes.to_vec()), &[v], None)
}

fn unary(u: UnaryOp, x: &Value, out: &Value, g: &Value) -> Option<Value> {
    match u {
        UnaryOp::Neg => Some(g.neg()),
        UnaryOp::Abs => Some(g.mul(&x.sign())),
        // Piecewise constant: the gradient is zero almost everywhere.
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Not => None,
        UnaryOp::Exp => Some(g.mul(out)),
        UnaryOp::Log => Some(g.div(x)),
        UnaryOp::Log1p => Some(g.div(&x.add(1.0))),
        UnaryOp::Sqrt => Some(g.div(&out.mul(2.0))),
        // d/dx x^(-1/2) = -1/2 x^(-3/2) = -1/2 out / x
        UnaryOp::Rsqrt => Some(g.mul(&out.div(x)).mul(-0.5)),
        UnaryOp::Tanh => Some(g.mul(&out.mul(out).neg().add(1.0))),
        UnaryOp::Logistic => Some(g.mul(&out.mul(&out.neg().add(1.0)))),
        UnaryOp::Erf => {
            let c = 2.0 / std::f64::consts::PI.sqrt();
            Some(g.mul(&x.mul(x).neg().exp()).mul(c))
        }
        UnaryOp::Sin => Some(g.mul(&x.cos())),
        UnaryOp::Cos => Some(g.mul(&x.sin()).neg()),
    }
}

fn binary(
    b: &Builder,
    op: BinaryOp,
    x: &Value,
    y: &Value,
    out: &Value,
    g: &Value,
) -> Vec<Option<Value>> {
    let (dx, dy) = match op {
        BinaryOp::Add => (g.clone(), g.clone()),
        BinaryOp::Sub => (g.clone(), g.neg()),
        BinaryOp::Mul => (g.mul(y), g.mul(x)),
        // d/dy x/y = -x/y^2 = -out/y
        BinaryOp::Div => (g.div(y), g.mul(out).div(y).neg()),
        // x rem y = x - y * trunc(x / y)
        BinaryOp::Rem => {
            let q = x.div(y);
            let trunc = q.sign().mul(&q.abs().floor());
            (g.clone(), g.mul(&trunc).neg())
        }
        BinaryOp::Pow => {
            // dx = y x^(y-1), taken as 0 where y == 0 (also at x == 0);
            // dy = log(x) x^y, taken as 0 where x == 0.
            let dx = y.eq(0.0).select(0.0, &y.mul(&x.pow(&y.sub(1.0))));
            let safe_x = x.eq(0.0).select(1.0, x);
            (g.mul(&dx), g.mul(out).mul(&safe_x.log()))
        }
        BinaryOp::Max | BinaryOp::Min => (
            g.mul(&balanced(b, op, x, y, out)),
            g.mul(&balanced(b, op, y, x, out)),
        ),
        BinaryOp::And | BinaryOp::Or => return vec![None, None],
    };
    vec![Some(dx), Some(dy)]
}

/// JAX's balanced max/min weight for operand `a`: 1 where `a` alone equals the result,
/// 1/2 where both operands tie, 0 elsewhere.
///
/// Against a splat constant `c` (a ReLU's 0) the weight is a function of `a` alone, the same
/// values without reading the result: `a > c` (`<` for min) gives 1, `a == c` 1/2, anything
/// else (NaN included) 0. The ReLU gradient then reads the pre-activation only.
fn balanced(b: &Builder, op: BinaryOp, a: &Value, other: &Value, out: &Value) -> Value {
    let ty = out.ty();
    if let Some(c) = other.splat_value() {
        let wins = if op == BinaryOp::Max {
            a.gt(c)
        } else {
            a.lt(c)
        };
        let tie = a.eq(c).select(&b.splat(0.5, ty.clone()), 0.0);
        return wins.select(&b.splat(1.0, ty), &tie);
    }
    let if_a = other
        .eq(out)
        .select(&b.splat(0.5, ty.clone()), &b.splat(1.0, ty));
    a.eq(out).select(&if_a, 0.0)
}

fn reduce(op: ReduceOp, dims: &[usize], x: &Value, out: &Value, g: &Value) -> Value {
    let shape = x.shape();
    let kept: Vec<usize> = (0..x.rank()).filter(|d| !dims.contains(d)).collect();
    let back = |v: &Value| v.broadcast_in_dim(&shape, &kept);
    match op {
        ReduceOp::Sum => back(g),
        // JAX's chooser rule: split g equally among the positions equal to the result.
        ReduceOp::Max | ReduceOp::Min => {
            let ind = x.eq(&back(out)).convert(x.dtype());
            let count = ind.sum(dims);
            ind.mul(&back(&g.div(&count)))
        }
    }
}

/// Both cotangents of `dot_general(lhs, rhs)`: each is a dot-general of `g` with the other
/// operand, transposed back to the operand's layout.
fn dot_general(dd: &DotDims, lhs: &Value, rhs: &Value, g: &Value) -> Vec<Option<Value>> {
    let nb = dd.lhs_batch.len();
    let nlf = dd.lhs_free(lhs.rank()).len();
    let nrf = dd.rhs_free(rhs.rank()).len();
    let dl = dot_side(
        g,
        rhs,
        lhs.rank(),
        (&dd.lhs_batch, &dd.lhs_contract),
        (&dd.rhs_batch, &dd.rhs_contract),
        (nb + nlf..nb + nlf + nrf).collect(),
    );
    let dr = dot_side(
        g,
        lhs,
        rhs.rank(),
        (&dd.rhs_batch, &dd.rhs_contract),
        (&dd.lhs_batch, &dd.lhs_contract),
        (nb..nb + nlf).collect(),
    );
    vec![Some(dl), Some(dr)]
}

/// Cotangent of one dot-general operand ("mine", of rank `rank`), given the other operand.
///
/// `g` has dims `[batch, lhs free, rhs free]`; `g_other_free` are the positions in `g` of the
/// other operand's free dims. Contracting those with the other operand's free dims and
/// batching the batch dims gives `[batch, my free, other's contracting dims in its order]`;
/// my contracting dim `c[j]` pairs with the other's `c'[j]`, which fixes the transpose.
fn dot_side(
    g: &Value,
    other: &Value,
    rank: usize,
    (my_batch, my_contract): (&[usize], &[usize]),
    (other_batch, other_contract): (&[usize], &[usize]),
    g_other_free: Vec<usize>,
) -> Value {
    let nb = my_batch.len();
    let other_free: Vec<usize> = (0..other.rank())
        .filter(|d| !other_batch.contains(d) && !other_contract.contains(d))
        .collect();
    let dims = DotDims {
        lhs_batch: (0..nb).collect(),
        rhs_batch: other_batch.to_vec(),
        lhs_contract: g_other_free,
        rhs_contract: other_free,
    };
    let res = g.dot_general(other, dims);
    let my_free: Vec<usize> = (0..rank)
        .filter(|d| !my_batch.contains(d) && !my_contract.contains(d))
        .collect();
    let perm: Vec<usize> = (0..rank)
        .map(|d| {
            if let Some(k) = my_batch.iter().position(|&x| x == d) {
                k
            } else if let Some(k) = my_free.iter().position(|&x| x == d) {
                nb + k
            } else {
                let j = my_contract.iter().position(|&x| x == d).unwrap();
                let partner = other_contract[j];
                nb + my_free.len() + other_contract.iter().filter(|&&c| c < partner).count()
            }
        })
        .collect();
    res.transpose(&perm)
}

/// Both cotangents of `conv(x, w)` (x `[N, S.., Cin]`, w `[K.., Cin, Cout]`, g
/// `[N, O.., Cout]`), each itself a stride-1 convolution:
/// - `dx = conv(g, reverse(w) with Cin and Cout swapped)` with padding `K - 1 - pad` per
///   side; where `pad > K - 1` that would be negative, so the rows of `g` that only saw
///   padding are sliced off instead;
/// - `dw = conv(x^T, g^T)` with the forward padding, where `x^T = [Cin, S.., N]` and
///   `g^T = [O.., N, Cout]` (the batch is the contracted "feature" dim), transposed back to
///   `[K.., Cin, Cout]`.
fn conv(
    b: &Builder,
    pad_lo: &[usize],
    pad_hi: &[usize],
    x: &Value,
    w: &Value,
    g: &Value,
) -> Vec<Option<Value>> {
    let k = pad_lo.len();
    if x.ty().num_elements() == 0 || w.ty().num_elements() == 0 || g.ty().num_elements() == 0 {
        return vec![Some(zeros(b, x)), Some(zeros(b, w))];
    }
    let (ks, os) = (w.shape(), g.shape());
    let (mut start, mut limit) = (vec![0; k + 2], os.clone());
    let (mut lo, mut hi) = (Vec::with_capacity(k), Vec::with_capacity(k));
    for i in 0..k {
        let reach = ks[i] - 1;
        start[1 + i] = pad_lo[i].saturating_sub(reach);
        limit[1 + i] -= pad_hi[i].saturating_sub(reach);
        lo.push(reach.saturating_sub(pad_lo[i]));
        hi.push(reach.saturating_sub(pad_hi[i]));
    }
    let spatial: Vec<usize> = (0..k).collect();
    let mut swap: Vec<usize> = (0..k).collect();
    swap.extend([k + 1, k]);
    let wt = w.reverse(&spatial).transpose(&swap);
    let trimmed = if start.iter().all(|&s| s == 0) && limit == os {
        g.clone()
    } else {
        g.slice(&start, &limit)
    };
    let dx = trimmed.conv(&wt, &lo, &hi);

    let mut xp = vec![k + 1];
    xp.extend(1..=k);
    xp.push(0);
    let mut gp: Vec<usize> = (1..=k).collect();
    gp.extend([0, k + 1]);
    let mut back: Vec<usize> = (1..=k).collect();
    back.extend([0, k + 1]);
    let dw = x
        .transpose(&xp)
        .conv(&g.transpose(&gp), pad_lo, pad_hi)
        .transpose(&back);
    vec![Some(dx), Some(dw)]
}
