//! Convolution (GShard, Lepikhin et al. 2020, App. A.4). A batch or output-feature split needs
//! no communication; a split input-feature dim leaves the local result a pending partial sum,
//! like a dot's contracting dim. A spatial dim split over mesh axes `A` is computed from each
//! device's own tile plus halos from its two neighbours along `A`:
//!
//! - *window* (kernel dim whole): each device computes its own output tile. With stride 1
//!   it needs `pad_lo` elements of its left neighbour and `K - 1 - pad_lo` of its right one
//!   when the output tiles line up with the input tiles (SAME padding); otherwise (VALID,
//!   one-sided padding) the needs are affine in the device's rank, so the largest ones are
//!   exchanged and each device dynamic-slices its window at `start + rank * step`.
//! - *summed* (kernel dim split like the lhs, as in the kernel gradient of a spatially split
//!   conv): each device adds the part of every output that its kernel tile covers, from the
//!   same kind of halos (`O` in place of `K`); the result is a partial sum over `A`. The
//!   kernel dim must split evenly: a padded kernel element would multiply real lhs values.
//!
//! A halo is two collective-permutes over `A` (pairs `(i, i+1)` and `(i+1, i)`); a device
//! with no neighbour receives zeros, which are exactly the conv's zero padding, and the
//! local conv runs with no padding on that dim. Padding of uneven tiles is zeroed first so
//! it reads as zero padding too. A halo longer than a tile falls back to gathering the dim.
//! The layout is chosen among keeping the lhs, keeping the kernel, taking the output's, or
//! replicating, by the bytes the reshards and halos move.

use super::to;
use crate::ctx::Ctx;
use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use crate::reshard::{cost, dynamic_slice_dim};
use ir::{BinaryOp, Mesh, Op, Sharding, Type, Value};

/// Global sizes of one convolution.
struct Geo<'a> {
    pad_lo: &'a [usize],
    /// lhs `[N, S.., Cin]`, kernel `[K.., Cin, Cout]`, result `[N, O.., Cout]`.
    xs: &'a [usize],
    ks: &'a [usize],
    os: &'a [usize],
}

/// The halo exchange of one split spatial dim: `left` elements come from the left
/// neighbour, `right` from the right one, and the local conv reads the window
/// `[start + rank * step, .. + len)` of `[left halo, tile, right halo]`, where `rank` is the
/// device's tile index (with stride 1 the halos are affine in the rank, so the largest ones
/// are exchanged and each device slices its own window; `step` is 0 when the tiles line up).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Halo {
    left: usize,
    right: usize,
    start: isize,
    step: isize,
    len: usize,
}

/// How the local conv covers one spatial dim.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Split {
    /// Whole on every device (unsplit, or split into one tile): the local conv pads with
    /// the global padding.
    Whole,
    /// Lhs split, kernel whole: each device computes its output tile.
    Window(Halo),
    /// Lhs and kernel split alike: a partial sum of the whole output dim.
    Summed(Halo),
}

impl Split {
    fn halo(self) -> Option<Halo> {
        match self {
            Split::Whole => None,
            Split::Window(h) | Split::Summed(h) => Some(h),
        }
    }
}

/// How spatial dim `j` is computed with the lhs split over `a` and the kernel over `b`, or
/// `None` if that layout is not supported (the caller gathers the dim).
///
/// Device `r` holds lhs elements `[r s, r s + s)`. A window split computes output tile
/// `[r t, r t + t)`, a summed split the contribution of kernel tile `[r t, r t + t)` to the
/// `W = O` outputs; either way it reads the padded lhs at `[r t, r t + t + W - 1)` (with
/// `W = K` for a window), i.e. lhs elements from `r t - pad_lo`. Every device must find them
/// in its own tile and its two neighbours'.
fn classify(g: &Geo, mesh: &Mesh, j: usize, a: &[String], b: &[String]) -> Option<Split> {
    if a.is_empty() {
        return b.is_empty().then_some(Split::Whole);
    }
    let d = mesh.size_of(a);
    if d == 1 {
        // One tile: the whole dim on every device.
        return b.is_empty().then_some(Split::Whole);
    }
    let tiles = |n: usize| n.div_ceil(d) as isize;
    let (lo, s) = (g.pad_lo[j] as isize, tiles(g.xs[1 + j]));
    let (w, t) = if b.is_empty() {
        (g.ks[j] as isize, tiles(g.os[1 + j]))
    } else if b == a && g.ks[j].is_multiple_of(d) {
        // Kernel padding would meet real lhs values in the window (`0 * inf` is NaN), so
        // only whole kernel tiles are summed.
        (g.os[1 + j] as isize, tiles(g.ks[j]))
    } else {
        return None;
    };
    if w == 0 {
        return None;
    }
    // Elements needed before the tile's start and after its end are affine in the rank:
    // their largest values are at the first or the last rank.
    let last = d as isize - 1;
    let left_at = |r: isize| lo + r * (s - t);
    let right_at = |r: isize| (r + 1) * (t - s) + w - 1 - lo;
    let left = left_at(0).max(left_at(last)).max(0);
    let right = right_at(0).max(right_at(last)).max(0);
    if left > s || right > s {
        return None;
    }
    let halo = Halo {
        left: left as usize,
        right: right as usize,
        start: left - lo,
        step: t - s,
        len: (t + w - 1) as usize,
    };
    Some(if b.is_empty() {
        Split::Window(halo)
    } else {
        Split::Summed(halo)
    })
}

/// A supported layout: lhs and kernel shardings, the local result's sharding (partial over
/// split input features and summed dims) and each spatial dim's split.
struct Layout {
    ls: Sharding,
    rs: Sharding,
    res: Sharding,
    splits: Vec<Split>,
}

/// Make a candidate layout supported: spatial dims that cannot be computed locally are
/// gathered, the kernel's input features follow the lhs's; `None` if the output features
/// would reuse an axis of the lhs.
fn fix(g: &Geo, mesh: &Mesh, mut ls: Sharding, mut rs: Sharding) -> Option<Layout> {
    let k = g.pad_lo.len();
    for j in 0..k {
        if classify(g, mesh, j, &ls.dims[1 + j], &rs.dims[j]).is_none() {
            rs.dims[j].clear();
            if classify(g, mesh, j, &ls.dims[1 + j], &[]).is_none() {
                ls.dims[1 + j].clear();
            }
        }
    }
    rs.dims[k] = ls.dims[k + 1].clone();
    let used = ls.split_axes();
    if rs.dims[k + 1].iter().any(|a| used.contains(a)) {
        return None;
    }
    let splits: Vec<Split> = (0..k)
        .map(|j| classify(g, mesh, j, &ls.dims[1 + j], &rs.dims[j]))
        .collect::<Option<_>>()?;
    let mut dims = vec![ls.dims[0].clone()];
    let mut partial = ls.dims[k + 1].clone();
    for (j, split) in splits.iter().enumerate() {
        match split {
            Split::Window(_) | Split::Whole => dims.push(ls.dims[1 + j].clone()),
            Split::Summed(_) => {
                dims.push(Vec::new());
                partial.extend(ls.dims[1 + j].iter().cloned());
            }
        }
    }
    dims.push(rs.dims[k + 1].clone());
    Some(Layout {
        ls,
        rs,
        res: Sharding { dims, partial },
        splits,
    })
}

/// `axes` without those in `used`.
fn minus(axes: &[String], used: &[String]) -> Vec<String> {
    axes.iter().filter(|a| !used.contains(a)).cloned().collect()
}

/// The candidate layouts: keep the lhs, keep the kernel, the output's, replicated.
fn candidates(
    k: usize,
    lcur: &Sharding,
    rcur: &Sharding,
    t: &Sharding,
) -> Vec<(Sharding, Sharding)> {
    let rank = k + 2;
    let mut out = Vec::new();
    // Keep the lhs; the kernel keeps its spatial and output-feature axes where free.
    let mut rs = rcur.clone();
    rs.dims[k + 1] = minus(&rcur.dims[k + 1], &lcur.split_axes());
    out.push((lcur.clone(), rs));
    // Keep the kernel; the lhs follows it on split spatial dims and input features.
    let used = rcur.split_axes();
    let mut ls = Sharding::replicated(rank);
    ls.dims[0] = minus(&lcur.dims[0], &used);
    for j in 0..k {
        ls.dims[1 + j] = if rcur.dims[j].is_empty() {
            minus(&lcur.dims[1 + j], &used)
        } else {
            rcur.dims[j].clone()
        };
    }
    ls.dims[k + 1] = rcur.dims[k].clone();
    out.push((ls, rcur.clone()));
    // The output's layout: batch and spatial on the lhs, output features on the kernel.
    let mut ls = Sharding::replicated(rank);
    let mut rs = Sharding::replicated(rank);
    for d in 0..=k {
        ls.dims[d] = t.dims[d].clone();
    }
    rs.dims[k + 1] = t.dims[k + 1].clone();
    out.push((ls, rs));
    out.push((Sharding::replicated(rank), Sharding::replicated(rank)));
    out
}

/// Bytes one device receives for the halos of `lay`.
fn halo_bytes(g: &Geo, mesh: &Mesh, lay: &Layout, esz: usize) -> f64 {
    let local = lay.ls.shard_shape(mesh, g.xs);
    let mut total = 0.0;
    for (j, split) in lay.splits.iter().enumerate() {
        if let Some(h) = split.halo() {
            let rest: usize = (0..local.len())
                .filter(|&d| d != 1 + j)
                .map(|d| local[d])
                .product();
            total += ((h.left + h.right) * rest * esz) as f64;
        }
    }
    total
}

pub fn conv(
    ctx: &mut Ctx,
    pad_lo: &[usize],
    pad_hi: &[usize],
    l: &PartitionedValue,
    r: &PartitionedValue,
    ty: &Type,
    t: &Sharding,
) -> Result<PartitionedValue, SpmdError> {
    let k = pad_lo.len();
    let g = Geo {
        pad_lo,
        xs: &l.global.shape,
        ks: &r.global.shape,
        os: &ty.shape,
    };
    let mesh = ctx.mesh.clone();
    let strip = |s: &Sharding| Sharding {
        dims: s.dims.clone(),
        partial: vec![],
    };
    let (lcur, rcur) = (strip(&l.sharding), strip(&r.sharding));
    let esz = ty.dtype.size_bytes();
    let mut best: Option<(f64, Layout)> = None;
    for (ls, rs) in candidates(k, &lcur, &rcur, t) {
        let Some(lay) = fix(&g, &mesh, ls, rs) else {
            continue;
        };
        let c = cost(&l.global, &l.sharding, &lay.ls, &mesh)
            + cost(&r.global, &r.sharding, &lay.rs, &mesh)
            + halo_bytes(&g, &mesh, &lay, esz)
            + cost(ty, &lay.res, t, &mesh);
        if best.as_ref().is_none_or(|b| c < b.0) {
            best = Some((c, lay));
        }
    }
    let (_, lay) = best.ok_or_else(|| SpmdError::Internal {
        index: ctx.at,
        msg: "no conv layout".into(),
    })?;
    let mut ll = to(ctx, l, &lay.ls)?;
    let mut rl = to(ctx, r, &lay.rs)?;
    // Zero the padding that the local conv reads: input features on both sides (0 * NaN is
    // NaN), the lhs of every split spatial dim, the kernel of every summed one.
    if !lay.ls.dims[k + 1].is_empty() {
        let axes = &lay.ls.dims[k + 1];
        ll = ctx.mask_padding(&ll, k + 1, axes, g.xs[k + 1], 0.0)?;
        rl = ctx.mask_padding(&rl, k, axes, g.ks[k], 0.0)?;
    }
    let (mut lo, mut hi) = (pad_lo.to_vec(), pad_hi.to_vec());
    for (j, split) in lay.splits.iter().enumerate() {
        let Some(h) = split.halo() else {
            continue;
        };
        let axes = &lay.ls.dims[1 + j];
        ll = ctx.mask_padding(&ll, 1 + j, axes, g.xs[1 + j], 0.0)?;
        if matches!(split, Split::Summed(_)) {
            rl = ctx.mask_padding(&rl, j, axes, g.ks[j], 0.0)?;
        }
        ll = halo_exchange(ctx, &ll, 1 + j, axes, h)?;
        lo[j] = 0;
        hi[j] = 0;
    }
    let local = ty.with_shape(lay.res.shard_shape(&mesh, &ty.shape));
    let v = ctx.emit(
        Op::Conv {
            pad_lo: lo,
            pad_hi: hi,
        },
        &[&ll, &rl],
        Some(local),
    )?;
    Ok(PartitionedValue {
        local: v,
        global: ty.clone(),
        sharding: lay.res,
    })
}

/// The window `h` of `[left halo, x, right halo]` along `dim`: the last `h.left` elements of
/// the left neighbour along `axes` and the first `h.right` of the right one (neighbours that
/// do not exist send zeros).
fn halo_exchange(
    ctx: &mut Ctx,
    x: &Value,
    dim: usize,
    axes: &[String],
    h: Halo,
) -> Result<Value, SpmdError> {
    let n = ctx.mesh.size_of(axes);
    let s = x.shape()[dim];
    let slice = |ctx: &Ctx, x: &Value, start: usize, limit: usize| {
        let mut st = vec![0; x.rank()];
        let mut li = x.shape();
        st[dim] = start;
        li[dim] = limit;
        ctx.emit(
            Op::Slice {
                start: st,
                limit: li,
            },
            &[x],
            None,
        )
    };
    let permute = |ctx: &Ctx, x: &Value, pairs: Vec<(usize, usize)>| {
        ctx.emit(Op::collective_permute(axes.to_vec(), pairs), &[x], None)
    };
    let mut parts = Vec::new();
    if h.left > 0 {
        let tail = slice(ctx, x, s - h.left, s)?;
        parts.push(permute(
            ctx,
            &tail,
            (0..n - 1).map(|i| (i, i + 1)).collect(),
        )?);
    }
    parts.push(x.clone());
    if h.right > 0 {
        let head = slice(ctx, x, 0, h.right)?;
        parts.push(permute(
            ctx,
            &head,
            (0..n - 1).map(|i| (i + 1, i)).collect(),
        )?);
    }
    let ext = if parts.len() == 1 {
        x.clone()
    } else {
        let refs: Vec<&Value> = parts.iter().collect();
        ctx.emit(Op::Concatenate { dim }, &refs, None)?
    };
    let total = h.left + s + h.right;
    if h.step == 0 {
        let start = h.start as usize;
        if start == 0 && h.len == total {
            return Ok(ext);
        }
        return slice(ctx, &ext, start, start + h.len);
    }
    // The window moves by `step` per rank: start = h.start + rank * h.step.
    let r = ctx.rank(axes)?;
    let step = ctx.i32(h.step as i64);
    let off = ctx.bin(BinaryOp::Mul, &r, &step)?;
    let start = ctx.bin(BinaryOp::Add, &off, &ctx.i32(h.start as i64))?;
    let mut sizes = ext.shape();
    sizes[dim] = h.len;
    dynamic_slice_dim(ctx, &ext, dim, &start, sizes)
}
