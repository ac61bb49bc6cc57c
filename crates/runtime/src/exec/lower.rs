//! Lowering: a program to a [`Plan`] of one step per live instruction, with the
//! elementwise chains fused ([`Passes::All`]), or every instruction a step of the reference
//! interpreter ([`Passes::None`]).
//!
//! *Fusion*: chains of elementwise ops (unary, binary, compare, select, convert) plus the
//! identities `reshape`/`copy`/`stop_gradient` become one [`Fused`] group evaluated in one
//! pass over L1-sized chunks. A producer joins its consumer's group when it is fusible, is
//! not a program output and that consumer is its only user; splat constants, iotas and
//! broadcasts feeding a group are inlined as generated leaves (re-evaluated per use rather
//! than materialised). Only group roots are written to memory. `x * 1` is `x` exactly (the
//! autodiff seeds gradients with ones). Dots get their [`DotPlan`] (normalised once);
//! every other instruction is a [`Kind::Kernel`]. The rewrites of [`super::passes`] start
//! from this plan.

use super::ids::IdVec;
use super::plan::{is_output, op_label, Kind, Plan, Step};
use super::Passes;
use crate::kernels::dot::{DotPlan, Tables};
use crate::kernels::elementwise::{collapse_broadcast, Fused, Node};
use crate::kernels::strides;
use ir::{BinaryOp, DType, Literal, Op, Program, ValueId};
use std::collections::HashMap;

/// Most nodes of one fused group (an upper bound counted over its ops and their operands):
/// each node takes a scratch lane of [`CHUNK`](crate::kernels::elementwise::CHUNK) elements
/// per thread, so a chain of elementwise ops as long as the program is cut into groups of
/// at most this many (each group's root is materialised and read by the next; the same
/// values to the bit).
const MAX_GROUP_NODES: usize = 1024;

/// The plan of `p` before any rewrite: fused ([`Passes::All`]) or for the reference
/// interpreter ([`Passes::None`]); its dots' offset tables as `tables` says.
pub(crate) fn lower(p: &Program, passes: Passes, tables: Tables) -> Plan {
    match passes {
        Passes::All => lower_fused(p, tables),
        Passes::None => lower_oracle(p),
    }
}

/// The users of every value, each listed once (in program order).
pub(crate) fn consumers(p: &Program) -> IdVec<ValueId, Vec<ValueId>> {
    let mut consumers: IdVec<ValueId, Vec<ValueId>> = IdVec::filled(Vec::new(), p.instrs.len());
    for (i, ins) in p.instrs.iter().enumerate() {
        let i = ValueId(i as u32);
        for &o in &ins.operands {
            if consumers[o].last() != Some(&i) {
                consumers[o].push(i);
            }
        }
    }
    consumers
}

/// Whether each value is a program output.
pub(crate) fn outputs(p: &Program) -> IdVec<ValueId, bool> {
    let mut is_output = IdVec::filled(false, p.instrs.len());
    for &(_, v) in &p.outputs {
        is_output[v] = true;
    }
    is_output
}

/// The values of `p` in order.
pub(crate) fn values(p: &Program) -> impl Iterator<Item = ValueId> {
    (0..p.instrs.len() as u32).map(ValueId)
}

/// Every live instruction one step, computed by the reference interpreter: parameters and
/// partition ids as in the native plan, collectives between segments.
fn lower_oracle(p: &Program) -> Plan {
    let consumers = consumers(p);
    let mut plan = Plan::new(p.instrs.len());
    for i in values(p) {
        let ins = &p.instrs[i.index()];
        if consumers[i].is_empty() && !is_output(p, i) && !matches!(ins.op, Op::Parameter { .. }) {
            continue;
        }
        let label = op_label(p, i);
        let step = match &ins.op {
            Op::Parameter { name } => {
                Step::new(i, Kind::Param(name.clone()), vec![], "param", label)
            }
            Op::PartitionId => Step::new(i, Kind::PartitionId, vec![], "kernel", label),
            Op::Collective(_) => Step::new(
                i,
                Kind::OracleCollective,
                ins.operands.clone(),
                "collective",
                label,
            ),
            Op::Constant { .. }
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert
            | Op::StopGradient
            | Op::Copy
            | Op::Reshape
            | Op::Broadcast { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Reduce { .. }
            | Op::DotGeneral(_)
            | Op::Conv { .. }
            | Op::Reverse { .. }
            | Op::Cumsum { .. }
            | Op::Argmax { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Rng { .. } => Step::new(i, Kind::Oracle, ins.operands.clone(), "kernel", label),
        };
        plan.steps.push(step);
    }
    plan
}

/// Fusion groups, generated leaves, dot plans; every other live instruction one step.
fn lower_fused(p: &Program, tables: Tables) -> Plan {
    let n = p.instrs.len();
    let is_output = outputs(p);
    let consumers = consumers(p);
    let absorbed = absorbed(p, &consumers, &is_output);
    let numel = |i: ValueId| p.instrs[i.index()].ty.num_elements();
    let fusible_at = |i: ValueId| fusible(&p.instrs[i.index()].op);
    // Generators are materialised only if something outside a group needs them.
    let gen_materialise = |i: ValueId| {
        is_output[i]
            || consumers[i]
                .iter()
                .any(|&c| !fusible_at(c) || numel(c) != numel(i))
    };
    let mut plan = Plan::new(n);
    for i in values(p) {
        let ins = &p.instrs[i.index()];
        let dead = consumers[i].is_empty() && !is_output[i];
        if dead && !matches!(ins.op, Op::Parameter { .. }) {
            continue;
        }
        let label = op_label(p, i);
        let operands = ins.operands.clone();
        let step = match &ins.op {
            Op::Parameter { name } => {
                Step::new(i, Kind::Param(name.clone()), vec![], "param", label)
            }
            Op::PartitionId => Step::new(i, Kind::PartitionId, vec![], "kernel", label),
            op if op.is_collective() => Step::new(
                i,
                Kind::Collective { out_perm: None },
                operands,
                "collective",
                label,
            ),
            op if fusible(op) => {
                if absorbed[i] {
                    continue;
                }
                group(p, &absorbed, i)
            }
            op if generator(op) && !gen_materialise(i) => continue,
            Op::DotGeneral(dd) => {
                let plan = DotPlan::with_tables(
                    &p.ty(ins.operands[0]).shape,
                    &p.ty(ins.operands[1]).shape,
                    dd,
                    tables,
                );
                Step::new(i, Kind::Dot(Box::new(plan)), operands, "dot", label)
            }
            Op::Constant { .. }
            | Op::Iota { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert
            | Op::StopGradient
            | Op::Copy
            | Op::Reshape
            | Op::Broadcast { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Reduce { .. }
            | Op::Conv { .. }
            | Op::Reverse { .. }
            | Op::Cumsum { .. }
            | Op::Argmax { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Rng { .. }
            | Op::Collective(_) => Step::new(i, Kind::Kernel, operands, "kernel", label),
        };
        plan.steps.push(step);
    }
    plan
}

/// `absorbed[i]`: fusible value `i` is computed inside its only consumer's group (it is not
/// an output, and that consumer is fusible and of its size). A group's operand is
/// materialised instead when the group would otherwise pass [`MAX_GROUP_NODES`] (the
/// largest absorbed operands first).
fn absorbed(
    p: &Program,
    consumers: &IdVec<ValueId, Vec<ValueId>>,
    is_output: &IdVec<ValueId, bool>,
) -> IdVec<ValueId, bool> {
    let n = p.instrs.len();
    let numel = |i: ValueId| p.instrs[i.index()].ty.num_elements();
    let mut absorbed: IdVec<ValueId, bool> = IdVec::filled(false, n);
    // `size[i]`: at most how many nodes the group of `i`'s absorbed operands and `i`
    // has, kept under MAX_GROUP_NODES by materialising the largest absorbed operands.
    let mut size: IdVec<ValueId, usize> = IdVec::filled(1, n);
    for i in values(p) {
        let ins = &p.instrs[i.index()];
        if !fusible(&ins.op) {
            continue;
        }
        let mut parts: Vec<ValueId> = ins.operands.clone();
        parts.sort_unstable();
        parts.dedup();
        parts.retain(|&o| absorbed[o]);
        let mut total = 1 + ins.operands.len() + parts.iter().map(|&o| size[o]).sum::<usize>();
        while total > MAX_GROUP_NODES {
            let Some(k) = (0..parts.len()).max_by_key(|&k| (size[parts[k]], parts[k])) else {
                break;
            };
            let o = parts.swap_remove(k);
            absorbed[o] = false;
            total -= size[o];
        }
        size[i] = total;
        if !is_output[i] && consumers[i].len() == 1 {
            let c = consumers[i][0];
            absorbed[i] = fusible(&p.instrs[c.index()].op) && numel(c) == numel(i);
        }
    }
    absorbed
}

/// The step of the fused group rooted at `i`.
fn group(p: &Program, absorbed: &IdVec<ValueId, bool>, i: ValueId) -> Step {
    let ins = &p.instrs[i.index()];
    let mut g = GroupBuilder {
        p,
        absorbed,
        nodes: Vec::new(),
        inputs: Vec::new(),
        memo: HashMap::new(),
        broadcast_inputs: Vec::new(),
    };
    let root = g.node(i, true);
    if root + 1 != g.nodes.len() {
        g.push(Node::Convert(root), ins.ty.dtype);
    }
    // In program order (the memo is a hash map): one name per group in every run, so
    // profiles of several runs line up.
    let mut members: Vec<ValueId> = g
        .memo
        .keys()
        .copied()
        .filter(|&v| v == i || absorbed[v])
        .collect();
    members.sort_unstable();
    let ops: Vec<&str> = members
        .iter()
        .map(|&v| p.instrs[v.index()].op.name())
        .collect();
    let label = format!("fused[{}] %{} ({})", ops.len(), i.0, ops.join(","));
    let inplace_ok = (0..g.inputs.len())
        .map(|k| !g.broadcast_inputs.contains(&k))
        .collect();
    let f = Fused {
        len: ins.ty.num_elements(),
        nodes: g.nodes,
        n_inputs: g.inputs.len(),
    };
    let kind = Kind::Fused {
        f,
        inputs: g.inputs.clone(),
        inplace_ok,
    };
    Step::new(i, kind, g.inputs, "fused", label)
}

/// Whether `op` can join a fused group: every elementwise op ([`Op::class`]), and reshapes
/// (an identity on a contiguous buffer).
pub(crate) fn fusible(op: &Op) -> bool {
    op.is_elementwise() || matches!(op, Op::Reshape)
}

/// Leaves inlined into groups instead of being read from memory.
pub(crate) fn generator(op: &Op) -> bool {
    match op {
        Op::Constant { value } => matches!(value, Literal::Splat(_)),
        Op::Iota { .. } | Op::Broadcast { .. } => true,
        Op::Parameter { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice
        | Op::Pad { .. }
        | Op::Concatenate { .. }
        | Op::Reduce { .. }
        | Op::DotGeneral(_)
        | Op::Conv { .. }
        | Op::Reverse { .. }
        | Op::Cumsum { .. }
        | Op::Argmax { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Rng { .. }
        | Op::PartitionId
        | Op::Collective(_) => false,
    }
}

/// Builds one fused group rooted at a value.
struct GroupBuilder<'a> {
    p: &'a Program,
    absorbed: &'a IdVec<ValueId, bool>,
    nodes: Vec<(Node, DType)>,
    inputs: Vec<ValueId>,
    memo: HashMap<ValueId, usize>,
    broadcast_inputs: Vec<usize>,
}

impl GroupBuilder<'_> {
    fn input(&mut self, v: ValueId) -> usize {
        match self.inputs.iter().position(|&x| x == v) {
            Some(k) => k,
            None => {
                self.inputs.push(v);
                self.inputs.len() - 1
            }
        }
    }

    fn push(&mut self, n: Node, dt: DType) -> usize {
        self.nodes.push((n, dt));
        self.nodes.len() - 1
    }

    /// The node computing value `v`; `inline` says whether `v` is computed inside the group.
    /// Operands come before their users, left to right (a post-order walk), each value
    /// once; the walk keeps its own stack, as a group's chain may be as long as the program.
    fn node(&mut self, v: ValueId, inline: bool) -> usize {
        /// A value being built: the operand values it reads as nodes, and their nodes.
        struct Frame {
            v: ValueId,
            inline: bool,
            parts: Vec<ValueId>,
            done: Vec<usize>,
        }
        if let Some(&n) = self.memo.get(&v) {
            return n;
        }
        let frame = |this: &Self, v: ValueId, inline: bool| Frame {
            v,
            inline,
            parts: this.parts(v, inline),
            done: Vec::new(),
        };
        let mut stack = vec![frame(self, v, inline)];
        while let Some(top) = stack.last_mut() {
            if let Some(&o) = top.parts.get(top.done.len()) {
                match self.memo.get(&o) {
                    Some(&n) => top.done.push(n),
                    None => {
                        let inl = self.absorbed[o] || generator(&self.p.instrs[o.index()].op);
                        stack.push(frame(self, o, inl));
                    }
                }
                continue;
            }
            let Frame {
                v, inline, done, ..
            } = stack.pop().expect("the loop saw a frame");
            let n = self.finish(v, inline, &done);
            self.memo.insert(v, n);
            match stack.last_mut() {
                Some(parent) => parent.done.push(n),
                None => return n,
            }
        }
        unreachable!("the walk returns when it finishes its first frame")
    }

    /// The operand values whose nodes [`GroupBuilder::finish`] needs for `v`, in order.
    fn parts(&self, v: ValueId, inline: bool) -> Vec<ValueId> {
        if !inline {
            return vec![];
        }
        let ins = &self.p.instrs[v.index()];
        let ops = |k: usize| ins.operands[k];
        match &ins.op {
            Op::Unary(_) | Op::Convert | Op::StopGradient | Op::Copy | Op::Reshape => vec![ops(0)],
            // `x * 1` is `x` exactly (the autodiff seeds gradients with ones).
            Op::Binary(BinaryOp::Mul) if self.p.splat_value(ins.operands[1]) == Some(1.0) => {
                vec![ops(0)]
            }
            Op::Binary(BinaryOp::Mul) if self.p.splat_value(ins.operands[0]) == Some(1.0) => {
                vec![ops(1)]
            }
            Op::Binary(_) | Op::Compare(_) => vec![ops(0), ops(1)],
            Op::Select => vec![ops(0), ops(1), ops(2)],
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Iota { .. }
            | Op::Broadcast { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Reduce { .. }
            | Op::DotGeneral(_)
            | Op::Conv { .. }
            | Op::Reverse { .. }
            | Op::Cumsum { .. }
            | Op::Argmax { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Rng { .. }
            | Op::PartitionId
            | Op::Collective(_) => vec![],
        }
    }

    /// The node of `v` given the nodes `kids` of its [`GroupBuilder::parts`].
    fn finish(&mut self, v: ValueId, inline: bool, kids: &[usize]) -> usize {
        let p = self.p;
        let ins = &p.instrs[v.index()];
        let dt = ins.ty.dtype;
        if !inline {
            let k = self.input(v);
            return self.push(Node::Input(k), dt);
        }
        match &ins.op {
            Op::Unary(u) => self.push(Node::Unary(*u, kids[0]), dt),
            Op::Binary(BinaryOp::Mul)
                if p.splat_value(ins.operands[1]) == Some(1.0)
                    || p.splat_value(ins.operands[0]) == Some(1.0) =>
            {
                kids[0]
            }
            Op::Binary(b) => self.push(Node::Binary(*b, kids[0], kids[1]), dt),
            Op::Compare(c) => self.push(Node::Compare(*c, kids[0], kids[1]), dt),
            Op::Select => self.push(Node::Select(kids[0], kids[1], kids[2]), dt),
            Op::Convert => self.push(Node::Convert(kids[0]), dt),
            Op::StopGradient | Op::Copy | Op::Reshape => kids[0],
            Op::Constant {
                value: Literal::Splat(x),
            } => self.push(Node::Splat(*x), dt),
            Op::Iota { dim } => {
                let st = strides(&ins.ty.shape);
                self.push(
                    Node::Iota {
                        stride: st[*dim],
                        size: ins.ty.shape[*dim],
                    },
                    dt,
                )
            }
            Op::Broadcast { dims } => {
                let src = ins.operands[0];
                let ist = strides(&p.instrs[src.index()].ty.shape);
                let mut st = vec![0usize; ins.ty.rank()];
                for (k, &d) in dims.iter().enumerate() {
                    st[d] = ist[k];
                }
                let (shape, st) = collapse_broadcast(&ins.ty.shape, &st);
                let input = self.input(src);
                self.broadcast_inputs.push(input);
                self.push(Node::Broadcast { input, shape, st }, dt)
            }
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Reduce { .. }
            | Op::DotGeneral(_)
            | Op::Conv { .. }
            | Op::Reverse { .. }
            | Op::Cumsum { .. }
            | Op::Argmax { .. }
            | Op::Gather { .. }
            | Op::ScatterAdd { .. }
            | Op::Rng { .. }
            | Op::PartitionId
            | Op::Collective(_) => {
                let k = self.input(v);
                self.push(Node::Input(k), dt)
            }
        }
    }
}
