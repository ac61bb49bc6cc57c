//! Steps that return their (first) operand unchanged become aliases of it (no work, no
//! buffer): a collective over groups of one device (every kind but a permute that does
//! not send rank 0 to itself, which yields zeros), data movement that moves nothing (a
//! slice or dynamic slice of the whole array, an identity transpose, a broadcast to the
//! same shape, a zero pad, a concatenation of one operand, a reverse of size-1 dims), and
//! a fused group that computes nothing (a reshape, copy or `x * 1` of a materialised
//! value).
//!
//! Exactness: each of these returns its operand's elements in their order, bit for bit.

use crate::exec::plan::{op_label, Kind, Plan};
use ir::{CollectiveKind, Op, Program, ValueId};

/// Turn every step of the module doc into an alias of its operand.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    for s in plan.steps.iter_mut() {
        let ins = &p.instrs[s.value.index()];
        let src = match &s.kind {
            Kind::Collective { .. } if trivial_collective(p, &ins.op) => ins.operands[0],
            Kind::Kernel if identity_op(p, s.value, &ins.op) => ins.operands[0],
            Kind::Fused { f, inputs, .. }
                if f.nodes.len() == 1
                    && matches!(f.nodes[0].0, crate::kernels::elementwise::Node::Input(_)) =>
            {
                inputs[0]
            }
            _ => continue,
        };
        s.kind = Kind::Alias(src);
        s.reads = vec![src];
        s.cat = "alias";
        s.label = op_label(p, s.value);
    }
}

/// A collective over groups of one device that returns its operand unchanged (every kind
/// but a permute that does not send rank 0 to itself, which yields zeros).
pub(crate) fn trivial_collective(p: &Program, op: &Op) -> bool {
    let k = match (op.collective_axes(), &p.mesh) {
        (Some(axes), Some(mesh)) => mesh.size_of(axes),
        _ => return false,
    };
    let sends_to_itself = if let Some(CollectiveKind::Permute { pairs }) = op.collective_kind() {
        pairs.contains(&(0, 0))
    } else {
        true
    };
    k == 1 && sends_to_itself
}

/// Data movement that returns its (first) operand unchanged: a slice or dynamic slice of
/// the whole array, an identity transpose, a broadcast to the same shape, a zero pad, a
/// concatenation of one operand, a reverse of size-1 dims.
fn identity_op(p: &Program, i: ValueId, op: &Op) -> bool {
    let ins = &p.instrs[i.index()];
    let Some(first) = ins.operands.first() else {
        return false;
    };
    let same_shape = p.ty(*first).shape == ins.ty.shape;
    match op {
        Op::Slice { .. } | Op::DynamicSlice { .. } | Op::Broadcast { .. } => same_shape,
        Op::Transpose { perm } => perm.iter().enumerate().all(|(a, &b)| a == b),
        Op::Pad { low, high } => low.iter().chain(high).all(|&x| x == 0),
        Op::Concatenate { .. } => ins.operands.len() == 1,
        Op::Reverse { dims } => dims.iter().all(|&d| ins.ty.shape[d] <= 1),
        Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Iota { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::DynamicUpdateSlice
        | Op::Reduce { .. }
        | Op::DotGeneral(_)
        | Op::Conv { .. }
        | Op::Cumsum { .. }
        | Op::Argmax { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Rng { .. }
        | Op::PartitionId
        | Op::Collective(_) => false,
    }
}
