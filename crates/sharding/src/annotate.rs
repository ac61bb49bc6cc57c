//! The annotation API with GShard's names (`replicate`, `split`, `shard`) and GSPMD's
//! `mesh_split` (Lepikhin et al. 2020, section 3.2; Xu et al. 2021, arXiv 2105.04663).
//!
//! An annotation attaches a sharding to a value and marks it as the user's: propagation
//! never overwrites it. Annotating a value that has no sharding yet sets it in place (the
//! annotation folds onto its producer); annotating one that already carries a different
//! sharding inserts a `copy` that carries the new one, so two annotations in a row are an
//! explicit reshard.

use ir::{Mesh, MeshError, Sharding, Value};
use thiserror::Error;

/// A bad annotation: names the value, the sharding and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShardingError {
    #[error("cannot annotate {value}: the program has no mesh; create the builder with Builder::with_mesh")]
    NoMesh { value: String },
    #[error("cannot annotate {value} with {sharding}: {source}")]
    Invalid {
        value: String,
        sharding: String,
        source: MeshError,
    },
    #[error("split({value}, dim {dim}, ...): the value has rank {rank}")]
    DimOutOfRange {
        value: String,
        dim: usize,
        rank: usize,
    },
    #[error("shard({value}): device assignment of shape {shape:?} needs one entry per dim of the value (rank {rank})")]
    AssignmentRank {
        value: String,
        shape: Vec<usize>,
        rank: usize,
    },
    #[error("shard({value}): device assignment {devices:?} with shape {shape:?} is not a layout of mesh {mesh}; declare a mesh whose axes and device order produce it, or use mesh_split")]
    AssignmentNotOnMesh {
        value: String,
        shape: Vec<usize>,
        devices: Vec<u32>,
        mesh: String,
    },
}

fn name(x: &Value) -> String {
    format!("{x:?}")
}

/// Attach `s` to `x` as a user annotation (see the module doc).
pub fn annotate(x: &Value, s: Sharding) -> Result<Value, ShardingError> {
    let mesh = x
        .builder()
        .mesh()
        .ok_or_else(|| ShardingError::NoMesh { value: name(x) })?;
    s.validate(&mesh, &x.shape())
        .map_err(|source| ShardingError::Invalid {
            value: name(x),
            sharding: s.to_string(),
            source,
        })?;
    match x.sharding() {
        None => {
            x.set_sharding(Some(s));
            Ok(x.clone())
        }
        Some(cur) if cur == s => Ok(x.clone()),
        Some(_) => {
            let y = x.copy();
            y.set_sharding(Some(s));
            Ok(y)
        }
    }
}

/// Every device holds the whole value.
pub fn replicate(x: &Value) -> Result<Value, ShardingError> {
    annotate(x, Sharding::replicated(x.rank()))
}

/// Split dim `dim` of `x` over mesh axis `axis` (GShard `split(x, d, n)` with `n` the axis
/// size); every other dim is replicated.
pub fn split(x: &Value, dim: usize, axis: &str) -> Result<Value, ShardingError> {
    if dim >= x.rank() {
        return Err(ShardingError::DimOutOfRange {
            value: name(x),
            dim,
            rank: x.rank(),
        });
    }
    annotate(x, Sharding::split(x.rank(), dim, axis))
}

/// GSPMD `mesh_split`: `dims[i]` lists the mesh axes tensor dim `i` is split over (empty =
/// not split; several axes = split over their product, first axis major).
pub fn mesh_split(x: &Value, dims: &[&[&str]]) -> Result<Value, ShardingError> {
    annotate(x, Sharding::from_dims(dims))
}

/// GShard `shard(x, device_assignment)`: `shape` gives the number of pieces per tensor dim,
/// `devices` (row-major over `shape`, with a trailing replication group when `shape` has
/// one more entry than the rank) the device holding each piece. The assignment must be a
/// layout of the program's mesh: each split dim is matched to an ordered set of mesh axes.
pub fn shard(x: &Value, shape: &[usize], devices: &[u32]) -> Result<Value, ShardingError> {
    let mesh = x
        .builder()
        .mesh()
        .ok_or_else(|| ShardingError::NoMesh { value: name(x) })?;
    let rank = x.rank();
    if shape.len() != rank && shape.len() != rank + 1 {
        return Err(ShardingError::AssignmentRank {
            value: name(x),
            shape: shape.to_vec(),
            rank,
        });
    }
    let not_on_mesh = || ShardingError::AssignmentNotOnMesh {
        value: name(x),
        shape: shape.to_vec(),
        devices: devices.to_vec(),
        mesh: mesh.to_string(),
    };
    if shape.iter().product::<usize>() != devices.len() || devices.len() != mesh.num_devices() {
        return Err(not_on_mesh());
    }
    let s = find_layout(&mesh, &shape[..rank])
        .into_iter()
        .find(|s| layout_devices(&mesh, s, shape) == devices);
    annotate(x, s.ok_or_else(not_on_mesh)?)
}

/// Every sharding of a rank-`counts.len()` value whose tile counts are `counts`, one axis
/// list per dim, axes in any order.
fn find_layout(mesh: &Mesh, counts: &[usize]) -> Vec<Sharding> {
    fn go(
        mesh: &Mesh,
        counts: &[usize],
        d: usize,
        used: &mut Vec<String>,
        cur: &mut Vec<Vec<String>>,
        out: &mut Vec<Sharding>,
    ) {
        if d == counts.len() {
            out.push(Sharding {
                dims: cur.clone(),
                partial: vec![],
            });
            return;
        }
        // Choose an ordered list of unused axes whose sizes multiply to counts[d].
        fn lists(
            mesh: &Mesh,
            want: usize,
            used: &[String],
            acc: &mut Vec<String>,
            out: &mut Vec<Vec<String>>,
        ) {
            let have = mesh.size_of(acc);
            if have == want {
                out.push(acc.clone());
            }
            if have >= want {
                return;
            }
            for a in &mesh.axes {
                if a.size > 1 && !used.contains(&a.name) && !acc.contains(&a.name) {
                    acc.push(a.name.clone());
                    lists(mesh, want, used, acc, out);
                    acc.pop();
                }
            }
        }
        let mut options = Vec::new();
        lists(mesh, counts[d], used, &mut Vec::new(), &mut options);
        for o in options {
            used.extend(o.iter().cloned());
            cur.push(o.clone());
            go(mesh, counts, d + 1, used, cur, out);
            cur.pop();
            used.truncate(used.len() - o.len());
        }
    }
    let mut out = Vec::new();
    go(mesh, counts, 0, &mut Vec::new(), &mut Vec::new(), &mut out);
    out
}

/// The device assignment array (row-major over tiles, then the replication group, members
/// in mesh-position order) that sharding `s` produces on `mesh`.
fn layout_devices(mesh: &Mesh, s: &Sharding, shape: &[usize]) -> Vec<u32> {
    let rank = s.rank();
    let tiles: usize = (0..rank).map(|d| s.tiles(mesh, d)).product();
    let repl = mesh.num_devices() / tiles.max(1);
    let mut out = vec![u32::MAX; mesh.num_devices()];
    let mut seen_in_tile = vec![0usize; tiles];
    for pos in 0..mesh.num_devices() {
        let mut t = 0;
        for d in 0..rank {
            t = t * s.tiles(mesh, d) + s.tile_index(mesh, pos, d);
        }
        let r = seen_in_tile[t];
        seen_in_tile[t] += 1;
        let slot = if shape.len() > rank { t * repl + r } else { t };
        if slot < out.len() {
            out[slot] = mesh.devices[pos];
        }
    }
    out
}
