//! Per-op propagation rules (after XLA's sharding propagation): `forward` infers a result
//! sharding from the operands' shardings, `backward` infers an operand's sharding from a user's
//! result. One exhaustive `match` over `Op` each, so a new op must decide here.
//!
//! Levels follow XLA's aggressiveness ladder: level 0 propagates only through ops that
//! move data without changing it (elementwise, copy, reshape, transpose); level 1 through
//! everything except broadcast; level 2 also broadcast backward; level 3 broadcast forward,
//! last, so a small tensor's sharding does not spread onto a huge broadcast. One deviation:
//! a broadcast that only appends minor dims goes forward at level 1, because per-row values
//! broadcast back over their rows (softmax statistics, one-hots, gates times masks) must keep
//! the rows' layout; otherwise MoE gating would stay unsharded until a dot's backward rule
//! picked a layout for it.

use crate::algebra::{self, merge_all};
use ir::{Mesh, Op, Program, Sharding};

/// What the rules can see: the program, its mesh and the current shardings.
pub struct Ctx<'a> {
    pub p: &'a Program,
    pub mesh: &'a Mesh,
    pub cur: &'a [Option<Sharding>],
}

impl Ctx<'_> {
    fn of(&self, v: ir::ValueId) -> Option<&Sharding> {
        self.cur[v.index()].as_ref()
    }
    fn shape(&self, v: ir::ValueId) -> &[usize] {
        &self.p.ty(v).shape
    }
}

/// Clear the axes of the listed dims.
fn clear(s: &Sharding, dims: impl IntoIterator<Item = usize>) -> Sharding {
    let mut s = s.clone();
    for d in dims {
        s.dims[d].clear();
    }
    s
}

/// Drop the listed dims (ascending or not).
fn remove_dims(s: &Sharding, dims: &[usize]) -> Sharding {
    Sharding {
        dims: s
            .dims
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, d)| d.clone())
            .collect(),
        partial: Vec::new(),
    }
}

/// Insert empty dims at the listed positions of the result.
fn insert_dims(s: &Sharding, dims: &[usize], rank: usize) -> Sharding {
    let mut it = s.dims.iter();
    Sharding {
        dims: (0..rank)
            .map(|i| {
                if dims.contains(&i) {
                    Vec::new()
                } else {
                    it.next().cloned().unwrap_or_default()
                }
            })
            .collect(),
        partial: Vec::new(),
    }
}

/// Dims on which a slice-like op keeps the whole extent.
fn unchanged_dims(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    (0..in_shape.len())
        .filter(|&d| in_shape[d] == out_shape[d])
        .collect()
}

fn from_dims(rank: usize, pairs: impl IntoIterator<Item = (usize, Vec<String>)>) -> Sharding {
    let mut s = Sharding::replicated(rank);
    for (d, axes) in pairs {
        s.dims[d] = axes;
    }
    s
}

fn valid(s: Sharding) -> Option<Sharding> {
    let axes = s.split_axes();
    let mut u = axes.clone();
    u.sort();
    u.dedup();
    (u.len() == axes.len()).then_some(s)
}

/// Candidate sharding of instruction `i`'s result from its operands.
pub fn forward(ctx: &Ctx, i: usize, level: u8) -> Option<Sharding> {
    let ins = &ctx.p.instrs[i];
    let ops = &ins.operands;
    let out_rank = ins.ty.rank();
    let level1 = level >= 1;
    match &ins.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::Rng { .. } => None,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy => {
            let cands: Vec<Sharding> = ops.iter().filter_map(|&o| ctx.of(o).cloned()).collect();
            merge_all(&cands, ctx.mesh)
        }
        Op::Reshape => ctx
            .of(ops[0])
            .map(|s| algebra::reshape(s, ctx.shape(ops[0]), &ins.ty.shape, ctx.mesh)),
        Op::Transpose { perm } => ctx.of(ops[0]).map(|s| algebra::transpose(s, perm)),
        Op::Broadcast { dims } => {
            // A broadcast that only appends minor dims (row statistics broadcast back over
            // their row, a one-hot) keeps the operand's layout and goes at level 1; any other
            // broadcast (a weight or bias spread over a batch) waits for level 3.
            let suffix_only = dims.iter().enumerate().all(|(k, &d)| k == d);
            let s = ctx
                .of(ops[0])
                .filter(|_| level >= 3 || (level >= 1 && suffix_only))?;
            Some(from_dims(
                out_rank,
                dims.iter()
                    .enumerate()
                    .map(|(k, &d)| (d, s.dims[k].clone())),
            ))
        }
        Op::Slice { .. } | Op::DynamicSlice { .. } | Op::Pad { .. } => {
            let s = ctx.of(ops[0]).filter(|_| level1)?;
            let keep = unchanged_dims(ctx.shape(ops[0]), &ins.ty.shape);
            Some(clear(s, (0..out_rank).filter(|d| !keep.contains(d))))
        }
        Op::DynamicUpdateSlice => {
            if !level1 {
                return None;
            }
            let mut cands: Vec<Sharding> = ctx.of(ops[0]).cloned().into_iter().collect();
            if let Some(u) = ctx.of(ops[1]) {
                let keep = unchanged_dims(&ins.ty.shape, ctx.shape(ops[1]));
                cands.push(clear(u, (0..out_rank).filter(|d| !keep.contains(d))));
            }
            merge_all(&cands, ctx.mesh)
        }
        Op::Concatenate { dim } => {
            if !level1 {
                return None;
            }
            let cands: Vec<Sharding> = ops
                .iter()
                .filter_map(|&o| ctx.of(o).map(|s| clear(s, [*dim])))
                .collect();
            merge_all(&cands, ctx.mesh)
        }
        Op::Reduce { dims, .. } => ctx
            .of(ops[0])
            .filter(|_| level1)
            .map(|s| remove_dims(s, dims)),
        Op::Cumsum { dim, .. } => ctx.of(ops[0]).filter(|_| level1).map(|s| clear(s, [*dim])),
        Op::Argmax { dim } => ctx
            .of(ops[0])
            .filter(|_| level1)
            .map(|s| remove_dims(s, &[*dim])),
        Op::DotGeneral(dd) => {
            if !level1 {
                return None;
            }
            let (lr, rr) = (ctx.p.ty(ops[0]).rank(), ctx.p.ty(ops[1]).rank());
            let (lf, rf) = (dd.lhs_free(lr), dd.rhs_free(rr));
            let nb = dd.lhs_batch.len();
            let mut cands = Vec::new();
            if let Some(s) = ctx.of(ops[0]) {
                let pairs = dd
                    .lhs_batch
                    .iter()
                    .enumerate()
                    .map(|(k, &d)| (k, s.dims[d].clone()));
                let free = lf
                    .iter()
                    .enumerate()
                    .map(|(k, &d)| (nb + k, s.dims[d].clone()));
                cands.push((
                    ctx.p.ty(ops[0]).size_bytes(),
                    from_dims(out_rank, pairs.chain(free)),
                ));
            }
            if let Some(s) = ctx.of(ops[1]) {
                let pairs = dd
                    .rhs_batch
                    .iter()
                    .enumerate()
                    .map(|(k, &d)| (k, s.dims[d].clone()));
                let free = rf
                    .iter()
                    .enumerate()
                    .map(|(k, &d)| (nb + lf.len() + k, s.dims[d].clone()));
                cands.push((
                    ctx.p.ty(ops[1]).size_bytes(),
                    from_dims(out_rank, pairs.chain(free)),
                ));
            }
            // The larger operand's candidate is primary (as in XLA), then merge the other.
            cands.sort_by_key(|c| std::cmp::Reverse(c.0));
            let cands: Vec<Sharding> = cands.into_iter().filter_map(|(_, s)| valid(s)).collect();
            let mut best = cands.first()?.clone();
            for c in &cands[1..] {
                if let Some(m) = algebra::merge(&best, c) {
                    best = m;
                }
            }
            Some(best)
        }
        Op::Conv { pad_lo, .. } => {
            if !level1 {
                return None;
            }
            // Batch and spatial dims come from the lhs (a spatial dim whose kernel dim is
            // split is summed over, not kept), output features from the kernel.
            let k = pad_lo.len();
            let ker = ctx.of(ops[1]);
            let mut cands = Vec::new();
            if let Some(s) = ctx.of(ops[0]) {
                let spatial = (0..k)
                    .filter(|&j| ker.is_none_or(|w| w.dims[j].is_empty()))
                    .map(|j| (1 + j, s.dims[1 + j].clone()));
                cands.push((
                    ctx.p.ty(ops[0]).size_bytes(),
                    from_dims(
                        out_rank,
                        std::iter::once((0, s.dims[0].clone())).chain(spatial),
                    ),
                ));
            }
            if let Some(w) = ker {
                cands.push((
                    ctx.p.ty(ops[1]).size_bytes(),
                    from_dims(out_rank, [(k + 1, w.dims[k + 1].clone())]),
                ));
            }
            cands.sort_by_key(|c| std::cmp::Reverse(c.0));
            let cands: Vec<Sharding> = cands.into_iter().filter_map(|(_, s)| valid(s)).collect();
            let mut best = cands.first()?.clone();
            for c in &cands[1..] {
                if let Some(m) = algebra::merge(&best, c) {
                    best = m;
                }
            }
            Some(best)
        }
        // Same tiles; the partitioner moves whole tiles to their mirrored devices.
        Op::Reverse { .. } => ctx.of(ops[0]).cloned(),
        Op::Gather { axis, batch_dims } => {
            if !level1 {
                return None;
            }
            let (xr, ir_) = (ctx.p.ty(ops[0]).rank(), ctx.p.ty(ops[1]).rank());
            let nidx = ir_ - batch_dims;
            let mut cands = Vec::new();
            if let Some(s) = ctx.of(ops[0]) {
                let before = (0..*axis).map(|d| (d, s.dims[d].clone()));
                let after = (axis + 1..xr).map(|d| (d - 1 + nidx, s.dims[d].clone()));
                cands.push(from_dims(out_rank, before.chain(after)));
            }
            if let Some(s) = ctx.of(ops[1]) {
                let batch = (0..*batch_dims).map(|d| (d, s.dims[d].clone()));
                let idx = (*batch_dims..ir_).map(|d| (axis + d - batch_dims, s.dims[d].clone()));
                cands.push(from_dims(out_rank, batch.chain(idx)));
            }
            merge_all(
                &cands.into_iter().filter_map(valid).collect::<Vec<_>>(),
                ctx.mesh,
            )
        }
        Op::ScatterAdd { axis, batch_dims } => {
            if !level1 {
                return None;
            }
            let mut cands: Vec<Sharding> = ctx.of(ops[0]).cloned().into_iter().collect();
            if let Some(u) = ctx.of(ops[2]) {
                let nidx = ctx.p.ty(ops[1]).rank() - batch_dims;
                let before = (0..*axis).map(|d| (d, u.dims[d].clone()));
                let after = (axis + 1..out_rank).map(|d| (d, u.dims[d - 1 + nidx].clone()));
                cands.extend(valid(from_dims(out_rank, before.chain(after))));
            }
            merge_all(&cands, ctx.mesh)
        }
        Op::PartitionId | Op::Collective(_) => None,
    }
}

/// Candidate sharding for operand `k` of instruction `i`, from `i`'s result sharding
/// (and, for dot-general, the other operand's).
pub fn backward(ctx: &Ctx, i: usize, k: usize, level: u8) -> Option<Sharding> {
    let ins = &ctx.p.instrs[i];
    let ops = &ins.operands;
    let s = ctx.cur[i].as_ref()?;
    let in_shape = ctx.shape(ops[k]);
    let in_rank = in_shape.len();
    let level1 = level >= 1;
    match &ins.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::Rng { .. } => None,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy => Some(s.clone()),
        Op::Reshape => Some(algebra::reshape(s, &ins.ty.shape, in_shape, ctx.mesh)),
        Op::Transpose { perm } => Some(algebra::untranspose(s, perm)),
        Op::Broadcast { dims } => (level >= 2).then(|| {
            from_dims(
                in_rank,
                dims.iter()
                    .enumerate()
                    .map(|(k, &d)| (k, s.dims[d].clone())),
            )
        }),
        Op::Slice { .. } | Op::Pad { .. } | Op::DynamicSlice { .. } => {
            if k != 0 || !level1 {
                return None;
            }
            let keep = unchanged_dims(in_shape, &ins.ty.shape);
            Some(clear(s, (0..in_rank).filter(|d| !keep.contains(d))))
        }
        Op::DynamicUpdateSlice => match k {
            0 if level1 => Some(s.clone()),
            1 if level1 => {
                let keep = unchanged_dims(&ins.ty.shape, in_shape);
                Some(clear(s, (0..in_rank).filter(|d| !keep.contains(d))))
            }
            _ => None,
        },
        Op::Concatenate { dim } => level1.then(|| clear(s, [*dim])),
        Op::Reduce { dims, .. } => level1.then(|| insert_dims(s, dims, in_rank)),
        Op::Cumsum { dim, .. } => level1.then(|| clear(s, [*dim])),
        Op::Argmax { dim } => level1.then(|| insert_dims(s, &[*dim], in_rank)),
        Op::DotGeneral(dd) => {
            if !level1 {
                return None;
            }
            let other = ops[1 - k];
            let (lr, rr) = (ctx.p.ty(ops[0]).rank(), ctx.p.ty(ops[1]).rank());
            let (lf, rf) = (dd.lhs_free(lr), dd.rhs_free(rr));
            let nb = dd.lhs_batch.len();
            let (my_batch, my_contract, my_free, free_off, other_batch, other_contract) = if k == 0
            {
                (
                    &dd.lhs_batch,
                    &dd.lhs_contract,
                    &lf,
                    nb,
                    &dd.rhs_batch,
                    &dd.rhs_contract,
                )
            } else {
                (
                    &dd.rhs_batch,
                    &dd.rhs_contract,
                    &rf,
                    nb + lf.len(),
                    &dd.lhs_batch,
                    &dd.lhs_contract,
                )
            };
            let from_out = from_dims(
                in_rank,
                my_batch
                    .iter()
                    .enumerate()
                    .map(|(j, &d)| (d, s.dims[j].clone()))
                    .chain(
                        my_free
                            .iter()
                            .enumerate()
                            .map(|(j, &d)| (d, s.dims[free_off + j].clone())),
                    ),
            );
            let mut cands: Vec<Sharding> = valid(from_out).into_iter().collect();
            if let Some(o) = ctx.of(other) {
                let pairs = other_batch
                    .iter()
                    .zip(my_batch)
                    .chain(other_contract.iter().zip(my_contract))
                    .map(|(&od, &md)| (md, o.dims[od].clone()));
                cands.extend(valid(from_dims(in_rank, pairs)));
            }
            let mut best = cands.first()?.clone();
            for c in &cands[1..] {
                if let Some(m) = algebra::merge(&best, c) {
                    best = m;
                }
            }
            Some(best)
        }
        Op::Conv { pad_lo, .. } => {
            if !level1 {
                return None;
            }
            let kk = pad_lo.len();
            let other = ctx.of(ops[1 - k]);
            let (from_out, from_other) = if k == 0 {
                // Batch and spatial dims from the result, input features from the kernel's.
                let out = from_dims(in_rank, (0..=kk).map(|d| (d, s.dims[d].clone())));
                let feat = other.map(|w| from_dims(in_rank, [(kk + 1, w.dims[kk].clone())]));
                (out, feat)
            } else {
                // Output features from the result, input features from the lhs; the window
                // dims stay whole.
                let out = from_dims(in_rank, [(kk + 1, s.dims[kk + 1].clone())]);
                let feat = other.map(|l| from_dims(in_rank, [(kk, l.dims[kk + 1].clone())]));
                (out, feat)
            };
            let mut cands: Vec<Sharding> = valid(from_out).into_iter().collect();
            cands.extend(from_other.and_then(valid));
            let mut best = cands.first()?.clone();
            for c in &cands[1..] {
                if let Some(m) = algebra::merge(&best, c) {
                    best = m;
                }
            }
            Some(best)
        }
        Op::Reverse { .. } => Some(s.clone()),
        Op::Gather { axis, batch_dims } => {
            if !level1 {
                return None;
            }
            let xr = ctx.p.ty(ops[0]).rank();
            let ir_ = ctx.p.ty(ops[1]).rank();
            let nidx = ir_ - batch_dims;
            match k {
                0 => {
                    let before = (0..*axis).map(|d| (d, s.dims[d].clone()));
                    let after = (axis + 1..xr).map(|d| (d, s.dims[d - 1 + nidx].clone()));
                    valid(from_dims(in_rank, before.chain(after)))
                }
                _ => {
                    let batch = (0..*batch_dims).map(|d| (d, s.dims[d].clone()));
                    let idx =
                        (*batch_dims..ir_).map(|d| (d, s.dims[axis + d - batch_dims].clone()));
                    valid(from_dims(in_rank, batch.chain(idx)))
                }
            }
        }
        Op::ScatterAdd { axis, batch_dims } => {
            if !level1 {
                return None;
            }
            let out_rank = ins.ty.rank();
            let ir_ = ctx.p.ty(ops[1]).rank();
            let nidx = ir_ - batch_dims;
            match k {
                0 => Some(s.clone()),
                2 => {
                    let before = (0..*axis).map(|d| (d, s.dims[d].clone()));
                    let after = (axis + 1..out_rank).map(|d| (d - 1 + nidx, s.dims[d].clone()));
                    valid(from_dims(in_rank, before.chain(after)))
                }
                _ => {
                    // Indices follow the updates' index dims.
                    let u = ctx.of(ops[2])?;
                    let batch = (0..*batch_dims).map(|d| (d, u.dims[d].clone()));
                    let idx =
                        (*batch_dims..ir_).map(|d| (d, u.dims[axis + d - batch_dims].clone()));
                    valid(from_dims(in_rank, batch.chain(idx)))
                }
            }
        }
        Op::PartitionId | Op::Collective(_) => None,
    }
}
