//! `manifest.json` of a sharded checkpoint: the format, the step, the run's config, the
//! mesh, every file with its size and SHA-256, and for every tensor its global shape, dtype,
//! sharding and shards (file, box, byte range, SHA-256 of the shard and of each
//! [`CHUNK_BYTES`](super::CHUNK_BYTES) chunk of it). Read back with every field checked, so
//! a manifest that does not describe a loadable checkpoint is an error before any shard is
//! read.

use super::boxes::Region;
use super::{CheckpointError, MANIFEST};
use ir::{DType, Mesh, Sharding, Type};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The format a manifest is written in.
pub const MANIFEST_FORMAT: &str = "gshard-sharded-1";

/// One mesh axis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshAxisEntry {
    pub name: String,
    pub size: usize,
}

/// One device's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    /// The mesh position of the device that wrote it.
    pub device: usize,
    pub bytes: u64,
    pub sha256: String,
}

/// One shard of a tensor: a box of it, stored row-major at `[start, end)` of `file`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub file: String,
    pub offset: Vec<usize>,
    pub len: Vec<usize>,
    pub start: u64,
    pub end: u64,
    pub sha256: String,
    /// The SHA-256 of each `CHUNK_BYTES` of the shard's bytes (the last one shorter).
    pub chunks: Vec<String>,
}

impl ShardEntry {
    pub fn region(&self) -> Region {
        Region {
            offset: self.offset.clone(),
            len: self.len.clone(),
        }
    }
}

/// One tensor: its global type, how it was sharded, and its shards (each tile once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Per dim, the mesh axes it is split over (major first).
    pub sharding: Vec<Vec<String>>,
    pub shards: Vec<ShardEntry>,
}

impl TensorEntry {
    /// The global type (the dtype is checked when the manifest is read).
    pub fn ty(&self) -> Type {
        Type::new(
            DType::from_name(&self.dtype).unwrap_or(DType::F32),
            self.shape.clone(),
        )
    }

    pub fn sharding(&self) -> Sharding {
        Sharding {
            dims: self.sharding.clone(),
            partial: Vec::new(),
        }
    }
}

/// A sharded checkpoint's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// Steps completed.
    pub step: u64,
    /// Counts the commits in this directory; the files of commit `g` are named after it, so
    /// a commit never overwrites a file the previous manifest names.
    pub generation: u64,
    /// The run's config (TOML).
    pub config: String,
    pub mesh: Vec<MeshAxisEntry>,
    pub files: Vec<FileEntry>,
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl Manifest {
    /// The mesh it was written on.
    pub fn mesh(&self) -> Result<Mesh, String> {
        let axes: Vec<(&str, usize)> = self
            .mesh
            .iter()
            .map(|a| (a.name.as_str(), a.size))
            .collect();
        Mesh::new(&axes).map_err(|e| e.to_string())
    }

    /// Every tensor's global type, by name.
    pub fn types(&self) -> Vec<(String, Type)> {
        self.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.ty()))
            .collect()
    }

    /// The bytes of all its files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Serialised, canonically (sorted keys, so the same checkpoint is the same bytes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest serialises") + "\n"
    }

    /// Read and check `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, CheckpointError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(super::io_err(&path))?;
        Manifest::parse(&text, &path)
    }

    /// Parse and check a manifest's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Manifest, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        let format = v.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if format != MANIFEST_FORMAT {
            return Err(CheckpointError::Version {
                path: path.to_path_buf(),
                found: format.to_string(),
            });
        }
        let m: Manifest =
            serde_json::from_value(v).map_err(|e| corrupt(format!("bad manifest: {e}")))?;
        m.check().map_err(corrupt)?;
        Ok(m)
    }

    /// Every entry consistent: known dtypes and files, shards inside their tensor and their
    /// file, and each tensor covered exactly by its shards.
    fn check(&self) -> Result<(), String> {
        self.mesh()?;
        let sizes: BTreeMap<&str, u64> = self
            .files
            .iter()
            .map(|f| (f.name.as_str(), f.bytes))
            .collect();
        for f in &self.files {
            if f.name.contains('/') || f.name.contains('\\') || f.name.starts_with('.') {
                return Err(format!("file name `{}` is not a plain file name", f.name));
            }
        }
        for (name, t) in &self.tensors {
            let dtype = DType::from_name(&t.dtype)
                .ok_or_else(|| format!("tensor `{name}` has unknown dtype `{}`", t.dtype))?;
            if t.sharding.len() != t.shape.len() {
                return Err(format!(
                    "tensor `{name}`: its sharding and shape differ in rank"
                ));
            }
            let mut covered = 0usize;
            for s in &t.shards {
                let size = sizes.get(s.file.as_str()).ok_or_else(|| {
                    format!("tensor `{name}` names an unlisted file `{}`", s.file)
                })?;
                let r = s.region();
                let bytes = r.elements() as u64 * dtype.size_bytes() as u64;
                let chunks = bytes.div_ceil(super::CHUNK_BYTES) as usize;
                if !r.within(&t.shape)
                    || s.end < s.start
                    || s.end - s.start != bytes
                    || s.end > *size
                    || s.chunks.len() != chunks
                {
                    return Err(format!(
                        "tensor `{name}`: a shard in `{}` is out of bounds",
                        s.file
                    ));
                }
                covered += r.elements();
            }
            for (i, a) in t.shards.iter().enumerate() {
                if t.shards[..i]
                    .iter()
                    .any(|b| a.region().intersect(&b.region()).is_some())
                {
                    return Err(format!("tensor `{name}`: two shards overlap"));
                }
            }
            if covered != t.shape.iter().product::<usize>() {
                return Err(format!("tensor `{name}`: its shards do not cover it"));
            }
        }
        Ok(())
    }
}
