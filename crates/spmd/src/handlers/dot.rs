//! Dot-general (after XLA's dot handler): normalise into batch / contracting / free dim groups.
//! Operands that already agree on their batch and contracting dims, with a contracting dim
//! split (a weight gradient over a split batch, a tensor-parallel projection over split
//! heads or hidden units), compute locally as they are: gathering them instead would repeat
//! the whole product on every device, work a byte count does not see. Otherwise choose among
//! layouts by the bytes the reshards would move: keep the lhs layout and bring the rhs to
//! match; keep the rhs layout; take the output's layout for both (no partial sums); or
//! replicate both. A split contracting dim leaves the local result a pending partial sum,
//! which the driver's reshard turns into an all-reduce or a reduce-scatter.

use super::to;
use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use crate::reshard::cost;
use ir::{DotDims, Op, Sharding, Type};

struct Dims {
    nb: usize,
    lf: Vec<usize>,
    rf: Vec<usize>,
}

fn unique(axes: &[String]) -> bool {
    let mut u = axes.to_vec();
    u.sort();
    u.dedup();
    u.len() == axes.len()
}

/// The result sharding of a local dot of operands laid out as `l` and `r`, or `None` if
/// the layouts disagree on a batch or contracting pair or reuse an axis.
fn result_sharding(dd: &DotDims, d: &Dims, l: &Sharding, r: &Sharding) -> Option<Sharding> {
    for (a, b) in dd
        .lhs_batch
        .iter()
        .zip(&dd.rhs_batch)
        .chain(dd.lhs_contract.iter().zip(&dd.rhs_contract))
    {
        if l.dims[*a] != r.dims[*b] {
            return None;
        }
    }
    let mut dims: Vec<Vec<String>> = dd.lhs_batch.iter().map(|&a| l.dims[a].clone()).collect();
    dims.extend(d.lf.iter().map(|&a| l.dims[a].clone()));
    dims.extend(d.rf.iter().map(|&b| r.dims[b].clone()));
    let partial: Vec<String> = dd
        .lhs_contract
        .iter()
        .flat_map(|&a| l.dims[a].clone())
        .collect();
    let mut all: Vec<String> = dims.iter().flatten().cloned().collect();
    all.extend(partial.iter().cloned());
    unique(&all).then_some(Sharding { dims, partial })
}

/// Lay out the other operand to match `l` on batch and contracting dims; its free dims keep
/// their current axes where still free.
fn matching(
    mine_b: &[usize],
    mine_c: &[usize],
    other_b: &[usize],
    other_c: &[usize],
    other_free: &[usize],
    mine: &Sharding,
    other_cur: &Sharding,
) -> Sharding {
    let mut s = Sharding::replicated(other_cur.rank());
    for (m, o) in mine_b.iter().zip(other_b).chain(mine_c.iter().zip(other_c)) {
        s.dims[*o] = mine.dims[*m].clone();
    }
    let mut used = mine.split_axes();
    used.extend(s.split_axes());
    for &f in other_free {
        let axes: Vec<String> = other_cur.dims[f]
            .iter()
            .filter(|a| !used.contains(a))
            .cloned()
            .collect();
        used.extend(axes.iter().cloned());
        s.dims[f] = axes;
    }
    s
}

pub fn dot_general(
    ctx: &mut Ctx,
    dd: &DotDims,
    l: &PartitionedValue,
    r: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let (lr, rr) = (l.global.rank(), r.global.rank());
    let d = Dims {
        nb: dd.lhs_batch.len(),
        lf: dd.lhs_free(lr),
        rf: dd.rhs_free(rr),
    };
    let mesh = ctx.mesh.clone();
    let lcur = Sharding {
        dims: l.sharding.dims.clone(),
        partial: vec![],
    };
    let rcur = Sharding {
        dims: r.sharding.dims.clone(),
        partial: vec![],
    };

    let mut plans: Vec<(Sharding, Sharding)> = Vec::new();
    // Keep the lhs layout.
    plans.push((
        lcur.clone(),
        matching(
            &dd.lhs_batch,
            &dd.lhs_contract,
            &dd.rhs_batch,
            &dd.rhs_contract,
            &d.rf,
            &lcur,
            &rcur,
        ),
    ));
    // Keep the rhs layout.
    plans.push((
        matching(
            &dd.rhs_batch,
            &dd.rhs_contract,
            &dd.lhs_batch,
            &dd.lhs_contract,
            &d.lf,
            &rcur,
            &lcur,
        ),
        rcur.clone(),
    ));
    // The output's layout on both operands (contracting dims whole).
    let mut lo = Sharding::replicated(lr);
    let mut ro = Sharding::replicated(rr);
    for (j, (&a, &b)) in dd.lhs_batch.iter().zip(&dd.rhs_batch).enumerate() {
        lo.dims[a] = t.dims[j].clone();
        ro.dims[b] = t.dims[j].clone();
    }
    for (j, &a) in d.lf.iter().enumerate() {
        lo.dims[a] = t.dims[d.nb + j].clone();
    }
    for (j, &b) in d.rf.iter().enumerate() {
        ro.dims[b] = t.dims[d.nb + d.lf.len() + j].clone();
    }
    plans.push((lo, ro));
    plans.push((Sharding::replicated(lr), Sharding::replicated(rr)));

    let mut best: Option<(f64, Sharding, Sharding, Sharding)> = None;
    let agreed = plans[0].1 == rcur && dd.lhs_contract.iter().any(|&a| !lcur.dims[a].is_empty());
    if agreed {
        if let Some(res) = result_sharding(dd, &d, &lcur, &rcur) {
            best = Some((0.0, lcur.clone(), rcur.clone(), res));
        }
    }
    if best.is_some() {
        plans.clear();
    }
    for (ls, rs) in plans {
        let Some(res) = result_sharding(dd, &d, &ls, &rs) else {
            continue;
        };
        let c = cost(&l.global, &l.sharding, &ls, &mesh)
            + cost(&r.global, &r.sharding, &rs, &mesh)
            + cost(ty, &res, t, &mesh);
        if best.as_ref().is_none_or(|b| c < b.0) {
            best = Some((c, ls, rs, res));
        }
    }
    let (_, ls, rs, res) = best.ok_or_else(|| SpmdError::Internal {
        index: ctx.at,
        msg: "no dot layout".into(),
    })?;
    let mut ll = to(ctx, l, &ls)?;
    let mut rl = to(ctx, r, &rs)?;
    // Padding on split contracting dims must be zero on both sides (0 * NaN = NaN).
    for (&a, &b) in dd.lhs_contract.iter().zip(&dd.rhs_contract) {
        if !ls.dims[a].is_empty() {
            ll = ctx.mask_padding(&ll, a, &ls.dims[a], l.global.shape[a], 0.0)?;
            rl = ctx.mask_padding(&rl, b, &rs.dims[b], r.global.shape[b], 0.0)?;
        }
    }
    let local = ty.with_shape(res.shard_shape(&mesh, &ty.shape));
    let v = ctx.emit(Op::DotGeneral(dd.clone()), &[&ll, &rl], Some(local))?;
    Ok(PartitionedValue {
        local: v,
        global: ty.clone(),
        sharding: res,
    })
}
