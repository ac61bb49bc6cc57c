//! The native kernel of one instruction that is neither elementwise (fused groups) nor a
//! collective: layout, reductions, gathers, convolutions, random numbers, and the dots no
//! rewrite planned ([`crate::kernels`]).

use crate::kernels::dot::{dot, DotPlan};
use crate::kernels::{conv, index, layout, reduce, scalar_f64};
use crate::tensor::Data;
use ir::{Instr, Op, Program};

/// Run one non-elementwise, non-collective instruction natively.
pub(super) fn kernel(p: &Program, ins: &Instr, args: &[&Data], out: &mut Data) {
    let ty = &ins.ty;
    let shape = |k: usize| &p.instrs[ins.operands[k].index()].ty.shape;
    match &ins.op {
        Op::Constant { value } => layout::constant(value, out),
        Op::Iota { dim } => layout::iota(&ty.shape, *dim, out),
        Op::Broadcast { dims } => layout::broadcast(args[0], shape(0), dims, &ty.shape, out),
        Op::Transpose { perm } => layout::transpose(args[0], shape(0), perm, out),
        Op::Slice { start, .. } => layout::window(args[0], shape(0), start, &ty.shape, out),
        Op::DynamicSlice { sizes } => {
            let start = layout::clamped_starts(shape(0), sizes, &args[1..]);
            layout::window(args[0], shape(0), &start, &ty.shape, out)
        }
        Op::DynamicUpdateSlice => {
            let start = layout::clamped_starts(shape(0), shape(1), &args[2..]);
            layout::dynamic_update_slice(args[0], shape(0), args[1], shape(1), &start, out)
        }
        Op::Pad { low, .. } => layout::pad(args[0], shape(0), args[1], low, &ty.shape, out),
        Op::Concatenate { dim } => {
            let xs: Vec<(&Data, &[usize])> = args
                .iter()
                .enumerate()
                .map(|(k, a)| (*a, shape(k).as_slice()))
                .collect();
            layout::concatenate(&xs, *dim, &ty.shape, out)
        }
        Op::Reduce { op, dims } => reduce::reduce(args[0], shape(0), *op, dims, out),
        Op::DotGeneral(dd) => {
            let plan = DotPlan::new(shape(0), shape(1), dd);
            dot(&plan, shape(0), args[0], shape(1), args[1], out);
        }
        Op::Conv { pad_lo, .. } => {
            conv::conv(args[0], shape(0), args[1], shape(1), pad_lo, &ty.shape, out)
        }
        Op::Reverse { dims } => layout::reverse(args[0], shape(0), dims, out),
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => reduce::cumsum(args[0], shape(0), *dim, *exclusive, *reverse, out),
        Op::Argmax { dim } => reduce::argmax(args[0], shape(0), *dim, out),
        Op::Gather { axis, batch_dims } => index::gather(
            args[0],
            shape(0),
            args[1],
            shape(1),
            index::Axis {
                axis: *axis,
                batch_dims: *batch_dims,
            },
            out,
        ),
        Op::ScatterAdd { axis, batch_dims } => index::scatter_add(
            args[0],
            shape(0),
            args[1],
            shape(1),
            args[2],
            index::Axis {
                axis: *axis,
                batch_dims: *batch_dims,
            },
            out,
        ),
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => {
            let seed = scalar_f64(args[0]) as i32;
            let offsets: Vec<i64> = (0..global_shape.len())
                .map(|d| args.get(d + 1).map_or(0, |o| scalar_f64(o) as i64))
                .collect();
            layout::random(*dist, *stream, global_shape, seed, &offsets, &ty.shape, out)
        }
        Op::Parameter { .. }
        | Op::PartitionId
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::Collective(_) => {
            unreachable!("{} is planned as its own step kind", ins.op.name())
        }
    }
}
