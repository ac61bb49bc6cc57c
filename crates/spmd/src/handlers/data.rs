//! Elementwise ops and data movement: broadcast, reshape, transpose, reverse, the slicing
//! family, concatenate, and ops along one dim (cumsum, argmax). Dims whose extent an op
//! changes are made unsplit first; every other dim keeps the assigned layout.

use super::{cleared, emit_as, to};
use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use ir::{BinaryOp, Op, Sharding, Type};

pub fn elementwise(
    ctx: &mut Ctx,
    op: &Op,
    ops: &[&PartitionedValue],
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    if let Some(s) = linear_in_partial_sums(op, ops, ty, t) {
        let refs: Vec<&ir::Value> = ops.iter().map(|o| &o.local).collect();
        return emit_as(ctx, op.clone(), &refs, ty, &s);
    }
    let mut locals = Vec::new();
    for o in ops {
        locals.push(to(ctx, o, t)?);
    }
    let refs: Vec<&ir::Value> = locals.iter().collect();
    emit_as(ctx, op.clone(), &refs, ty, t)
}

/// The sharding of `a + b`, `a - b` or a widening float convert left a pending partial
/// sum: when every operand is a partial sum over the same axes with the target's dims,
/// `sum_d a_d + sum_d b_d = sum_d (a_d + b_d)`, so the op runs on the local parts and one
/// reduction serves the result (the tied embedding's three gradient contributions need one
/// all-reduce, not three). A convert to a wider float (bf16 -> f32, f32 -> f64) is exact on
/// each part, so the parts are summed in the wider type: one reduction after the convert,
/// and no rounding of the sum to the narrow type that the single device would not do either.
pub(crate) fn linear_in_partial_sums(
    op: &Op,
    ops: &[&PartitionedValue],
    out: &Type,
    t: &Sharding,
) -> Option<Sharding> {
    let linear = match op {
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => true,
        Op::Convert => {
            let from = ops.first()?.global.dtype;
            from.is_float() && out.dtype.is_float() && out.dtype.size_bytes() > from.size_bytes()
        }
        _ => false,
    };
    let first = &ops.first()?.sharding;
    let same = ops.iter().all(|o| {
        o.sharding.dims == t.dims
            && o.sharding.partial == first.partial
            && o.local.ty() == ops[0].local.ty()
    });
    (linear && !first.partial.is_empty() && same).then(|| first.clone())
}

pub fn broadcast(
    ctx: &mut Ctx,
    dims: &[usize],
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let s = Sharding {
        dims: dims.iter().map(|&d| t.dims[d].clone()).collect(),
        partial: vec![],
    };
    let xl = to(ctx, x, &s)?;
    emit_as(
        ctx,
        Op::Broadcast {
            dims: dims.to_vec(),
        },
        &[&xl],
        ty,
        t,
    )
}

pub fn transpose(
    ctx: &mut Ctx,
    perm: &[usize],
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let s = sharding::algebra::untranspose(t, perm);
    let xl = to(ctx, x, &s)?;
    emit_as(
        ctx,
        Op::Transpose {
            perm: perm.to_vec(),
        },
        &[&xl],
        ty,
        t,
    )
}

/// Reverse: an evenly split reversed dim keeps its layout; every device flips its tile and
/// one collective-permute sends it to the mirrored device (tile `i` to tile `k - 1 - i` on
/// every reversed dim at once). An unevenly split reversed dim is gathered first, since its
/// padding would end up in front.
pub fn reverse(
    ctx: &mut Ctx,
    dims: &[usize],
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let mesh = ctx.mesh.clone();
    let mut s = cleared(t, []);
    for &d in dims {
        let k = s.tiles(&mesh, d);
        if k > 1 && !ty.shape[d].is_multiple_of(k) {
            s.dims[d].clear();
        }
    }
    let xl = to(ctx, x, &s)?;
    let mut pv = emit_as(
        ctx,
        Op::Reverse {
            dims: dims.to_vec(),
        },
        &[&xl],
        ty,
        &s,
    )?;
    let moved: Vec<usize> = dims
        .iter()
        .copied()
        .filter(|&d| s.tiles(&mesh, d) > 1)
        .collect();
    if moved.is_empty() {
        return Ok(pv);
    }
    // Ranks over the concatenated axes are mixed-radix numbers, one digit per moved dim.
    let sizes: Vec<usize> = moved.iter().map(|&d| s.tiles(&mesh, d)).collect();
    let axes: Vec<String> = moved.iter().flat_map(|&d| s.dims[d].clone()).collect();
    let pairs = (0..sizes.iter().product())
        .map(|r: usize| {
            let mut rest = r;
            let mut mirrored = 0;
            let mut scale = 1;
            for &n in sizes.iter().rev() {
                mirrored += (n - 1 - rest % n) * scale;
                rest /= n;
                scale *= n;
            }
            (r, mirrored)
        })
        .collect();
    pv.local = ctx.emit(Op::collective_permute(axes, pairs), &[&pv.local], None)?;
    Ok(pv)
}

pub fn reshape(
    ctx: &mut Ctx,
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let (src, dst) = (&x.global.shape, &ty.shape);
    let back = sharding::algebra::reshape(t, dst, src, &ctx.mesh);
    let there = sharding::algebra::reshape(&back, src, dst, &ctx.mesh);
    let (s, out) = if there == *t {
        (back, t.clone())
    } else {
        // The target layout does not survive the reshape: reshape whole, slice after.
        (
            Sharding::replicated(src.len()),
            Sharding::replicated(dst.len()),
        )
    };
    let xl = to(ctx, x, &s)?;
    emit_as(ctx, Op::Reshape, &[&xl], ty, &out)
}

/// Dims whose extent differs between operand and result.
fn changed(a: &[usize], b: &[usize]) -> Vec<usize> {
    (0..a.len()).filter(|&d| a[d] != b[d]).collect()
}

pub fn slicing(
    ctx: &mut Ctx,
    op: &Op,
    ops: &[&PartitionedValue],
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let x = ops[0];
    let ch = match op {
        Op::DynamicUpdateSlice => changed(&x.global.shape, &ops[1].global.shape),
        _ => changed(&x.global.shape, &ty.shape),
    };
    let s = cleared(t, ch.iter().copied());
    let xl = to(ctx, x, &s)?;
    let local = s.shard_shape(&ctx.mesh, &x.global.shape);
    let scalar = Sharding::replicated(0);
    let mut rest = Vec::new();
    for o in &ops[1..] {
        let target = if o.global.rank() == 0 {
            scalar.clone()
        } else {
            s.clone()
        };
        rest.push(to(ctx, o, &target)?);
    }
    let local_op = match op {
        Op::Slice { start, limit } => {
            let (mut st, mut li) = (start.clone(), limit.clone());
            for d in 0..local.len() {
                if !ch.contains(&d) {
                    st[d] = 0;
                    li[d] = local[d];
                }
            }
            Op::Slice {
                start: st,
                limit: li,
            }
        }
        Op::Pad { low, high } => {
            let (mut lo, mut hi) = (low.clone(), high.clone());
            for d in 0..local.len() {
                if !ch.contains(&d) {
                    lo[d] = 0;
                    hi[d] = 0;
                }
            }
            Op::Pad { low: lo, high: hi }
        }
        Op::DynamicSlice { sizes } => {
            let mut sz = sizes.clone();
            for d in 0..local.len() {
                if !ch.contains(&d) {
                    sz[d] = local[d];
                }
            }
            Op::DynamicSlice { sizes: sz }
        }
        other => other.clone(),
    };
    let mut refs: Vec<&ir::Value> = vec![&xl];
    refs.extend(rest.iter());
    emit_as(ctx, local_op, &refs, ty, &s)
}

pub fn concatenate(
    ctx: &mut Ctx,
    dim: usize,
    ops: &[&PartitionedValue],
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let s = cleared(t, [dim]);
    let mut locals = Vec::new();
    for o in ops {
        locals.push(to(ctx, o, &s)?);
    }
    let refs: Vec<&ir::Value> = locals.iter().collect();
    emit_as(ctx, Op::Concatenate { dim }, &refs, ty, &s)
}

/// Ops that need the whole of `dim` on one device: cumsum (same rank) and argmax
/// (`removes` the dim).
pub fn along_dim(
    ctx: &mut Ctx,
    op: &Op,
    dim: usize,
    removes: bool,
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let (s, out) = if removes {
        let mut dims = t.dims.clone();
        dims.insert(dim, Vec::new());
        (
            Sharding {
                dims,
                partial: vec![],
            },
            cleared(t, []),
        )
    } else {
        let s = cleared(t, [dim]);
        (s.clone(), s)
    };
    let xl = to(ctx, x, &s)?;
    emit_as(ctx, op.clone(), &[&xl], ty, &out)
}
