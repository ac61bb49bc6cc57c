//! The one `reshard()` (after XLA's `ReshardNoCache`): move a value from any sharding to any
//! other.
//!
//! Planning and emission are separate so the dot-general cost model prices exactly the
//! collectives that would be emitted. When `S` and `T` cut every dim into the same number of
//! tiles (and neither holds partial sums), a reshard only moves whole tiles between devices:
//! one collective-permute (each device receives the tile it holds under `T` from a device
//! that holds it under `S`, itself where it can), or nothing at all where every device
//! already holds its tile. That plan is taken when it costs no more than the general one,
//! which, for shardings `S -> T`, is:
//! 1. pending partial sums that `T` does not keep: a reduce-scatter where `T` splits a dim
//!    next on that axis, else one all-reduce;
//! 2. a changing dim that does not divide evenly is gathered whole and trimmed (its padding
//!    would not line up otherwise);
//! 3. every dim is cut back to a prefix of its target axis list, minor axis first: an axis
//!    that `T` wants next on another dim moves there with an all-to-all, any other is
//!    all-gathered;
//! 4. every dim grows to its target by dynamic-slicing at the device's offset (no
//!    communication; uneven dims are padded first);
//! 5. partial axes that `T` adds but `S` lacks keep the value on rank 0 and zeros elsewhere.

use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use ir::{Literal, Mesh, Op, ReduceOp, Sharding, Type};

/// One step of a reshard plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    AllReduce {
        axes: Vec<String>,
    },
    ReduceScatter {
        dim: usize,
        axis: String,
    },
    GatherWholeAndTrim {
        dim: usize,
        axes: Vec<String>,
    },
    AllGather {
        dim: usize,
        axis: String,
    },
    AllToAll {
        split_dim: usize,
        concat_dim: usize,
        axis: String,
    },
    DynamicSlice {
        dim: usize,
        axis: String,
    },
    PadAndSlice {
        dim: usize,
        axes: Vec<String>,
    },
    MakePartial {
        axes: Vec<String>,
    },
    /// Whole tiles move: rank `src` sends its buffer to rank `dst` within the groups along
    /// `axes`.
    CollectivePermute {
        axes: Vec<String>,
        pairs: Vec<(usize, usize)>,
    },
}

fn is_prefix(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && a == &b[..a.len()]
}

/// The steps that take a value of `global` shape from `s` to `t`: the tile permutation
/// where one exists and costs no more, else the general plan.
pub fn plan(global: &[usize], s: &Sharding, t: &Sharding, mesh: &Mesh) -> Vec<Step> {
    match tile_permutation(s, t, mesh) {
        Some(p) if p.is_empty() => p,
        Some(p) => {
            let general = general_plan(global, s, t, mesh);
            let shard = s.shard_shape(mesh, global);
            let price = |steps: &[Step]| steps_cost(global, &shard, steps, mesh, 1.0);
            if price(&p) <= price(&general) {
                p
            } else {
                general
            }
        }
        None => general_plan(global, s, t, mesh),
    }
}

/// The one collective-permute that moves whole tiles from `s` to `t` (empty if every device
/// already holds its tile), or `None` if the layouts cut some dim into different numbers of
/// tiles or hold partial sums.
///
/// The permute runs over every mesh axis that either layout splits on; a tile depends only
/// on a device's coordinates on those axes, so one set of pairs serves every group. Both
/// layouts place each tile on equally many members of a group, so a receiver can always be
/// matched with a distinct sender; receivers that already hold their tile keep it.
fn tile_permutation(s: &Sharding, t: &Sharding, mesh: &Mesh) -> Option<Vec<Step>> {
    let rank = s.rank();
    if !s.partial.is_empty()
        || !t.partial.is_empty()
        || t.rank() != rank
        || (0..rank).any(|d| s.tiles(mesh, d) != t.tiles(mesh, d))
    {
        return None;
    }
    if s.dims == t.dims {
        return Some(Vec::new());
    }
    let (su, tu) = (s.split_axes(), t.split_axes());
    let axes: Vec<String> = mesh
        .axes
        .iter()
        .map(|a| a.name.clone())
        .filter(|a| su.contains(a) || tu.contains(a))
        .collect();
    // The members of the first group (coordinate 0 on every other axis), in rank order.
    let n = mesh.size_of(&axes);
    let position = |rank: usize| {
        let (mut rest, mut pos) = (rank, 0);
        for a in axes.iter().rev() {
            let size = mesh.axis_size(a).unwrap_or(1);
            pos += rest % size * mesh.axis_stride(a).unwrap_or(0);
            rest /= size;
        }
        pos
    };
    let tile = |sh: &Sharding, pos: usize| -> Vec<usize> {
        (0..rank).map(|d| sh.tile_index(mesh, pos, d)).collect()
    };
    let have: Vec<Vec<usize>> = (0..n).map(|r| tile(s, position(r))).collect();
    let want: Vec<Vec<usize>> = (0..n).map(|r| tile(t, position(r))).collect();
    let mut sends = vec![false; n];
    let mut from: Vec<Option<usize>> = vec![None; n];
    for q in 0..n {
        if have[q] == want[q] {
            sends[q] = true;
            from[q] = Some(q);
        }
    }
    if from.iter().all(Option::is_some) {
        return Some(Vec::new());
    }
    for q in 0..n {
        if from[q].is_none() {
            let p = (0..n).find(|&p| !sends[p] && have[p] == want[q])?;
            sends[p] = true;
            from[q] = Some(p);
        }
    }
    let pairs = from
        .into_iter()
        .enumerate()
        .map(|(q, p)| p.map(|p| (p, q)))
        .collect::<Option<Vec<_>>>()?;
    Some(vec![Step::CollectivePermute { axes, pairs }])
}

/// The general plan (see the module doc, steps 1-5).
fn general_plan(global: &[usize], s: &Sharding, t: &Sharding, mesh: &Mesh) -> Vec<Step> {
    let rank = global.len();
    let mut steps = Vec::new();
    let mut cur = s.clone();
    let even = |d: usize| {
        global[d].is_multiple_of(s.tiles(mesh, d).max(1))
            && global[d].is_multiple_of(t.tiles(mesh, d).max(1))
    };

    // 1. Pending partial sums.
    let red: Vec<String> = s
        .partial
        .iter()
        .filter(|a| !t.partial.contains(a))
        .cloned()
        .collect();
    let mut all_reduce = Vec::new();
    for a in red {
        let target_dim = (0..rank).find(|&j| {
            even(j)
                && is_prefix(&cur.dims[j], &t.dims[j])
                && t.dims[j].get(cur.dims[j].len()) == Some(&a)
        });
        match target_dim {
            Some(j) => {
                steps.push(Step::ReduceScatter {
                    dim: j,
                    axis: a.clone(),
                });
                cur.dims[j].push(a.clone());
            }
            None => all_reduce.push(a.clone()),
        }
        cur.partial.retain(|x| *x != a);
    }
    if !all_reduce.is_empty() {
        steps.push(Step::AllReduce { axes: all_reduce });
    }

    // 2. Uneven dims that change are gathered whole.
    for d in 0..rank {
        if cur.dims[d] != t.dims[d] && !even(d) && !cur.dims[d].is_empty() {
            steps.push(Step::GatherWholeAndTrim {
                dim: d,
                axes: cur.dims[d].clone(),
            });
            cur.dims[d].clear();
        }
    }

    // 3. Cut every dim back to a prefix of its target.
    loop {
        let bad: Vec<usize> = (0..rank)
            .filter(|&d| !is_prefix(&cur.dims[d], &t.dims[d]))
            .collect();
        if bad.is_empty() {
            break;
        }
        let mut moved = false;
        for &i in &bad {
            let a = cur.dims[i].last().unwrap().clone();
            let dest = (0..rank).find(|&j| {
                j != i
                    && even(i)
                    && even(j)
                    && is_prefix(&cur.dims[j], &t.dims[j])
                    && t.dims[j].get(cur.dims[j].len()) == Some(&a)
            });
            if let Some(j) = dest {
                steps.push(Step::AllToAll {
                    split_dim: j,
                    concat_dim: i,
                    axis: a.clone(),
                });
                cur.dims[i].pop();
                cur.dims[j].push(a);
                moved = true;
                break;
            }
        }
        if !moved {
            // Prefer gathering an axis that the target does not want on any dim.
            let wanted = t.split_axes();
            let i = bad
                .iter()
                .copied()
                .find(|&i| !wanted.contains(cur.dims[i].last().unwrap()))
                .unwrap_or(bad[0]);
            let a = cur.dims[i].pop().unwrap();
            steps.push(Step::AllGather { dim: i, axis: a });
        }
    }

    // 4. Grow every dim to its target.
    for d in 0..rank {
        if cur.dims[d] == t.dims[d] {
            continue;
        }
        if even(d) {
            while cur.dims[d] != t.dims[d] {
                let a = t.dims[d][cur.dims[d].len()].clone();
                steps.push(Step::DynamicSlice {
                    dim: d,
                    axis: a.clone(),
                });
                cur.dims[d].push(a);
            }
        } else {
            steps.push(Step::PadAndSlice {
                dim: d,
                axes: t.dims[d].clone(),
            });
            cur.dims[d] = t.dims[d].clone();
        }
    }

    // 5. New partial axes.
    let add: Vec<String> = t
        .partial
        .iter()
        .filter(|a| !cur.partial.contains(a))
        .cloned()
        .collect();
    if !add.is_empty() {
        steps.push(Step::MakePartial { axes: add });
    }
    steps
}

/// Bytes one device receives to carry out the plan (ring all-reduce counted twice).
pub fn cost(global: &Type, s: &Sharding, t: &Sharding, mesh: &Mesh) -> f64 {
    let local = s.shard_shape(mesh, &global.shape);
    let steps = plan(&global.shape, s, t, mesh);
    steps_cost(
        &global.shape,
        &local,
        &steps,
        mesh,
        global.dtype.size_bytes() as f64,
    )
}

/// Bytes one device receives for `steps`, starting from a local buffer of shape `local`
/// with elements of `esz` bytes.
fn steps_cost(global: &[usize], local: &[usize], steps: &[Step], mesh: &Mesh, esz: f64) -> f64 {
    let mut local = local.to_vec();
    let mut total = 0.0;
    for step in steps {
        let bytes = local.iter().product::<usize>() as f64 * esz;
        let k = |axes: &[String]| mesh.size_of(axes) as f64;
        match &step {
            Step::AllReduce { axes } => total += 2.0 * bytes * (k(axes) - 1.0) / k(axes),
            Step::ReduceScatter { dim, axis } => {
                let kk = k(std::slice::from_ref(axis));
                total += bytes * (kk - 1.0) / kk;
                local[*dim] /= kk as usize;
            }
            Step::GatherWholeAndTrim { dim, axes } => {
                total += bytes * (k(axes) - 1.0);
                local[*dim] = global[*dim];
            }
            Step::AllGather { dim, axis } => {
                let kk = k(std::slice::from_ref(axis));
                total += bytes * (kk - 1.0);
                local[*dim] *= kk as usize;
            }
            Step::AllToAll {
                split_dim,
                concat_dim,
                axis,
            } => {
                let kk = k(std::slice::from_ref(axis));
                total += bytes * (kk - 1.0) / kk;
                local[*split_dim] /= kk as usize;
                local[*concat_dim] *= kk as usize;
            }
            Step::DynamicSlice { dim, axis } => {
                local[*dim] /= k(std::slice::from_ref(axis)) as usize
            }
            Step::PadAndSlice { dim, axes } => {
                local[*dim] = global[*dim].div_ceil(k(axes) as usize)
            }
            Step::MakePartial { .. } => {}
            Step::CollectivePermute { .. } => total += bytes,
        }
    }
    total
}

/// Emit the collectives and slices that move `pv` to sharding `t` (cached per value and target).
pub fn reshard(
    ctx: &mut Ctx,
    pv: &PartitionedValue,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    if pv.sharding == *t {
        return Ok(pv.clone());
    }
    let key = (pv.local.id, t.clone());
    if let Some(hit) = ctx.reshard_cache.get(&key) {
        return Ok(hit.clone());
    }
    let g = &pv.global.shape;
    let steps = plan(g, &pv.sharding, t, &ctx.mesh.clone());
    let outer = ctx.resharding.take();
    ctx.resharding = Some(crate::why::Reshard {
        moved: outer
            .as_ref()
            .map(|r| r.moved)
            .unwrap_or_else(|| ctx.moved_here(pv.local.id)),
        from: pv.sharding.clone(),
        to: t.clone(),
        global: pv.global.clone(),
        gathers_whole: gathers_whole(&pv.sharding, t, &steps),
    });
    let result = emit_steps(ctx, pv, steps, pv.local.clone());
    ctx.resharding = outer;
    let x = result?;
    let out = PartitionedValue {
        local: x,
        global: pv.global.clone(),
        sharding: t.clone(),
    };
    ctx.reshard_cache.insert(key, out.clone());
    Ok(out)
}

/// Whether a reshard from `s` to `t` gathers a split value whole (`t` splits nothing that
/// `s` split, holds no partial sums) through an all-gather.
fn gathers_whole(s: &Sharding, t: &Sharding, steps: &[Step]) -> bool {
    let split = |x: &Sharding| x.dims.iter().any(|d| !d.is_empty());
    split(s)
        && !split(t)
        && t.partial.is_empty()
        && steps
            .iter()
            .any(|st| matches!(st, Step::AllGather { .. } | Step::GatherWholeAndTrim { .. }))
}

/// Emit `steps` on `x` (the local form of `pv`); returns the result.
fn emit_steps(
    ctx: &mut Ctx,
    pv: &PartitionedValue,
    steps: Vec<Step>,
    mut x: ir::Value,
) -> Result<ir::Value, SpmdError> {
    let g = &pv.global.shape;
    for step in steps {
        let ty = x.ty();
        let one = |a: &String| vec![a.clone()];
        x = match step {
            Step::AllReduce { axes } => {
                ctx.emit(Op::all_reduce(ReduceOp::Sum, axes), &[&x], None)?
            }
            Step::ReduceScatter { dim, axis } => ctx.emit(
                Op::reduce_scatter(ReduceOp::Sum, dim, one(&axis)),
                &[&x],
                None,
            )?,
            Step::GatherWholeAndTrim { dim, axes } => {
                let full = ctx.emit(Op::all_gather(dim, axes), &[&x], None)?;
                let mut limit = full.shape();
                limit[dim] = g[dim];
                ctx.emit(
                    Op::Slice {
                        start: vec![0; limit.len()],
                        limit,
                    },
                    &[&full],
                    None,
                )?
            }
            Step::AllGather { dim, axis } => {
                ctx.emit(Op::all_gather(dim, one(&axis)), &[&x], None)?
            }
            Step::AllToAll {
                split_dim,
                concat_dim,
                axis,
            } => ctx.emit(
                Op::all_to_all(split_dim, concat_dim, one(&axis)),
                &[&x],
                None,
            )?,
            Step::DynamicSlice { dim, axis } => {
                let k = ctx.mesh.size_of(&one(&axis));
                let mut sizes = ty.shape.clone();
                sizes[dim] /= k;
                let start = ctx.offset(&one(&axis), sizes[dim])?;
                dynamic_slice_dim(ctx, &x, dim, &start, sizes)?
            }
            Step::PadAndSlice { dim, axes } => {
                let k = ctx.mesh.size_of(&axes);
                let s = g[dim].div_ceil(k);
                let mut high = vec![0; ty.rank()];
                high[dim] = k * s - ty.shape[dim];
                let zero = ctx.emit(
                    Op::Constant {
                        value: Literal::Splat(0.0),
                    },
                    &[],
                    Some(Type::scalar(ty.dtype)),
                )?;
                let padded = ctx.emit(
                    Op::Pad {
                        low: vec![0; ty.rank()],
                        high,
                    },
                    &[&x, &zero],
                    None,
                )?;
                let mut sizes = ty.shape.clone();
                sizes[dim] = s;
                let start = ctx.offset(&axes, s)?;
                dynamic_slice_dim(ctx, &padded, dim, &start, sizes)?
            }
            Step::MakePartial { axes } => {
                let r = ctx.rank(&axes)?;
                let zero_i = ctx.i32(0);
                let first = ctx.emit(Op::Compare(ir::CompareOp::Eq), &[&r, &zero_i], None)?;
                let pred = ctx.emit(
                    Op::Broadcast { dims: vec![] },
                    &[&first],
                    Some(ty.with_dtype(ir::DType::Bool)),
                )?;
                let zeros = ctx.emit(
                    Op::Constant {
                        value: Literal::Splat(0.0),
                    },
                    &[],
                    Some(ty.clone()),
                )?;
                ctx.emit(Op::Select, &[&pred, &x, &zeros], None)?
            }
            Step::CollectivePermute { axes, pairs } => {
                ctx.emit(Op::collective_permute(axes, pairs), &[&x], None)?
            }
        };
    }
    Ok(x)
}

/// Dynamic slice of `x` with the given start along `dim` (0 elsewhere).
pub fn dynamic_slice_dim(
    ctx: &mut Ctx,
    x: &ir::Value,
    dim: usize,
    start: &ir::Value,
    sizes: Vec<usize>,
) -> Result<ir::Value, SpmdError> {
    let zero = ctx.i32(0);
    let starts: Vec<&ir::Value> = (0..sizes.len())
        .map(|d| if d == dim { start } else { &zero })
        .collect();
    let mut ops = vec![x];
    ops.extend(starts);
    ctx.emit(Op::DynamicSlice { sizes }, &ops, None)
}
