//! Rematerialisation: trade FLOPs for memory by recomputing forward values in the backward
//! pass instead of keeping them alive from the forward pass to their backward use.
//!
//! [`remat`] runs on a program that [`grad`](crate::grad) extended: the backward pass starts
//! at its first instruction with the `grad` scope marker. A [`Policy`] picks which forward
//! values stay alive for the backward pass ("kept"); every other forward value that a
//! backward instruction reads is recomputed: its chain back to kept values is cloned right
//! before its first backward reader, and the backward readers are rewired to the clone. The
//! forward original then dies at its last forward use (the executor frees every value after
//! its last reader), and the clone lives only while the backward pass of its region runs.
//!
//! Clones are the forward instructions themselves (same op, operands, annotation), so they
//! compute the same values: random ops are counter-based (a pure function of the seed
//! operand, stream and element index), and the seed is a parameter, always kept. Each clone
//! has the scope of its original with the `grad` marker. No later pass merges equal
//! instructions (the partitioner maps instructions one to one and the executor lowers one
//! step per live instruction), so the clones stay clones.
//!
//! Always kept, whatever the policy: parameters, constants, iotas, partition ids,
//! collectives (recomputing one would communicate twice) and program outputs.
//!
//! Checkpoint regions come from the config ([`Policy::Scopes`] lists their paths) or from
//! the model code ([`Policy::Marked`]: the regions the model opened with
//! [`ir::Builder::checkpoint_scope`], [`marked_regions`]); either way a region is
//! recomputed from the values entering it, by the same code.

use ir::scope::{layer_of, within};
use ir::{Instr, Op, OpClass, Program, ValueId};
use std::collections::HashMap;
use std::fmt;
use thiserror::Error;

/// Which forward values the backward pass reads from the forward pass (the rest it
/// recomputes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Keep everything (no recomputation).
    #[default]
    None,
    /// Keep what each layer (a scope path through a segment `layer<N>`,
    /// [`ir::scope::layer_of`]) passes to other code, its output; recompute the layer's
    /// forward pass inside its backward pass. Code outside layers is kept.
    Layer,
    /// Keep the outputs of contractions (dot products, convolutions); recompute the
    /// elementwise, layout, reduction and indexing work between them.
    Dots,
    /// Checkpoint regions: each listed scope path (with everything under it) is recomputed
    /// like a layer of [`Policy::Layer`], from the values entering it. The most specific
    /// path that contains an instruction's scope is its region.
    Scopes(Vec<String>),
    /// The checkpoint regions the model code marked ([`ir::Builder::checkpoint_scope`]),
    /// recomputed exactly as [`Policy::Scopes`] recomputes their paths
    /// ([`marked_regions`]). A program without a marked region is refused
    /// ([`RematError::NothingMarked`]).
    Marked,
}

impl Policy {
    /// Parse `none`, `layer`, `dots`, `marked` or `scopes:PATH,PATH,...` (as in configs
    /// and flags).
    pub fn parse(s: &str) -> Result<Policy, RematError> {
        match s.trim() {
            "none" => Ok(Policy::None),
            "layer" => Ok(Policy::Layer),
            "dots" => Ok(Policy::Dots),
            "marked" => Ok(Policy::Marked),
            other => match other.strip_prefix("scopes:") {
                Some(list) => {
                    let paths: Vec<String> = list
                        .split(',')
                        .map(|p| p.trim().trim_matches('/').to_string())
                        .filter(|p| !p.is_empty())
                        .collect();
                    if paths.is_empty() {
                        Err(RematError::NoScopes)
                    } else {
                        Ok(Policy::Scopes(paths))
                    }
                }
                None => Err(RematError::UnknownPolicy {
                    given: other.to_string(),
                }),
            },
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::None => f.write_str("none"),
            Policy::Layer => f.write_str("layer"),
            Policy::Dots => f.write_str("dots"),
            Policy::Scopes(paths) => write!(f, "scopes:{}", paths.join(",")),
            Policy::Marked => f.write_str("marked"),
        }
    }
}

/// Why [`remat`] or [`Policy::parse`] refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RematError {
    #[error("remat policy {given:?} is unknown; use \"none\", \"layer\", \"dots\", \"marked\" (the checkpoint regions the model code marks) or \"scopes:PATH,PATH\" (e.g. \"scopes:encoder/layer0/ffn\")")]
    UnknownPolicy { given: String },
    #[error("remat policy \"scopes:\" lists no scope; name at least one scope path, e.g. \"scopes:encoder/layer0/ffn\"")]
    NoScopes,
    #[error("remat scope `{scope}` contains no forward instruction of the program; use a scope path that `gshard inspect` prints, e.g. `encoder/layer0/ffn`")]
    UnknownScope { scope: String },
    #[error("remat policy \"marked\" finds no checkpoint region in the program; mark regions in the model code (`Builder::checkpoint_scope`, or `[model] checkpoint = [\"ffn\"]` in a run config) or use another policy, e.g. \"scopes:encoder/layer0/ffn\"")]
    NothingMarked,
}

/// A program after [`remat`], and what was recomputed.
#[derive(Clone, Debug)]
pub struct Rematerialised {
    pub program: Program,
    /// The recomputed clones, in program order (ids of `program`).
    pub recomputed: Vec<ValueId>,
}

/// Recompute in the backward pass of `p` the forward values that `policy` does not keep
/// (see the module doc). A program without a backward pass, or [`Policy::None`], comes back
/// unchanged. Instructions before the backward pass keep their ids.
pub fn remat(p: &Program, policy: &Policy) -> Result<Rematerialised, RematError> {
    if *policy == Policy::Marked {
        let regions = marked_regions(p);
        if regions.is_empty() {
            return Err(RematError::NothingMarked);
        }
        return remat(p, &Policy::Scopes(regions));
    }
    let unchanged = || Rematerialised {
        program: p.clone(),
        recomputed: Vec::new(),
    };
    let Some(boundary) = p.instrs.iter().position(|i| p.scopes.is_grad(i.scope)) else {
        return match policy {
            Policy::Scopes(paths) => Err(RematError::UnknownScope {
                scope: paths[0].clone(),
            }),
            _ => Ok(unchanged()),
        };
    };
    let keep = match policy {
        Policy::None => return Ok(unchanged()),
        // Never reached: `marked` became `scopes:` with its regions above.
        Policy::Marked => return Ok(unchanged()),
        Policy::Dots => kept_dots(p, boundary),
        Policy::Layer => {
            let regions = regions_by(p, |path| layer_region(path).map(str::to_string));
            kept_regions(p, boundary, &regions)
        }
        Policy::Scopes(paths) => {
            let regions = regions_by(p, |path| {
                paths
                    .iter()
                    .filter(|s| within(path, s))
                    .max_by_key(|s| s.len())
                    .cloned()
            });
            for s in paths {
                let used = p.instrs[..boundary]
                    .iter()
                    .any(|i| within(p.scopes.path(i.scope), s));
                if !used {
                    return Err(RematError::UnknownScope { scope: s.clone() });
                }
            }
            kept_regions(p, boundary, &regions)
        }
    };
    Ok(rewrite(p, boundary, &keep))
}

/// The checkpoint regions the model code marked in the forward pass of `p` (the whole
/// program when it has no backward pass): the region path of every forward instruction's
/// scope that has one, each once, sorted. [`Policy::Marked`] recomputes these as
/// [`Policy::Scopes`] would.
pub fn marked_regions(p: &Program) -> Vec<String> {
    let forward = p
        .instrs
        .iter()
        .position(|i| p.scopes.is_grad(i.scope))
        .unwrap_or(p.len());
    let mut seen = vec![false; p.scopes.len()];
    let mut regions: Vec<String> = Vec::new();
    for ins in &p.instrs[..forward] {
        let Some(s) = seen.get_mut(ins.scope.index()) else {
            continue;
        };
        if std::mem::replace(s, true) {
            continue;
        }
        if let Some(r) = p.scopes.checkpoint_region(ins.scope) {
            regions.push(r.to_string());
        }
    }
    regions.sort();
    regions.dedup();
    regions
}

/// The layer `path` belongs to (through its first `layer<N>` segment), if any.
fn layer_region(path: &str) -> Option<&str> {
    let layer = layer_of(path);
    let last = layer.rsplit('/').next()?;
    let is_layer = last
        .strip_prefix("layer")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    is_layer.then_some(layer)
}

/// A region name per instruction (`None`: outside every region), computed once per scope
/// of the table.
struct Regions {
    of_instr: Vec<Option<u32>>,
}

fn regions_by(p: &Program, region: impl Fn(&str) -> Option<String>) -> Regions {
    let mut ids: HashMap<String, u32> = HashMap::new();
    let of_scope: Vec<Option<u32>> = p
        .scopes
        .iter()
        .map(|(_, s)| {
            region(&s.path).map(|name| {
                let next = ids.len() as u32;
                *ids.entry(name).or_insert(next)
            })
        })
        .collect();
    let of_instr = p
        .instrs
        .iter()
        .map(|i| of_scope.get(i.scope.index()).copied().flatten())
        .collect();
    Regions { of_instr }
}

/// What every policy keeps: sources other than random numbers, collectives, outputs.
fn always_kept(p: &Program, boundary: usize) -> Vec<bool> {
    let mut keep: Vec<bool> = p.instrs[..boundary]
        .iter()
        .map(|i| match i.op.class() {
            OpClass::Source => !matches!(i.op, Op::Rng { .. }),
            OpClass::Collective => true,
            OpClass::Elementwise
            | OpClass::Layout
            | OpClass::Reduction
            | OpClass::Contraction
            | OpClass::Indexing => false,
        })
        .collect();
    for (_, v) in &p.outputs {
        if let Some(k) = keep.get_mut(v.index()) {
            *k = true;
        }
    }
    keep
}

fn kept_dots(p: &Program, boundary: usize) -> Vec<bool> {
    let mut keep = always_kept(p, boundary);
    for (k, i) in keep.iter_mut().zip(&p.instrs) {
        *k |= i.op.class() == OpClass::Contraction;
    }
    keep
}

/// Kept: values outside every region, and values a forward instruction of another region
/// (or of none) reads: what a region passes on.
fn kept_regions(p: &Program, boundary: usize, r: &Regions) -> Vec<bool> {
    let mut keep = always_kept(p, boundary);
    for (v, k) in keep.iter_mut().enumerate() {
        *k |= r.of_instr[v].is_none();
    }
    for (u, ins) in p.instrs[..boundary].iter().enumerate() {
        for o in &ins.operands {
            if r.of_instr[o.index()] != r.of_instr[u] {
                keep[o.index()] = true;
            }
        }
    }
    keep
}

/// Copy the forward pass, then the backward pass with each read of a forward value that
/// `keep` does not keep redirected to a clone, emitted (with its own chain) before the
/// first such read.
fn rewrite(p: &Program, boundary: usize, keep: &[bool]) -> Rematerialised {
    let mut out = Program {
        instrs: p.instrs[..boundary].to_vec(),
        outputs: Vec::new(),
        mesh: p.mesh.clone(),
        scopes: p.scopes.clone(),
    };
    // New id of every value: forward values keep theirs; clones of forward values apart.
    let mut map: Vec<ValueId> = (0..p.len() as u32).map(ValueId).collect();
    let mut clone: Vec<Option<ValueId>> = vec![None; boundary];
    let mut recomputed = Vec::new();
    let recompute = |o: ValueId| o.index() < boundary && !keep[o.index()];
    for i in boundary..p.len() {
        let ins = &p.instrs[i];
        for &o in &ins.operands {
            if !recompute(o) || clone[o.index()].is_some() {
                continue;
            }
            // Depth-first over the chain, with an explicit stack (chains can be as long as
            // the forward pass): a value is cloned after all its recomputed operands.
            let mut stack = vec![(o, false)];
            while let Some((v, ready)) = stack.pop() {
                if clone[v.index()].is_some() {
                    continue;
                }
                let orig = &p.instrs[v.index()];
                if !ready {
                    stack.push((v, true));
                    for &w in &orig.operands {
                        if recompute(w) && clone[w.index()].is_none() {
                            stack.push((w, false));
                        }
                    }
                    continue;
                }
                let operands = orig
                    .operands
                    .iter()
                    .map(|&w| clone[w.index()].unwrap_or(w))
                    .collect();
                let scope = out.scopes.grad_of(orig.scope);
                let id = out.push(Instr {
                    op: orig.op.clone(),
                    operands,
                    ty: orig.ty.clone(),
                    sharding: orig.sharding.clone(),
                    scope,
                });
                clone[v.index()] = Some(id);
                recomputed.push(id);
            }
        }
        let operands = ins
            .operands
            .iter()
            .map(|&o| match clone.get(o.index()).copied().flatten() {
                Some(c) if recompute(o) => c,
                _ => map[o.index()],
            })
            .collect();
        map[i] = out.push(Instr {
            operands,
            ..ins.clone()
        });
    }
    out.outputs = p
        .outputs
        .iter()
        .map(|(n, v)| (n.clone(), map[v.index()]))
        .collect();
    debug_assert!(
        ir::verify(&out).is_ok(),
        "{}",
        ir::verify(&out).unwrap_err()
    );
    Rematerialised {
        program: out,
        recomputed,
    }
}

#[cfg(test)]
mod tests;
