//! Running a plan: each device's buffers and pool ([`Dev`]), one step on one device
//! ([`Dev::step`], dispatching to the functions of `steps`), and the walk over the
//! segments ([`Executable::run_shared`]): local segments as one task per device on the
//! rayon pool, collectives between them (`collective`).

use super::collective::Started;
use super::ids::{IdVec, StepId};
use super::liveness::Segment;
use super::plan::Kind;
use super::schedule::{keep_awake, DeviceTask, RunEnd};
use super::steps::{At, Epilogue};
use super::{CollectiveStat, ExecError, Executable, Passes, RunResult};
use crate::alloc::AllocError;
use crate::comm::{Communicator, Sinks};
use crate::error::RuntimeError;
use crate::kernels::dot::Support;
use crate::kernels::{bytes, try_zeros};
use crate::profile::{Profiler, TraceEvent};
use crate::tensor::{Data, HostTensor};
use ir::{DType, Type, ValueId};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

/// A device buffer: produced here, or an input shared with the caller.
#[derive(Clone)]
pub(super) enum Buf {
    Own(Arc<Data>),
    Input(Arc<HostTensor>),
}

impl Buf {
    pub(super) fn data(&self) -> &Data {
        match self {
            Buf::Own(d) => d,
            Buf::Input(t) => &t.data,
        }
    }
}

/// Freed buffers per (dtype, length), for reuse.
#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<(DType, usize), Vec<Data>>,
    pub(super) bytes: usize,
    /// The largest peak of live bytes seen: the pool never holds more than this.
    pub(super) cap: usize,
}

impl Pool {
    fn take(&mut self, dtype: DType, n: usize) -> Result<Data, AllocError> {
        if let Some(d) = self.free.get_mut(&(dtype, n)).and_then(Vec::pop) {
            self.bytes -= bytes(&d);
            return Ok(d);
        }
        try_zeros(dtype, n)
    }

    pub(super) fn give(&mut self, d: Data, cap: usize) {
        let b = bytes(&d);
        if b > 0 && self.bytes + b <= cap {
            self.bytes += b;
            self.free.entry((d.dtype(), d.len())).or_default().push(d);
        }
    }
}

/// One device's state during a run.
pub(super) struct Dev<'a> {
    pub(super) pos: usize,
    pub(super) vals: IdVec<ValueId, Option<Buf>>,
    pool: Pool,
    pub(super) live: usize,
    peak: usize,
    resident: usize,
    pub(super) events: Vec<TraceEvent>,
    inputs: &'a HashMap<String, Arc<HostTensor>>,
    pub(super) profiler: Option<&'a Profiler>,
    error_device: Option<usize>,
    /// Supports found in this run, by support key (`None`: dense), and the buffer class
    /// each was found on.
    pub(super) supports: HashMap<super::ids::SupportKey, (Option<Support>, super::ids::BufClass)>,
}

impl Executable {
    /// [`Executable::run`] with inputs shared, not copied (repeated steps on resident data).
    pub fn run_shared(
        &self,
        comm: &dyn Communicator,
        inputs: &[HashMap<String, Arc<HostTensor>>],
        profiler: Option<&Profiler>,
    ) -> Result<RunResult, ExecError> {
        if self.tables == crate::kernels::dot::Tables::ShapesOnly {
            return Err(ExecError::PlanningOnly);
        }
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
                vals: IdVec::filled(None, self.program.instrs.len()),
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
        // collective runs between segments, on this one task. (The reference mode keeps
        // rayon's own sleeping and the collectives' copy pass.)
        let shared = comm.shared_memory() && self.options.passes == Passes::All;
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
            let run = Walk {
                comm,
                profiler,
                positions: &positions,
                shared,
            };
            self.run_segments(&mut devs, &run, &mut stats)
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
                let bufs: Vec<(String, ValueId, Buf)> = self
                    .program
                    .outputs
                    .iter()
                    .map(|(name, v)| {
                        let buf = d.vals[*v].clone().expect("outputs are kept");
                        (name.clone(), *v, buf)
                    })
                    .collect();
                d.vals = IdVec::new();
                let mut m = HashMap::new();
                for (name, v, buf) in bufs {
                    let data = match buf {
                        Buf::Own(a) => Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone()),
                        Buf::Input(t) => t.data.clone(),
                    };
                    let ty = self.program.instrs[v.index()].ty.clone();
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
        run: &Walk,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        // Results of all-to-alls placed by their senders, until their round.
        let mut placed: HashMap<StepId, Vec<Data>> = HashMap::new();
        // Collectives started and not yet waited for, by value.
        let mut started: HashMap<ValueId, Started> = HashMap::new();
        for (k, seg) in self.order.segments.iter().enumerate() {
            match *seg {
                Segment::Local { start, end } => {
                    let sends = if run.shared {
                        &self.order.sends[k][..]
                    } else {
                        &[]
                    };
                    let mut sinks = Vec::with_capacity(sends.len());
                    for &si in sends {
                        let v = self.plan.steps[si].value;
                        let n = self.mesh_of(si)?.0.num_devices();
                        let mut bufs: Vec<Data> = devs
                            .iter_mut()
                            .map(|d| d.alloc(self, v))
                            .collect::<Result<_, _>>()?;
                        let ptrs = Sinks::new(n, run.positions, &mut bufs);
                        placed.insert(si, bufs);
                        sinks.push((si, ptrs));
                    }
                    // One task per device (rayon would otherwise run runs of
                    // neighbouring devices as one sequential task, which a thread left
                    // idle at the segment's end cannot split).
                    // With several devices here, a task that ends keeps its thread busy
                    // until the segment's last one ends ([`DeviceTask::end`]).
                    let left = AtomicUsize::new(devs.len());
                    let wait = run.shared && devs.len() > 1 && rayon::current_num_threads() > 1;
                    let errs: Vec<Result<(), ExecError>> = devs
                        .par_iter_mut()
                        .with_max_len(1)
                        .map(|d| {
                            let task = DeviceTask::start(&left);
                            let r = (|| {
                                for si in Segment::steps(start, end) {
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
                Segment::Collective(si) => match &self.plan.steps[si].kind {
                    Kind::Start { .. } => {
                        let s = self.start(devs, si, run.comm, run.profiler)?;
                        started.insert(self.plan.steps[si].value, s);
                    }
                    Kind::Wait => {
                        let s = started
                            .remove(&self.plan.steps[si].value)
                            .expect("Plan::verify: a wait follows its start");
                        self.wait(devs, si, s, run.comm, run.profiler, stats)?;
                    }
                    _ => match placed.remove(&si) {
                        Some(bufs) => self.placed(devs, si, bufs, run.profiler, stats)?,
                        None => self.collective(devs, si, run.comm, run.profiler, stats)?,
                    },
                },
            }
        }
        Ok(())
    }
}

/// What the walk over the segments runs with.
struct Walk<'a> {
    comm: &'a dyn Communicator,
    profiler: Option<&'a Profiler>,
    positions: &'a [usize],
    /// Devices share memory (and the plan is native): sends and busy waits.
    shared: bool,
}

impl Dev<'_> {
    pub(super) fn add_live(&mut self, b: usize) {
        self.live += b;
        self.peak = self.peak.max(self.live);
        self.resident = self.resident.max(self.live + self.pool.bytes);
    }

    pub(super) fn data(&self, v: ValueId) -> &Data {
        self.vals[v].as_ref().expect("operands are live").data()
    }

    /// Run step `si` of `exe` on this device, then release what it was the last to read.
    pub(super) fn step(&mut self, exe: &Executable, si: StepId) -> Result<(), ExecError> {
        let s = &exe.plan.steps[si];
        let ins = &exe.program.instrs[s.value.index()];
        let t0 = self.profiler.map(|p| p.now_us());
        let at = At { si, s, ins };
        let (flops, detail) = match &s.kind {
            Kind::Param(name) => {
                let t = self.param(name, &ins.ty)?;
                self.add_live(bytes(&t.data));
                self.vals[s.value] = Some(Buf::Input(t));
                (0.0, String::new())
            }
            Kind::PartitionId => {
                self.add_live(4);
                self.vals[s.value] = Some(Buf::Own(Arc::new(Data::I32(vec![self.pos as i32]))));
                (0.0, String::new())
            }
            Kind::Alias(src) => {
                self.vals[s.value] = self.vals[*src].clone();
                (0.0, String::new())
            }
            Kind::Move(src) => {
                self.vals[s.value] = self.vals[*src].take();
                (0.0, String::new())
            }
            Kind::Fused {
                f,
                inputs,
                inplace_ok,
            } => self.fused(exe, at, f, inputs, inplace_ok)?,
            Kind::Dot(plan) => self.dot(exe, at, plan)?,
            Kind::MaskedDot { plan, masks } => self.masked_dot(exe, at, plan, masks)?,
            Kind::MaskedDotSums { plan, dot, terms } => {
                self.masked_dot_sums(exe, at, plan, *dot, terms)?
            }
            Kind::DotFused {
                plan,
                dot,
                f,
                inputs,
                slot,
                keep,
            } => {
                let epilogue = Epilogue {
                    dot: *dot,
                    f,
                    inputs,
                    slot: *slot,
                    keep: *keep,
                };
                self.dot_fused(exe, at, plan, &epilogue)?
            }
            Kind::Kernel => self.kernel(exe, at)?,
            Kind::Oracle => self.oracle(exe, at)?,
            Kind::SumProduct => self.sum_product(exe, at)?,
            Kind::Collective { .. } | Kind::OracleCollective | Kind::Start { .. } | Kind::Wait => {
                unreachable!("collectives run between segments")
            }
        };
        for v in s.outputs() {
            if exe.live.eager_support[v] {
                let key = exe.live.support_of[v];
                if !self.supports.contains_key(&key) {
                    if let Some(Data::F32(x)) = self.vals[v].as_ref().map(Buf::data) {
                        let sup = Support::of(x);
                        self.supports.insert(key, (sup, exe.live.class[v]));
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

    /// Release the buffer classes whose last reader is step `si`, and the values whose
    /// remaining readers take them by their support where this run found it (a value found
    /// dense, or not scanned, stays until its last reader).
    pub(super) fn release(&mut self, exe: &Executable, si: StepId) {
        for &c in &exe.live.frees[si] {
            self.free_class(exe, c);
        }
        for &(c, key) in &exe.live.frees_sparse[si] {
            if matches!(self.supports.get(&key), Some((Some(_), scanned)) if *scanned == c) {
                self.free_class(exe, c);
            }
        }
    }

    /// Drop buffer class `c` (its root and aliases) and give its buffer to the pool when
    /// nothing else holds it (nothing, if it is released already).
    fn free_class(&mut self, exe: &Executable, c: super::ids::BufClass) {
        let buf = self.vals[c.root()].take();
        for &m in &exe.live.members[c] {
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
    pub(super) fn copy_of(
        &mut self,
        exe: &Executable,
        v: ValueId,
        x: &Data,
    ) -> Result<Data, ExecError> {
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
    pub(super) fn alloc(&mut self, exe: &Executable, v: ValueId) -> Result<Data, ExecError> {
        let ty = &exe.program.instrs[v.index()].ty;
        let d = self
            .pool
            .take(ty.dtype, ty.num_elements())
            .map_err(|e| self.out_of_memory(exe, v, e))?;
        self.add_live(bytes(&d));
        Ok(d)
    }

    fn out_of_memory(&self, exe: &Executable, v: ValueId, e: AllocError) -> ExecError {
        let ty = &exe.program.instrs[v.index()].ty;
        RuntimeError::out_of_memory(e, v.index(), ty, Some(self.pos)).into()
    }

    /// Return a buffer from [`Dev::alloc`] that no value holds (a step's scratch).
    pub(super) fn free_temp(&mut self, d: Data) {
        self.live -= bytes(&d);
        self.recycle(d);
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
