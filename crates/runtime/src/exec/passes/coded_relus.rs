//! Coded ReLUs: `h = max(a, +0)` (f32) whose pre-activation `a` is read otherwise only by
//! compares with zero (the ReLU's derivative, `a > 0` and `a == 0`), after `h`, and whose
//! `h` is read only by dots, is computed coded: `-0` where `a < 0` (`+0` where `a == ±0`,
//! `a` where positive, NaN where NaN); those compares read `a` back from `h` (`-1` where
//! `h` is `-0`, else `h`). An expert's pre-activation, as large as its ReLU, is then
//! neither written nor kept from the forward pass to the backward one.
//!
//! Exactness: every compare with zero gives on the decoded value what it gave on `a`, and
//! a dot sums `-0 * x` as `+0 * x` (a sum that starts at `+0` stays `+0` either way, and
//! any other term decides), so every value but `h`'s zero signs keeps its bits, and no
//! reader of `h` sees those signs.

use crate::exec::lower::{consumers, generator, outputs, values};
use crate::exec::plan::{Kind, Plan};
use crate::kernels::elementwise::{Fused, Node};
use ir::{BinaryOp, DType, Op, Program, ValueId};
use std::collections::HashMap;

/// Code every ReLU that qualifies (see the module doc): its group becomes
/// `ReluCode(a)`, and each group reading `a` reads `ReluDecode(h)` in its place.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let codes = relu_codes(p);
    if codes.is_empty() {
        return;
    }
    let relu_in: HashMap<ValueId, ValueId> = codes.iter().map(|(&a, &h)| (h, a)).collect();
    for s in plan.steps.iter_mut() {
        if let Some(&a) = relu_in.get(&s.value) {
            // The coded ReLU reads `a` alone (its `+0` is the code's).
            let len = p.instrs[s.value.index()].ty.num_elements();
            let f = Fused {
                len,
                nodes: vec![
                    (Node::Input(0), DType::F32),
                    (Node::ReluCode(0), DType::F32),
                ],
                n_inputs: 1,
            };
            let Kind::Fused { .. } = s.kind else {
                unreachable!("a ReLU is fusible and the root of its group (dots read it)")
            };
            s.kind = Kind::Fused {
                f,
                inputs: vec![a],
                inplace_ok: vec![true],
            };
            s.reads = vec![a];
            s.label = format!(
                "fused[1] %{} ({})",
                s.value.0,
                p.instrs[s.value.index()].op.name()
            );
            continue;
        }
        let Kind::Fused { f, inputs, .. } = &mut s.kind else {
            continue;
        };
        for (k, input) in inputs.iter_mut().enumerate() {
            let Some(&h) = codes.get(input) else {
                continue;
            };
            // The input node of `a` becomes `ReluDecode(h)`: `h` in its slot, the decode
            // right after it, and every reference to the old node (or a later one) moved.
            *input = h;
            s.reads[k] = h;
            let at = f
                .nodes
                .iter()
                .position(|(n, _)| *n == Node::Input(k))
                .expect("a group reads each input through one node");
            for (n, _) in f.nodes.iter_mut() {
                shift_operands(n, at);
            }
            f.nodes.insert(at + 1, (Node::ReluDecode(at), DType::F32));
        }
    }
}

/// Move every reference to node `at` or later one node on (a node inserted after `at`).
fn shift_operands(n: &mut Node, at: usize) {
    let shift = |x: &mut usize| {
        if *x >= at {
            *x += 1;
        }
    };
    match n {
        Node::Input(_) | Node::Splat(_) | Node::Iota { .. } | Node::Broadcast { .. } => {}
        Node::Unary(_, x) | Node::Convert(x) | Node::ReluCode(x) | Node::ReluDecode(x) => shift(x),
        Node::Binary(_, x, y) | Node::Compare(_, x, y) => {
            shift(x);
            shift(y);
        }
        Node::Select(c, x, y) => {
            shift(c);
            shift(x);
            shift(y);
        }
    }
}

/// The ReLUs to code (see the module doc): pre-activation `a -> h`.
fn relu_codes(p: &Program) -> HashMap<ValueId, ValueId> {
    let consumers = consumers(p);
    let is_output = outputs(p);
    let zero = |v: ValueId| p.splat_value(v) == Some(0.0);
    let plus_zero = |v: ValueId| {
        p.splat_value(v)
            .is_some_and(|x| x == 0.0 && x.is_sign_positive())
    };
    let mut codes = HashMap::new();
    for a in values(p) {
        let ins = &p.instrs[a.index()];
        // (A generator is inlined where it is read, never a buffer to read back.)
        if ins.ty.dtype != DType::F32 || is_output[a] || generator(&ins.op) {
            continue;
        }
        let (mut relu, mut compares, mut other_use) = (None, 0, false);
        for &c in &consumers[a] {
            let ci = &p.instrs[c.index()];
            let z = match ci.operands.as_slice() {
                [x, y] if *x == a && *y != a => Some(*y),
                [x, y] if *y == a && *x != a => Some(*x),
                _ => None,
            };
            let max = matches!(ci.op, Op::Binary(BinaryOp::Max));
            let compare = matches!(ci.op, Op::Compare(_));
            if max && z.is_some_and(plus_zero) && relu.is_none() {
                relu = Some(c);
            } else if compare && z.is_some_and(zero) {
                compares += 1;
            } else {
                other_use = true;
            }
        }
        let Some(h) = relu else { continue };
        let dots_only = !consumers[h].is_empty()
            && consumers[h]
                .iter()
                .all(|&c| matches!(p.instrs[c.index()].op, Op::DotGeneral(_)));
        let after = consumers[a].iter().all(|&c| c >= h);
        if !other_use && compares > 0 && after && dots_only && !is_output[h] {
            codes.insert(a, h);
        }
    }
    codes
}
