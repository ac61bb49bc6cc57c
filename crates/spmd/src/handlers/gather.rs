//! Gather and scatter-add along an axis ("take along axis" with batch dims).
//!
//! Gather: the operand's gathered axis is either made whole (all-gather), or, when it is
//! split and keeping it is cheaper, each device gathers from its own rows with shifted
//! indices (out-of-range rows give zeros) and the result is a pending partial sum.
//! Scatter-add: a split scatter axis takes shifted indices (out-of-range updates drop);
//! updates split on their index dims make each device add its part, a partial sum (the
//! base is added on one member only).

use super::{emit_as, to};
use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use crate::reshard::cost;
use ir::{BinaryOp, CompareOp, DType, Literal, Op, Sharding, Type};

fn free_axes(axes: &[String], used: &[String]) -> Vec<String> {
    axes.iter().filter(|a| !used.contains(a)).cloned().collect()
}

/// Broadcast an i32 scalar to `shape`.
fn splat_i32(ctx: &mut Ctx, v: &ir::Value, shape: &[usize]) -> Result<ir::Value, SpmdError> {
    ctx.emit(
        Op::Broadcast { dims: vec![] },
        &[v],
        Some(Type::new(DType::I32, shape.to_vec())),
    )
}

pub fn gather(
    ctx: &mut Ctx,
    axis: usize,
    b: usize,
    x: &PartitionedValue,
    idx: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let xr = x.global.rank();
    let nidx = idx.global.rank() - b;
    let used = t.split_axes();
    let mut xs = Sharding::replicated(xr);
    for d in 0..axis {
        xs.dims[d] = t.dims[d].clone();
    }
    for d in axis + 1..xr {
        xs.dims[d] = t.dims[d - 1 + nidx].clone();
    }
    let mut is = Sharding::replicated(idx.global.rank());
    for d in 0..idx.global.rank() {
        is.dims[d] = if d < b {
            t.dims[d].clone()
        } else {
            t.dims[axis + d - b].clone()
        };
    }
    // Keep the operand split on the gathered axis if that is cheaper than gathering it.
    let a = free_axes(&x.sharding.dims[axis], &used);
    let mesh = ctx.mesh.clone();
    let mut xs_split = xs.clone();
    xs_split.dims[axis] = a.clone();
    let out_local_bytes =
        t.shard_shape(&mesh, &ty.shape).iter().product::<usize>() * ty.dtype.size_bytes();
    let k = mesh.size_of(&a) as f64;
    // The split form sums the members' results, which bools cannot do.
    let keep_split = !a.is_empty()
        && ty.dtype != DType::Bool
        && cost(&x.global, &x.sharding, &xs_split, &mesh)
            + 2.0 * out_local_bytes as f64 * (k - 1.0) / k
            < cost(&x.global, &x.sharding, &xs, &mesh);
    if !keep_split {
        let xl = to(ctx, x, &xs)?;
        let il = to(ctx, idx, &is)?;
        return emit_as(
            ctx,
            Op::Gather {
                axis,
                batch_dims: b,
            },
            &[&xl, &il],
            ty,
            t,
        );
    }
    let xl = to(ctx, x, &xs_split)?;
    let il = to(ctx, idx, &is)?;
    let n = x.global.shape[axis];
    let s = xl.ty().shape[axis];
    let ishape = il.ty().shape;
    let off = ctx.offset(&a, s)?;
    let off = splat_i32(ctx, &off, &ishape)?;
    let zero = ctx.emit(
        Op::Constant {
            value: Literal::Splat(0.0),
        },
        &[],
        Some(Type::new(DType::I32, ishape.clone())),
    )?;
    let lim = ctx.emit(
        Op::Constant {
            value: Literal::Splat(n as f64),
        },
        &[],
        Some(Type::new(DType::I32, ishape.clone())),
    )?;
    let minus1 = ctx.emit(
        Op::Constant {
            value: Literal::Splat(-1.0),
        },
        &[],
        Some(Type::new(DType::I32, ishape.clone())),
    )?;
    let ge = ctx.emit(Op::Compare(CompareOp::Ge), &[&il, &zero], None)?;
    let lt = ctx.emit(Op::Compare(CompareOp::Lt), &[&il, &lim], None)?;
    let ok = ctx.bin(BinaryOp::And, &ge, &lt)?;
    let shifted = ctx.bin(BinaryOp::Sub, &il, &off)?;
    let li = ctx.emit(Op::Select, &[&ok, &shifted, &minus1], None)?;
    let pv = emit_as(
        ctx,
        Op::Gather {
            axis,
            batch_dims: b,
        },
        &[&xl, &li],
        ty,
        t,
    )?;
    Ok(PartitionedValue {
        sharding: Sharding {
            partial: a,
            ..pv.sharding.clone()
        },
        ..pv
    })
}

/// Partition `scatter_add(base, idx, upd)` along `axis`, the first `b` dims of `idx` being
/// batch dims.
pub fn scatter_add(
    ctx: &mut Ctx,
    axis: usize,
    b: usize,
    [base, idx, upd]: [&PartitionedValue; 3],
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let rank = ty.rank();
    let ir_ = idx.global.rank();
    let nidx = ir_ - b;
    let used = t.split_axes();
    // Updates keep their own split on the index dims where the axes are free: each device
    // then scatters its part and the result is a partial sum over those axes.
    let mut us = Sharding::replicated(upd.global.rank());
    let mut is = Sharding::replicated(ir_);
    let mut p_axes: Vec<String> = Vec::new();
    for d in 0..upd.global.rank() {
        us.dims[d] = if d < axis {
            t.dims[d].clone()
        } else if d < axis + nidx {
            let ax = free_axes(&upd.sharding.dims[d], &used);
            let ax = free_axes(&ax, &p_axes);
            p_axes.extend(ax.iter().cloned());
            ax
        } else {
            t.dims[d + 1 - nidx].clone()
        };
    }
    for d in 0..ir_ {
        is.dims[d] = if d < b {
            t.dims[d].clone()
        } else {
            us.dims[axis + d - b].clone()
        };
    }
    let bs = Sharding {
        dims: t.dims.clone(),
        partial: vec![],
    };
    let mut bl = to(ctx, base, &bs)?;
    let mut il = to(ctx, idx, &is)?;
    let mut ul = to(ctx, upd, &us)?;
    // Padded updates of an unevenly split index dim must add nothing.
    for d in axis..axis + nidx {
        if !us.dims[d].is_empty() {
            ul = ctx.mask_padding(&ul, d, &us.dims[d], upd.global.shape[d], 0.0)?;
        }
    }
    if !t.dims[axis].is_empty() {
        let s = bl.ty().shape[axis];
        let off = ctx.offset(&t.dims[axis], s)?;
        let off = splat_i32(ctx, &off, &il.ty().shape)?;
        il = ctx.bin(BinaryOp::Sub, &il, &off)?;
    }
    if !p_axes.is_empty() {
        let r = ctx.rank(&p_axes)?;
        let zero = ctx.i32(0);
        let first = ctx.emit(Op::Compare(CompareOp::Eq), &[&r, &zero], None)?;
        let bty = bl.ty();
        let pred = ctx.emit(
            Op::Broadcast { dims: vec![] },
            &[&first],
            Some(bty.with_dtype(DType::Bool)),
        )?;
        let zeros = ctx.emit(
            Op::Constant {
                value: Literal::Splat(0.0),
            },
            &[],
            Some(bty),
        )?;
        bl = ctx.emit(Op::Select, &[&pred, &bl, &zeros], None)?;
    }
    let _ = rank;
    let pv = emit_as(
        ctx,
        Op::ScatterAdd {
            axis,
            batch_dims: b,
        },
        &[&bl, &il, &ul],
        ty,
        &bs,
    )?;
    Ok(PartitionedValue {
        sharding: Sharding {
            partial: p_axes,
            ..bs
        },
        ..pv
    })
}
