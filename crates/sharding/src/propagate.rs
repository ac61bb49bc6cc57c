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
use ir::{Program, Sharding};
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

/// Complete the shardings of `p`. The result has a sharding on every instruction.
pub fn propagate(p: &Program) -> Result<Program, PropagateError> {
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
        return Ok(out);
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
    Ok(out)
}
