//! Reductions: reduce locally (padding masked with the identity), then a sum over split
//! reduced dims stays a pending partial sum for the driver's reshard (so it can become a
//! reduce-scatter), while max/min all-reduce at once.

use super::{emit_as, to};
use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use ir::{Op, ReduceOp, Sharding, Type};

pub fn reduce(
    ctx: &mut Ctx,
    op: ReduceOp,
    dims: &[usize],
    x: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let rank = x.global.rank();
    let used = t.split_axes();
    let mut kept = t.dims.iter();
    let s = Sharding {
        dims: (0..rank)
            .map(|d| {
                if dims.contains(&d) {
                    x.sharding.dims[d]
                        .iter()
                        .filter(|a| !used.contains(a))
                        .cloned()
                        .collect()
                } else {
                    kept.next().cloned().unwrap_or_default()
                }
            })
            .collect(),
        partial: vec![],
    };
    let mut xl = to(ctx, x, &s)?;
    let mut red_axes = Vec::new();
    for &d in dims {
        if !s.dims[d].is_empty() {
            xl = ctx.mask_padding(&xl, d, &s.dims[d], x.global.shape[d], op.identity())?;
            red_axes.extend(s.dims[d].iter().cloned());
        }
    }
    let out = Sharding {
        dims: t.dims.clone(),
        partial: vec![],
    };
    let pv = emit_as(
        ctx,
        Op::Reduce {
            op,
            dims: dims.to_vec(),
        },
        &[&xl],
        ty,
        &out,
    )?;
    if red_axes.is_empty() {
        return Ok(pv);
    }
    match op {
        ReduceOp::Sum => Ok(PartitionedValue {
            sharding: Sharding {
                partial: red_axes,
                ..out
            },
            ..pv
        }),
        ReduceOp::Max | ReduceOp::Min => {
            let v = ctx.emit(Op::all_reduce(op, red_axes), &[&pv.local], None)?;
            Ok(PartitionedValue { local: v, ..pv })
        }
    }
}
