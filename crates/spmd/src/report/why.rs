//! `gshard inspect --why`: every collective with its scope, bytes per device and the chain
//! of shardings behind it, grouped by layer; involuntary full gathers flagged with the
//! annotation that would avoid them.

use super::{collectives, human_bytes, CollectiveInfo};
use crate::why::{CollectiveCause, Link, Moved};
use crate::Partitioned;
use ir::scope::layer_of;
use ir::{Program, ValueId};
use sharding::Provenance;
use std::collections::HashMap;
use std::fmt::Write;

/// Options of the `--why` report.
#[derive(Clone, Copy, Debug)]
pub struct WhyOptions {
    /// Flag a full gather only of a tensor of at least this many bytes (global).
    pub min_gather_bytes: usize,
}

impl Default for WhyOptions {
    fn default() -> WhyOptions {
        WhyOptions {
            min_gather_bytes: 1024,
        }
    }
}

/// One collective with its cause, for printing.
#[derive(Clone, Debug)]
pub struct WhyEntry<'a> {
    pub info: CollectiveInfo,
    /// `None` if the partitioner recorded no cause (reported as "unknown").
    pub cause: Option<&'a CollectiveCause>,
    /// The collective's scope path and `grad` marker.
    pub scope: &'a str,
    pub grad: bool,
    /// Its layer (`decoder/layer1`), the group it is printed in.
    pub layer: &'a str,
    /// An involuntary full gather of at least `min_gather_bytes`.
    pub flagged: bool,
}

/// Every collective of `part` with its cause, in program order.
pub fn entries(part: &Partitioned, opts: WhyOptions) -> Vec<WhyEntry<'_>> {
    let p = &part.program;
    let by_id: HashMap<ValueId, &CollectiveCause> =
        part.causes.iter().map(|c| (c.collective, c)).collect();
    collectives(p)
        .into_iter()
        .map(|info| {
            let id = ValueId(info.index as u32);
            let cause = by_id.get(&id).copied();
            let scope = p.scope(id);
            let flagged = cause.is_some_and(|c| {
                c.full_gather.is_some()
                    && c.reshard
                        .as_ref()
                        .is_some_and(|r| r.global.size_bytes() >= opts.min_gather_bytes)
            });
            WhyEntry {
                info,
                cause,
                scope: &scope.path,
                grad: scope.grad,
                layer: layer_of(&scope.path),
                flagged,
            }
        })
        .collect()
}

/// The entries grouped by layer, groups in order of first appearance.
pub fn by_layer<'a, 'e>(entries: &'e [WhyEntry<'a>]) -> Vec<(&'a str, Vec<&'e WhyEntry<'a>>)> {
    let mut groups: Vec<(&str, Vec<&WhyEntry>)> = Vec::new();
    for e in entries {
        match groups.iter_mut().find(|(l, _)| *l == e.layer) {
            Some((_, g)) => g.push(e),
            None => groups.push((e.layer, vec![e])),
        }
    }
    groups
}

/// How a link's sharding was decided, in words.
pub fn how(link: &Link) -> String {
    match link.how {
        Provenance::Annotated => "annotated".to_string(),
        Provenance::Forward { level, from } => match from {
            Some(f) => format!("propagated forward from {f} (level {level})"),
            None => format!("propagated forward (level {level})"),
        },
        Provenance::Backward {
            level,
            user,
            operand,
        } => format!("propagated backward from its user {user} (operand {operand}, level {level})"),
        Provenance::Default => "nothing reached it: replicated".to_string(),
    }
}

/// A value as `%3 parameter "w"` or `%7 dot_general`.
pub fn value_label(link: &Link) -> String {
    match &link.param {
        Some(name) => format!("{} parameter {name:?}", link.value),
        None => format!("{} {}", link.value, link.op),
    }
}

/// One link as `%3 parameter "w" {data, _} at mlp: annotated`.
pub fn describe_link(p: &Program, link: &Link) -> String {
    format!(
        "{} {} at {}: {}",
        value_label(link),
        link.sharding,
        p.scopes.get(link.scope),
        how(link)
    )
}

/// What the collective moves for the instruction it serves, in words.
pub fn describe_moved(cause: &CollectiveCause) -> String {
    let op = format!("{} {}", cause.serves, cause.serves_op);
    match &cause.reshard {
        None => format!("serves {op}: its own exchange (a halo or partial result)"),
        Some(r) => {
            let what = match r.moved {
                Moved::Operand { position, value } => format!("operand {position} ({value})"),
                Moved::Result => "its result".to_string(),
                Moved::Internal => "an intermediate value".to_string(),
            };
            format!(
                "serves {op}: {what} {} moved {} -> {}",
                r.global, r.from, r.to
            )
        }
    }
}

/// The full-gather flag line, if the entry is flagged.
pub fn describe_gather(p: &Program, cause: &CollectiveCause) -> Option<String> {
    let avoid = cause.full_gather.as_ref()?;
    let r = cause.reshard.as_ref()?;
    let whole = human_bytes(r.global.size_bytes());
    let scope = p.scopes.get(avoid.scope);
    let fix = format!("annotate {} {} (at {scope})", avoid.value, avoid.sharding);
    Some(match &avoid.culprit {
        Some(c) => format!(
            "involuntary full gather of {} ({whole}): the annotation {} of {} at {} splits it; {fix} to avoid it",
            r.global,
            c.sharding,
            value_label(c),
            p.scopes.get(c.scope)
        ),
        None => format!(
            "involuntary full gather of {} ({whole}): nothing asked for it whole; {fix} to avoid it",
            r.global
        ),
    })
}

/// The whole `--why` report as text.
pub fn text(part: &Partitioned, opts: WhyOptions) -> String {
    let p = &part.program;
    let entries = entries(part, opts);
    let total: usize = entries.iter().map(|e| e.info.bytes).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# why each collective: {} collectives, {} sent per device, by layer",
        entries.len(),
        human_bytes(total)
    );
    for (layer, group) in by_layer(&entries) {
        let bytes: usize = group.iter().map(|e| e.info.bytes).sum();
        let name = if layer.is_empty() {
            "(top level)"
        } else {
            layer
        };
        let _ = writeln!(
            out,
            "## {name}: {} collectives, {}",
            group.len(),
            human_bytes(bytes)
        );
        for e in group {
            let c = &e.info;
            let scope = p.scope(ValueId(c.index as u32));
            let _ = writeln!(
                out,
                "  %{:<5} {:<18} axes [{}]  {}  {}  at {scope}",
                c.index,
                c.kind,
                c.axes.join(","),
                ir::Type::new(c.dtype, c.shape.clone()),
                human_bytes(c.bytes),
            );
            let Some(cause) = e.cause else {
                let _ = writeln!(out, "      cause unknown");
                continue;
            };
            let _ = writeln!(out, "      {}", describe_moved(cause));
            for (k, l) in cause.required.iter().enumerate() {
                let head = if k == 0 { "needed:" } else { "       " };
                let _ = writeln!(out, "      {head} {}", describe_link(p, l));
            }
            for (k, l) in cause.had.iter().enumerate() {
                let head = if k == 0 { "had:   " } else { "       " };
                let _ = writeln!(out, "      {head} {}", describe_link(p, l));
            }
            if e.flagged {
                if let Some(line) = describe_gather(p, cause) {
                    let _ = writeln!(out, "      ! {line}");
                }
            }
        }
    }
    out
}
