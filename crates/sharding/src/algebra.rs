//! Pure functions on shardings: merging two compatible shardings, moving a sharding through
//! a transpose or a reshape, and the "is this candidate better" test of propagation
//! (XLA's `IsShardingMoreSpecific` and `MergeSharding`, restated for named mesh axes).

use ir::{Mesh, Sharding};

/// Merge two shardings of one value: per dim, equal axis lists stay, an empty list takes
/// the other's, anything else is a conflict. `None` if they conflict or the result would
/// use an axis twice. Partial axes are not merged (propagation never produces them).
pub fn merge(a: &Sharding, b: &Sharding) -> Option<Sharding> {
    if a.rank() != b.rank() || !a.partial.is_empty() || !b.partial.is_empty() {
        return None;
    }
    let mut dims = Vec::with_capacity(a.rank());
    for (x, y) in a.dims.iter().zip(&b.dims) {
        dims.push(if x == y || y.is_empty() {
            x.clone()
        } else if x.is_empty() {
            y.clone()
        } else {
            return None;
        });
    }
    let s = Sharding {
        dims,
        partial: Vec::new(),
    };
    let axes = s.split_axes();
    let mut sorted = axes.clone();
    sorted.sort();
    sorted.dedup();
    (sorted.len() == axes.len()).then_some(s)
}

/// Whether `cand` should replace `cur` (as XLA's sharding propagation decides): an absent
/// sharding takes anything; else a compatible merge with more tiles wins; else a strictly more
/// tiled candidate wins. Ties keep the first sharding that arrived.
pub fn improve(cur: Option<&Sharding>, cand: &Sharding, mesh: &Mesh) -> Option<Sharding> {
    let Some(cur) = cur else {
        return Some(cand.clone());
    };
    let cur_tiles = cur.num_tiles(mesh);
    if let Some(m) = merge(cur, cand) {
        if m.num_tiles(mesh) > cur_tiles {
            return Some(m);
        }
        return None;
    }
    (cand.num_tiles(mesh) > cur_tiles).then(|| cand.clone())
}

/// Merge a list of candidates: start from the most tiled (first on ties) and fold in every
/// compatible one.
pub fn merge_all(cands: &[Sharding], mesh: &Mesh) -> Option<Sharding> {
    let mut best: Option<Sharding> = None;
    for c in cands {
        if let Some(n) = improve(best.as_ref(), c, mesh) {
            best = Some(n);
        }
    }
    let mut best = best?;
    for c in cands {
        if let Some(m) = merge(&best, c) {
            best = m;
        }
    }
    Some(best)
}

/// Result sharding of `transpose(perm)`: `out[i] = in[perm[i]]`.
pub fn transpose(s: &Sharding, perm: &[usize]) -> Sharding {
    Sharding {
        dims: perm.iter().map(|&p| s.dims[p].clone()).collect(),
        partial: s.partial.clone(),
    }
}

/// Operand sharding of a transpose whose result has sharding `s`.
pub fn untranspose(s: &Sharding, perm: &[usize]) -> Sharding {
    let mut dims = vec![Vec::new(); perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        dims[p] = s.dims[i].clone();
    }
    Sharding {
        dims,
        partial: s.partial.clone(),
    }
}

/// Groups of consecutive dims of two shapes with equal element products:
/// `[(src dims, dst dims)]`. Unit dims form groups of their own (with nothing on the other
/// side). `None` if the shapes have different element counts or a zero-sized dim.
pub fn reshape_groups(src: &[usize], dst: &[usize]) -> Option<Vec<(Vec<usize>, Vec<usize>)>> {
    if src.contains(&0) || dst.contains(&0) {
        return None;
    }
    let mut groups = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < src.len() || j < dst.len() {
        if i < src.len() && src[i] == 1 {
            groups.push((vec![i], vec![]));
            i += 1;
            continue;
        }
        if j < dst.len() && dst[j] == 1 {
            groups.push((vec![], vec![j]));
            j += 1;
            continue;
        }
        if i >= src.len() || j >= dst.len() {
            return None;
        }
        let (mut gs, mut gd) = (vec![i], vec![j]);
        let (mut ps, mut pd) = (src[i], dst[j]);
        i += 1;
        j += 1;
        while ps != pd {
            if ps < pd {
                ps = ps.checked_mul(*src.get(i)?)?;
                gs.push(i);
                i += 1;
            } else {
                pd = pd.checked_mul(*dst.get(j)?)?;
                gd.push(j);
                j += 1;
            }
        }
        groups.push((gs, gd));
    }
    Some(groups)
}

/// Move a sharding through a reshape `src -> dst`. Within each group of dims with equal
/// products only the major-most non-unit dim may carry axes, and they move to the
/// major-most non-unit dim on the other side when both sizes divide by the tile count.
/// Axes that cannot move are dropped (that part becomes replicated). Partial axes carry
/// over unchanged.
pub fn reshape(s: &Sharding, src: &[usize], dst: &[usize], mesh: &Mesh) -> Sharding {
    let mut out = Sharding::replicated(dst.len());
    out.partial = s.partial.clone();
    let Some(groups) = reshape_groups(src, dst) else {
        return out;
    };
    for (gs, gd) in groups {
        let major_s = gs.iter().copied().find(|&d| src[d] != 1);
        let major_d = gd.iter().copied().find(|&d| dst[d] != 1);
        let (Some(ms), Some(md)) = (major_s, major_d) else {
            continue;
        };
        // Only the major dim may be split; axes on minor dims of the group break contiguity.
        if gs.iter().any(|&d| d != ms && !s.dims[d].is_empty()) {
            continue;
        }
        let k = s.tiles(mesh, ms);
        if k > 1 && src[ms].is_multiple_of(k) && dst[md].is_multiple_of(k) {
            out.dims[md] = s.dims[ms].clone();
        }
    }
    out
}
