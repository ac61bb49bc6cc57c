//! The memory of a run without running it: [`Executable::memory_plan`] walks the final plan
//! on shapes alone with the executor's own bookkeeping (the same segments, buffer classes,
//! releases, in-place groups, moved collective operands and all-to-alls placed by their
//! senders as `run` applies them) and returns the peak of live bytes per device, the step
//! where it is first reached and every buffer live there ([`MemoryPlan`]).
//!
//! Two things of a run depend on its data, and the walk assumes the usual case of both:
//! a masked product's masked path applies (its operands are finite), and a scan finds a
//! support sparse exactly where the program makes the value sparse by construction: where
//! [`density_bounds`] allows at most one non-zero in ten (one-hot comparisons with an iota
//! and what multiplies, converts, moves or indicates them), and the masks the plan itself
//! treats as sparse (the masks of summed masked dots, indicators `convert(x != 0)` and the
//! values they indicate: MoE's dispatch masks and combine weights, at most two non-zeros
//! per token); every other scanned value is dense. With those, the planned peak is the run's
//! [`peak_bytes_per_device`](super::RunResult::peak_bytes_per_device) to the byte.

use super::ids::{BufClass, IdVec, StepId, SupportKey};
use super::liveness::Segment;
use super::plan::Kind;
use super::Executable;
use crate::kernels::dot::DotPlan;
use ir::{Type, ValueId};
use std::collections::{HashMap, HashSet};

/// How a planned run places its collectives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Devices share memory (in-process devices) and the plan is native: all-to-alls whose
    /// operand exists early are placed by their senders, their results allocated before the
    /// segment that precedes their round. False for MPI ranks and real accelerators.
    pub shared_memory: bool,
}

impl MemoryOptions {
    /// In-process devices (what `run` does with [`InProcess`](crate::comm::InProcess)).
    pub fn in_process() -> MemoryOptions {
        MemoryOptions {
            shared_memory: true,
        }
    }

    /// One device per process (MPI ranks, accelerators).
    pub fn distributed() -> MemoryOptions {
        MemoryOptions {
            shared_memory: false,
        }
    }
}

/// What a buffer live at the peak is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Held {
    /// The buffer of value `value` (and its aliases).
    Value,
    /// A collective's operand (moved in or copied) while its results are made.
    CollectiveOperand,
    /// An all-to-all's result placed by its senders before its round.
    Placed,
    /// The operand of a collective in flight (started, not yet waited for), under the
    /// collective's value.
    InFlight,
}

/// One buffer live at the peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBuffer {
    pub value: ValueId,
    pub bytes: usize,
    pub held: Held,
}

/// A run's memory on one device, planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Peak bytes of live buffers (parameters included, aliases counted once).
    pub peak_bytes: usize,
    /// The step during which the peak is first reached.
    pub peak_step: StepId,
    /// The buffers live at that moment; their bytes sum to `peak_bytes`.
    pub at_peak: Vec<LiveBuffer>,
}

/// One buffer of the walk.
struct Buffer {
    bytes: usize,
    /// Made by the device (not a caller's input).
    own: bool,
    /// Values holding it (an alias adds one).
    holders: u32,
}

/// The walk's state on one device.
struct Walk<'a> {
    exe: &'a Executable,
    /// Whether a scan of each value finds it sparse.
    sparse: Vec<bool>,
    vals: IdVec<ValueId, Option<usize>>,
    bufs: Vec<Buffer>,
    /// Buffers no value holds yet: collective operands, placed results.
    extra: Vec<(ValueId, usize, Held)>,
    supports: HashMap<SupportKey, (bool, BufClass)>,
    live: usize,
    peak: usize,
    peak_event: usize,
    peak_step: StepId,
    events: usize,
    /// Stop and keep the live set at this event.
    stop_at: Option<usize>,
    at_peak: Option<Vec<LiveBuffer>>,
    step: StepId,
}

impl Executable {
    /// The memory of one run on one device, planned from the plan alone (see the module
    /// doc): no tensor is allocated.
    pub fn memory_plan(&self, opts: MemoryOptions) -> MemoryPlan {
        let first = self.walk(opts, None);
        let second = self.walk(opts, Some(first.peak_event));
        let mut at_peak = second.at_peak.unwrap_or_default();
        at_peak.sort_by_key(|b| (std::cmp::Reverse(b.bytes), b.value));
        debug_assert_eq!(
            at_peak.iter().map(|b| b.bytes).sum::<usize>(),
            first.peak,
            "the live set at the peak sums to the peak"
        );
        MemoryPlan {
            peak_bytes: first.peak,
            peak_step: first.peak_step,
            at_peak,
        }
    }

    fn walk(&self, opts: MemoryOptions, stop_at: Option<usize>) -> Walk<'_> {
        let mut w = Walk::new(self, stop_at);
        let shared = opts.shared_memory && self.options.passes == super::Passes::All;
        let mut placed: HashSet<StepId> = HashSet::new();
        for (k, seg) in self.order.segments.iter().enumerate() {
            match *seg {
                Segment::Local { start, end } => {
                    if shared {
                        for &si in &self.order.sends[k] {
                            w.step = si;
                            let v = self.plan.steps[si].value;
                            w.add_extra(v, self.type_bytes(v), Held::Placed);
                            placed.insert(si);
                        }
                    }
                    for si in Segment::steps(start, end) {
                        w.step = si;
                        w.local(si);
                    }
                }
                Segment::Collective(si) => {
                    w.step = si;
                    let v = self.plan.steps[si].value;
                    if matches!(self.plan.steps[si].kind, Kind::Start { .. }) {
                        w.start(si);
                    } else if matches!(self.plan.steps[si].kind, Kind::Wait) {
                        w.wait(v);
                    } else if placed.remove(&si) {
                        let at = w.extra.iter().position(|e| e.0 == v && e.2 == Held::Placed);
                        let (_, b, _) = w.extra.remove(at.expect("placed before its round"));
                        w.hold(v, b, true);
                    } else {
                        w.collective(si);
                    }
                    w.release(si);
                }
            }
        }
        w
    }

    fn type_bytes(&self, v: ValueId) -> usize {
        ty_bytes(&self.program.instrs[v.index()].ty)
    }
}

/// The bytes of a buffer of type `ty` (as the kernels allocate it).
fn ty_bytes(ty: &Type) -> usize {
    ty.num_elements() * ty.dtype.size_bytes()
}

impl<'a> Walk<'a> {
    fn new(exe: &'a Executable, stop_at: Option<usize>) -> Walk<'a> {
        let live = &exe.live;
        let n = exe.program.instrs.len();
        // Supports the plan shares by construction: indicators and the values they
        // indicate.
        let shared: HashSet<SupportKey> = live
            .class
            .ids()
            .filter(|&v| live.support_of[v].class() != live.class[v])
            .map(|v| live.support_of[v])
            .collect();
        // A scan finds a support where at most a tenth of the values are non-zero: by the
        // program's bound, or a mask the plan treats as one.
        let sparse = density_bounds(&exe.program)
            .into_iter()
            .zip(live.class.ids())
            .map(|(d, v)| d <= 0.1 || live.eager_support[v] || shared.contains(&live.support_of[v]))
            .collect();
        Walk {
            exe,
            sparse,
            vals: IdVec::filled(None, n),
            bufs: Vec::new(),
            extra: Vec::new(),
            supports: HashMap::new(),
            live: 0,
            peak: 0,
            peak_event: 0,
            peak_step: StepId(0),
            events: 0,
            stop_at,
            at_peak: None,
            step: StepId(0),
        }
    }

    /// `b` more bytes live (the executor's `add_live`).
    fn add(&mut self, b: usize) {
        self.live += b;
        self.events += 1;
        if self.live > self.peak {
            self.peak = self.live;
            self.peak_event = self.events;
            self.peak_step = self.step;
        }
        if self.stop_at == Some(self.events) {
            self.at_peak = Some(self.snapshot());
        }
    }

    /// Every live buffer, once.
    fn snapshot(&self) -> Vec<LiveBuffer> {
        let mut seen = vec![false; self.bufs.len()];
        let mut out = Vec::new();
        for v in self.vals.ids() {
            if let Some(id) = self.vals[v] {
                if !std::mem::replace(&mut seen[id], true) {
                    let bytes = self.bufs[id].bytes;
                    out.push(LiveBuffer {
                        value: v,
                        bytes,
                        held: Held::Value,
                    });
                }
            }
        }
        out.extend(self.extra.iter().map(|&(value, bytes, held)| LiveBuffer {
            value,
            bytes,
            held,
        }));
        out
    }

    fn add_extra(&mut self, v: ValueId, b: usize, held: Held) {
        self.extra.push((v, b, held));
        self.add(b);
    }

    /// Value `v` holds a new buffer of `b` bytes already counted live.
    fn hold(&mut self, v: ValueId, b: usize, own: bool) {
        self.bufs.push(Buffer {
            bytes: b,
            own,
            holders: 1,
        });
        self.vals[v] = Some(self.bufs.len() - 1);
    }

    /// A new buffer for `v` (the executor's `alloc`).
    fn alloc(&mut self, v: ValueId) {
        let b = self.exe.type_bytes(v);
        self.hold(v, b, true);
        self.add(b);
    }

    fn local(&mut self, si: StepId) {
        let exe = self.exe;
        let s = &exe.plan.steps[si];
        match &s.kind {
            Kind::Param(_) => {
                let b = exe.type_bytes(s.value);
                self.hold(s.value, b, false);
                self.add(b);
            }
            Kind::PartitionId => {
                self.hold(s.value, 4, true);
                self.add(4);
            }
            Kind::Alias(src) => {
                self.vals[s.value] = self.vals[*src];
                if let Some(id) = self.vals[*src] {
                    self.bufs[id].holders += 1;
                }
            }
            Kind::Move(src) => self.vals[s.value] = self.vals[*src].take(),
            Kind::Fused {
                inputs, inplace_ok, ..
            } => {
                let live = &exe.live;
                let ty = &exe.program.instrs[s.value.index()].ty;
                let target = inputs.iter().enumerate().position(|(k, &v)| {
                    let c = live.class[v];
                    inplace_ok[k]
                        && live.last_read[c] == si
                        && live.members[c].len() == 1
                        && self.vals[v]
                            .is_some_and(|id| self.bufs[id].own && self.bufs[id].holders == 1)
                        && exe.program.instrs[v.index()].ty == *ty
                });
                match target {
                    Some(k) => self.vals[s.value] = self.vals[inputs[k]].take(),
                    None => self.alloc(s.value),
                }
            }
            Kind::Dot(plan) => {
                self.alloc(s.value);
                self.scan(plan, [s.reads[0], s.reads[1]]);
            }
            // The masked path applies (module doc): no scan.
            Kind::MaskedDot { .. } | Kind::Kernel | Kind::Oracle | Kind::SumProduct => {
                self.alloc(s.value)
            }
            Kind::MaskedDotSums { terms, .. } => {
                for &(_, u) in terms {
                    self.alloc(u);
                }
            }
            Kind::DotFused { dot, keep, .. } => {
                self.alloc(*dot);
                if *keep {
                    self.alloc(s.value);
                } else {
                    self.vals[s.value] = self.vals[*dot].take();
                }
            }
            Kind::Collective { .. } | Kind::OracleCollective | Kind::Start { .. } | Kind::Wait => {
                unreachable!("collectives run between segments")
            }
        }
        for v in s.outputs() {
            if exe.live.eager_support[v] && self.vals[v].is_some() {
                let key = exe.live.support_of[v];
                let found = self.sparse[v.index()];
                self.supports
                    .entry(key)
                    .or_insert((found, exe.live.class[v]));
            }
        }
        self.release(si);
    }

    /// The support scans of a plain dot over `[l, r]` (the executor's `run_dot`).
    fn scan(&mut self, plan: &DotPlan, operands: [ValueId; 2]) {
        let exe = self.exe;
        let live = &exe.live;
        for v in operands {
            let key = live.support_of[v];
            if self.supports.contains_key(&key) {
                continue;
            }
            let len = exe.program.instrs[v.index()].ty.num_elements();
            let root = key.class().root();
            let src = if self.vals[root].is_some()
                && exe.program.instrs[root.index()].ty.num_elements() == len
            {
                root
            } else {
                v
            };
            let dtype = exe.program.instrs[src.index()].ty.dtype;
            if matches!(dtype, ir::DType::F32 | ir::DType::F64) && plan.sparse_worth(len) {
                let found = self.sparse[src.index()];
                self.supports.insert(key, (found, live.class[src]));
            }
        }
    }

    /// The start of a collective (the executor's `start`): its operand, moved in or
    /// copied, stays live until its wait.
    fn start(&mut self, si: StepId) {
        let value = self.exe.plan.steps[si].value;
        self.hold_operand(si, value, Held::InFlight);
    }

    /// Collective step `si`'s operand held as `held` under `key` until released: moved
    /// in when it dies here and nothing else holds its buffer, else copied (the copy
    /// counted live), as the executor's `operands` does.
    fn hold_operand(&mut self, si: StepId, key: ValueId, held: Held) {
        let exe = self.exe;
        let v = exe.plan.steps[si].reads[0];
        let c = exe.live.class[v];
        let dies = exe.live.last_read[c] == si && exe.live.members[c].len() == 1;
        let id = self.vals[v].expect("operands are live");
        let b = self.bufs[id].bytes;
        if dies && self.bufs[id].own && self.bufs[id].holders == 1 {
            self.vals[v] = None;
            self.extra.push((key, b, held));
        } else {
            self.add_extra(key, b, held);
        }
    }

    /// The wait of collective `value` (the executor's `wait`): its results exist, its
    /// operand is no longer held.
    fn wait(&mut self, value: ValueId) {
        self.alloc(value);
        let at = self
            .extra
            .iter()
            .position(|e| e.0 == value && e.2 == Held::InFlight)
            .expect("a wait follows its start");
        let (_, b, _) = self.extra.remove(at);
        self.live -= b;
    }

    /// A collective over the operand (the executor's `collective`).
    fn collective(&mut self, si: StepId) {
        let s = &self.exe.plan.steps[si];
        let (v, value) = (s.reads[0], s.value);
        self.hold_operand(si, v, Held::CollectiveOperand);
        self.alloc(value);
        let done: usize = self
            .extra
            .iter()
            .filter(|e| e.2 == Held::CollectiveOperand)
            .map(|e| e.1)
            .sum();
        self.extra.retain(|e| e.2 != Held::CollectiveOperand);
        self.live -= done;
    }

    /// The releases after step `si` (the executor's `release`).
    fn release(&mut self, si: StepId) {
        let exe = self.exe;
        for &c in &exe.live.frees[si] {
            self.free_class(c);
        }
        for &(c, key) in &exe.live.frees_sparse[si] {
            if matches!(self.supports.get(&key), Some(&(true, scanned)) if scanned == c) {
                self.free_class(c);
            }
        }
    }

    fn free_class(&mut self, c: BufClass) {
        let exe = self.exe;
        let buf = self.vals[c.root()].take();
        for &m in &exe.live.members[c] {
            self.vals[m] = None;
        }
        if let Some(id) = buf {
            self.live -= self.bufs[id].bytes;
        }
    }
}

/// For every value of `p`, an upper bound on the share of its elements that are non-zero,
/// from the program alone: `iota == y` with `y` constant along the iota's dim (a one-hot)
/// has one non-zero in each run along that dim; converts, moves, broadcasts and `x != 0`
/// keep their operand's share; a product or a logical and has at most its sparser
/// operand's, a sum at most both together, a select of zero at most its predicate's or
/// its value's. Anything else may be dense (1).
pub fn density_bounds(p: &ir::Program) -> Vec<f64> {
    use ir::{BinaryOp, CompareOp, Op};
    let n = p.instrs.len();
    let mut d = vec![1.0f64; n];
    // The dim along which a value counts up (an iota, plus or converted from one, plus
    // anything constant along that dim).
    let mut iota: Vec<Option<usize>> = vec![None; n];
    let is_zero = |l: &ir::Literal| match l {
        ir::Literal::Splat(x) => *x == 0.0,
        ir::Literal::Dense(xs) => xs.iter().all(|x| *x == 0.0),
    };
    let zero = |v: ValueId| match &p.instrs[v.index()].op {
        Op::Constant { value } => is_zero(value),
        Op::Broadcast { .. } => matches!(
            &p.instrs[p.instrs[v.index()].operands[0].index()].op,
            Op::Constant { value } if is_zero(value)
        ),
        _ => false,
    };
    // Whether `v` is constant along result dim `dim`.
    let constant_along = |v: ValueId, dim: usize| match &p.instrs[v.index()].op {
        Op::Broadcast { dims } => !dims.contains(&dim),
        Op::Constant { .. } => true,
        _ => p.instrs[v.index()].ty.shape.get(dim) == Some(&1),
    };
    for (i, ins) in p.instrs.iter().enumerate() {
        let o = |k: usize| ins.operands[k];
        let od = |k: usize| d[ins.operands[k].index()];
        iota[i] = match &ins.op {
            Op::Iota { dim } => Some(*dim),
            Op::Convert | Op::Copy => iota[o(0).index()],
            Op::Binary(BinaryOp::Add | BinaryOp::Sub) => {
                match (iota[o(0).index()], iota[o(1).index()]) {
                    (Some(a), _) if constant_along(o(1), a) => Some(a),
                    (_, Some(b)) if constant_along(o(0), b) => Some(b),
                    _ => None,
                }
            }
            _ => None,
        };
        d[i] = match &ins.op {
            Op::Compare(CompareOp::Eq) => {
                let one_hot = |a: ValueId, b: ValueId| {
                    iota[a.index()]
                        .filter(|&dim| constant_along(b, dim))
                        .map(|dim| 1.0 / ins.ty.shape[dim].max(1) as f64)
                };
                one_hot(o(0), o(1)).or(one_hot(o(1), o(0))).unwrap_or(1.0)
            }
            Op::Compare(CompareOp::Ne) if zero(o(1)) => od(0),
            Op::Compare(CompareOp::Ne) if zero(o(0)) => od(1),
            Op::Convert
            | Op::Copy
            | Op::StopGradient
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::Broadcast { .. } => od(0),
            Op::Binary(BinaryOp::Mul | BinaryOp::And) => od(0).min(od(1)),
            Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Or) => (od(0) + od(1)).min(1.0),
            Op::Select if zero(o(2)) => od(0).min(od(1)),
            Op::Select => (od(1) + od(2)).min(1.0),
            _ => 1.0,
        };
    }
    d
}
