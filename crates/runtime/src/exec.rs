//! The device executor: runs one per-device program on every mesh position this process
//! owns, bulk-synchronously, with native kernels ([`crate::kernels`]).
//!
//! **Preparation** ([`Executable::new`], once per program):
//! - *Fusion*: chains of elementwise ops (unary, binary, compare, select, convert) plus the
//!   identities `reshape`/`copy`/`stop_gradient` become one [`Fused`] group evaluated in one
//!   pass over L1-sized chunks. A producer joins its consumer's group when it is fusible, is
//!   not a program output and that consumer is its only user; splat constants, iotas and
//!   broadcasts feeding a group are inlined as generated leaves (re-evaluated per use rather
//!   than materialised). Only group roots are written to memory.
//! - *Aliases*: a `reshape`/`copy`/`stop_gradient` of a materialised value shares its buffer;
//!   a transpose that is an all-to-all's only reader takes the all-to-all's buffer over,
//!   the all-to-all having written its layout (`Communicator::collective_transposed`).
//! - *Dots* are normalised once ([`DotPlan`]); a transpose that is a dot's only user
//!   (directly or through collectives over groups of one) is written by the dot, and so is
//!   one whose operand is an all-reduce of the dot, which then sums the transposed layout.
//!   A dot whose result is a program output that no step reads streams it to memory
//!   ([`DotPlan::stream_output`]). A multiply by a splat one is its other operand.
//! - *Dot epilogues*: an f32 dot and an f32 group that reads it elementwise become one step
//!   (`Kind::DotFused`): each batch entry (an expert) goes through the group right after
//!   its GEMM, while in cache. It takes the dot's place when the group's other inputs exist
//!   by then, so the peak never grows.
//! - *Coded ReLUs*: `h = max(a, 0)` whose pre-activation `a` is otherwise read only by
//!   compares with zero (its derivative) and whose `h` only by dots is computed with `-0`
//!   where `a < 0`; the compares read `a` back from `h` (`-1` where `h` is `-0`), so `a` is
//!   never kept from the forward pass to the backward one (an expert's pre-activation, as
//!   large as its ReLU). Dots sum `-0` terms as `+0` ones: every other value is unchanged.
//! - *Masked dots*: an f32 dot whose every use is a one-multiply group `dot * mask` summed
//!   by reductions (`Kind::MaskedDot`) is computed only where a mask is non-zero, when a
//!   run-time check shows that exact ([`DotCall::run_masked`]); otherwise as a plain dot. When each
//!   masked product is read only by one sum over the product's column dims, the step
//!   computes those sums itself (`Kind::MaskedDotSums`, [`DotCall::run_masked_sums`]): no product,
//!   multiply or reduce pass over memory.
//! - *Sums of products*: an f32 sum over every dim of a group `a * b` that nothing else
//!   reads (a layer's loss `sum(y * dy)`) is one pass (`Kind::SumProduct`): the same f32
//!   products added in the same f64 order, the product never written.
//! - *Shared supports*: a group `convert(x != 0)` has the non-zeros of `x`; both get one
//!   key (`same_supports`). At run time the first sparse product that reads a buffer
//!   with a key finds its support (one pass, over `x` itself while it is live, keeping its
//!   values), and every later product with that key lists its terms from it
//!   ([`kernels::dot::Support`]): the MoE layer's mask and combine weights are scanned once
//!   for the dispatch, the combine and both their gradients. The masks of summed masked
//!   dots get theirs as soon as they are computed, while in cache, and the masked dot
//!   walks it in the backward pass instead of scanning the cold masks. Such a mask whose
//!   other readers are done (the gating masks after the combine weights' group) is
//!   released then, when its support was found: the sums read the support alone
//!   ([`Executable::sparse_releases`]), and the buffer is not held to the backward pass.
//!   Likewise an f32 value whose later readers are plain dots, once a sparse product found
//!   its support (the combine weights): those dots take it by its support alone
//!   ([`DotCall::run`]), rebuilding it where their path reads it densely.
//! - *Indicator reads*: a group `convert(x != 0)` read only by plain dots is not computed;
//!   the dots read `x` as an indicator ([`indicator_dots`], `DotPlan::read_indicator`):
//!   their sparse walk over that side takes `x`'s non-zeros (its shared support) with the
//!   value 1, and any other path multiplies a 0/1 copy. The MoE dispatch mask is neither
//!   written nor kept alive from the forward pass to the backward.
//! - *Liveness*: each buffer (a value and its aliases) is released after the last step
//!   that reads it; outputs are kept.
//! - *Rounds*: small collectives (scalar losses, norms) wait to run in the round of the
//!   next collective, one barrier for all ([`coalesce_collectives`]).
//! - *Segments*: maximal runs of non-collective steps. Each collective is a segment alone.
//!
//! **Running** ([`Executable::run`]): for each local segment, every device runs the whole
//! segment as one task on the one rayon pool (devices in parallel; kernels inside split their
//! work on the same pool: gemm with `Parallelism::Rayon(0)`, batched GEMMs, chunked
//! elementwise, so busy threads never exceed the pool's). Tasks never block. Between segments,
//! each collective runs over all device buffers through the [`Communicator`]. Where the
//! communicator shares memory (in-process devices), an all-to-all whose operand exists when the
//! segment before its round ends is instead placed by its senders: the results are allocated
//! before that segment and each device task, as it ends, copies its blocks into every
//! receiver's result (`Dev::send`), so the copies run while other tasks still compute instead
//! of in a pass after the barrier. There, too, the pool's other threads stay busy through the
//! run (`keep_awake`) and a device task that ends waits busily for its segment's last one
//! (`DeviceTask::end`), instead of falling asleep at every barrier to be woken by a futex.
//! Deterministic and deadlock-free: no task waits for a peer (the busy waits end by themselves
//! after `BUSY_IDLE` without work).
//!
//! **Memory**: freed buffers go to a per-device pool (exact dtype and length), kept across
//! runs of the same [`Executable`] and capped at the run's peak of live bytes; a fused group
//! whose input dies at that step and has the output's dtype and length writes in place.
//! [`RunResult::peak_bytes_per_device`] is the peak of live buffer bytes (parameters
//! included, aliases counted once); `peak_resident_bytes_per_device` adds the pool.

use crate::alloc::AllocError;
use crate::comm::{place_all_to_all, wire_bytes, CommError, Communicator, Sinks, SMALL_COLLECTIVE};
use crate::error::RuntimeError;
use crate::kernels::dot::{
    dot, masked_row_sums, DotCall, DotPath, DotPlan, Epilogue, Known, Operand, Support, Values,
    NO_TAIL,
};
use crate::kernels::elementwise::{
    collapse_broadcast, run_fused_inplace, run_fused_part, Fused, Node,
};
use crate::kernels::{bytes, conv, index, layout, reduce, scalar_f64, strides, try_zeros};
use crate::profile::{Profiler, TraceEvent};
use crate::tensor::{Data, HostTensor};
use ir::{BinaryOp, CollectiveKind, DType, Instr, Literal, Mesh, Op, Program, Type};
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ExecError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error("{got} input maps for {want} local devices; pass one per local mesh position")]
    DeviceCount { want: usize, got: usize },
}

/// Bytes moved by one kind of collective in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveStat {
    pub kind: &'static str,
    pub count: usize,
    /// Sum over local devices of the bytes each sends to other devices ([`wire_bytes`]).
    pub bytes: usize,
}

/// What a run produced: outputs per local device, memory and communication.
pub struct RunResult {
    pub outputs: Vec<HashMap<String, HostTensor>>,
    /// Peak bytes of live buffers on any device (parameters included).
    pub peak_bytes_per_device: usize,
    /// Peak of live plus pooled (freed, kept for reuse) bytes on any device.
    pub peak_resident_bytes_per_device: usize,
    /// Sum over local devices and collectives of the bytes sent to other devices.
    pub collective_bytes: usize,
    /// The same per collective kind, in first-use order.
    pub collectives: Vec<CollectiveStat>,
}

/// A device buffer: produced here, or an input shared with the caller.
#[derive(Clone)]
enum Buf {
    Own(Arc<Data>),
    Input(Arc<HostTensor>),
}

impl Buf {
    fn data(&self) -> &Data {
        match self {
            Buf::Own(d) => d,
            Buf::Input(t) => &t.data,
        }
    }
}

#[derive(Debug)]
enum Kind {
    Param(String),
    PartitionId,
    /// `inputs` are the external values of the group, in `Node::Input` order;
    /// `inplace_ok[k]`: input `k` is read only elementwise (may be overwritten).
    Fused {
        f: Fused,
        inputs: Vec<usize>,
        inplace_ok: Vec<bool>,
    },
    /// Shares the buffer of this value.
    Alias(usize),
    /// The value of another, whose only reader this is, taken over buffer and all (a
    /// transpose whose layout the all-to-all producing its operand wrote).
    Move(usize),
    Dot(Box<DotPlan>),
    /// An f32 dot used only multiplied by one of the f32 values `masks` (its shape) and then
    /// summed: computed where a mask is non-zero, when that is exact ([`DotCall::run_masked`]),
    /// else as [`Kind::Dot`].
    MaskedDot {
        plan: Box<DotPlan>,
        masks: Vec<usize>,
    },
    /// A [`Kind::MaskedDot`] (value `dot`, never materialised) whose products with each mask
    /// are read only by one sum over the product's column dims: computes those sums
    /// directly, `terms` = (mask, the reduction's value), at most two (this step's value and
    /// its `also`) — [`DotCall::run_masked_sums`], or the dense product and [`masked_row_sums`].
    MaskedDotSums {
        plan: Box<DotPlan>,
        dot: usize,
        terms: Vec<(usize, usize)>,
    },
    /// An f32 dot (value `dot`) whose batch entries go, each right after its GEMM, through
    /// the f32 fused group `f` that reads it as input `slot`: the group's result is this
    /// step's value. With `keep`, the dot's result is materialised too (other steps read
    /// it); without, the group runs in place over it.
    DotFused {
        plan: Box<DotPlan>,
        dot: usize,
        f: Fused,
        inputs: Vec<usize>,
        slot: usize,
        keep: bool,
    },
    Kernel,
    /// The f32 sum of every element of `a * b` (two f32 values of one shape), the multiply
    /// group and the reduction that was its only reader in one pass ([`masked_row_sums`]
    /// over one row): the step reads `a` and `b`.
    SumProduct,
    /// A collective between segments; with `out_perm`, each device's result is written
    /// transposed by it (an all-to-all whose only reader is a transpose, which takes the
    /// result over: [`Kind::Move`]).
    Collective {
        out_perm: Option<Vec<usize>>,
    },
}

#[derive(Debug)]
struct Step {
    /// The instruction whose value this step produces.
    instr: usize,
    /// A second value it produces (a dot materialised by [`Kind::DotFused`]).
    also: Option<usize>,
    kind: Kind,
    /// Values read.
    reads: Vec<usize>,
    /// Buffer classes (root values) released after this step.
    frees: Vec<usize>,
    /// `(class, support key)`: values whose later readers are only summed masked dots (as
    /// masks) or plain dots, released after this step when the run has found their support
    /// (those readers then take them by the support alone; see [`Dev::release`]).
    frees_sparse: Vec<(usize, usize)>,
    label: String,
    cat: &'static str,
}

#[derive(Debug)]
enum Segment {
    Local(Range<usize>),
    Collective(usize),
}

/// Freed buffers per (dtype, length), for reuse.
#[derive(Default)]
struct Pool {
    free: HashMap<(DType, usize), Vec<Data>>,
    bytes: usize,
    /// The largest peak of live bytes seen: the pool never holds more than this.
    cap: usize,
}

impl Pool {
    fn take(&mut self, dtype: DType, n: usize) -> Result<Data, AllocError> {
        if let Some(d) = self.free.get_mut(&(dtype, n)).and_then(Vec::pop) {
            self.bytes -= bytes(&d);
            return Ok(d);
        }
        try_zeros(dtype, n)
    }

    fn give(&mut self, d: Data, cap: usize) {
        let b = bytes(&d);
        if b > 0 && self.bytes + b <= cap {
            self.bytes += b;
            self.free.entry((d.dtype(), d.len())).or_default().push(d);
        }
    }
}

/// A program prepared for execution: fusion groups, dot plans, liveness, segments.
pub struct Executable {
    program: Program,
    steps: Vec<Step>,
    /// `then[si]`: the dot step right after dot step `si` (see [`Dev::tail`]).
    then: Vec<Option<usize>>,
    /// ReLUs computed coded, their pre-activation not kept ([`relu_codes`]).
    coded_relus: usize,
    segments: Vec<Segment>,
    /// `sends[k]`: for local segment `k`, the all-to-all steps of the round after it whose
    /// senders place their blocks at the end of this segment's device tasks, where the
    /// communicator shares memory ([`Communicator::shared_memory`]).
    sends: Vec<Vec<usize>>,
    /// `class[v]`: the value whose buffer `v` shares (itself unless an alias).
    class: Vec<usize>,
    /// Values sharing each class root's buffer.
    members: Vec<Vec<usize>>,
    /// Last step reading each class (usize::MAX for outputs).
    last_read: Vec<usize>,
    /// `support_of[v]`: the buffer class whose non-zeros `v` has at the same positions
    /// (its own class, or that of `x` for a group `convert(x != 0)`): the key of the
    /// supports a run shares between sparse products ([`kernels::dot::Support`]).
    support_of: Vec<usize>,
    /// Values whose support is found as soon as they are computed, while in cache: the
    /// masks of summed masked dots, which read them much later (the backward pass).
    eager_support: Vec<bool>,
    pools: Mutex<Vec<Pool>>,
    /// Run kernels with the reference interpreter (a debugging / differential mode).
    reference_kernels: bool,
}

fn fusible(op: &Op) -> bool {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape => true,
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
        | Op::Collective(_) => false,
    }
}

/// Leaves inlined into groups instead of being read from memory.
fn generator(op: &Op) -> bool {
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

/// Most nodes of one fused group (an upper bound counted over its ops and their operands):
/// each node takes a scratch lane of [`CHUNK`](crate::kernels::elementwise::CHUNK) elements
/// per thread, so a chain of elementwise ops as long as the program is cut into groups of
/// at most this many (each group's root is materialised and read by the next; the same
/// values to the bit).
const MAX_GROUP_NODES: usize = 1024;

/// Builds one fused group rooted at `root`.
struct GroupBuilder<'a> {
    p: &'a Program,
    absorbed: &'a [bool],
    /// ReLU pre-activations read through their coded ReLU ([`relu_codes`]): `a -> h`.
    relu_of: &'a HashMap<usize, usize>,
    /// The coded ReLUs: `h -> a`.
    relu_in: &'a HashMap<usize, usize>,
    nodes: Vec<(Node, DType)>,
    inputs: Vec<usize>,
    memo: HashMap<usize, usize>,
    broadcast_inputs: Vec<usize>,
}

impl GroupBuilder<'_> {
    fn input(&mut self, v: usize) -> usize {
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
    fn node(&mut self, v: usize, inline: bool) -> usize {
        /// A value being built: the operand values it reads as nodes, and their nodes.
        struct Frame {
            v: usize,
            inline: bool,
            parts: Vec<usize>,
            done: Vec<usize>,
        }
        if let Some(&n) = self.memo.get(&v) {
            return n;
        }
        let frame = |this: &Self, v: usize, inline: bool| Frame {
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
                        let inl = self.absorbed[o] || generator(&self.p.instrs[o].op);
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
    fn parts(&self, v: usize, inline: bool) -> Vec<usize> {
        if !inline || self.relu_in.contains_key(&v) {
            return vec![];
        }
        let ins = &self.p.instrs[v];
        let ops = |k: usize| ins.operands[k].index();
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
            _ => vec![],
        }
    }

    /// The node of `v` given the nodes `kids` of its [`GroupBuilder::parts`].
    fn finish(&mut self, v: usize, inline: bool, kids: &[usize]) -> usize {
        let p = self.p;
        let ins = &p.instrs[v];
        let dt = ins.ty.dtype;
        if let (true, Some(&a)) = (inline, self.relu_in.get(&v)) {
            // The coded ReLU `max(a, 0)`, `-0` where `a < 0` (see `relu_codes`).
            let k = self.input(a);
            let a = self.push(Node::Input(k), DType::F32);
            return self.push(Node::ReluCode(a), DType::F32);
        }
        if let (false, Some(&h)) = (inline, self.relu_of.get(&v)) {
            // The pre-activation as its compares with zero see it, from its coded ReLU.
            let k = self.input(h);
            let h = self.push(Node::Input(k), DType::F32);
            return self.push(Node::ReluDecode(h), DType::F32);
        }
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
                let src = ins.operands[0].index();
                let ist = strides(&p.instrs[src].ty.shape);
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

/// ReLUs `h = max(a, 0)` (f32, `+0`) whose pre-activation `a` is read otherwise only by
/// compares with zero (the ReLU's derivative, `a > 0` and `a == 0`), after `h`, and whose `h`
/// is read only by dots: `h` is then computed coded, `-0` where `a < 0` (`+0` where
/// `a == ±0`, `a` where positive, NaN where NaN), and those compares read `a` back from it
/// (`-1` where `h` is `-0`, else `h`: every compare with zero gives what it gave on `a`). A dot
/// sums `-0 * x` as `+0 * x` (a sum that starts at `+0` stays `+0` either way, and any other
/// term decides), so every value but `h`'s zero signs is the same, and `a` is never kept for
/// the backward pass: an expert's pre-activation, as large as its ReLU, is neither written
/// nor read back. Returns `a -> h`.
fn relu_codes(p: &Program, consumers: &[Vec<usize>], is_output: &[bool]) -> HashMap<usize, usize> {
    let zero = |v: ir::ValueId| p.splat_value(v) == Some(0.0);
    let plus_zero = |v: ir::ValueId| {
        p.splat_value(v)
            .is_some_and(|x| x == 0.0 && x.is_sign_positive())
    };
    let mut codes = HashMap::new();
    for (a, ins) in p.instrs.iter().enumerate() {
        // (A generator is inlined where it is read, never a buffer to read back.)
        if ins.ty.dtype != DType::F32 || is_output[a] || generator(&ins.op) {
            continue;
        }
        let (mut relu, mut compares, mut other_use) = (None, 0, false);
        for &c in &consumers[a] {
            let ci = &p.instrs[c];
            let z = match ci.operands.as_slice() {
                [x, y] if x.index() == a && y.index() != a => Some(*y),
                [x, y] if y.index() == a && x.index() != a => Some(*x),
                _ => None,
            };
            match (&ci.op, z) {
                (Op::Binary(BinaryOp::Max), Some(z)) if plus_zero(z) && relu.is_none() => {
                    relu = Some(c)
                }
                (Op::Compare(_), Some(z)) if zero(z) => compares += 1,
                _ => other_use = true,
            }
        }
        let Some(h) = relu else { continue };
        let dots_only = !consumers[h].is_empty()
            && consumers[h]
                .iter()
                .all(|&c| matches!(p.instrs[c].op, Op::DotGeneral(_)));
        let after = consumers[a].iter().all(|&c| c >= h);
        if !other_use && compares > 0 && after && dots_only && !is_output[h] {
            codes.insert(a, h);
        }
    }
    codes
}

/// A collective over groups of one device that returns its operand unchanged (every kind
/// but a permute that does not send rank 0 to itself, which yields zeros).
fn trivial_collective(p: &Program, op: &Op) -> bool {
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
/// concatenation of one operand.
fn identity_op(p: &Program, i: usize, op: &Op) -> bool {
    let ins = &p.instrs[i];
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

/// Whether value `v` is one of the program's outputs.
fn is_output(p: &Program, v: usize) -> bool {
    p.outputs.iter().any(|(_, o)| o.index() == v)
}

/// Whether value `v` is f32.
fn f32_value(p: &Program, v: usize) -> bool {
    p.instrs[v].ty.dtype == DType::F32
}

/// Remove the steps marked in `marked` (one flag per step), keeping the order of the rest.
fn remove_marked(steps: &mut Vec<Step>, marked: &[bool]) {
    let mut flags = marked.iter();
    steps.retain(|_| !flags.next().copied().unwrap_or(false));
}

/// The step producing each value, and the steps reading it (in order, each once).
fn producers_and_readers(steps: &[Step]) -> (HashMap<usize, usize>, HashMap<usize, Vec<usize>>) {
    let mut producer: HashMap<usize, usize> = HashMap::new();
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    for (si, s) in steps.iter().enumerate() {
        producer.insert(s.instr, si);
        for &r in &s.reads {
            let rs = readers.entry(r).or_default();
            if rs.last() != Some(&si) {
                rs.push(si);
            }
        }
    }
    (producer, readers)
}

/// Mark the f32 dots whose every use is `dot * mask` (a group of that one multiply, with
/// `mask` computed before the dot) summed by reductions and nothing else, as
/// [`Kind::MaskedDot`]: where every mask is zero the product's value cannot matter to a
/// sum (when finite; checked at run time), so only the masked-in values are computed.
fn mask_dots(p: &Program, steps: &mut [Step]) {
    let (producer, readers) = producers_and_readers(steps);
    for d in 0..steps.len() {
        let Kind::Dot(_) = &steps[d].kind else {
            continue;
        };
        let dv = steps[d].instr;
        if !f32_value(p, dv) || is_output(p, dv) || !steps[d].reads.iter().all(|&v| f32_value(p, v))
        {
            continue;
        }
        let rs = readers.get(&dv).map(Vec::as_slice).unwrap_or(&[]);
        // The mask of each reader that is `dv * mask`, summed and nothing else.
        let mask_of = |j: usize| -> Option<usize> {
            let Kind::Fused { f, inputs, .. } = &steps[j].kind else {
                return None;
            };
            let [(Node::Input(a), _), (Node::Input(b), _), (Node::Binary(BinaryOp::Mul, x, y), _)] =
                f.nodes.as_slice()
            else {
                return None;
            };
            let other = match (inputs[*a] == dv, inputs[*b] == dv) {
                (true, false) => *b,
                (false, true) => *a,
                _ => return None,
            };
            let (mask, gv) = (inputs[other], steps[j].instr);
            let reads_both = (*x == 0 && *y == 1) || (*x == 1 && *y == 0);
            let summed = !is_output(p, gv)
                && readers.get(&gv).is_some_and(|us| {
                    us.iter().all(|&u| {
                        matches!(steps[u].kind, Kind::Kernel)
                            && matches!(
                                p.instrs[steps[u].instr].op,
                                Op::Reduce {
                                    op: ir::ReduceOp::Sum,
                                    ..
                                }
                            )
                    })
                });
            (reads_both
                && f32_value(p, mask)
                && f32_value(p, gv)
                && f.len == p.instrs[dv].ty.num_elements()
                && p.instrs[mask].ty.num_elements() == f.len
                && producer.get(&mask).is_some_and(|&q| q < d)
                && summed)
                .then_some(mask)
        };
        let masks: Option<Vec<usize>> = rs.iter().map(|&j| mask_of(j)).collect();
        let Some(mut masks) = masks.filter(|m| !m.is_empty()) else {
            continue;
        };
        masks.sort_unstable();
        masks.dedup();
        let Kind::Dot(plan) = std::mem::replace(&mut steps[d].kind, Kind::Kernel) else {
            unreachable!("matched above")
        };
        steps[d].reads.extend(masks.iter().copied());
        steps[d].kind = Kind::MaskedDot { plan, masks };
    }
}

/// Turn each [`Kind::MaskedDot`] whose every `dot * mask` is read only by one sum over the
/// product's column dims (the trailing dims, untransposed: `[G, S, E, C]` summed over
/// `E, C` in the MoE combine weights' gradient) into [`Kind::MaskedDotSums`], dropping the
/// multiply groups and the reductions: the sums come straight from the masked-in values,
/// without writing the product, the multiplied values or reading them back.
fn sum_masked_dots(p: &Program, steps: &mut Vec<Step>) {
    let (_, readers) = producers_and_readers(steps);
    let none: &[usize] = &[];
    let mut dropped = vec![false; steps.len()];
    for d in 0..steps.len() {
        let Kind::MaskedDot { plan, .. } = &steps[d].kind else {
            continue;
        };
        if plan.writes_transposed() {
            continue;
        }
        let dv = steps[d].instr;
        let shape = &p.instrs[dv].ty.shape;
        let (bm, n) = (plan.b * plan.m, plan.n);
        // The (mask, reduction step, group step) of each reader of the dot.
        let term = |j: usize| -> Option<(usize, usize, usize)> {
            let Kind::Fused { inputs, .. } = &steps[j].kind else {
                return None;
            };
            let mask = inputs.iter().copied().find(|&v| v != dv)?;
            let gv = steps[j].instr;
            let [u] = readers.get(&gv).map(Vec::as_slice).unwrap_or(none) else {
                return None;
            };
            let Op::Reduce {
                op: ir::ReduceOp::Sum,
                dims,
            } = &p.instrs[steps[*u].instr].op
            else {
                return None;
            };
            let r0 = shape.len().checked_sub(dims.len())?;
            let suffix = dims.iter().enumerate().all(|(q, &dd)| dd == r0 + q);
            let cols: usize = shape[r0..].iter().product();
            let rows: usize = shape[..r0].iter().product();
            (matches!(steps[*u].kind, Kind::Kernel) && suffix && cols == n && rows == bm)
                .then_some((mask, *u, j))
        };
        let terms: Option<Vec<(usize, usize, usize)>> = readers
            .get(&dv)
            .map(Vec::as_slice)
            .unwrap_or(none)
            .iter()
            .map(|&j| term(j))
            .collect();
        let Some(terms) = terms.filter(|t| (1..=2).contains(&t.len())) else {
            continue;
        };
        let Kind::MaskedDot { plan, .. } = std::mem::replace(&mut steps[d].kind, Kind::Kernel)
        else {
            unreachable!("matched above")
        };
        let outs: Vec<usize> = terms.iter().map(|&(_, u, _)| steps[u].instr).collect();
        for &(_, u, j) in &terms {
            dropped[u] = true;
            dropped[j] = true;
        }
        let s = &mut steps[d];
        s.reads.truncate(2);
        s.reads.extend(terms.iter().map(|&(mask, _, _)| mask));
        s.instr = outs[0];
        s.also = outs.get(1).copied();
        let sums: Vec<String> = outs.iter().map(|u| format!("%{u}")).collect();
        s.label = format!("{} +sums {}", s.label, sums.join(","));
        s.kind = Kind::MaskedDotSums {
            plan,
            dot: dv,
            terms: terms
                .iter()
                .zip(&outs)
                .map(|(&(mask, _, _), &u)| (mask, u))
                .collect(),
        };
    }
    remove_marked(steps, &dropped);
}

/// Turn each f32 sum over every dim of an f32 group `a * b` (two inputs of its shape, no
/// other node), the group read by nothing else, into one [`Kind::SumProduct`] step that
/// multiplies and adds in one pass: the loss `sum(y * dy)` of a layer's step. The sum is
/// the reduction's (f64, in element order, from `+0`) over the group's f32 products, so
/// the value is the same; the product is never written.
fn sum_products(p: &Program, steps: &mut Vec<Step>) {
    let (producer, readers) = producers_and_readers(steps);
    let mut dropped = vec![false; steps.len()];
    for r in 0..steps.len() {
        let ins = &p.instrs[steps[r].instr];
        let (
            Kind::Kernel,
            Op::Reduce {
                op: ir::ReduceOp::Sum,
                dims,
            },
        ) = (&steps[r].kind, &ins.op)
        else {
            continue;
        };
        let [v] = steps[r].reads[..] else {
            continue;
        };
        let rank = p.instrs[v].ty.shape.len();
        if !f32_value(p, v)
            || !f32_value(p, steps[r].instr)
            || dims.len() != rank
            || is_output(p, v)
        {
            continue;
        }
        let Some(&j) = producer.get(&v) else {
            continue;
        };
        if readers.get(&v).map(Vec::as_slice) != Some(&[r][..]) || steps[j].also.is_some() {
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
                (Node::Binary(ir::BinaryOp::Mul, 0, 1), DType::F32),
            ]
        );
        let same = |u: usize| f32_value(p, u) && p.instrs[u].ty.shape == p.instrs[v].ty.shape;
        if !product || inputs.len() != 2 || !inputs.iter().all(|&u| same(u)) {
            continue;
        }
        let (a, b) = (inputs[0], inputs[1]);
        dropped[j] = true;
        let s = &mut steps[r];
        s.kind = Kind::SumProduct;
        s.reads = vec![a, b];
        s.label = format!("{} +product %{v}", s.label);
    }
    remove_marked(steps, &dropped);
}

/// `support_of[v]` for every value (see [`Executable`]): its buffer class, except that a
/// fused group computing exactly `convert(x != 0)` (or `0 != x`) to a float from a float
/// `x` of its shape shares `x`'s key: both are non-zero at the same positions (`-0` and
/// `+0` compare equal to zero, NaN does not, as in the sparse path's scan). A combine
/// weight's support then also serves its dispatch mask (MoE: one pass over the four
/// one-hot products' sparse operands instead of four).
fn same_supports(p: &Program, steps: &[Step], class: &[usize]) -> Vec<usize> {
    let mut key = class.to_vec();
    for s in steps {
        if let Some(x) = indicator_of(p, s) {
            key[class[s.instr]] = key[class[x]];
        }
    }
    // A class's members share its key.
    (0..class.len()).map(|v| key[class[v]]).collect()
}

/// `x` where step `s` is a fused group of one input `x` that computes exactly the indicator
/// `convert(x != 0)` (or `0 != x`) to a float of `x`'s shape, from a float `x`: `1` where
/// `x` is non-zero (NaN included: it compares unequal to zero), `0` where it is `±0`.
fn indicator_of(p: &Program, s: &Step) -> Option<usize> {
    let Kind::Fused { f, inputs, .. } = &s.kind else {
        return None;
    };
    let [x] = inputs[..] else {
        return None;
    };
    let float = |t: DType| matches!(t, DType::F32 | DType::F64);
    let zero = |n: usize| matches!(f.nodes.get(n), Some((Node::Splat(z), _)) if *z == 0.0);
    let input = |n: usize| matches!(f.nodes.get(n), Some((Node::Input(0), _)));
    let indicator = match f.nodes.last() {
        Some(&(Node::Convert(c), t)) if float(t) => matches!(
            f.nodes.get(c),
            Some(&(Node::Compare(ir::CompareOp::Ne, a, b), _))
                if (input(a) && zero(b)) || (zero(a) && input(b))
        ),
        _ => false,
    };
    let (tx, ty) = (&p.instrs[x].ty, &p.instrs[s.instr].ty);
    (indicator && float(tx.dtype) && tx.shape == ty.shape).then_some(x)
}

/// Drop each indicator group `v = convert(x != 0)` (f32 or f64, `x` of its dtype) whose
/// every reader is a plain dot: the dots read `x` in its place, as an indicator
/// ([`DotPlan::read_indicator`]). A sparse path over that side walks `x`'s non-zeros (the
/// support shared with `x`'s other readers) with the value 1; another path multiplies a
/// 0/1 copy. The MoE dispatch mask: the dispatch and its gradient read the combine weights
/// instead, and the mask is neither computed nor written (256 KiB per device and step in
/// the small benchmark layer), nor kept alive until the backward pass.
fn indicator_dots(p: &Program, steps: &mut Vec<Step>) {
    let (_, readers) = producers_and_readers(steps);
    let mut gone = vec![false; steps.len()];
    for si in 0..steps.len() {
        let (s, v) = (&steps[si], steps[si].instr);
        let Some(x) = indicator_of(p, s) else {
            continue;
        };
        let same_type = p.instrs[x].ty.dtype == p.instrs[v].ty.dtype;
        if s.also.is_some() || is_output(p, v) || !same_type {
            continue;
        }
        let Some(rs) = readers.get(&v) else {
            continue;
        };
        if !rs.iter().all(|&r| matches!(steps[r].kind, Kind::Dot(_))) {
            continue;
        }
        for &r in rs {
            let st = &mut steps[r];
            let Kind::Dot(plan) = &mut st.kind else {
                unreachable!("checked above")
            };
            for side in 0..2 {
                if st.reads[side] == v {
                    st.reads[side] = x;
                    plan.read_indicator(side);
                }
            }
        }
        gone[si] = true;
    }
    remove_marked(steps, &gone);
}

/// Merge each f32 dot with an f32 elementwise group that reads it into one
/// [`Kind::DotFused`] step: every batch entry of the product goes through the group right
/// after its GEMM, while it is in cache, instead of in a second pass over memory (the ReLU
/// after an expert's up-projection, the ReLU mask on its gradient). The values computed are
/// the same. The merged step takes the dot's place when every other input of the group
/// exists by then (required when the dot's result is also read elsewhere), else the
/// group's.
fn fuse_dot_epilogues(p: &Program, steps: &mut Vec<Step>) {
    let (producer, readers) = producers_and_readers(steps);
    let mut gone = vec![false; steps.len()];
    for d in 0..steps.len() {
        let Kind::Dot(plan) = &steps[d].kind else {
            continue;
        };
        let dv = steps[d].instr;
        if gone[d] || plan.writes_transposed() || !steps[d].reads.iter().all(|&v| f32_value(p, v)) {
            continue;
        }
        let rs = readers.get(&dv).map(Vec::as_slice).unwrap_or(&[]);
        let keep = rs.len() > 1 || is_output(p, dv);
        let Some((j, slot, early)) = rs.iter().find_map(|&j| {
            let Kind::Fused {
                f,
                inputs,
                inplace_ok,
            } = &steps[j].kind
            else {
                return None;
            };
            let slot = inputs.iter().position(|&v| v == dv)?;
            let others_ready = inputs
                .iter()
                .all(|&v| v == dv || producer.get(&v).is_some_and(|&q| q < d));
            (!gone[j]
                && f32_value(p, steps[j].instr)
                && f.len == p.instrs[dv].ty.num_elements()
                && inplace_ok[slot]
                && (others_ready || !keep))
                .then_some((j, slot, others_ready))
        }) else {
            continue;
        };
        let Kind::Fused { f, inputs, .. } = std::mem::replace(&mut steps[j].kind, Kind::Kernel)
        else {
            unreachable!("matched above")
        };
        let Kind::Dot(plan) = std::mem::replace(&mut steps[d].kind, Kind::Kernel) else {
            unreachable!("matched above")
        };
        let mut reads = steps[d].reads.clone();
        reads.extend(inputs.iter().copied().filter(|&v| v != dv));
        let merged = Step {
            instr: steps[j].instr,
            also: keep.then_some(dv),
            kind: Kind::DotFused {
                plan,
                dot: dv,
                f,
                inputs,
                slot,
                keep,
            },
            reads,
            frees: Vec::new(),
            frees_sparse: Vec::new(),
            label: format!("{} +{}", steps[d].label, steps[j].label),
            cat: "dot",
        };
        // At the dot's place when possible: later, the group's other inputs may die there
        // and the result could no longer reuse their buffers (the unfused group writes in
        // place over one), so the fused step would raise the peak.
        let (at, drop) = if early { (d, j) } else { (j, d) };
        steps[at] = merged;
        gone[drop] = true;
    }
    remove_marked(steps, &gone);
}

/// Reorder the steps so that small collectives (scalar losses, norms, counts: operands under
/// [`SMALL_COLLECTIVE`] elements) share the round of the next collective instead of each
/// stopping every device task: a small collective waits for the next round, and the steps
/// that read its result (or such a step's) wait until after that round, unless one reads a
/// large value, which makes the round run there; every other step keeps its program order.
/// Large collectives keep their places, so the buffers they move and the steps around them
/// live as long as before and the peak stays that of program order (moving everything as
/// early as it could run put all of a training step's gradient all-reduces in one round
/// and raised its peak a fifth, though the MoE layer ran ~7 % faster at 8 devices). The
/// MoE layer's eleven collectives (four all-to-alls, six scalar all-reduces, the gating
/// weight's gradient) meet in five rounds. Every process orders the same program the same
/// way, so ranks still issue their collectives in one order.
fn coalesce_collectives(p: &Program, steps: Vec<Step>) -> Vec<Step> {
    use std::collections::{HashSet, VecDeque};
    let small = |s: &Step| p.instrs[s.reads[0]].ty.num_elements() < SMALL_COLLECTIVE;
    let mut queue: VecDeque<Step> = steps.into();
    let mut out: Vec<Step> = Vec::with_capacity(queue.len());
    // Small collectives waiting for the next round, and the steps waiting on them.
    let mut pending: Vec<Step> = Vec::new();
    let mut waiting: Vec<Step> = Vec::new();
    let mut unavailable: HashSet<usize> = HashSet::new();
    loop {
        let Some(s) = queue.pop_front() else {
            if pending.is_empty() && waiting.is_empty() {
                break;
            }
            // The last round, then what waited on it.
            out.append(&mut pending);
            unavailable.clear();
            queue.extend(waiting.drain(..));
            continue;
        };
        let collective = matches!(s.kind, Kind::Collective { .. });
        let large = |v: &usize| p.instrs[*v].ty.num_elements() >= SMALL_COLLECTIVE;
        if s.reads.iter().any(|r| unavailable.contains(r)) {
            if s.reads.iter().any(large) {
                // It would hold a large buffer while it waits: run the round now.
                out.append(&mut pending);
                unavailable.clear();
                queue.push_front(s);
                for w in waiting.drain(..).rev() {
                    queue.push_front(w);
                }
                continue;
            }
            unavailable.extend(std::iter::once(s.instr).chain(s.also));
            waiting.push(s);
        } else if collective && small(&s) {
            unavailable.insert(s.instr);
            pending.push(s);
        } else if collective {
            // A round: the waiting small collectives with this one; then the steps that
            // waited on them, ahead of the rest.
            out.append(&mut pending);
            out.push(s);
            unavailable.clear();
            for w in waiting.drain(..).rev() {
                queue.push_front(w);
            }
        } else {
            out.push(s);
        }
    }
    out
}

fn op_label(i: usize, ins: &Instr) -> String {
    format!("{} %{i}", ins.op.name())
}

impl Executable {
    /// Verify and prepare `p` (see the module doc).
    pub fn new(p: &Program) -> Result<Executable, ExecError> {
        Executable::with_options(p, false)
    }

    /// [`Executable::new`]; with `reference_kernels`, every kernel and collective is computed
    /// by the reference interpreter instead (same plan, buffers and liveness): a
    /// differential-testing mode that isolates executor plumbing from kernel numerics.
    pub fn with_options(p: &Program, reference_kernels: bool) -> Result<Executable, ExecError> {
        if p.mesh.is_none() {
            if let Some((index, ins)) = p
                .instrs
                .iter()
                .enumerate()
                .find(|(_, i)| i.op.is_collective())
            {
                return Err(RuntimeError::NoMesh {
                    index,
                    op: ins.op.name().to_string(),
                }
                .into());
            }
        }
        ir::verify(p).map_err(RuntimeError::from)?;
        let n = p.instrs.len();
        let mut is_output = vec![false; n];
        for (_, v) in &p.outputs {
            is_output[v.index()] = true;
        }
        let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, ins) in p.instrs.iter().enumerate() {
            for o in &ins.operands {
                if consumers[o.index()].last() != Some(&i) {
                    consumers[o.index()].push(i);
                }
            }
        }
        let relu_of = if reference_kernels {
            HashMap::new()
        } else {
            relu_codes(p, &consumers, &is_output)
        };
        let relu_in: HashMap<usize, usize> = relu_of.iter().map(|(&a, &h)| (h, a)).collect();
        let numel = |i: usize| p.instrs[i].ty.num_elements();
        let mut absorbed = vec![false; n];
        // `size[i]`: at most how many nodes the group of `i`'s absorbed operands and `i`
        // has, kept under MAX_GROUP_NODES by materialising the largest absorbed operands.
        let mut size = vec![1usize; n];
        for i in 0..n {
            let op = &p.instrs[i].op;
            if fusible(op) && !reference_kernels {
                let mut parts: Vec<usize> =
                    p.instrs[i].operands.iter().map(|o| o.index()).collect();
                parts.sort_unstable();
                parts.dedup();
                parts.retain(|&o| absorbed[o]);
                let operands = p.instrs[i].operands.len();
                let mut total = 1 + operands + parts.iter().map(|&o| size[o]).sum::<usize>();
                while total > MAX_GROUP_NODES {
                    let Some(k) = (0..parts.len()).max_by_key(|&k| (size[parts[k]], parts[k]))
                    else {
                        break;
                    };
                    let o = parts.swap_remove(k);
                    absorbed[o] = false;
                    total -= size[o];
                }
                size[i] = total;
            }
            if fusible(op) && !reference_kernels && !is_output[i] && consumers[i].len() == 1 {
                let c = consumers[i][0];
                absorbed[i] = fusible(&p.instrs[c].op) && numel(c) == numel(i);
            }
        }
        // Generators are materialised only if something outside a group needs them.
        let gen_materialise = |i: usize| {
            reference_kernels
                || is_output[i]
                || consumers[i]
                    .iter()
                    .any(|&c| !fusible(&p.instrs[c].op) || numel(c) != numel(i))
        };
        let mut steps: Vec<Step> = Vec::new();
        let mut pending_dot: HashMap<usize, (DotPlan, Vec<usize>, String)> = HashMap::new();
        // Trivial collectives between a dot and the transpose fused into it: no step.
        let mut passed: Vec<usize> = Vec::new();
        // Transposes written by the all-to-all that is their operand.
        let mut folded = vec![false; n];
        // Transposes of an all-reduce of a dot, which the dot writes in their layout.
        let mut reduced_transposed: Vec<usize> = Vec::new();
        for i in 0..n {
            let ins = &p.instrs[i];
            let dead = consumers[i].is_empty() && !is_output[i];
            let label = op_label(i, ins);
            let operands: Vec<usize> = ins.operands.iter().map(|o| o.index()).collect();
            let step = |kind: Kind, reads: Vec<usize>, cat: &'static str, label: String| Step {
                instr: i,
                also: None,
                kind,
                reads,
                frees: Vec::new(),
                frees_sparse: Vec::new(),
                label,
                cat,
            };
            if (dead && !matches!(ins.op, Op::Parameter { .. })) || passed.contains(&i) {
                continue;
            }
            match &ins.op {
                Op::Parameter { name } => {
                    steps.push(step(Kind::Param(name.clone()), vec![], "param", label))
                }
                Op::Transpose { .. } if pending_dot.contains_key(&i) => {
                    let (plan, reads, label) = pending_dot.remove(&i).expect("checked");
                    steps.push(step(Kind::Dot(Box::new(plan)), reads, "dot", label));
                }
                Op::Transpose { .. } if reduced_transposed.contains(&i) => {
                    // Its dot wrote the layout, and the all-reduce between kept it.
                    let src = operands[0];
                    steps.push(step(Kind::Alias(src), vec![src], "alias", label));
                }
                Op::PartitionId => steps.push(step(Kind::PartitionId, vec![], "kernel", label)),
                op if op.is_collective() && !reference_kernels && trivial_collective(p, op) => {
                    // A group of one: the identity, so the result shares the operand.
                    let src = operands[0];
                    steps.push(step(Kind::Alias(src), vec![src], "alias", label));
                }
                Op::Transpose { .. } if folded[i] => {
                    // Written transposed by the all-to-all that is its operand, whose only
                    // reader it is: it takes that buffer over (its own buffer class, so a
                    // reader can still overwrite it in place or move it on).
                    let src = operands[0];
                    steps.push(step(Kind::Move(src), vec![src], "alias", label));
                }
                op if op.is_collective() => {
                    // An all-to-all read only by a transpose writes its results in the
                    // transpose's layout (the in-process backend places each block there
                    // directly): the MoE dispatch's `[G, E, C, M]` -> `[E, G, C, M]` costs
                    // no pass of its own.
                    // (Only where the transpose keeps the last dim last: each block is
                    // then copied as whole rows.)
                    let fold = match (op.collective_kind(), consumers[i].as_slice(), is_output[i]) {
                        (Some(CollectiveKind::AllToAll { .. }), &[c], false)
                            if !reference_kernels =>
                        {
                            match &p.instrs[c].op {
                                Op::Transpose { perm }
                                    if perm.last() == Some(&(perm.len() - 1)) =>
                                {
                                    Some((c, perm.clone()))
                                }
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    let (label, out_perm) = match fold {
                        Some((c, perm)) => {
                            folded[c] = true;
                            (format!("{label} +transpose %{c}"), Some(perm))
                        }
                        None => (label, None),
                    };
                    steps.push(step(
                        Kind::Collective { out_perm },
                        operands,
                        "collective",
                        label,
                    ))
                }
                op if fusible(op) && !reference_kernels => {
                    if absorbed[i] {
                        continue;
                    }
                    let mut g = GroupBuilder {
                        p,
                        absorbed: &absorbed,
                        relu_of: &relu_of,
                        relu_in: &relu_in,
                        nodes: Vec::new(),
                        inputs: Vec::new(),
                        memo: HashMap::new(),
                        broadcast_inputs: Vec::new(),
                    };
                    let root = g.node(i, true);
                    if root + 1 != g.nodes.len() {
                        g.push(Node::Convert(root), ins.ty.dtype);
                    }
                    if g.nodes.len() == 1 && matches!(g.nodes[0].0, Node::Input(_)) {
                        let src = g.inputs[0];
                        steps.push(step(Kind::Alias(src), vec![src], "alias", label));
                        continue;
                    }
                    // In program order (the memo is a hash map): one name per group in
                    // every run, so profiles of several runs line up.
                    let mut members: Vec<usize> = g
                        .memo
                        .keys()
                        .copied()
                        .filter(|&v| v == i || absorbed[v])
                        .collect();
                    members.sort_unstable();
                    let ops: Vec<&str> = members.iter().map(|&v| p.instrs[v].op.name()).collect();
                    let label = format!("fused[{}] %{i}", ops.len());
                    let inplace_ok = (0..g.inputs.len())
                        .map(|k| !g.broadcast_inputs.contains(&k))
                        .collect();
                    let f = Fused {
                        len: ins.ty.num_elements(),
                        nodes: g.nodes,
                        n_inputs: g.inputs.len(),
                    };
                    let mut s = step(
                        Kind::Fused {
                            f,
                            inputs: g.inputs.clone(),
                            inplace_ok,
                        },
                        g.inputs,
                        "fused",
                        label,
                    );
                    s.label = format!("{} ({})", s.label, ops.join(","));
                    steps.push(s);
                }
                op if generator(op) && !gen_materialise(i) => {}
                op if !reference_kernels && identity_op(p, i, op) => {
                    // Full-size slices, identity transposes/broadcasts, empty pads: aliases.
                    let src = operands[0];
                    steps.push(step(Kind::Alias(src), vec![src], "alias", label));
                }
                Op::DotGeneral(dd) if !reference_kernels => {
                    let mut plan = DotPlan::new(
                        &p.ty(ins.operands[0]).shape,
                        &p.ty(ins.operands[1]).shape,
                        dd,
                    );
                    // A transpose that is the only user (directly, or through collectives
                    // over groups of one, identities that only it reads: the partitioner
                    // leaves those on a one-device mesh): write the result in its layout.
                    let mut v = i;
                    let mut between = Vec::new();
                    let mut target = None;
                    while let ([c], false) = (consumers[v].as_slice(), is_output[v]) {
                        match &p.instrs[*c].op {
                            Op::Transpose { perm } => target = Some((*c, perm)),
                            op if op.is_collective() && trivial_collective(p, op) => {
                                between.push(*c);
                                v = *c;
                                continue;
                            }
                            _ => {}
                        }
                        break;
                    }
                    if let Some((c, perm)) = target {
                        plan.fuse_output_transpose(perm);
                        let label = format!("{label} +transpose %{c}");
                        pending_dot.insert(c, (plan, operands, label));
                        passed.extend(between);
                        continue;
                    }
                    // A dot whose only user is an all-reduce whose only user is a
                    // transpose (a weight's gradient summed over the devices, then laid
                    // out as the weight): the sum is elementwise, so the dot writes the
                    // transpose's layout, the all-reduce sums that, and the transpose is
                    // its result (no transposes after the sum, alone at the end of a
                    // step, one per device).
                    let summed = match (consumers[i].as_slice(), is_output[i]) {
                        (&[r], false)
                            if matches!(
                                p.instrs[r].op.collective_kind(),
                                Some(CollectiveKind::AllReduce { .. })
                            ) =>
                        {
                            match (consumers[r].as_slice(), is_output[r]) {
                                (&[c], false) => match &p.instrs[c].op {
                                    Op::Transpose { perm } => Some((c, perm)),
                                    _ => None,
                                },
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    if let Some((c, perm)) = summed {
                        plan.fuse_output_transpose(perm);
                        reduced_transposed.push(c);
                        let label = format!("{label} +transpose %{c} (before the sum)");
                        steps.push(step(Kind::Dot(Box::new(plan)), operands, "dot", label));
                        continue;
                    }
                    steps.push(step(Kind::Dot(Box::new(plan)), operands, "dot", label));
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
                | Op::DotGeneral(_)
                | Op::Conv { .. }
                | Op::Reverse { .. }
                | Op::Cumsum { .. }
                | Op::Argmax { .. }
                | Op::Gather { .. }
                | Op::ScatterAdd { .. }
                | Op::Rng { .. }
                | Op::Collective(_) => steps.push(step(Kind::Kernel, operands, "kernel", label)),
            }
        }
        if !reference_kernels {
            mask_dots(p, &mut steps);
            sum_masked_dots(p, &mut steps);
            fuse_dot_epilogues(p, &mut steps);
            sum_products(p, &mut steps);
            indicator_dots(p, &mut steps);
        }
        let mut steps = coalesce_collectives(p, steps);
        // A dot whose result is a program output that no step reads (a weight's gradient)
        // streams it to memory ([`DotPlan::stream_output`]). In-process A/B on the small
        // MoE layer (1 MiB of such results per device: the up-projection's weight
        // gradient; the down-projection's runs on the row-sparse path, which does not
        // stream): 1.002-1.005 at 8 devices, 1.005 at 1; the large shape no different.
        let read: std::collections::HashSet<usize> =
            steps.iter().flat_map(|s| s.reads.iter().copied()).collect();
        for s in &mut steps {
            if let Kind::Dot(plan) = &mut s.kind {
                if is_output[s.instr] && !read.contains(&s.instr) {
                    plan.stream_output();
                }
            }
        }
        // Buffer classes and liveness (of the reordered steps).
        let mut class: Vec<usize> = (0..n).collect();
        for s in &steps {
            if let Kind::Alias(src) = s.kind {
                class[s.instr] = class[src];
            }
        }
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); n];
        for s in &steps {
            for v in std::iter::once(s.instr).chain(s.also) {
                members[class[v]].push(v);
            }
        }
        let mut last_read: Vec<usize> = vec![0; n];
        for (si, s) in steps.iter().enumerate() {
            for v in std::iter::once(s.instr).chain(s.also) {
                last_read[class[v]] = last_read[class[v]].max(si);
            }
            for &r in &s.reads {
                last_read[class[r]] = last_read[class[r]].max(si);
            }
        }
        for (_, v) in &p.outputs {
            last_read[class[v.index()]] = usize::MAX;
        }
        for c in 0..n {
            if class[c] == c && !members[c].is_empty() && last_read[c] != usize::MAX {
                steps[last_read[c]].frees.push(c);
            }
        }
        let support_of = same_supports(p, &steps, &class);
        let mut eager_support = vec![false; n];
        for s in &steps {
            if let Kind::MaskedDotSums { terms, .. } = &s.kind {
                for &(mask, _) in terms {
                    eager_support[mask] = f32_value(p, mask);
                }
            }
        }
        // A mask with an eager support whose readers after some step are only summed
        // masked dots (the gating masks, read in the forward pass by the combine weights'
        // group and in the backward one by the sums of their gradient) is released after
        // that step when its support was found: the sums read the support alone, and its
        // buffer goes back to the pool while in cache (the small MoE layer's two masks,
        // 512 KiB per device, were otherwise held from the forward pass to the backward).
        // In-process A/B on the small layer: 1.0047 and 1.0033 at 8 devices, 1.0075 at 1;
        // resident bytes per device 7.88 -> 7.38 MiB (the peak comes earlier in the step).
        let mut last_dense: Vec<usize> = vec![0; n];
        // The first plain dot reading each class: where a sparse product may find its
        // support, before which nothing is released.
        let mut first_dot: Vec<usize> = vec![usize::MAX; n];
        for (si, s) in steps.iter().enumerate() {
            if matches!(s.kind, Kind::Dot(_)) {
                for &r in s.reads.iter().take(2) {
                    first_dot[class[r]] = first_dot[class[r]].min(si);
                }
            }
            for v in std::iter::once(s.instr).chain(s.also) {
                last_dense[class[v]] = last_dense[class[v]].max(si);
            }
            let sums = matches!(s.kind, Kind::MaskedDotSums { .. });
            // A plain dot lists an operand's terms from its support and rebuilds it from
            // the support where its path reads it densely ([`DotCall::run`]).
            let plain = matches!(s.kind, Kind::Dot(_));
            for (q, &r) in s.reads.iter().enumerate() {
                let only_mask =
                    sums && q >= 2 && s.reads[..2].iter().all(|&x| class[x] != class[r]);
                let dot_operand = plain && q < 2;
                if !only_mask && !dot_operand {
                    last_dense[class[r]] = last_dense[class[r]].max(si);
                }
            }
        }
        // Also any other f32 value whose later readers are plain dots, released where a
        // sparse product found its support on it (the MoE combine weights, read in the
        // backward pass by their own gradient's dot and, as an indicator, by the dispatch
        // gradient's): its support may be found by a plain dot up to its last other reader.
        let mut by_support = eager_support.clone();
        for (v, b) in by_support.iter_mut().enumerate() {
            *b |= class[v] == v
                && support_of[v] == v
                && f32_value(p, v)
                && first_dot[v] <= last_dense[v];
        }
        for v in 0..n {
            let c = class[v];
            if by_support[v]
                && last_read[c] != usize::MAX
                && last_dense[c] < last_read[c]
                && !steps[last_dense[c]]
                    .frees_sparse
                    .iter()
                    .any(|&(x, _)| x == c)
            {
                steps[last_dense[c]].frees_sparse.push((c, support_of[v]));
            }
        }
        let mut segments = Vec::new();
        let mut start = 0;
        for (si, s) in steps.iter().enumerate() {
            if matches!(s.kind, Kind::Collective { .. }) {
                if start < si {
                    segments.push(Segment::Local(start..si));
                }
                segments.push(Segment::Collective(si));
                start = si + 1;
            }
        }
        if start < steps.len() {
            segments.push(Segment::Local(start..steps.len()));
        }
        // All-to-alls whose (large) operand exists when the local segment before their round
        // ends: with devices sharing memory, each sender places its blocks in the
        // receivers' results as its task ends, while the other tasks still run, instead of
        // all devices waiting for a copy pass after the barrier.
        let made_at: HashMap<usize, usize> = steps
            .iter()
            .enumerate()
            .flat_map(|(si, s)| std::iter::once((s.instr, si)).chain(s.also.map(|v| (v, si))))
            .collect();
        let sends: Vec<Vec<usize>> = segments
            .iter()
            .enumerate()
            .map(|(k, seg)| {
                let Segment::Local(range) = seg else {
                    return Vec::new();
                };
                segments[k + 1..]
                    .iter()
                    .map_while(|s| match s {
                        Segment::Collective(si) => Some(*si),
                        Segment::Local(_) => None,
                    })
                    .filter(|&si| {
                        let s = &steps[si];
                        let v = s.reads[0];
                        matches!(
                            p.instrs[s.instr].op.collective_kind(),
                            Some(CollectiveKind::AllToAll { .. })
                        ) && p.instrs[v].ty.num_elements() >= SMALL_COLLECTIVE
                            && made_at.get(&v).is_some_and(|&at| at < range.end)
                    })
                    .collect()
            })
            .collect();
        // A dot followed by a dot (the same segment: only collectives end one): the first
        // one's last GEMM fetches the second one's first-entry operands.
        let is_dot = |s: &Step| matches!(s.kind, Kind::Dot(_) | Kind::DotFused { .. });
        let then: Vec<Option<usize>> = (0..steps.len())
            .map(|si| {
                let next = si + 1;
                (next < steps.len() && is_dot(&steps[si]) && is_dot(&steps[next])).then_some(next)
            })
            .collect();
        Ok(Executable {
            program: p.clone(),
            steps,
            then,
            coded_relus: relu_of.len(),
            segments,
            sends,
            class,
            members,
            last_read,
            support_of,
            eager_support,
            pools: Mutex::new(Vec::new()),
            reference_kernels,
        })
    }

    /// Rounds of collectives per run: runs of collectives with no local steps between them
    /// (each round is one barrier across the device tasks; see [`coalesce_collectives`]).
    pub fn collective_rounds(&self) -> usize {
        let mut rounds = 0;
        let mut prev_collective = false;
        for seg in &self.segments {
            let c = matches!(seg, Segment::Collective(_));
            rounds += usize::from(c && !prev_collective);
            prev_collective = c;
        }
        rounds
    }

    /// The prepared program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Number of steps (kernels, fused groups, aliases, collectives, parameters).
    pub fn num_steps(&self) -> usize {
        self.steps.len()
    }

    /// Number of ReLUs whose pre-activation is read back from their coded result instead of
    /// being kept (see the module docs).
    pub fn coded_relus(&self) -> usize {
        self.coded_relus
    }

    /// Number of values that share another buffer's support (`convert(x != 0)` groups; see
    /// [`kernels::dot::Support`]).
    pub fn shared_supports(&self) -> usize {
        (0..self.class.len())
            .filter(|&v| self.support_of[v] != self.class[v])
            .count()
    }

    /// Number of values released before their last reader when a run finds their support
    /// (their later readers are summed masked dots or plain dots; see the module docs).
    pub fn sparse_releases(&self) -> usize {
        self.steps.iter().map(|s| s.frees_sparse.len()).sum()
    }

    /// Number of dot operands read as indicators, `convert(x != 0)` computed by no step
    /// ([`DotPlan::read_indicator`]).
    pub fn indicator_reads(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match &s.kind {
                Kind::Dot(plan) => plan.indicators().iter().filter(|&&b| b).count(),
                _ => 0,
            })
            .sum()
    }

    /// Number of fused groups and of instructions folded into them.
    pub fn fusion_stats(&self) -> (usize, usize) {
        let mut groups = 0;
        let mut ops = 0;
        for s in &self.steps {
            if let Kind::Fused { f, .. } | Kind::DotFused { f, .. } = &s.kind {
                groups += 1;
                ops += f.ops();
            }
        }
        (groups, ops)
    }

    /// Run on the local devices of `comm`; `inputs[j]` feeds `comm.local_positions()[j]`
    /// (copied into device buffers). Events go to `profiler` if given.
    pub fn run(
        &self,
        comm: &dyn Communicator,
        inputs: &[HashMap<String, HostTensor>],
        profiler: Option<&Profiler>,
    ) -> Result<RunResult, ExecError> {
        let shared: Vec<HashMap<String, Arc<HostTensor>>> = inputs
            .iter()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), Arc::new(v.clone())))
                    .collect()
            })
            .collect();
        self.run_shared(comm, &shared, profiler)
    }

    /// [`Executable::run`] with inputs shared, not copied (repeated steps on resident data).
    pub fn run_shared(
        &self,
        comm: &dyn Communicator,
        inputs: &[HashMap<String, Arc<HostTensor>>],
        profiler: Option<&Profiler>,
    ) -> Result<RunResult, ExecError> {
        let positions = comm.local_positions();
        if inputs.len() != positions.len() {
            return Err(ExecError::DeviceCount {
                want: positions.len(),
                got: inputs.len(),
            });
        }
        let mut pools = std::mem::take(&mut *self.pools.lock().unwrap_or_else(|e| e.into_inner()));
        pools.resize_with(positions.len(), Pool::default);
        let mut devs: Vec<Dev> = positions
            .iter()
            .zip(pools)
            .zip(inputs)
            .map(|((&pos, pool), inputs)| Dev {
                pos,
                vals: vec![None; self.program.instrs.len()],
                pool,
                live: 0,
                peak: 0,
                resident: 0,
                events: Vec::new(),
                inputs,
                profiler,
                error_device: (self.program.mesh.is_some()).then_some(pos),
                supports: HashMap::new(),
            })
            .collect();
        let mut stats: Vec<CollectiveStat> = Vec::new();
        // The segments run on a worker of the rayon pool, not on the calling thread: every
        // parallel loop below (the device tasks of a segment, a collective's copies) is then
        // pushed to that worker's own queue, where the other workers steal it while they
        // are still spinning, instead of being injected from outside the pool and waking
        // sleeping workers (two dozen such hand-offs per MoE layer cost ~3 % of the small
        // layer's 23 ms step on 8 devices, 2 cores). No worker blocks on another: a
        // collective runs between segments, on this one task.
        let shared = comm.shared_memory() && !self.reference_kernels;
        // The pool's other threads stay awake through the run (`keep_awake`) when the
        // devices share this process: a thread with nothing to do would otherwise fall
        // asleep within tens of microseconds, at every segment's end, and the next
        // segment's tasks would reach it only after a futex wake-up.
        let running = Arc::new(AtomicBool::new(true));
        let awake = shared && rayon::current_num_threads() > 1;
        let result: Result<(), ExecError> = rayon::scope(|_| {
            // The run ends (`running` false) however the segments end, a panic included.
            let _end = RunEnd(running.clone());
            if awake {
                // Not tied to the scope: the run never waits for a thread to take its job
                // (one blocked outside rayon never would); a job taken after the run sees
                // it ended and returns.
                let leader = rayon::current_thread_index();
                let running = running.clone();
                rayon::spawn_broadcast(move |ctx| {
                    if Some(ctx.index()) != leader {
                        keep_awake(&running);
                    }
                });
            }
            self.run_segments(&mut devs, comm, profiler, &positions, &mut stats, shared)
        });
        let peak = devs.iter().map(|d| d.peak).max().unwrap_or(0);
        let resident = devs.iter().map(|d| d.resident).max().unwrap_or(0);
        let mut outputs = Vec::with_capacity(devs.len());
        let mut pools = Vec::with_capacity(devs.len());
        for mut d in devs {
            if let Some(p) = profiler {
                p.record(std::mem::take(&mut d.events));
            }
            if result.is_ok() {
                let bufs: Vec<(String, usize, Buf)> = self
                    .program
                    .outputs
                    .iter()
                    .map(|(name, v)| {
                        let buf = d.vals[v.index()].clone().expect("outputs are kept");
                        (name.clone(), v.index(), buf)
                    })
                    .collect();
                d.vals.clear();
                let mut m = HashMap::new();
                for (name, v, buf) in bufs {
                    let data = match buf {
                        Buf::Own(a) => Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()),
                        Buf::Input(t) => t.data.clone(),
                    };
                    let ty = self.program.instrs[v].ty.clone();
                    m.insert(name, HostTensor { ty, data });
                }
                outputs.push(m);
            }
            pools.push(d.pool);
        }
        *self.pools.lock().unwrap_or_else(|e| e.into_inner()) = pools;
        result?;
        Ok(RunResult {
            outputs,
            peak_bytes_per_device: peak,
            peak_resident_bytes_per_device: resident,
            collective_bytes: stats.iter().map(|s| s.bytes).sum(),
            collectives: stats,
        })
    }

    /// Run the segments in order on the devices `devs` (see [`Executable::run_shared`]).
    fn run_segments(
        &self,
        devs: &mut [Dev],
        comm: &dyn Communicator,
        profiler: Option<&Profiler>,
        positions: &[usize],
        stats: &mut Vec<CollectiveStat>,
        shared: bool,
    ) -> Result<(), ExecError> {
        // Results of all-to-alls placed by their senders, until their round.
        let mut placed: HashMap<usize, Vec<Data>> = HashMap::new();
        for (k, seg) in self.segments.iter().enumerate() {
            match seg {
                Segment::Local(range) => {
                    let sends = if shared { &self.sends[k][..] } else { &[] };
                    let mut sinks = Vec::with_capacity(sends.len());
                    for &si in sends {
                        let v = self.steps[si].instr;
                        let n = self.mesh_of(si)?.0.num_devices();
                        let mut bufs: Vec<Data> = devs
                            .iter_mut()
                            .map(|d| d.alloc(self, v))
                            .collect::<Result<_, _>>()?;
                        let ptrs = Sinks::new(n, positions, &mut bufs);
                        placed.insert(si, bufs);
                        sinks.push((si, ptrs));
                    }
                    // One task per device (rayon would otherwise run runs of
                    // neighbouring devices as one sequential task, which a thread left
                    // idle at the segment's end cannot split).
                    // With several devices here, a task that ends keeps its thread busy
                    // until the segment's last one ends ([`DeviceTask::end`]).
                    let left = AtomicUsize::new(devs.len());
                    let wait = shared && devs.len() > 1 && rayon::current_num_threads() > 1;
                    let errs: Vec<Result<(), ExecError>> = devs
                        .par_iter_mut()
                        .with_max_len(1)
                        .map(|d| {
                            let task = DeviceTask::start(&left);
                            let r = (|| {
                                for si in range.clone() {
                                    d.step(self, si)?;
                                }
                                for (si, ptrs) in &sinks {
                                    d.send(self, *si, ptrs)?;
                                }
                                Ok(())
                            })();
                            task.end(wait);
                            r
                        })
                        .collect();
                    if let Some(e) = errs.into_iter().find(|r| r.is_err()) {
                        return e;
                    }
                }
                Segment::Collective(si) => match placed.remove(si) {
                    Some(bufs) => self.placed(devs, *si, bufs, profiler, stats)?,
                    None => self.collective(devs, *si, comm, profiler, stats)?,
                },
            }
        }
        Ok(())
    }

    /// Give the buffers of a run's outputs back to the device pools (for repeated steps:
    /// the next run reuses them instead of faulting in fresh pages).
    pub fn recycle(&self, outputs: Vec<HashMap<String, HostTensor>>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for (j, m) in outputs.into_iter().enumerate() {
            let Some(pool) = pools.get_mut(j) else { break };
            let cap = pool.cap;
            for (_, t) in m {
                pool.give(t.data, cap);
            }
        }
    }

    /// Finish all-to-all step `si` whose senders placed their blocks in `bufs` (one per
    /// device, in `devs` order; see [`Dev::send`]): the results become the step's values.
    fn placed(
        &self,
        devs: &mut [Dev],
        si: usize,
        bufs: Vec<Data>,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let s = &self.steps[si];
        let ins = &self.program.instrs[s.instr];
        let operand_ty = &self.program.instrs[s.reads[0]].ty;
        let (_, k) = self.mesh_of(si)?;
        let sent = wire_bytes(&ins.op, operand_ty, k);
        self.count(stats, ins, sent * devs.len());
        let t = profiler.map(|p| p.now_us());
        for (d, data) in devs.iter_mut().zip(bufs) {
            // Live since the segment before (allocated there).
            d.vals[s.instr] = Some(Buf::Own(Arc::new(data)));
            if let Some(t) = t {
                d.events.push(TraceEvent {
                    device: d.pos,
                    name: s.label.clone(),
                    cat: "collective",
                    ts_us: t,
                    dur_us: 0.0,
                    flops: 0.0,
                    bytes: sent,
                    detail: format!("{operand_ty} over {k} devices, placed by the senders"),
                });
            }
            d.release(self, si);
        }
        Ok(())
    }

    /// The mesh collective step `si` runs over, and the size `k` of its groups.
    fn mesh_of(&self, si: usize) -> Result<(&Mesh, usize), ExecError> {
        let ins = &self.program.instrs[self.steps[si].instr];
        let mesh = self
            .program
            .mesh
            .as_ref()
            .ok_or_else(|| RuntimeError::NoMesh {
                index: self.steps[si].instr,
                op: ins.op.name().into(),
            })?;
        Ok((mesh, mesh.size_of(ins.op.collective_axes().unwrap_or(&[]))))
    }

    /// Add `bytes` sent by one run of collective `ins` to `stats`.
    fn count(&self, stats: &mut Vec<CollectiveStat>, ins: &Instr, bytes: usize) {
        match stats.iter_mut().find(|c| c.kind == ins.op.name()) {
            Some(c) => {
                c.count += 1;
                c.bytes += bytes;
            }
            None => stats.push(CollectiveStat {
                kind: ins.op.name(),
                count: 1,
                bytes,
            }),
        }
    }

    fn collective(
        &self,
        devs: &mut [Dev],
        si: usize,
        comm: &dyn Communicator,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let s = &self.steps[si];
        let ins = &self.program.instrs[s.instr];
        let (mesh, k) = self.mesh_of(si)?;
        let v = s.reads[0];
        let operand_ty = self.program.instrs[v].ty.clone();
        let t0 = profiler.map(|p| p.now_us());
        // Operands that die here move into the collective; others are copied.
        let c = self.class[v];
        let dies = self.last_read[c] == si && self.members[c].len() == 1;
        let mut moved = vec![0usize; devs.len()];
        let take = |(d, moved): (&mut Dev, &mut usize)| -> Result<HostTensor, ExecError> {
            let data = match d.vals[v].take() {
                Some(Buf::Own(a)) if dies => match Arc::try_unwrap(a) {
                    Ok(data) => {
                        *moved = bytes(&data);
                        data
                    }
                    Err(a) => {
                        let data = d.copy_of(self, v, &a);
                        d.vals[v] = Some(Buf::Own(a));
                        data?
                    }
                },
                Some(b) => {
                    let data = d.copy_of(self, v, b.data());
                    d.vals[v] = Some(b);
                    data?
                }
                None => unreachable!("operands are live"),
            };
            Ok(HostTensor {
                ty: operand_ty.clone(),
                data,
            })
        };
        // Small operands (a loss, a norm) are gathered on this thread: handing a few bytes
        // to the pool costs more than copying them.
        let local: Vec<HostTensor> = if operand_ty.num_elements() < SMALL_COLLECTIVE {
            devs.iter_mut()
                .zip(moved.iter_mut())
                .map(take)
                .collect::<Result<_, _>>()?
        } else {
            devs.par_iter_mut()
                .zip(moved.par_iter_mut())
                .map(take)
                .collect::<Result<_, _>>()?
        };
        let out = if self.reference_kernels {
            crate::reference::collective_on_hosts(&ins.op, mesh, &local).ok_or_else(|| {
                CommError::Failed {
                    index: s.instr,
                    op: ins.op.name().into(),
                    msg: "not a collective".into(),
                }
            })?
        } else {
            match &s.kind {
                Kind::Collective {
                    out_perm: Some(perm),
                } => comm.collective_transposed(s.instr, &ins.op, mesh, local, perm)?,
                _ => comm.collective(s.instr, &ins.op, mesh, local)?,
            }
        };
        let sent = wire_bytes(&ins.op, &operand_ty, k);
        self.count(stats, ins, sent * devs.len());
        let t1 = profiler.map(|p| p.now_us());
        for ((d, t), moved) in devs.iter_mut().zip(out).zip(moved) {
            d.add_live(bytes(&t.data));
            // The moved operand was live until the results existed.
            d.live -= moved;
            d.vals[s.instr] = Some(Buf::Own(Arc::new(t.data)));
            if let (Some(t0), Some(t1)) = (t0, t1) {
                d.events.push(TraceEvent {
                    device: d.pos,
                    name: s.label.clone(),
                    cat: "collective",
                    ts_us: t0,
                    dur_us: t1 - t0,
                    flops: 0.0,
                    bytes: sent,
                    detail: format!("{operand_ty} over {k} devices"),
                });
            }
            d.release(self, si);
        }
        Ok(())
    }
}

thread_local! {
    /// Device tasks in progress on this thread (one inside another when a task waiting on
    /// its kernels' parallel parts ran another device's task).
    static TASKS_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// This thread is inside [`busy_until`]: a task it runs there does not wait again.
    static BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks a run ended when dropped.
struct RunEnd(Arc<AtomicBool>);

impl Drop for RunEnd {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A device's task within a segment: counts the segment's unfinished tasks down when it
/// ends, unwinding included.
struct DeviceTask<'a> {
    left: &'a AtomicUsize,
}

impl Drop for DeviceTask<'_> {
    fn drop(&mut self) {
        TASKS_HERE.with(|c| c.set(c.get() - 1));
        self.left.fetch_sub(1, Ordering::Release);
    }
}

impl<'a> DeviceTask<'a> {
    fn start(left: &'a AtomicUsize) -> DeviceTask<'a> {
        TASKS_HERE.with(|c| c.set(c.get() + 1));
        DeviceTask { left }
    }

    /// End the task; with `wait`, and no other device task in progress beneath this one on
    /// this thread, keep the thread busy until the segment's last task ends ([`busy_until`],
    /// at most [`TASK_WAIT`]): a thread that went idle in rayon instead would fall asleep
    /// after a few dozen microseconds and wake up only after a futex round trip when the
    /// segment ends.
    fn end(self, wait: bool) {
        let left = self.left;
        drop(self);
        if wait && TASKS_HERE.with(|c| c.get()) == 0 {
            busy_until(|| left.load(Ordering::Acquire) == 0, TASK_WAIT);
        }
    }
}

/// How long a thread waits with nothing to run before [`busy_until`] gives up.
const BUSY_IDLE: std::time::Duration = std::time::Duration::from_micros(300);
/// The longest a device task that ended waits for its segment's others.
const TASK_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// The longest a pool thread stays awake for one run ([`keep_awake`]).
const RUN_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Keep this pool thread busy until `done()`: run the pool's pending work (other devices'
/// tasks, the parallel parts of their kernels) or spin. A waiting thread may sit on top of
/// unfinished work that `done` waits for (a task it took while waiting inside a kernel's
/// parallel loop), so every wait ends by itself: after [`BUSY_IDLE`] without anything to
/// run, and after `most` in all. Waits do not nest (a task run inside one does not wait
/// again on top of it: a thread handling thousands of devices would otherwise nest a
/// frame per task and overflow its stack).
fn busy_until(done: impl Fn() -> bool, most: std::time::Duration) {
    if BUSY.with(|b| b.replace(true)) {
        return;
    }
    // Clears the flag however the wait ends (a job run here may panic).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            BUSY.with(|b| b.set(false));
        }
    }
    let _clear = Clear;
    let start = std::time::Instant::now();
    let mut idle_since: Option<std::time::Instant> = None;
    while !done() {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle_since = None;
            if start.elapsed() > most {
                return;
            }
        } else if idle_since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
            > BUSY_IDLE
            || start.elapsed() > most
        {
            return;
        } else {
            // A pause between polls (each poll reads the other threads' queues, which
            // their owners write).
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

/// A pool thread's part in a run of in-process devices ([`Executable::run_shared`]): take
/// device tasks and kernel parts as they appear, through the segments and the collectives
/// between them, until the run ends (or nothing comes for [`BUSY_IDLE`], or after
/// [`RUN_WAIT`]: a long run's barriers cost it little). Taken inside a device task (a
/// concurrent run's job, found while waiting in a kernel), it returns at once.
fn keep_awake(running: &AtomicBool) {
    if TASKS_HERE.with(|c| c.get()) == 0 {
        busy_until(|| !running.load(Ordering::Acquire), RUN_WAIT);
    }
}

/// One device's state during a run.
struct Dev<'a> {
    pos: usize,
    vals: Vec<Option<Buf>>,
    pool: Pool,
    live: usize,
    peak: usize,
    resident: usize,
    events: Vec<TraceEvent>,
    inputs: &'a HashMap<String, Arc<HostTensor>>,
    profiler: Option<&'a Profiler>,
    error_device: Option<usize>,
    /// Supports found in this run, by [`Executable::support_of`] key (`None`: dense), and
    /// the buffer class each was found on.
    supports: HashMap<usize, (Option<Support>, usize)>,
}

impl Dev<'_> {
    fn add_live(&mut self, b: usize) {
        self.live += b;
        self.peak = self.peak.max(self.live);
        self.resident = self.resident.max(self.live + self.pool.bytes);
    }

    fn data(&self, v: usize) -> &Data {
        self.vals[v].as_ref().expect("operands are live").data()
    }

    /// Release the buffer classes whose last reader is step `si`, and the values whose
    /// remaining readers take them by their support where this run found it
    /// ([`Step::frees_sparse`]; a value found dense, or not scanned, stays until its last
    /// reader).
    fn release(&mut self, exe: &Executable, si: usize) {
        for &c in &exe.steps[si].frees {
            self.free_class(exe, c);
        }
        for &(c, key) in &exe.steps[si].frees_sparse {
            if matches!(self.supports.get(&key), Some((Some(_), scanned)) if *scanned == c) {
                self.free_class(exe, c);
            }
        }
    }

    /// Drop buffer class `c` (its root and aliases) and give its buffer to the pool when
    /// nothing else holds it (nothing, if it is released already).
    fn free_class(&mut self, exe: &Executable, c: usize) {
        let buf = self.vals[c].take();
        for &m in &exe.members[c] {
            self.vals[m] = None;
        }
        let Some(buf) = buf else { return };
        let b = bytes(buf.data());
        self.live -= b;
        if let Buf::Own(a) = buf {
            if let Ok(d) = Arc::try_unwrap(a) {
                self.recycle(d);
            }
        }
    }

    /// Keep a buffer nothing holds any more for reuse (within the pool's cap: the peak).
    fn recycle(&mut self, d: Data) {
        self.pool.cap = self.pool.cap.max(self.peak);
        let cap = self.pool.cap;
        self.pool.give(d, cap);
    }

    /// A copy of `x` (value `v`) in a pooled buffer (a fresh one costs a page fault per 4 KiB).
    fn copy_of(&mut self, exe: &Executable, v: usize, x: &Data) -> Result<Data, ExecError> {
        let mut d = self
            .pool
            .take(x.dtype(), x.len())
            .map_err(|e| self.out_of_memory(exe, v, e))?;
        match (&mut d, x) {
            (Data::F32(o), Data::F32(i)) => o.copy_from_slice(i),
            (Data::F64(o), Data::F64(i)) => o.copy_from_slice(i),
            (Data::BF16(o), Data::BF16(i)) => o.copy_from_slice(i),
            (Data::I32(o), Data::I32(i)) => o.copy_from_slice(i),
            (Data::Bool(o), Data::Bool(i)) => o.copy_from_slice(i),
            _ => unreachable!("the pool returns the requested dtype"),
        }
        Ok(d)
    }

    /// A buffer for value `v` (from the pool, else fresh), or the error naming `v` when
    /// the machine cannot hold it.
    fn alloc(&mut self, exe: &Executable, v: usize) -> Result<Data, ExecError> {
        let ty = &exe.program.instrs[v].ty;
        let d = self
            .pool
            .take(ty.dtype, ty.num_elements())
            .map_err(|e| self.out_of_memory(exe, v, e))?;
        self.add_live(bytes(&d));
        Ok(d)
    }

    fn out_of_memory(&self, exe: &Executable, v: usize, e: AllocError) -> ExecError {
        let ty = &exe.program.instrs[v].ty;
        RuntimeError::out_of_memory(e, v, ty, Some(self.pos)).into()
    }

    /// Return a buffer from [`Dev::alloc`] that no value holds (a step's scratch).
    fn free_temp(&mut self, d: Data) {
        self.live -= bytes(&d);
        self.recycle(d);
    }

    /// The spans of the first-entry operands of the dot that runs after step `si` (for its
    /// last GEMM to fetch), where that dot reads f32 operands that exist already.
    fn tail(&self, exe: &Executable, si: usize) -> [(usize, usize); 2] {
        let Some(sj) = exe.then[si] else {
            return NO_TAIL;
        };
        let s = &exe.steps[sj];
        let plan = match &s.kind {
            Kind::Dot(plan) | Kind::DotFused { plan, .. } => plan,
            _ => return NO_TAIL,
        };
        // A missing operand (written by step `si` itself, say) reads as empty: no span.
        let f32s = |v: usize| match self.vals[v].as_ref().map(|b| b.data()) {
            Some(Data::F32(x)) => x.as_slice(),
            _ => &[],
        };
        plan.first_entry_spans(f32s(s.reads[0]), f32s(s.reads[1]))
    }

    /// Place this device's blocks of all-to-all step `si` (its operand exists) into every
    /// receiver's result (`sinks`), as the senders' half of [`Executable::placed`].
    fn send(&mut self, exe: &Executable, si: usize, sinks: &Sinks) -> Result<(), ExecError> {
        let s = &exe.steps[si];
        let ins = &exe.program.instrs[s.instr];
        let v = s.reads[0];
        let perm = match &s.kind {
            Kind::Collective { out_perm } => out_perm.as_deref(),
            _ => None,
        };
        let (mesh, k) = exe.mesh_of(si)?;
        let t0 = self.profiler.map(|p| p.now_us());
        let shape = &exe.program.instrs[v].ty.shape;
        // SAFETY: `sinks` address the buffers `run_shared` allocated for this step's results
        // (its dtype and size), which nothing else touches until every task has ended.
        unsafe { place_all_to_all(&ins.op, mesh, shape, perm, self.pos, self.data(v), sinks) }
            .map_err(|msg| CommError::Failed {
                index: s.instr,
                op: ins.op.name().into(),
                msg,
            })?;
        if let (Some(p), Some(t0)) = (self.profiler, t0) {
            let ty = &exe.program.instrs[v].ty;
            self.events.push(TraceEvent {
                device: self.pos,
                name: format!("{} (send)", s.label),
                cat: "send",
                ts_us: t0,
                dur_us: p.now_us() - t0,
                flops: 0.0,
                bytes: wire_bytes(&ins.op, ty, k),
                detail: format!("{ty}: this device's blocks placed in the {k} receivers' results"),
            });
        }
        Ok(())
    }

    /// Run dot `plan` on values `l` and `r` into `out`: its flops and profile detail.
    #[allow(clippy::too_many_arguments)]
    fn run_dot(
        &mut self,
        exe: &Executable,
        plan: &DotPlan,
        l: usize,
        r: usize,
        out: &mut Data,
        tail: &[(usize, usize); 2],
    ) -> (f64, String) {
        // An operand a sparse path may list: its support, found once per run and shared by
        // every product reading it (or the same non-zeros). The pass reads the buffer the
        // key names where it is live (a combine weight, whose values the products need),
        // else this operand.
        for v in [l, r] {
            let key = exe.support_of[v];
            if self.supports.contains_key(&key) {
                continue;
            }
            let len = self.data(v).len();
            let src = match &self.vals[key] {
                Some(b) if b.data().len() == len => key,
                _ => v,
            };
            let sup = match self.data(src) {
                Data::F32(x) if plan.sparse_worth(x.len()) => Support::of(x),
                Data::F64(x) if plan.sparse_worth(x.len()) => Support::of(x),
                _ => continue,
            };
            self.supports.insert(key, (sup, exe.class[src]));
        }
        let known = [l, r].map(|v| match self.supports.get(&exe.support_of[v]) {
            None => Known::Unknown,
            Some((None, _)) => Known::Dense,
            Some((Some(sup), scanned)) => {
                let vals = if exe.class[v] == *scanned {
                    Values::Scanned
                } else if exe.class[v] != exe.support_of[v] {
                    Values::Ones
                } else {
                    Values::Read
                };
                Known::Sparse(sup, vals)
            }
        });
        // An operand released early ([`Step::frees_sparse`]) is given by its support alone.
        let empty = Data::F32(Vec::new());
        let data = |v: usize| self.vals[v].as_ref().map_or(&empty, Buf::data);
        let lhs = Operand::new(&exe.program.instrs[l].ty.shape, data(l));
        let rhs = Operand::new(&exe.program.instrs[r].ty.shape, data(r));
        let call = DotCall {
            tail: *tail,
            known,
            ..DotCall::new(plan, lhs, rhs)
        };
        let path = call.run(out);
        let copied = match plan.copies(path) {
            (false, false) => "",
            (true, false) => " (lhs copied)",
            (false, true) => " (rhs copied)",
            (true, true) => " (both copied)",
        };
        let gemm = if path == DotPath::Dense { "gemm " } else { "" };
        let indicator = match plan.indicator_copies(path) {
            (false, false) => "",
            (true, false) => " (lhs indicator copied)",
            (false, true) => " (rhs indicator copied)",
            (true, true) => " (both indicators copied)",
        };
        let detail = format!(
            "{gemm}{path:?} B={} M={} N={} K={}{copied}{indicator}",
            plan.b, plan.m, plan.n, plan.k
        );
        (plan.flops(), detail)
    }

    fn step(&mut self, exe: &Executable, si: usize) -> Result<(), ExecError> {
        let s = &exe.steps[si];
        let ins = &exe.program.instrs[s.instr];
        let t0 = self.profiler.map(|p| p.now_us());
        let mut detail = String::new();
        let mut flops = 0.0;
        match &s.kind {
            Kind::Param(name) => {
                let t = self.param(name, &ins.ty)?;
                self.add_live(bytes(&t.data));
                self.vals[s.instr] = Some(Buf::Input(t));
            }
            Kind::PartitionId => {
                self.add_live(4);
                self.vals[s.instr] = Some(Buf::Own(Arc::new(Data::I32(vec![self.pos as i32]))));
            }
            Kind::Alias(src) => self.vals[s.instr] = self.vals[*src].clone(),
            Kind::Move(src) => self.vals[s.instr] = self.vals[*src].take(),
            Kind::Fused {
                f,
                inputs,
                inplace_ok,
            } => {
                // Write in place over an input that dies here, if one fits.
                let target = inputs.iter().enumerate().position(|(k, &v)| {
                    let c = exe.class[v];
                    inplace_ok[k]
                        && exe.last_read[c] == si
                        && exe.members[c].len() == 1
                        && matches!(&self.vals[v], Some(Buf::Own(a)) if Arc::strong_count(a) == 1)
                        && exe.program.instrs[v].ty == ins.ty
                });
                let mut out = match target {
                    Some(k) => {
                        let v = inputs[k];
                        let Some(Buf::Own(a)) = self.vals[v].take() else {
                            unreachable!("checked above")
                        };
                        detail = "in place".into();
                        Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone())
                    }
                    None => self.alloc(exe, s.instr)?,
                };
                {
                    let empty = Data::Bool(Vec::new());
                    let ins_data: Vec<&Data> = inputs
                        .iter()
                        .enumerate()
                        .map(|(k, &v)| {
                            if Some(k) == target {
                                &empty
                            } else {
                                self.data(v)
                            }
                        })
                        .collect();
                    run_fused_inplace(f, &ins_data, &mut out, target);
                }
                self.vals[s.instr] = Some(Buf::Own(Arc::new(out)));
            }
            Kind::Dot(plan) => {
                let mut out = self.alloc(exe, s.instr)?;
                let tail = self.tail(exe, si);
                (flops, detail) = self.run_dot(exe, plan, s.reads[0], s.reads[1], &mut out, &tail);
                self.vals[s.instr] = Some(Buf::Own(Arc::new(out)));
            }
            Kind::MaskedDot { plan, masks } => {
                let mut out = self.alloc(exe, s.instr)?;
                let (l, r) = (s.reads[0], s.reads[1]);
                let computed = match (self.data(l), self.data(r), &mut out) {
                    (Data::F32(lv), Data::F32(rv), Data::F32(o)) => {
                        let ms: Option<Vec<&[f32]>> = masks
                            .iter()
                            .map(|&v| match self.data(v) {
                                Data::F32(x) => Some(x.as_slice()),
                                _ => None,
                            })
                            .collect();
                        let lhs = Operand::new(&exe.program.instrs[l].ty.shape, &lv[..]);
                        let rhs = Operand::new(&exe.program.instrs[r].ty.shape, &rv[..]);
                        ms.and_then(|ms| DotCall::new(plan, lhs, rhs).run_masked(&ms, o))
                    }
                    _ => None,
                };
                match computed {
                    Some(c) => (flops, detail) = masked_detail(plan, c),
                    None => {
                        (flops, detail) = self.run_dot(exe, plan, l, r, &mut out, &NO_TAIL);
                        detail.push_str(" (masks dense)");
                    }
                }
                self.vals[s.instr] = Some(Buf::Own(Arc::new(out)));
            }
            Kind::MaskedDotSums { plan, dot, terms } => {
                let (l, r) = (s.reads[0], s.reads[1]);
                let mut outs: Vec<Data> = terms
                    .iter()
                    .map(|&(_, u)| self.alloc(exe, u))
                    .collect::<Result<_, _>>()?;
                fn f32s(d: &Data) -> Option<&[f32]> {
                    match d {
                        Data::F32(x) => Some(x.as_slice()),
                        _ => None,
                    }
                }
                // A mask released early ([`Step::frees_sparse`]) reads as empty: its
                // support stands for it.
                let masks: Option<Vec<&[f32]>> = terms
                    .iter()
                    .map(|&(v, _)| {
                        self.vals[v]
                            .as_ref()
                            .map_or(Some(&[][..]), |b| f32s(b.data()))
                    })
                    .collect();
                let (lv, rv) = (f32s(self.data(l)), f32s(self.data(r)));
                let (Some(masks), Some(lv), Some(rv)) = (masks, lv, rv) else {
                    unreachable!("masked dots are f32")
                };
                let mut sums: Vec<&mut [f32]> = outs
                    .iter_mut()
                    .map(|d| match d {
                        Data::F32(x) => x.as_mut_slice(),
                        _ => unreachable!("masked dot sums are f32"),
                    })
                    .collect();
                // The masks' supports, where found on these very buffers.
                let sups: Vec<Option<&Support>> = terms
                    .iter()
                    .map(|&(v, _)| match self.supports.get(&exe.support_of[v]) {
                        Some((Some(sup), scanned)) if *scanned == exe.class[v] => Some(sup),
                        _ => None,
                    })
                    .collect();
                let lhs = Operand::new(&exe.program.instrs[l].ty.shape, lv);
                let rhs = Operand::new(&exe.program.instrs[r].ty.shape, rv);
                match DotCall::new(plan, lhs, rhs).run_masked_sums(&masks, &sups, &mut sums) {
                    Some(c) => {
                        (flops, detail) = masked_detail(plan, c);
                        detail.push_str(", summed");
                    }
                    None => {
                        drop(sums);
                        let mut prod = self.alloc(exe, *dot)?;
                        (flops, detail) = self.run_dot(exe, plan, l, r, &mut prod, &NO_TAIL);
                        detail.push_str(" (masks dense), summed");
                        let Data::F32(pv) = &prod else {
                            unreachable!("masked dots are f32")
                        };
                        for (o, &(v, _)) in outs.iter_mut().zip(terms) {
                            let Data::F32(o) = o else {
                                unreachable!("masked dot sums are f32")
                            };
                            match self.vals[v].as_ref().map(Buf::data) {
                                Some(Data::F32(mask)) => masked_row_sums(plan.n, pv, mask, o),
                                Some(_) => unreachable!("masked dot sums are f32"),
                                // Released early: the mask again, from its support.
                                None => {
                                    let sup = match self.supports.get(&exe.support_of[v]) {
                                        Some((Some(sup), _)) => sup,
                                        _ => unreachable!("released only with its support"),
                                    };
                                    masked_row_sums(plan.n, pv, &sup.dense(), o);
                                }
                            }
                        }
                        self.free_temp(prod);
                    }
                }
                for (o, &(_, u)) in outs.into_iter().zip(terms) {
                    self.vals[u] = Some(Buf::Own(Arc::new(o)));
                }
            }
            Kind::DotFused {
                plan,
                dot,
                f,
                inputs,
                slot,
                keep,
            } => {
                let (l, r) = (s.reads[0], s.reads[1]);
                let tail = self.tail(exe, si);
                let mut d = self.alloc(exe, *dot)?;
                let mut o = if *keep {
                    Some(self.alloc(exe, s.instr)?)
                } else {
                    None
                };
                let path = {
                    let empty = Data::Bool(Vec::new());
                    let ins_data: Vec<&Data> = inputs
                        .iter()
                        .enumerate()
                        .map(|(k, &v)| if k == *slot { &empty } else { self.data(v) })
                        .collect();
                    let (Data::F32(lv), Data::F32(rv), Data::F32(dv)) =
                        (self.data(l), self.data(r), &mut d)
                    else {
                        unreachable!("fused dots are f32")
                    };
                    let mn = plan.m * plan.n;
                    // With `keep`, each entry's group output goes to its own chunk of `o`.
                    let parts: Vec<std::sync::Mutex<&mut [f32]>> = match &mut o {
                        Some(Data::F32(ov)) => ov
                            .chunks_mut(mn.max(1))
                            .map(std::sync::Mutex::new)
                            .collect(),
                        _ => Vec::new(),
                    };
                    let epi = |bb: usize, x: &mut [f32]| match parts.get(bb) {
                        Some(part) => {
                            let mut part = part.lock().unwrap_or_else(|e| e.into_inner());
                            run_fused_part(f, &ins_data, bb * mn, &mut part, *slot, Some(x));
                        }
                        None => run_fused_part(f, &ins_data, bb * mn, x, *slot, None),
                    };
                    let epi_in: Vec<&[f32]> = ins_data
                        .iter()
                        .filter_map(|d| match d {
                            Data::F32(x) => Some(x.as_slice()),
                            _ => None,
                        })
                        .collect();
                    let lhs = Operand::new(&exe.program.instrs[l].ty.shape, &lv[..]);
                    let rhs = Operand::new(&exe.program.instrs[r].ty.shape, &rv[..]);
                    let call = DotCall {
                        tail,
                        ..DotCall::new(plan, lhs, rhs)
                    };
                    let epi = Epilogue {
                        f: &epi,
                        reads: &epi_in,
                    };
                    call.run_then(dv, &epi)
                };
                flops = plan.flops();
                detail = format!(
                    "{:?} B={} M={} N={} K={} + fused epilogue",
                    path, plan.b, plan.m, plan.n, plan.k
                );
                match o {
                    Some(o) => {
                        self.vals[*dot] = Some(Buf::Own(Arc::new(d)));
                        self.vals[s.instr] = Some(Buf::Own(Arc::new(o)));
                    }
                    None => self.vals[s.instr] = Some(Buf::Own(Arc::new(d))),
                }
            }
            Kind::Kernel => {
                let out = if exe.reference_kernels {
                    let args: Vec<HostTensor> = s
                        .reads
                        .iter()
                        .map(|&v| HostTensor {
                            ty: exe.program.instrs[v].ty.clone(),
                            data: self.data(v).clone(),
                        })
                        .collect();
                    let refs: Vec<&HostTensor> = args.iter().collect();
                    let t =
                        crate::reference::eval_local(s.instr, ins, &refs).map_err(|e| match e {
                            RuntimeError::OutOfMemory { bytes, what, .. } => {
                                let device = Some(self.pos);
                                RuntimeError::OutOfMemory {
                                    bytes,
                                    what,
                                    device,
                                }
                            }
                            e => e,
                        })?;
                    self.add_live(bytes(&t.data));
                    t.data
                } else {
                    let mut out = self.alloc(exe, s.instr)?;
                    let args: Vec<&Data> = s.reads.iter().map(|&v| self.data(v)).collect();
                    kernel(&exe.program, ins, &args, &mut out);
                    out
                };
                self.vals[s.instr] = Some(Buf::Own(Arc::new(out)));
            }
            Kind::SumProduct => {
                let mut out = self.alloc(exe, s.instr)?;
                match (self.data(s.reads[0]), self.data(s.reads[1]), &mut out) {
                    (Data::F32(a), Data::F32(b), Data::F32(o)) => {
                        masked_row_sums(a.len(), a, b, &mut o[..1])
                    }
                    _ => unreachable!("sums of products are f32"),
                }
                self.vals[s.instr] = Some(Buf::Own(Arc::new(out)));
            }
            Kind::Collective { .. } => unreachable!("collectives run between segments"),
        }
        for v in std::iter::once(s.instr).chain(s.also) {
            if exe.eager_support[v] {
                let key = exe.support_of[v];
                if !self.supports.contains_key(&key) {
                    if let Some(Data::F32(x)) = self.vals[v].as_ref().map(Buf::data) {
                        let sup = Support::of(x);
                        self.supports.insert(key, (sup, exe.class[v]));
                    }
                }
            }
        }
        if let (Some(p), Some(t0)) = (self.profiler, t0) {
            let t1 = p.now_us();
            self.events.push(TraceEvent {
                device: self.pos,
                name: s.label.clone(),
                cat: s.cat,
                ts_us: t0,
                dur_us: t1 - t0,
                flops,
                bytes: ins.ty.size_bytes(),
                detail,
            });
        }
        self.release(exe, si);
        Ok(())
    }

    fn param(&self, name: &str, ty: &Type) -> Result<Arc<HostTensor>, RuntimeError> {
        let device = self.error_device;
        let t = self
            .inputs
            .get(name)
            .ok_or_else(|| RuntimeError::MissingInput {
                name: name.to_string(),
                expected: ty.clone(),
                device,
            })?;
        if t.ty != *ty {
            return Err(RuntimeError::InputTypeMismatch {
                name: name.to_string(),
                expected: ty.clone(),
                got: t.ty.clone(),
                device,
            });
        }
        if t.data.dtype() != t.ty.dtype || t.data.len() != t.ty.num_elements() {
            if let Err(source) = HostTensor::new(t.ty.clone(), t.data.clone()) {
                return Err(RuntimeError::MalformedInput {
                    name: name.to_string(),
                    device,
                    source,
                });
            }
        }
        Ok(t.clone())
    }
}

/// The flops and profile detail of a masked dot that computed `c` values.
fn masked_detail(plan: &DotPlan, c: usize) -> (f64, String) {
    let (b, m, n, k) = (plan.b, plan.m, plan.n, plan.k);
    let detail = format!(
        "Masked B={b} M={m} N={n} K={k}: {c} of {} values",
        b * m * n
    );
    (2.0 * (c * k) as f64, detail)
}

/// Run one non-elementwise, non-collective instruction natively.
fn kernel(p: &Program, ins: &Instr, args: &[&Data], out: &mut Data) {
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

/// Run `p` on the local devices of `comm`; `inputs[j]` feeds `comm.local_positions()[j]`.
pub fn run_devices(
    p: &Program,
    comm: &dyn Communicator,
    inputs: &[HashMap<String, HostTensor>],
) -> Result<RunResult, ExecError> {
    run_devices_profiled(p, comm, inputs, None)
}

/// [`run_devices`] recording per-op and per-collective timings into `profiler`.
pub fn run_devices_profiled(
    p: &Program,
    comm: &dyn Communicator,
    inputs: &[HashMap<String, HostTensor>],
    profiler: Option<&Profiler>,
) -> Result<RunResult, ExecError> {
    Executable::new(p)?.run(comm, inputs, profiler)
}
