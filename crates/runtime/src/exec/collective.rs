//! Collective steps, run between segments over every local device's buffers: through
//! the [`Communicator`] ([`Executable::collective`]), by the reference interpreter in the
//! reference mode, or, for an all-to-all placed by its senders, its senders' half at the
//! end of the segment before ([`Dev::send`]) and its finish here ([`Executable::placed`]).

use super::ids::StepId;
use super::plan::{Kind, SMALL_COLLECTIVE};
use super::run::{Buf, Dev};
use super::{CollectiveStat, ExecError, Executable};
use crate::comm::{place_all_to_all, wire_bytes, CommError, Communicator, Pending, Sinks};
use crate::error::RuntimeError;
use crate::kernels::bytes;
use crate::profile::{Profiler, TraceEvent, IN_FLIGHT};
use crate::tensor::{Data, HostTensor};
use ir::{Instr, Mesh};
use rayon::prelude::*;
use std::sync::Arc;

impl Executable {
    /// Finish all-to-all step `si` whose senders placed their blocks in `bufs` (one per
    /// device, in `devs` order; see [`Dev::send`]): the results become the step's values.
    pub(super) fn placed(
        &self,
        devs: &mut [Dev],
        si: StepId,
        bufs: Vec<Data>,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let s = &self.plan.steps[si];
        let ins = &self.program.instrs[s.value.index()];
        let operand_ty = &self.program.instrs[s.reads[0].index()].ty;
        let (_, k) = self.mesh_of(si)?;
        let sent = wire_bytes(&ins.op, operand_ty, k);
        count(stats, ins, sent * devs.len());
        let t = profiler.map(|p| p.now_us());
        for (d, data) in devs.iter_mut().zip(bufs) {
            // Live since the segment before (allocated there).
            d.vals[s.value] = Some(Buf::Own(Arc::new(data)));
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
    pub(super) fn mesh_of(&self, si: StepId) -> Result<(&Mesh, usize), ExecError> {
        let v = self.plan.steps[si].value;
        let ins = &self.program.instrs[v.index()];
        let mesh = self
            .program
            .mesh
            .as_ref()
            .ok_or_else(|| RuntimeError::NoMesh {
                index: v.index(),
                op: ins.op.name().into(),
            })?;
        Ok((mesh, mesh.size_of(ins.op.collective_axes().unwrap_or(&[]))))
    }

    /// Run collective step `si` over every device's operand.
    pub(super) fn collective(
        &self,
        devs: &mut [Dev],
        si: StepId,
        comm: &dyn Communicator,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let s = &self.plan.steps[si];
        let ins = &self.program.instrs[s.value.index()];
        let (mesh, _) = self.mesh_of(si)?;
        let t0 = profiler.map(|p| p.now_us());
        let (local, operand) = self.operands(devs, si)?;
        let index = s.value.index();
        let out = match &s.kind {
            Kind::OracleCollective => crate::reference::collective_on_hosts(&ins.op, mesh, &local)
                .ok_or_else(|| CommError::Failed {
                    index,
                    op: ins.op.name().into(),
                    msg: "not a collective".into(),
                })?,
            Kind::Collective {
                out_perm: Some(perm),
            } => comm.collective_transposed(index, &ins.op, mesh, local, perm)?,
            _ => comm.collective(index, &ins.op, mesh, local)?,
        };
        let began = Began {
            first: si,
            operand,
            t0,
        };
        self.results(devs, si, out, began, profiler, stats)
    }

    /// Start collective step `si` (a [`Kind::Start`]): its operands go to the
    /// communicator, whose [`Pending`] the matching [`Kind::Wait`] finishes
    /// ([`Executable::wait`]).
    pub(super) fn start(
        &self,
        devs: &mut [Dev],
        si: StepId,
        comm: &dyn Communicator,
        profiler: Option<&Profiler>,
    ) -> Result<Started, ExecError> {
        let s = &self.plan.steps[si];
        let ins = &self.program.instrs[s.value.index()];
        let (mesh, _) = self.mesh_of(si)?;
        let t0 = profiler.map(|p| p.now_us());
        let (local, operand) = self.operands(devs, si)?;
        let perm = match &s.kind {
            Kind::Start { out_perm } => out_perm.as_deref(),
            _ => None,
        };
        let pending = comm.start(s.value.index(), &ins.op, mesh, local, perm);
        for d in devs.iter_mut() {
            d.release(self, si);
        }
        Ok(Started {
            pending,
            began: Began {
                first: si,
                operand,
                t0,
            },
        })
    }

    /// Wait step `si` (a [`Kind::Wait`]): the results of the collective `started` began
    /// become the step's values.
    pub(super) fn wait(
        &self,
        devs: &mut [Dev],
        si: StepId,
        started: Started,
        comm: &dyn Communicator,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let t0 = profiler.map(|p| p.now_us());
        let out = comm.wait(started.pending)?;
        if let (Some(p), Some(t0)) = (profiler, t0) {
            // The time the devices blocked here, under the collective's own name: what of
            // its time in flight the computation since its start did not hide.
            let t1 = p.now_us();
            let first = started.began.first;
            for d in devs.iter_mut() {
                d.events.push(TraceEvent {
                    device: d.pos,
                    name: self.plan.steps[first].label.clone(),
                    cat: "collective",
                    ts_us: t0,
                    dur_us: t1 - t0,
                    flops: 0.0,
                    bytes: 0,
                    detail: format!(
                        "waiting at step {si} for the collective started at step {first}"
                    ),
                });
            }
        }
        self.results(devs, si, out, started.began, profiler, stats)
    }

    /// The operands of collective step `si`, one per device, with their bytes: moved out of
    /// the devices where they die at `si`, else copied (the copy counted live).
    fn operands(
        &self,
        devs: &mut [Dev],
        si: StepId,
    ) -> Result<(Vec<HostTensor>, Vec<usize>), ExecError> {
        let s = &self.plan.steps[si];
        let v = s.reads[0];
        let operand_ty = self.program.instrs[v.index()].ty.clone();
        // Operands that die here move into the collective; others are copied (the copy is
        // live until the results exist, like a moved operand).
        let c = self.live.class[v];
        let dies = self.live.last_read[c] == si && self.live.members[c].len() == 1;
        let mut operand = vec![0usize; devs.len()];
        let take = |(d, operand): (&mut Dev, &mut usize)| -> Result<HostTensor, ExecError> {
            let data = match d.vals[v].take() {
                Some(Buf::Own(a)) if dies => match Arc::try_unwrap(a) {
                    Ok(data) => data,
                    Err(a) => {
                        let data = d.copy_of(self, v, &a);
                        d.vals[v] = Some(Buf::Own(a));
                        d.add_live(data.as_ref().map_or(0, bytes));
                        data?
                    }
                },
                Some(b) => {
                    let data = d.copy_of(self, v, b.data());
                    d.vals[v] = Some(b);
                    d.add_live(data.as_ref().map_or(0, bytes));
                    data?
                }
                None => unreachable!("operands are live"),
            };
            *operand = bytes(&data);
            Ok(HostTensor {
                ty: operand_ty.clone(),
                data,
            })
        };
        // Small operands (a loss, a norm) are gathered on this thread: handing a few bytes
        // to the pool costs more than copying them.
        let local: Vec<HostTensor> = if operand_ty.num_elements() < SMALL_COLLECTIVE {
            devs.iter_mut()
                .zip(operand.iter_mut())
                .map(take)
                .collect::<Result<_, _>>()?
        } else {
            devs.par_iter_mut()
                .zip(operand.par_iter_mut())
                .map(take)
                .collect::<Result<_, _>>()?
        };
        Ok((local, operand))
    }

    /// The results `out` of the collective `began` (ended by step `si`: its own step, or
    /// its wait) become its value on every device; the operands' bytes, live since it
    /// began, are not any more.
    fn results(
        &self,
        devs: &mut [Dev],
        si: StepId,
        out: Vec<HostTensor>,
        began: Began,
        profiler: Option<&Profiler>,
        stats: &mut Vec<CollectiveStat>,
    ) -> Result<(), ExecError> {
        let Began { first, operand, t0 } = began;
        let s = &self.plan.steps[first];
        let ins = &self.program.instrs[s.value.index()];
        let (_, k) = self.mesh_of(first)?;
        let operand_ty = &self.program.instrs[s.reads[0].index()].ty;
        let sent = wire_bytes(&ins.op, operand_ty, k);
        count(stats, ins, sent * devs.len());
        let t1 = profiler.map(|p| p.now_us());
        let how = if first == si {
            String::new()
        } else {
            format!(", in flight from step {first} to step {si}")
        };
        for ((d, t), operand) in devs.iter_mut().zip(out).zip(operand) {
            d.add_live(bytes(&t.data));
            // The operand (moved or copied) was live until the results existed.
            d.live -= operand;
            d.vals[s.value] = Some(Buf::Own(Arc::new(t.data)));
            if let (Some(t0), Some(t1)) = (t0, t1) {
                d.events.push(TraceEvent {
                    device: d.pos,
                    name: s.label.clone(),
                    cat: if first == si { "collective" } else { IN_FLIGHT },
                    ts_us: t0,
                    dur_us: t1 - t0,
                    flops: 0.0,
                    bytes: sent,
                    detail: format!("{operand_ty} over {k} devices{how}"),
                });
            }
            d.release(self, si);
        }
        Ok(())
    }
}

/// A collective in flight between its [`Kind::Start`] and its [`Kind::Wait`].
pub(super) struct Started {
    pending: Pending,
    began: Began,
}

/// Where a collective began: its (first) step, each device's operand bytes (live until the
/// results exist) and the profile's clock then.
struct Began {
    first: StepId,
    operand: Vec<usize>,
    t0: Option<f64>,
}

/// Add `bytes` sent by one run of collective `ins` to `stats`.
fn count(stats: &mut Vec<CollectiveStat>, ins: &Instr, bytes: usize) {
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

impl Dev<'_> {
    /// Place this device's blocks of all-to-all step `si` (its operand exists) into every
    /// receiver's result (`sinks`), as the senders' half of [`Executable::placed`].
    pub(super) fn send(
        &mut self,
        exe: &Executable,
        si: StepId,
        sinks: &Sinks,
    ) -> Result<(), ExecError> {
        let s = &exe.plan.steps[si];
        let ins = &exe.program.instrs[s.value.index()];
        let v = s.reads[0];
        let perm = match &s.kind {
            Kind::Collective { out_perm } => out_perm.as_deref(),
            _ => None,
        };
        let (mesh, k) = exe.mesh_of(si)?;
        let t0 = self.profiler.map(|p| p.now_us());
        let shape = &exe.program.instrs[v.index()].ty.shape;
        // SAFETY: `sinks` address the buffers `run_segments` allocated for this step's
        // results (its dtype and size), which nothing else touches until every task has
        // ended.
        unsafe { place_all_to_all(&ins.op, mesh, shape, perm, self.pos, self.data(v), sinks) }
            .map_err(|msg| CommError::Failed {
                index: s.value.index(),
                op: ins.op.name().into(),
                msg,
            })?;
        if let (Some(p), Some(t0)) = (self.profiler, t0) {
            let ty = &exe.program.instrs[v.index()].ty;
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
}
