//! Where a device's shard sits in the global tensor (XLA's tile offsets: `ceil(n / tiles)` per
//! tile): pure index arithmetic shared by the partitioner, the input sharding of host tensors
//! and output assembly.

use ir::{Mesh, Sharding};

/// One dim of a device's shard: `[offset, offset + len)` of the global dim holds data; the
/// local buffer has `padded` elements (`len <= padded`, the rest is padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DimRange {
    pub offset: usize,
    pub len: usize,
    pub padded: usize,
}

/// The shard of mesh position `pos` for a value of `global` shape with `sharding`.
/// Partial axes do not change ranges (every member holds a full-size partial value).
pub fn shard_ranges(
    global: &[usize],
    sharding: &Sharding,
    mesh: &Mesh,
    pos: usize,
) -> Vec<DimRange> {
    global
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let k = sharding.tiles(mesh, d).max(1);
            let s = n.div_ceil(k);
            let t = sharding.tile_index(mesh, pos, d);
            let offset = (t * s).min(n);
            let end = ((t + 1) * s).min(n);
            DimRange {
                offset,
                len: end - offset,
                padded: s,
            }
        })
        .collect()
}

/// Whether the shard of `pos` is the canonical holder of its tile: rank 0 along every
/// replicated mesh axis (used when assembling outputs, so each tile is taken once).
pub fn is_canonical_holder(sharding: &Sharding, mesh: &Mesh, pos: usize) -> bool {
    let used = sharding.split_axes();
    mesh.axes
        .iter()
        .filter(|a| !used.contains(&a.name))
        .all(|a| mesh.coord(pos, &a.name) == Some(0))
}
