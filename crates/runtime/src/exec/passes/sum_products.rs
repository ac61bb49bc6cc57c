//! Sums of products: an f32 sum over every dim of an f32 group `a * b` (two inputs of its
//! shape, no other node) that nothing else reads becomes one [`Kind::SumProduct`] step
//! that multiplies and adds in one pass (a layer's loss `sum(y * dy)`); the product is
//! never written.
//!
//! Exactness: the sum is the reduction's (f64, in element order, from `+0`, rounded once)
//! over the group's f32 products, so the value is the same.

use super::f32_value;
use crate::exec::ids::{IdVec, StepId};
use crate::exec::plan::{is_output, Kind, Plan};
use crate::kernels::elementwise::Node;
use ir::{BinaryOp, DType, Op, Program, ReduceOp, ValueId};

/// Merge each qualifying sum with the product group it reads.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let (producer, readers) = plan.producers_and_readers();
    let mut dropped: IdVec<StepId, bool> = IdVec::filled(false, plan.steps.len());
    let steps = &mut plan.steps;
    for r in steps.ids() {
        let ins = &p.instrs[steps[r].value.index()];
        let (
            Kind::Kernel,
            Op::Reduce {
                op: ReduceOp::Sum,
                dims,
            },
        ) = (&steps[r].kind, &ins.op)
        else {
            continue;
        };
        let [v] = steps[r].reads[..] else {
            continue;
        };
        let rank = p.instrs[v.index()].ty.shape.len();
        if !f32_value(p, v)
            || !f32_value(p, steps[r].value)
            || dims.len() != rank
            || is_output(p, v)
        {
            continue;
        }
        let Some(j) = producer[v] else {
            continue;
        };
        if readers[v] != [r] || steps[j].also.is_some() {
            continue;
        }
        let Kind::Fused { f, inputs, .. } = &steps[j].kind else {
            continue;
        };
        let product = matches!(
            f.nodes.as_slice(),
            [
                (Node::Input(0), DType::F32),
                (Node::Input(1), DType::F32),
                (Node::Binary(BinaryOp::Mul, 0, 1), DType::F32),
            ]
        );
        let same = |u: ValueId| {
            f32_value(p, u) && p.instrs[u.index()].ty.shape == p.instrs[v.index()].ty.shape
        };
        if !product || inputs.len() != 2 || !inputs.iter().all(|&u| same(u)) {
            continue;
        }
        let (a, b) = (inputs[0], inputs[1]);
        dropped[j] = true;
        let s = &mut steps[r];
        s.kind = Kind::SumProduct;
        s.reads = vec![a, b];
        s.label = format!("{} +product %{}", s.label, v.0);
    }
    plan.remove_marked(&dropped);
}
