//! Device meshes (named axes over device ids) and shardings (per tensor dim, the ordered
//! mesh axes it is split over, plus the axes over which the value is a pending partial sum).
//!
//! One form covers GShard's `replicate`, `split`, `shard` and GSPMD's `mesh_split`: a dim
//! split over axes `(a, b)` is cut into `size(a) * size(b)` pieces, `a` major. Every mesh axis
//! that is neither used by a dim nor listed in `partial` replicates the value.

use crate::error::MeshError;
use std::fmt;

/// One named mesh axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeshAxis {
    pub name: String,
    pub size: usize,
}

/// A logical device mesh: named axes (row-major, first axis major) over device ids.
///
/// A *mesh position* is the row-major linear index of a device's coordinates; the
/// partitioned program's `partition_id` returns it. `devices[position]` is the physical id
/// (identity unless the user gave an explicit device assignment).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub axes: Vec<MeshAxis>,
    pub devices: Vec<u32>,
}

impl Mesh {
    /// A mesh over devices `0..prod(sizes)` in row-major order.
    pub fn new(axes: &[(&str, usize)]) -> Result<Mesh, MeshError> {
        let n = axes
            .iter()
            .try_fold(1usize, |acc, a| {
                acc.checked_mul(a.1).filter(|&n| n <= 1 << 24)
            })
            .ok_or(MeshError::TooManyDevices)?;
        Mesh::with_devices(axes, (0..n as u32).collect())
    }

    /// A mesh with an explicit row-major device assignment.
    pub fn with_devices(axes: &[(&str, usize)], devices: Vec<u32>) -> Result<Mesh, MeshError> {
        let mut seen = Vec::new();
        for (name, size) in axes {
            if name.is_empty()
                || *name == "_"
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(MeshError::BadAxisName(name.to_string()));
            }
            if seen.contains(name) {
                return Err(MeshError::DuplicateAxis(name.to_string()));
            }
            if *size == 0 {
                return Err(MeshError::ZeroSizedAxis(name.to_string()));
            }
            seen.push(*name);
        }
        let n: usize = axes.iter().map(|a| a.1).product();
        if devices.len() != n {
            return Err(MeshError::DeviceCount {
                expected: n,
                got: devices.len(),
            });
        }
        let mut sorted = devices.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != devices.len() {
            return Err(MeshError::DuplicateDevice);
        }
        Ok(Mesh {
            axes: axes
                .iter()
                .map(|(n, s)| MeshAxis {
                    name: n.to_string(),
                    size: *s,
                })
                .collect(),
            devices,
        })
    }

    /// Parse `data=2,expert=4` (spaces allowed). A bare number `N` means one axis `x=N`.
    pub fn parse_spec(spec: &str) -> Result<Mesh, MeshError> {
        let spec = spec.trim();
        if let Ok(n) = spec.parse::<usize>() {
            return Mesh::new(&[("x", n)]);
        }
        let mut axes = Vec::new();
        for part in spec.split(',') {
            let part = part.trim();
            let (name, size) = part
                .split_once('=')
                .ok_or_else(|| MeshError::BadSpec(spec.to_string()))?;
            let size: usize = size
                .trim()
                .parse()
                .map_err(|_| MeshError::BadSpec(spec.to_string()))?;
            axes.push((name.trim().to_string(), size));
        }
        let refs: Vec<(&str, usize)> = axes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        Mesh::new(&refs)
    }

    pub fn num_devices(&self) -> usize {
        self.devices.len()
    }

    pub fn is_iota(&self) -> bool {
        self.devices
            .iter()
            .enumerate()
            .all(|(i, &d)| d as usize == i)
    }

    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == name)
    }

    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axis_index(name).map(|i| self.axes[i].size)
    }

    /// Stride of an axis in mesh positions.
    pub fn axis_stride(&self, name: &str) -> Option<usize> {
        let i = self.axis_index(name)?;
        Some(self.axes[i + 1..].iter().map(|a| a.size).product())
    }

    /// Coordinate of mesh position `pos` along axis `name`.
    pub fn coord(&self, pos: usize, name: &str) -> Option<usize> {
        let i = self.axis_index(name)?;
        Some(pos / self.axis_stride(name)? % self.axes[i].size)
    }

    /// Product of the sizes of `axes`.
    pub fn size_of(&self, axes: &[String]) -> usize {
        axes.iter()
            .map(|a| self.axis_size(a).unwrap_or(1))
            .product()
    }

    /// Rank of position `pos` inside its group along `axes` (listed order = major to minor).
    pub fn rank_in_group(&self, pos: usize, axes: &[String]) -> usize {
        let mut r = 0;
        for a in axes {
            r = r * self.axis_size(a).unwrap_or(1) + self.coord(pos, a).unwrap_or(0);
        }
        r
    }

    /// Replica groups for communicating along `axes`: positions that share every coordinate
    /// on the other axes form a group; groups are enumerated row-major over the other axes and
    /// members ordered by `rank_in_group` (the listed axes, major to minor).
    pub fn groups(&self, axes: &[String]) -> Vec<Vec<usize>> {
        let k = self.size_of(axes);
        let n = self.num_devices();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut index_of_key: std::collections::HashMap<Vec<usize>, usize> = Default::default();
        for pos in 0..n {
            let key: Vec<usize> = self
                .axes
                .iter()
                .filter(|a| !axes.contains(&a.name))
                .map(|a| self.coord(pos, &a.name).unwrap())
                .collect();
            let gi = *index_of_key.entry(key).or_insert_with(|| {
                groups.push(vec![usize::MAX; k]);
                groups.len() - 1
            });
            groups[gi][self.rank_in_group(pos, axes)] = pos;
        }
        groups
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, a) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}={}", a.name, a.size)?;
        }
        f.write_str("]")?;
        if !self.is_iota() {
            f.write_str(" devices=[")?;
            for (i, d) in self.devices.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{d}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// How a value is laid out over a mesh.
///
/// `dims[i]` lists the mesh axes tensor dim `i` is split over (empty = not split), major
/// first. `partial` lists axes over which device values are partial sums that still need a
/// reduction (DTensor/Shardy "partial", not XLA's partial replication). Axes in neither are
/// replicated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Sharding {
    pub dims: Vec<Vec<String>>,
    pub partial: Vec<String>,
}

impl Sharding {
    /// Fully replicated sharding of a rank-`rank` value.
    pub fn replicated(rank: usize) -> Sharding {
        Sharding {
            dims: vec![Vec::new(); rank],
            partial: Vec::new(),
        }
    }

    /// `dims[dim]` split over the single axis `axis`, everything else replicated.
    pub fn split(rank: usize, dim: usize, axis: &str) -> Sharding {
        let mut s = Sharding::replicated(rank);
        s.dims[dim].push(axis.to_string());
        s
    }

    /// Build from per-dim axis lists.
    pub fn from_dims<S: AsRef<str>>(dims: &[&[S]]) -> Sharding {
        Sharding {
            dims: dims
                .iter()
                .map(|d| d.iter().map(|a| a.as_ref().to_string()).collect())
                .collect(),
            partial: Vec::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn is_replicated(&self) -> bool {
        self.partial.is_empty() && self.dims.iter().all(|d| d.is_empty())
    }

    /// Every axis that splits some dim, in dim order.
    pub fn split_axes(&self) -> Vec<String> {
        self.dims.iter().flatten().cloned().collect()
    }

    /// Number of pieces dim `i` is cut into.
    pub fn tiles(&self, mesh: &Mesh, dim: usize) -> usize {
        mesh.size_of(&self.dims[dim])
    }

    /// Total number of distinct tiles (partial axes not counted).
    pub fn num_tiles(&self, mesh: &Mesh) -> usize {
        (0..self.rank()).map(|d| self.tiles(mesh, d)).product()
    }

    /// Per-device (padded) shard shape: `ceil(n_i / tiles_i)` per dim (XLA's tile size).
    pub fn shard_shape(&self, mesh: &Mesh, shape: &[usize]) -> Vec<usize> {
        shape
            .iter()
            .enumerate()
            .map(|(i, &n)| n.div_ceil(self.tiles(mesh, i).max(1)))
            .collect()
    }

    /// Tile index of mesh position `pos` along dim `dim`.
    pub fn tile_index(&self, mesh: &Mesh, pos: usize, dim: usize) -> usize {
        mesh.rank_in_group(pos, &self.dims[dim])
    }

    /// Check the sharding against a mesh and a tensor shape: every axis exists, no axis is
    /// used twice, and the rank matches.
    pub fn validate(&self, mesh: &Mesh, shape: &[usize]) -> Result<(), MeshError> {
        if self.dims.len() != shape.len() {
            return Err(MeshError::RankMismatch {
                sharding: self.to_string(),
                dims: self.dims.len(),
                rank: shape.len(),
            });
        }
        let mut used: Vec<&str> = Vec::new();
        for a in self.dims.iter().flatten().chain(self.partial.iter()) {
            if mesh.axis_index(a).is_none() {
                return Err(MeshError::UnknownAxis {
                    axis: a.clone(),
                    mesh: mesh.to_string(),
                });
            }
            if used.contains(&a.as_str()) {
                return Err(MeshError::AxisUsedTwice {
                    axis: a.clone(),
                    sharding: self.to_string(),
                });
            }
            used.push(a);
        }
        Ok(())
    }
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d.len() {
                0 => f.write_str("_")?,
                1 => f.write_str(&d[0])?,
                _ => write!(f, "({})", d.join(","))?,
            }
        }
        if !self.partial.is_empty() {
            write!(f, " | partial {}", self.partial.join(","))?;
        }
        f.write_str("}")
    }
}
