//! TEMPORARY: a canonical dump of the whole preparation, for old/new comparison.

use super::liveness::{Segment, KEPT};
use super::plan::Kind;
use super::Executable;
use ir::Program;
use std::fmt::Write;

impl Executable {
    /// TEMPORARY: the dump (the old executor's format).
    pub fn debug_dump(&self) -> String {
        let mut o = String::new();
        let vs =
            |v: &[ir::ValueId]| format!("{:?}", v.iter().map(|x| x.0 as usize).collect::<Vec<_>>());
        let kind = |k: &Kind| -> String {
            match k {
                Kind::Param(n) => format!("Param({n})"),
                Kind::PartitionId => "PartitionId".into(),
                Kind::Fused {
                    f,
                    inputs,
                    inplace_ok,
                } => {
                    format!(
                        "Fused {{ f: {f:?}, inputs: {}, inplace_ok: {inplace_ok:?} }}",
                        vs(inputs)
                    )
                }
                Kind::Alias(s) => format!("Alias({})", s.0),
                Kind::Move(s) => format!("Move({})", s.0),
                Kind::Dot(p) => format!("Dot({p:?})"),
                Kind::MaskedDot { plan, masks } => format!("MaskedDot({plan:?}, {})", vs(masks)),
                Kind::MaskedDotSums { plan, dot, terms } => {
                    let t: Vec<(usize, usize)> = terms
                        .iter()
                        .map(|&(a, b)| (a.0 as usize, b.0 as usize))
                        .collect();
                    format!("MaskedDotSums({plan:?}, {}, {t:?})", dot.0)
                }
                Kind::DotFused {
                    plan,
                    dot,
                    f,
                    inputs,
                    slot,
                    keep,
                } => {
                    format!(
                        "DotFused({plan:?}, {}, {f:?}, {}, {slot}, {keep})",
                        dot.0,
                        vs(inputs)
                    )
                }
                Kind::Oracle => "Oracle".into(),
                Kind::Kernel => "Kernel".into(),
                Kind::SumProduct => "SumProduct".into(),
                Kind::OracleCollective => "OracleCollective(None)".into(),
                Kind::Collective { out_perm } => format!("Collective({out_perm:?})"),
                Kind::Start { out_perm } => format!("Start({out_perm:?})"),
                Kind::Wait => "Wait".into(),
            }
        };
        for (si, s) in self.plan.steps.iter_enumerated() {
            let frees: Vec<usize> = self.live.frees[si].iter().map(|c| c.0 as usize).collect();
            let sparse: Vec<(usize, usize)> = self.live.frees_sparse[si]
                .iter()
                .map(|&(c, k)| (c.0 as usize, k.0 as usize))
                .collect();
            writeln!(
                o,
                "{}: {} {:?} {} reads={} frees={:?} sparse={:?} label={:?} cat={} then={:?}",
                si.0,
                s.value.0,
                s.also.map(|v| v.0 as usize),
                kind(&s.kind),
                vs(&s.reads),
                frees,
                sparse,
                s.label,
                s.cat,
                self.order.then[si].map(|t| t.0 as usize)
            )
            .unwrap();
        }
        for (k, seg) in self.order.segments.iter().enumerate() {
            let seg = match seg {
                Segment::Local { start, end } => format!("Local({}..{})", start.0, end.0),
                Segment::Collective(si) => format!("Collective({})", si.0),
            };
            let sends: Vec<usize> = self.order.sends[k].iter().map(|s| s.0 as usize).collect();
            writeln!(o, "seg {k}: {seg} sends={sends:?}").unwrap();
        }
        for v in self.live.class.ids() {
            let c = self.live.class[v];
            let root = super::ids::BufClass::of(v);
            let lr = if self.live.last_read[root] == KEPT {
                "kept".to_string()
            } else {
                self.live.last_read[root].0.to_string()
            };
            writeln!(
                o,
                "v{}: class={} members={} last_read={lr} support={} eager={}",
                v.0,
                c.0,
                vs(&self.live.members[root]),
                self.live.support_of[v].0,
                self.live.eager_support[v]
            )
            .unwrap();
        }
        writeln!(
            o,
            "coded={} shared={} sparse={} indicators={} fusion={:?} rounds={}",
            self.coded_relus(),
            self.shared_supports(),
            self.sparse_releases(),
            self.indicator_reads(),
            self.fusion_stats(),
            self.collective_rounds()
        )
        .unwrap();
        o
    }
}

/// TEMPORARY: write `exe`'s dump under $GSHARD_PLAN_DUMP, named by the program and mode.
pub(super) fn dump_hook(p: &Program, reference: bool, exe: &Executable) {
    use std::hash::{Hash, Hasher};
    let Some(dir) = std::env::var_os("GSHARD_PLAN_DUMP") else {
        return;
    };
    if p.instrs.len() > 50_000 {
        return;
    }
    let text = ir::text::print(p);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    reference.hash(&mut h);
    let path = std::path::Path::new(&dir).join(format!("{:016x}.txt", h.finish()));
    let _ = std::fs::write(path, format!("{}\n{text}", exe.debug_dump()));
}
