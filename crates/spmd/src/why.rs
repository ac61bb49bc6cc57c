//! Why each collective: for every collective the partitioner emits, the instruction it
//! serves, what it moves there (an operand, the result, or a value inside the op's own
//! partitioning), from which sharding to which, and where those shardings came from (a
//! user annotation at a scope, or the propagation step and rule that chose them).
//!
//! Recorded while partitioning (the emission context notes each collective as it is
//! emitted, a few words per collective, nothing per instruction), completed once at the
//! end against the propagated program. `gshard inspect --why` prints it, grouped by layer.

use ir::{Program, ScopeId, Sharding, Type, ValueId};
use sharding::{provenance_chain, Provenance};

/// What a reshard moves for the instruction it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// Operand `position` of the served instruction, the global value `value`.
    Operand { position: usize, value: ValueId },
    /// The served instruction's result, to the sharding assigned to it.
    Result,
    /// A value inside the op's own partitioning (a halo, a partial result).
    Internal,
}

/// A reshard in progress: the context of the collectives it emits.
#[derive(Clone, Debug, PartialEq)]
pub struct Reshard {
    pub moved: Moved,
    pub from: Sharding,
    pub to: Sharding,
    /// The global type of the value moved.
    pub global: Type,
    /// The reshard gathers a split value whole (see [`CollectiveCause::full_gather`]).
    pub gathers_whole: bool,
}

/// One collective as emitted (local ids of the unpruned program).
#[derive(Clone, Debug)]
pub(crate) struct Emitted {
    pub(crate) local: ValueId,
    pub(crate) serves: ValueId,
    pub(crate) reshard: Option<Reshard>,
}

/// One value on the way from a requirement to its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    /// The value in the global (propagated) program.
    pub value: ValueId,
    pub op: &'static str,
    /// The parameter's name, for a parameter.
    pub param: Option<String>,
    /// Its scope (an id of the partitioned program's table, which holds the global one's).
    pub scope: ScopeId,
    pub sharding: Sharding,
    pub how: Provenance,
}

/// Why one collective of the per-device program is there.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveCause {
    /// The collective in the per-device program.
    pub collective: ValueId,
    /// The instruction of the global program it serves; the collective has its scope.
    pub serves: ValueId,
    pub serves_op: &'static str,
    pub scope: ScopeId,
    /// The reshard that emitted it; `None` for the op's own communication (a halo exchange).
    pub reshard: Option<Reshard>,
    /// Where the sharding that was needed came from: the served instruction's own result
    /// sharding and, for an operand, the operand's; each followed back to its annotation.
    pub required: Vec<Link>,
    /// Where the sharding it had came from (the moved value's chain), when it is a value of
    /// the global program.
    pub had: Vec<Link>,
    /// An involuntary full gather: a split value gathered whole where no annotation asked
    /// for it whole, with the annotation that would avoid it.
    pub full_gather: Option<Avoid>,
}

/// The annotation that would avoid a full gather: `value` annotated `sharding`.
#[derive(Clone, Debug, PartialEq)]
pub struct Avoid {
    pub value: ValueId,
    pub scope: ScopeId,
    pub sharding: Sharding,
    /// The annotated value whose layout the gathered one inherited, if one is.
    pub culprit: Option<Link>,
}

/// Follow `v`'s provenance back to its annotation (first the value itself).
fn chain(p: &Program, prov: &[Provenance], v: ValueId) -> Vec<Link> {
    let ids = provenance_chain(prov, v);
    // Keep the value, the step that decided it and the annotation it came from.
    let keep: Vec<ValueId> = match ids.len() {
        0..=3 => ids,
        n => vec![ids[0], ids[1], ids[n - 1]],
    };
    keep.into_iter().map(|id| link(p, prov, id)).collect()
}

/// Value `id` of `p` with its sharding and how it was decided.
fn link(p: &Program, prov: &[Provenance], id: ValueId) -> Link {
    let ins = p.instr(id);
    let param = match &ins.op {
        ir::Op::Parameter { name } => Some(name.clone()),
        _ => None,
    };
    Link {
        value: id,
        op: ins.op.name(),
        param,
        scope: ins.scope,
        sharding: ins
            .sharding
            .clone()
            .unwrap_or_else(|| Sharding::replicated(ins.ty.rank())),
        how: prov
            .get(id.index())
            .copied()
            .unwrap_or(Provenance::Annotated),
    }
}

/// Complete the recorded collectives against the propagated program `p` (with `prov`, how
/// each of its shardings was decided), keeping those `map` (old -> new local ids after
/// pruning) keeps.
pub(crate) fn complete(
    p: &Program,
    prov: &[Provenance],
    emitted: Vec<Emitted>,
    map: &[Option<ValueId>],
) -> Vec<CollectiveCause> {
    let mut out = Vec::new();
    for e in emitted {
        let Some(Some(collective)) = map.get(e.local.index()).copied() else {
            continue;
        };
        let ins = p.instr(e.serves);
        let required = chain(p, prov, e.serves);
        let mut had = Vec::new();
        if let Some(Reshard {
            moved: Moved::Operand { value, .. },
            ..
        }) = &e.reshard
        {
            had = chain(p, prov, *value);
        }
        if let Some(Reshard {
            moved: Moved::Result,
            ..
        }) = &e.reshard
        {
            // The result had the layout the handler chose from the operands: name the
            // first split one.
            let split = |v: &&ValueId| {
                p.instr(**v)
                    .sharding
                    .as_ref()
                    .is_some_and(|s| s.dims.iter().any(|d| !d.is_empty()))
            };
            if let Some(&o) = ins.operands.iter().find(split).or(ins.operands.first()) {
                had = chain(p, prov, o);
            }
        }
        let full_gather = e.reshard.as_ref().and_then(|r| avoid(p, prov, &e, r));
        out.push(CollectiveCause {
            collective,
            serves: e.serves,
            serves_op: ins.op.name(),
            scope: ins.scope,
            reshard: e.reshard,
            required,
            had,
            full_gather,
        });
    }
    out
}

/// The annotation that would avoid an involuntary full gather, if `r` is one.
fn avoid(p: &Program, prov: &[Provenance], e: &Emitted, r: &Reshard) -> Option<Avoid> {
    if !r.gathers_whole {
        return None;
    }
    let annotated = |v: ValueId| prov.get(v.index()) == Some(&Provenance::Annotated);
    match r.moved {
        // The user asked for the result whole: voluntary.
        Moved::Result if annotated(e.serves) => None,
        Moved::Result => Some(Avoid {
            value: e.serves,
            scope: p.instr(e.serves).scope,
            sharding: r.to.clone(),
            culprit: None,
        }),
        Moved::Operand { value, .. } => {
            let culprit = provenance_chain(prov, value)
                .into_iter()
                .rfind(|&v| annotated(v))
                .map(|v| link(p, prov, v));
            Some(Avoid {
                value,
                scope: p.instr(value).scope,
                sharding: r.to.clone(),
                culprit,
            })
        }
        Moved::Internal => None,
    }
}
