//! Sharding propagation ("completion", after XLA's `ShardingPropagation`): from the user's
//! annotations to a sharding for every value of the program, forward and backward, to a
//! fixpoint.
//!
//! The shardings present on the input program are the user's and never change. For each
//! aggressiveness level 0..=3, forward passes (program order) and backward passes (reverse
//! order) alternate until nothing changes; a value's sharding only ever moves to a strictly
//! more tiled one (or a compatible merge), so the loop terminates. Values that nothing
//! reached end replicated.

use crate::algebra::improve;
use crate::rules::{backward, forward, Ctx};
use ir::{Program, Sharding, ValueId};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PropagateError {
    #[error("instruction %{index} has sharding {sharding} but the program has no mesh; set program.mesh")]
    NoMesh { index: usize, sharding: String },
    #[error("instruction %{index} ({op}): {msg}")]
    BadAnnotation {
        index: usize,
        op: String,
        msg: String,
    },
    #[error("instruction %{index} is a {op}: propagation takes programs before partitioning")]
    AlreadyPartitioned { index: usize, op: String },
}

/// How propagation decided a value's sharding (the last step that changed it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// The input program's own annotation (the user's, or an earlier pass's).
    Annotated,
    /// The forward rule of the value's op, from its operand `from`, at aggressiveness
    /// `level` (0-3, see [`crate::rules`]).
    Forward { level: u8, from: Option<ValueId> },
    /// The backward rule of `user`, whose operand `operand` the value is, at `level`.
    Backward {
        level: u8,
        user: ValueId,
        operand: usize,
    },
    /// Nothing reached the value: replicated.
    Default,
}

impl Provenance {
    /// The value this decision was taken from, if any.
    pub fn source(&self) -> Option<ValueId> {
        match *self {
            Provenance::Forward { from, .. } => from,
            Provenance::Backward { user, .. } => Some(user),
            Provenance::Annotated | Provenance::Default => None,
        }
    }
}

/// The values a sharding came from, starting at `v`: each step's [`Provenance::source`]
/// until an annotated value (last) or a value with no source. Walks at most once per value,
/// so a cycle of decisions ends.
pub fn provenance_chain(prov: &[Provenance], v: ValueId) -> Vec<ValueId> {
    let mut seen = vec![false; prov.len()];
    let mut chain = vec![v];
    let mut cur = v;
    while let Some(next) = prov.get(cur.index()).and_then(Provenance::source) {
        if next.index() >= prov.len() || std::mem::replace(&mut seen[next.index()], true) {
            break;
        }
        chain.push(next);
        cur = next;
    }
    chain
}

/// Complete the shardings of `p`. The result has a sharding on every instruction.
pub fn propagate(p: &Program) -> Result<Program, PropagateError> {
    propagate_explained(p).map(|(q, _)| q)
}

/// [`propagate`], and for every value how its sharding was decided.
pub fn propagate_explained(p: &Program) -> Result<(Program, Vec<Provenance>), PropagateError> {
    let Some(mesh) = p.mesh.clone() else {
        if let Some((i, ins)) = p
            .instrs
            .iter()
            .enumerate()
            .find(|(_, x)| x.sharding.is_some())
        {
            return Err(PropagateError::NoMesh {
                index: i,
                sharding: ins.sharding.as_ref().unwrap().to_string(),
            });
        }
        let mut out = p.clone();
        for ins in &mut out.instrs {
            ins.sharding = Some(Sharding::replicated(ins.ty.rank()));
        }
        return Ok((out, vec![Provenance::Default; p.len()]));
    };
    for (i, ins) in p.instrs.iter().enumerate() {
        if ins.op.is_device_dependent() {
            return Err(PropagateError::AlreadyPartitioned {
                index: i,
                op: ins.op.name().into(),
            });
        }
        if let Some(s) = &ins.sharding {
            s.validate(&mesh, &ins.ty.shape)
                .map_err(|e| PropagateError::BadAnnotation {
                    index: i,
                    op: ins.op.name().into(),
                    msg: e.to_string(),
                })?;
        }
    }
    let n = p.instrs.len();
    let fixed: Vec<bool> = p.instrs.iter().map(|x| x.sharding.is_some()).collect();
    let mut cur: Vec<Option<Sharding>> = p.instrs.iter().map(|x| x.sharding.clone()).collect();
    let mut prov: Vec<Provenance> = fixed
        .iter()
        .map(|&f| {
            if f {
                Provenance::Annotated
            } else {
                Provenance::Default
            }
        })
        .collect();
    for level in 0..=3u8 {
        loop {
            let mut changed = false;
            for i in 0..n {
                if fixed[i] {
                    continue;
                }
                let cand = forward(
                    &Ctx {
                        p,
                        mesh: &mesh,
                        cur: &cur,
                    },
                    i,
                    level,
                );
                if let Some(c) = cand {
                    if let Some(new) = improve(cur[i].as_ref(), &c, &mesh) {
                        cur[i] = Some(new);
                        prov[i] = Provenance::Forward {
                            level,
                            from: forward_source(p, &cur, i),
                        };
                        changed = true;
                    }
                }
            }
            for i in (0..n).rev() {
                if cur[i].is_none() {
                    continue;
                }
                for k in 0..p.instrs[i].operands.len() {
                    let o = p.instrs[i].operands[k].index();
                    if fixed[o] {
                        continue;
                    }
                    let cand = backward(
                        &Ctx {
                            p,
                            mesh: &mesh,
                            cur: &cur,
                        },
                        i,
                        k,
                        level,
                    );
                    if let Some(c) = cand {
                        if c.rank() != p.instrs[o].ty.rank() {
                            continue;
                        }
                        if let Some(new) = improve(cur[o].as_ref(), &c, &mesh) {
                            cur[o] = Some(new);
                            prov[o] = Provenance::Backward {
                                level,
                                user: ValueId(i as u32),
                                operand: k,
                            };
                            changed = true;
                        }
                    }
                }
            }
            if !changed {
                break;
            }
        }
    }
    let mut out = p.clone();
    for (ins, s) in out.instrs.iter_mut().zip(cur) {
        ins.sharding = Some(s.unwrap_or_else(|| Sharding::replicated(ins.ty.rank())));
    }
    Ok((out, prov))
}

/// The operand a forward rule most plausibly took `i`'s sharding from: the first whose
/// sharding splits something, else the first that has one.
fn forward_source(p: &Program, cur: &[Option<Sharding>], i: usize) -> Option<ValueId> {
    let ops = &p.instrs[i].operands;
    let has = |o: &&ValueId| cur[o.index()].is_some();
    let splits = |o: &&ValueId| {
        cur[o.index()]
            .as_ref()
            .is_some_and(|s| s.dims.iter().any(|d| !d.is_empty()) || !s.partial.is_empty())
    };
    ops.iter()
        .find(splits)
        .or_else(|| ops.iter().find(has))
        .copied()
}
