//! One function per kind of step, run by [`Dev::step`](super::run::Dev::step) on one
//! device: fused groups (in place over an input that dies there), dots and their sparse
//! supports, masked dots and their sums, dots with an epilogue, single kernels, the
//! reference interpreter's steps, sums of products. Each returns the step's flops and
//! profile detail.

use super::ids::StepId;
use super::kernel::kernel;
use super::plan::Step;
use super::run::{Buf, Dev};
use super::{ExecError, Executable};
use crate::error::RuntimeError;
use crate::kernels::bytes;
use crate::kernels::dot::{
    masked_row_sums, DotCall, DotPath, DotPlan, Epilogue as DotEpilogue, Known, Operand, Support,
    Values, NO_TAIL,
};
use crate::kernels::elementwise::{run_fused_inplace, run_fused_part, Fused};
use crate::tensor::{Data, HostTensor};
use ir::{Instr, ValueId};
use std::sync::Arc;

/// A step's flops and profile detail.
type Done = (f64, String);

/// The step being run: its id, the step and its instruction.
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    pub(super) si: StepId,
    pub(super) s: &'a Step,
    pub(super) ins: &'a Instr,
}

/// The group of a [`Kind::DotFused`](super::plan::Kind::DotFused) step that runs on each
/// batch entry of dot `dot` (read as input `slot`), and whether the dot is kept.
pub(super) struct Epilogue<'a> {
    pub(super) dot: ValueId,
    pub(super) f: &'a Fused,
    pub(super) inputs: &'a [ValueId],
    pub(super) slot: usize,
    pub(super) keep: bool,
}

impl Dev<'_> {
    /// A fused group; written in place over an input that dies here, if one fits.
    pub(super) fn fused(
        &mut self,
        exe: &Executable,
        at: At,
        f: &Fused,
        inputs: &[ValueId],
        inplace_ok: &[bool],
    ) -> Result<Done, ExecError> {
        let (si, value, ty) = (at.si, at.s.value, &at.ins.ty);
        let mut detail = String::new();
        let target = inputs.iter().enumerate().position(|(k, &v)| {
            let c = exe.live.class[v];
            inplace_ok[k]
                && exe.live.last_read[c] == si
                && exe.live.members[c].len() == 1
                && matches!(&self.vals[v], Some(Buf::Own(a)) if Arc::strong_count(a) == 1)
                && exe.program.instrs[v.index()].ty == *ty
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
            None => self.alloc(exe, value)?,
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
        self.vals[value] = Some(Buf::Own(Arc::new(out)));
        Ok((0.0, detail))
    }

    /// A plain dot, prefetching the next dot's operands in its last GEMM.
    pub(super) fn dot(
        &mut self,
        exe: &Executable,
        at: At,
        plan: &DotPlan,
    ) -> Result<Done, ExecError> {
        let s = at.s;
        let mut out = self.alloc(exe, s.value)?;
        let tail = self.tail(exe, at.si);
        let done = self.run_dot(exe, plan, [s.reads[0], s.reads[1]], &mut out, &tail);
        self.vals[s.value] = Some(Buf::Own(Arc::new(out)));
        Ok(done)
    }

    /// The spans of the first-entry operands of the dot that runs after step `si` (for its
    /// last GEMM to fetch), where that dot reads f32 operands that exist already.
    fn tail(&self, exe: &Executable, si: StepId) -> [(usize, usize); 2] {
        let Some(sj) = exe.order.then[si] else {
            return NO_TAIL;
        };
        let s = &exe.plan.steps[sj];
        let plan = match &s.kind {
            super::plan::Kind::Dot(plan) | super::plan::Kind::DotFused { plan, .. } => plan,
            _ => return NO_TAIL,
        };
        // A missing operand (written by step `si` itself, say) reads as empty: no span.
        let f32s = |v: ValueId| match self.vals[v].as_ref().map(|b| b.data()) {
            Some(Data::F32(x)) => x.as_slice(),
            _ => &[],
        };
        plan.first_entry_spans(f32s(s.reads[0]), f32s(s.reads[1]))
    }

    /// Run dot `plan` on values `[l, r]` into `out`: its flops and profile detail.
    fn run_dot(
        &mut self,
        exe: &Executable,
        plan: &DotPlan,
        [l, r]: [ValueId; 2],
        out: &mut Data,
        tail: &[(usize, usize); 2],
    ) -> Done {
        let live = &exe.live;
        // An operand a sparse path may list: its support, found once per run and shared by
        // every product reading it (or the same non-zeros). The pass reads the buffer the
        // key names where it is live (a combine weight, whose values the products need),
        // else this operand.
        for v in [l, r] {
            let key = live.support_of[v];
            if self.supports.contains_key(&key) {
                continue;
            }
            let len = self.data(v).len();
            let src = match &self.vals[key.class().root()] {
                Some(b) if b.data().len() == len => key.class().root(),
                _ => v,
            };
            let sup = match self.data(src) {
                Data::F32(x) if plan.sparse_worth(x.len()) => Support::of(x),
                Data::F64(x) if plan.sparse_worth(x.len()) => Support::of(x),
                _ => continue,
            };
            self.supports.insert(key, (sup, live.class[src]));
        }
        let known = [l, r].map(|v| match self.supports.get(&live.support_of[v]) {
            None => Known::Unknown,
            Some((None, _)) => Known::Dense,
            Some((Some(sup), scanned)) => {
                let vals = if live.class[v] == *scanned {
                    Values::Scanned
                } else if live.class[v] != live.support_of[v].class() {
                    Values::Ones
                } else {
                    Values::Read
                };
                Known::Sparse(sup, vals)
            }
        });
        // An operand released early (`frees_sparse`) is given by its support alone.
        let empty = Data::F32(Vec::new());
        let data = |v: ValueId| self.vals[v].as_ref().map_or(&empty, Buf::data);
        let lhs = Operand::new(&exe.program.instrs[l.index()].ty.shape, data(l));
        let rhs = Operand::new(&exe.program.instrs[r.index()].ty.shape, data(r));
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

    /// A dot computed where its masks are non-zero, when exact; else densely.
    pub(super) fn masked_dot(
        &mut self,
        exe: &Executable,
        at: At,
        plan: &DotPlan,
        masks: &[ValueId],
    ) -> Result<Done, ExecError> {
        let s = at.s;
        let mut out = self.alloc(exe, s.value)?;
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
                let lhs = Operand::new(&exe.program.instrs[l.index()].ty.shape, &lv[..]);
                let rhs = Operand::new(&exe.program.instrs[r.index()].ty.shape, &rv[..]);
                ms.and_then(|ms| DotCall::new(plan, lhs, rhs).run_masked(&ms, o))
            }
            _ => None,
        };
        let done = match computed {
            Some(c) => masked_detail(plan, c),
            None => {
                let (flops, mut detail) = self.run_dot(exe, plan, [l, r], &mut out, &NO_TAIL);
                detail.push_str(" (masks dense)");
                (flops, detail)
            }
        };
        self.vals[s.value] = Some(Buf::Own(Arc::new(out)));
        Ok(done)
    }

    /// The sums of a masked dot's products with its masks, the product never written
    /// (unless the masked path is not exact: then densely, and summed).
    pub(super) fn masked_dot_sums(
        &mut self,
        exe: &Executable,
        at: At,
        plan: &DotPlan,
        dot: ValueId,
        terms: &[(ValueId, ValueId)],
    ) -> Result<Done, ExecError> {
        let s = at.s;
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
        // A mask released early (`frees_sparse`) reads as empty: its support stands for it.
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
        let live = &exe.live;
        // The masks' supports, where found on these very buffers.
        let sups: Vec<Option<&Support>> = terms
            .iter()
            .map(|&(v, _)| match self.supports.get(&live.support_of[v]) {
                Some((Some(sup), scanned)) if *scanned == live.class[v] => Some(sup),
                _ => None,
            })
            .collect();
        let lhs = Operand::new(&exe.program.instrs[l.index()].ty.shape, lv);
        let rhs = Operand::new(&exe.program.instrs[r.index()].ty.shape, rv);
        let done = match DotCall::new(plan, lhs, rhs).run_masked_sums(&masks, &sups, &mut sums) {
            Some(c) => {
                let (flops, mut detail) = masked_detail(plan, c);
                detail.push_str(", summed");
                (flops, detail)
            }
            None => {
                drop(sums);
                let mut prod = self.alloc(exe, dot)?;
                let (flops, mut detail) = self.run_dot(exe, plan, [l, r], &mut prod, &NO_TAIL);
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
                            let sup = match self.supports.get(&live.support_of[v]) {
                                Some((Some(sup), _)) => sup,
                                _ => unreachable!("released only with its support"),
                            };
                            masked_row_sums(plan.n, pv, &sup.dense(), o);
                        }
                    }
                }
                self.free_temp(prod);
                (flops, detail)
            }
        };
        for (o, &(_, u)) in outs.into_iter().zip(terms) {
            self.vals[u] = Some(Buf::Own(Arc::new(o)));
        }
        Ok(done)
    }

    /// A dot whose batch entries each go through a fused group right after their GEMM.
    pub(super) fn dot_fused(
        &mut self,
        exe: &Executable,
        at: At,
        plan: &DotPlan,
        e: &Epilogue,
    ) -> Result<Done, ExecError> {
        let s = at.s;
        let (f, slot) = (e.f, e.slot);
        let (l, r) = (s.reads[0], s.reads[1]);
        let tail = self.tail(exe, at.si);
        let mut d = self.alloc(exe, e.dot)?;
        let mut o = if e.keep {
            Some(self.alloc(exe, s.value)?)
        } else {
            None
        };
        let path = {
            let empty = Data::Bool(Vec::new());
            let ins_data: Vec<&Data> = e
                .inputs
                .iter()
                .enumerate()
                .map(|(k, &v)| if k == slot { &empty } else { self.data(v) })
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
                    run_fused_part(f, &ins_data, bb * mn, &mut part, slot, Some(x));
                }
                None => run_fused_part(f, &ins_data, bb * mn, x, slot, None),
            };
            let epi_in: Vec<&[f32]> = ins_data
                .iter()
                .filter_map(|d| match d {
                    Data::F32(x) => Some(x.as_slice()),
                    _ => None,
                })
                .collect();
            let lhs = Operand::new(&exe.program.instrs[l.index()].ty.shape, &lv[..]);
            let rhs = Operand::new(&exe.program.instrs[r.index()].ty.shape, &rv[..]);
            let call = DotCall {
                tail,
                ..DotCall::new(plan, lhs, rhs)
            };
            let epi = DotEpilogue {
                f: &epi,
                reads: &epi_in,
            };
            call.run_then(dv, &epi)
        };
        let detail = format!(
            "{:?} B={} M={} N={} K={} + fused epilogue",
            path, plan.b, plan.m, plan.n, plan.k
        );
        match o {
            Some(o) => {
                self.vals[e.dot] = Some(Buf::Own(Arc::new(d)));
                self.vals[s.value] = Some(Buf::Own(Arc::new(o)));
            }
            None => self.vals[s.value] = Some(Buf::Own(Arc::new(d))),
        }
        Ok((plan.flops(), detail))
    }

    /// One instruction on its native kernel.
    pub(super) fn kernel(&mut self, exe: &Executable, at: At) -> Result<Done, ExecError> {
        let (s, ins) = (at.s, at.ins);
        let mut out = self.alloc(exe, s.value)?;
        let args: Vec<&Data> = s.reads.iter().map(|&v| self.data(v)).collect();
        kernel(&exe.program, ins, &args, &mut out);
        self.vals[s.value] = Some(Buf::Own(Arc::new(out)));
        Ok((0.0, String::new()))
    }

    /// One instruction computed by the reference interpreter.
    pub(super) fn oracle(&mut self, exe: &Executable, at: At) -> Result<Done, ExecError> {
        let (s, ins) = (at.s, at.ins);
        let args: Vec<HostTensor> = s
            .reads
            .iter()
            .map(|&v| HostTensor {
                ty: exe.program.instrs[v.index()].ty.clone(),
                data: self.data(v).clone(),
            })
            .collect();
        let refs: Vec<&HostTensor> = args.iter().collect();
        let t = crate::reference::eval_local(s.value.index(), ins, &refs).map_err(|e| match e {
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
        self.vals[s.value] = Some(Buf::Own(Arc::new(t.data)));
        Ok((0.0, String::new()))
    }

    /// The f32 sum of the products of two f32 values, in one pass.
    pub(super) fn sum_product(&mut self, exe: &Executable, at: At) -> Result<Done, ExecError> {
        let s = at.s;
        let mut out = self.alloc(exe, s.value)?;
        match (self.data(s.reads[0]), self.data(s.reads[1]), &mut out) {
            (Data::F32(a), Data::F32(b), Data::F32(o)) => {
                masked_row_sums(a.len(), a, b, &mut o[..1])
            }
            _ => unreachable!("sums of products are f32"),
        }
        self.vals[s.value] = Some(Buf::Own(Arc::new(out)));
        Ok((0.0, String::new()))
    }
}

/// The flops and profile detail of a masked dot that computed `c` values.
fn masked_detail(plan: &DotPlan, c: usize) -> Done {
    let (b, m, n, k) = (plan.b, plan.m, plan.n, plan.k);
    let detail = format!(
        "Masked B={b} M={m} N={n} K={k}: {c} of {} values",
        b * m * n
    );
    (2.0 * (c * k) as f64, detail)
}
