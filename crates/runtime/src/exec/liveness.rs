//! What the final plan keeps in memory and when, computed once after the last rewrite:
//! buffer classes (a value and its aliases), the step after which each is released, the
//! supports values share and the values released early once a run found theirs
//! ([`Liveness`]); and the order of running: segments, the all-to-alls placed by their
//! senders, the dots that prefetch the next one's operands ([`Segments`]).

use super::ids::{BufClass, Id, IdVec, StepId, SupportKey};
use super::passes::{f32_value, indicator_dots::indicator_of};
use super::plan::{Kind, Plan, PlanError, PlanProblem, SMALL_COLLECTIVE};
use ir::{CollectiveKind, Program, ValueId};
use std::collections::HashMap;

/// `last_read` of a class that is never released (a program output's).
pub(crate) const KEPT: StepId = StepId(u32::MAX);

/// Buffers and their releases.
pub(crate) struct Liveness {
    /// `class[v]`: the buffer `v` shares (its own unless an alias).
    pub(crate) class: IdVec<ValueId, BufClass>,
    /// Values sharing each class root's buffer.
    pub(crate) members: IdVec<BufClass, Vec<ValueId>>,
    /// Last step reading each class ([`KEPT`] for outputs).
    pub(crate) last_read: IdVec<BufClass, StepId>,
    /// Buffer classes released after each step.
    pub(crate) frees: IdVec<StepId, Vec<BufClass>>,
    /// `(class, support key)`: values whose later readers are only summed masked dots (as
    /// masks) or plain dots, released after each step when the run has found their support
    /// (those readers then take them by the support alone; see `Dev::release`).
    pub(crate) frees_sparse: IdVec<StepId, Vec<(BufClass, SupportKey)>>,
    /// `support_of[v]`: the key of the non-zeros `v` has at the same positions (its own
    /// class, or that of `x` for a group `convert(x != 0)`): the key of the supports a run
    /// shares between sparse products ([`Support`](crate::kernels::dot::Support)).
    pub(crate) support_of: IdVec<ValueId, SupportKey>,
    /// Values whose support is found as soon as they are computed, while in cache: the
    /// masks of summed masked dots, which read them much later (the backward pass).
    pub(crate) eager_support: IdVec<ValueId, bool>,
}

impl Liveness {
    /// The buffers and releases of `plan`, a plan of `p` after its last rewrite.
    pub(crate) fn of(p: &Program, plan: &Plan) -> Liveness {
        let n = p.instrs.len();
        let steps = &plan.steps;
        let mut class: IdVec<ValueId, BufClass> = (0..n as u32).map(BufClass).collect();
        for s in steps.iter() {
            if let Kind::Alias(src) = s.kind {
                class[s.value] = class[src];
            }
        }
        let mut members: IdVec<BufClass, Vec<ValueId>> = IdVec::filled(Vec::new(), n);
        for s in steps.iter() {
            for v in s.outputs() {
                members[class[v]].push(v);
            }
        }
        let mut last_read: IdVec<BufClass, StepId> = IdVec::filled(StepId(0), n);
        for (si, s) in steps.iter_enumerated() {
            for v in s.outputs().chain(s.reads.iter().copied()) {
                let c = class[v];
                last_read[c] = last_read[c].max(si);
            }
        }
        for &(_, v) in &p.outputs {
            last_read[class[v]] = KEPT;
        }
        let mut frees: IdVec<StepId, Vec<BufClass>> = IdVec::filled(Vec::new(), steps.len());
        for c in class.ids().map(BufClass::of) {
            if class[c.root()] == c && !members[c].is_empty() && last_read[c] != KEPT {
                frees[last_read[c]].push(c);
            }
        }
        let support_of = same_supports(p, plan, &class);
        let mut eager_support: IdVec<ValueId, bool> = IdVec::filled(false, n);
        for s in steps.iter() {
            if let Kind::MaskedDotSums { terms, .. } = &s.kind {
                for &(mask, _) in terms {
                    eager_support[mask] = f32_value(p, mask);
                }
            }
        }
        let mut live = Liveness {
            class,
            members,
            last_read,
            frees,
            frees_sparse: IdVec::filled(Vec::new(), steps.len()),
            support_of,
            eager_support,
        };
        live.frees_sparse = live.sparse_releases(p, plan);
        live
    }

    /// The early releases (`frees_sparse`). A mask with an eager support whose readers
    /// after some step are only summed masked dots (the gating masks, read in the forward
    /// pass by the combine weights' group and in the backward one by the sums of their
    /// gradient) is released after that step when its support was found: the sums read the
    /// support alone, and its buffer goes back to the pool while in cache (the small MoE
    /// layer's two masks, 512 KiB per device, were otherwise held from the forward pass to
    /// the backward). In-process A/B on the small layer: 1.0047 and 1.0033 at 8 devices,
    /// 1.0075 at 1; resident bytes per device 7.88 -> 7.38 MiB (the peak comes earlier in
    /// the step). Also any other f32 value whose later readers are plain dots, released
    /// where a sparse product found its support on it (the MoE combine weights, read in the
    /// backward pass by their own gradient's dot and, as an indicator, by the dispatch
    /// gradient's): its support may be found by a plain dot up to its last other reader.
    fn sparse_releases(
        &self,
        p: &Program,
        plan: &Plan,
    ) -> IdVec<StepId, Vec<(BufClass, SupportKey)>> {
        let n = p.instrs.len();
        let steps = &plan.steps;
        let class = &self.class;
        let mut last_dense: IdVec<BufClass, StepId> = IdVec::filled(StepId(0), n);
        // The first plain dot reading each class: where a sparse product may find its
        // support, before which nothing is released.
        let mut first_dot: IdVec<BufClass, StepId> = IdVec::filled(KEPT, n);
        for (si, s) in steps.iter_enumerated() {
            if matches!(s.kind, Kind::Dot(_)) {
                for &r in s.reads.iter().take(2) {
                    first_dot[class[r]] = first_dot[class[r]].min(si);
                }
            }
            for v in s.outputs() {
                last_dense[class[v]] = last_dense[class[v]].max(si);
            }
            let sums = matches!(s.kind, Kind::MaskedDotSums { .. });
            // A plain dot lists an operand's terms from its support and rebuilds it from
            // the support where its path reads it densely (`dot_known`).
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
        let mut frees_sparse: IdVec<StepId, Vec<(BufClass, SupportKey)>> =
            IdVec::filled(Vec::new(), steps.len());
        for v in class.ids() {
            let own = BufClass::of(v);
            let by_support = self.eager_support[v]
                || (class[v] == own
                    && self.support_of[v] == SupportKey::of(own)
                    && f32_value(p, v)
                    && first_dot[own] <= last_dense[own]);
            let c = class[v];
            if by_support
                && self.last_read[c] != KEPT
                && last_dense[c] < self.last_read[c]
                && !frees_sparse[last_dense[c]].iter().any(|&(x, _)| x == c)
            {
                frees_sparse[last_dense[c]].push((c, self.support_of[v]));
            }
        }
        frees_sparse
    }

    /// Check the releases against the plan: no step reads a value whose buffer an
    /// earlier step released (`frees`; the early releases stand in for their support),
    /// and no output's buffer is released.
    pub(crate) fn verify(&self, p: &Program, plan: &Plan) -> Result<(), PlanError> {
        let mut released: IdVec<BufClass, Option<StepId>> = IdVec::filled(None, self.class.len());
        for (si, s) in plan.steps.iter_enumerated() {
            for &r in &s.reads {
                if let Some(at) = released[self.class[r]] {
                    let problem = PlanProblem::ReadAfterRelease {
                        value: r,
                        released: at,
                    };
                    return Err(plan.error(si, problem));
                }
            }
            for &c in &self.frees[si] {
                released[c] = Some(si);
            }
        }
        for &(_, v) in &p.outputs {
            if let Some(at) = released[self.class[v]] {
                return Err(plan.error(at, PlanProblem::OutputReleased { value: v }));
            }
        }
        Ok(())
    }
}

/// `support_of[v]` for every value (see [`Liveness::support_of`]): its buffer class,
/// except that a fused group computing exactly `convert(x != 0)` (or `0 != x`) to a float
/// from a float `x` of its shape shares `x`'s key: both are non-zero at the same positions
/// (`-0` and `+0` compare equal to zero, NaN does not, as in the sparse path's scan). A
/// combine weight's support then also serves its dispatch mask (MoE: one pass over the four
/// one-hot products' sparse operands instead of four).
fn same_supports(
    p: &Program,
    plan: &Plan,
    class: &IdVec<ValueId, BufClass>,
) -> IdVec<ValueId, SupportKey> {
    let mut key: IdVec<BufClass, SupportKey> = class.iter().map(|&c| SupportKey::of(c)).collect();
    for s in plan.steps.iter() {
        if let Some(x) = indicator_of(p, s) {
            key[class[s.value]] = key[class[x]];
        }
    }
    // A class's members share its key.
    class.iter().map(|&c| key[c]).collect()
}

/// A run's unit of work: a run of local steps every device runs as one task, or one
/// collective over all devices.
#[derive(Debug)]
pub(crate) enum Segment {
    /// Steps `start..end`.
    Local {
        start: StepId,
        end: StepId,
    },
    Collective(StepId),
}

impl Segment {
    /// The steps of a local segment, in order.
    #[inline]
    pub(crate) fn steps(start: StepId, end: StepId) -> impl Iterator<Item = StepId> {
        (start.0..end.0).map(StepId)
    }
}

/// The plan cut into segments, and what each local segment's tasks do at their end.
pub(crate) struct Segments {
    pub(crate) segments: Vec<Segment>,
    /// `sends[k]`: for local segment `k`, the all-to-all steps of the round after it whose
    /// senders place their blocks at the end of this segment's device tasks, where the
    /// communicator shares memory ([`Communicator::shared_memory`](crate::comm::Communicator::shared_memory)).
    pub(crate) sends: Vec<Vec<StepId>>,
    /// `then[si]`: the dot step right after dot step `si` (see `Dev::tail`).
    pub(crate) then: IdVec<StepId, Option<StepId>>,
}

impl Segments {
    /// Segments: maximal runs of non-collective steps; each collective is a segment alone.
    pub(crate) fn of(p: &Program, plan: &Plan) -> Segments {
        let steps = &plan.steps;
        let mut segments = Vec::new();
        let mut start = StepId(0);
        for (si, s) in steps.iter_enumerated() {
            if s.kind.is_collective() {
                if start < si {
                    segments.push(Segment::Local { start, end: si });
                }
                segments.push(Segment::Collective(si));
                start = si.next();
            }
        }
        let end = StepId::from_index(steps.len());
        if start < end {
            segments.push(Segment::Local { start, end });
        }
        // All-to-alls whose (large) operand exists when the local segment before their
        // round ends: with devices sharing memory, each sender places its blocks in the
        // receivers' results as its task ends, while the other tasks still run, instead of
        // all devices waiting for a copy pass after the barrier.
        let made_at: HashMap<ValueId, StepId> = steps
            .iter_enumerated()
            .flat_map(|(si, s)| s.outputs().map(move |v| (v, si)))
            .collect();
        let sends: Vec<Vec<StepId>> = segments
            .iter()
            .enumerate()
            .map(|(k, seg)| {
                let Segment::Local { end, .. } = *seg else {
                    return Vec::new();
                };
                segments[k + 1..]
                    .iter()
                    .map_while(|s| match s {
                        Segment::Collective(si) => Some(*si),
                        Segment::Local { .. } => None,
                    })
                    .filter(|&si| {
                        let s = &steps[si];
                        // A wait reads nothing (and its collective is not placed).
                        let Some(&v) = s.reads.first() else {
                            return false;
                        };
                        matches!(s.kind, Kind::Collective { .. })
                            && matches!(
                                p.instrs[s.value.index()].op.collective_kind(),
                                Some(CollectiveKind::AllToAll { .. })
                            )
                            && p.instrs[v.index()].ty.num_elements() >= SMALL_COLLECTIVE
                            && made_at.get(&v).is_some_and(|&at| at < end)
                    })
                    .collect()
            })
            .collect();
        // A dot followed by a dot (the same segment: only collectives end one): the first
        // one's last GEMM fetches the second one's first-entry operands.
        let is_dot = |s: &super::plan::Step| matches!(s.kind, Kind::Dot(_) | Kind::DotFused { .. });
        let then = steps
            .ids()
            .map(|si| {
                let next = si.next();
                steps
                    .get(next)
                    .is_some_and(|t| is_dot(&steps[si]) && is_dot(t))
                    .then_some(next)
            })
            .collect();
        Segments {
            segments,
            sends,
            then,
        }
    }

    /// Rounds of collectives per run: runs of collectives with no local steps between them
    /// (each round is one barrier across the device tasks; see
    /// [`rounds`](super::passes::rounds)).
    pub(crate) fn rounds(&self) -> usize {
        let mut rounds = 0;
        let mut prev_collective = false;
        for seg in &self.segments {
            let c = matches!(seg, Segment::Collective(_));
            rounds += usize::from(c && !prev_collective);
            prev_collective = c;
        }
        rounds
    }
}
