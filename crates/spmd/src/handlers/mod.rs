//! Per-op-family partitioning handlers (after XLA's SPMD partitioner). Each handler reshards
//! the operands to what the op needs, emits the local op, and returns the result with the
//! sharding it has (possibly with pending partial sums); the driver then reshards it to the
//! instruction's assigned sharding. One exhaustive `match` over `Op` dispatches.

mod conv;
mod data;
mod dot;
mod gather;
mod reduce;
mod source;

use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use crate::reshard::reshard;
use ir::{Op, Program, Sharding, Type};

/// Partition global instruction `i` given the partitioned values of all earlier ones.
pub fn partition_instr(
    ctx: &mut Ctx,
    p: &Program,
    i: usize,
    vals: &[PartitionedValue],
) -> Result<PartitionedValue, SpmdError> {
    let ins = &p.instrs[i];
    let t = ins.sharding.clone().ok_or_else(|| SpmdError::Unsharded {
        index: i,
        op: ins.op.name().into(),
    })?;
    let ops: Vec<&PartitionedValue> = ins.operands.iter().map(|o| &vals[o.index()]).collect();
    match &ins.op {
        Op::Parameter { name } => source::parameter(ctx, name, &ins.ty, &t),
        Op::Constant { value } => source::constant(ctx, value, &ins.ty, &t),
        Op::Iota { dim } => source::iota(ctx, *dim, &ins.ty, &t),
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => source::rng(ctx, *dist, *stream, global_shape, &ops, &ins.ty, &t),
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert => {
            let partial: Option<Vec<PartitionedValue>> = ins
                .operands
                .iter()
                .map(|o| ctx.partial_sums.get(&o.index()).cloned())
                .collect();
            if let Some(ps) = partial {
                let refs: Vec<&PartitionedValue> = ps.iter().collect();
                if data::linear_in_partial_sums(&ins.op, &refs, &ins.ty, &t).is_some() {
                    return data::elementwise(ctx, &ins.op, &refs, &ins.ty, &t);
                }
            }
            data::elementwise(ctx, &ins.op, &ops, &ins.ty, &t)
        }
        // Identities after autodiff: the operand passes through; the driver's reshard to
        // the assigned sharding is the whole effect of an annotation copy.
        Op::StopGradient | Op::Copy => Ok(ops[0].clone()),
        Op::Broadcast { dims } => data::broadcast(ctx, dims, ops[0], &ins.ty, &t),
        Op::Reshape => data::reshape(ctx, ops[0], &ins.ty, &t),
        Op::Transpose { perm } => data::transpose(ctx, perm, ops[0], &ins.ty, &t),
        Op::Slice { .. } | Op::Pad { .. } | Op::DynamicSlice { .. } | Op::DynamicUpdateSlice => {
            data::slicing(ctx, &ins.op, &ops, &ins.ty, &t)
        }
        Op::Concatenate { dim } => data::concatenate(ctx, *dim, &ops, &ins.ty, &t),
        Op::Cumsum { dim, .. } => data::along_dim(ctx, &ins.op, *dim, false, ops[0], &ins.ty, &t),
        Op::Argmax { dim } => data::along_dim(ctx, &ins.op, *dim, true, ops[0], &ins.ty, &t),
        Op::Reduce { op, dims } => reduce::reduce(ctx, *op, dims, ops[0], &ins.ty, &t),
        Op::DotGeneral(dd) => dot::dot_general(ctx, dd, ops[0], ops[1], &ins.ty, &t),
        Op::Conv { pad_lo, pad_hi } => conv::conv(ctx, pad_lo, pad_hi, ops[0], ops[1], &ins.ty, &t),
        Op::Reverse { dims } => data::reverse(ctx, dims, ops[0], &ins.ty, &t),
        Op::Gather { axis, batch_dims } => {
            gather::gather(ctx, *axis, *batch_dims, ops[0], ops[1], &ins.ty, &t)
        }
        Op::ScatterAdd { axis, batch_dims } => {
            let operands = [ops[0], ops[1], ops[2]];
            gather::scatter_add(ctx, *axis, *batch_dims, operands, &ins.ty, &t)
        }
        Op::PartitionId | Op::Collective(_) => Err(SpmdError::AlreadyPartitioned {
            index: i,
            op: ins.op.name().into(),
        }),
    }
}

/// Emit `op` on local operands; its result is the shard of `global` under `s`.
pub(crate) fn emit_as(
    ctx: &mut Ctx,
    op: Op,
    operands: &[&ir::Value],
    global: &Type,
    s: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let local = global.with_shape(s.shard_shape(&ctx.mesh, &global.shape));
    let v = ctx.emit(op, operands, Some(local))?;
    Ok(PartitionedValue {
        local: v,
        global: global.clone(),
        sharding: s.clone(),
    })
}

/// Reshard a non-partial target and return the local value.
pub(crate) fn to(
    ctx: &mut Ctx,
    pv: &PartitionedValue,
    s: &Sharding,
) -> Result<ir::Value, SpmdError> {
    Ok(reshard(ctx, pv, s)?.local)
}

/// `s` with the axes of `dims` removed (those dims unsplit).
pub(crate) fn cleared(s: &Sharding, dims: impl IntoIterator<Item = usize>) -> Sharding {
    let mut s = Sharding {
        dims: s.dims.clone(),
        partial: Vec::new(),
    };
    for d in dims {
        s.dims[d].clear();
    }
    s
}
