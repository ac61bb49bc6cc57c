//! Reading a sharded checkpoint onto any mesh: a device's block of a tensor is put together
//! from the saved shards it intersects, reading only the byte ranges it needs with
//! positioned reads through one chunk-sized buffer, and checking the SHA-256 of every chunk
//! it touches. No tensor is ever read whole unless the device holds all of it.
//!
//! Positioned reads (`pread`) rather than a memory map: the same "only the ranges needed"
//! with a hard bound on what the process holds (mapped file pages count in its resident
//! memory until unmapped), no `unsafe`, and no new dependency.

use super::boxes::{for_each_run, Frame, Region};
use super::manifest::{Manifest, ShardEntry, TensorEntry};
use super::single::{self, Checkpoint};
use super::stfile::hex;
use super::{io_err, CheckpointError, CHUNK_BYTES, MANIFEST};
use ir::{Mesh, Type};
use runtime::{BlockDim, Data, HostTensor};
use sha2::{Digest, Sha256};
use spmd::IoLayout;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// An opened sharded checkpoint: its manifest checked, and every file it names present with
/// its size.
pub struct ShardedReader {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

impl ShardedReader {
    /// Open `dir` (holding `manifest.json`).
    pub fn open(dir: &Path) -> Result<ShardedReader, CheckpointError> {
        let manifest = Manifest::read(dir)?;
        for f in &manifest.files {
            let path = dir.join(&f.name);
            let got = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(CheckpointError::MissingShard {
                        path,
                        dir: dir.to_path_buf(),
                    })
                }
                Err(e) => return Err(io_err(&path)(e)),
            };
            if got != f.bytes {
                return Err(CheckpointError::Truncated {
                    path,
                    got,
                    want: f.bytes,
                    dir: dir.to_path_buf(),
                });
            }
        }
        Ok(ShardedReader {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST)
    }

    /// Check that the checkpoint holds exactly `expected` (name and type), as a model needs.
    pub fn check_model(&self, expected: &[(String, Type)]) -> Result<(), CheckpointError> {
        check_types(&self.manifest_path(), &self.manifest.types(), expected)
    }

    /// Check that every layout of `layouts` splits its dims evenly over `mesh`.
    pub fn check_mesh(&self, mesh: &Mesh, layouts: &[IoLayout]) -> Result<(), CheckpointError> {
        for l in layouts {
            for (d, axes) in l.sharding.dims.iter().enumerate() {
                let tiles = mesh.size_of(axes);
                let n = l.global.shape[d];
                if tiles > 1 && !n.is_multiple_of(tiles) {
                    return Err(CheckpointError::Mesh {
                        path: self.manifest_path(),
                        mesh: mesh.to_string(),
                        reason: format!(
                            "tensor `{}` has {n} entries in dim {d}, which do not split over {} ({tiles} pieces)",
                            l.name,
                            axes.join("*")
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn tensor(&self, name: &str) -> Result<&TensorEntry, CheckpointError> {
        self.manifest
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::Mismatch {
                path: self.manifest_path(),
                reason: format!("tensor `{name}` is missing"),
            })
    }

    /// The block `block` (a device's padded shard, padding zero) of tensor `name`.
    pub fn read_block(
        &self,
        name: &str,
        block: &[BlockDim],
    ) -> Result<HostTensor, CheckpointError> {
        let t = self.tensor(name)?;
        let ty = t.ty();
        let w = ty.dtype.size_bytes();
        let padded: Vec<usize> = block.iter().map(|b| b.padded).collect();
        let want = Region::of_block(block);
        let mut out = vec![0u8; padded.iter().product::<usize>() * w];
        let mut buf = Vec::new();
        for s in &t.shards {
            let Some(part) = want.intersect(&s.region()) else {
                continue;
            };
            let path = self.dir.join(&s.file);
            let file = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => CheckpointError::MissingShard {
                    path: path.clone(),
                    dir: self.dir.clone(),
                },
                _ => io_err(&path)(e),
            })?;
            let mut reader = ChunkReader {
                file: &file,
                path: &path,
                dir: &self.dir,
                tensor: name,
                shard: s,
                loaded: None,
                buf: &mut buf,
            };
            let saved = Frame {
                origin: &s.offset,
                shape: &s.len,
            };
            let device = Frame {
                origin: &want.offset,
                shape: &padded,
            };
            for_each_run(&part, saved, device, |a, b, n| {
                reader.copy((a * w) as u64, &mut out[b * w..(b + n) * w])
            })?;
        }
        let data = match ty.dtype {
            ir::DType::Bool => Data::Bool(out.iter().map(|&b| b != 0).collect()),
            d => Data::from_bytes(d, &out).expect("whole elements"),
        };
        HostTensor::new(ty.with_shape(padded), data).map_err(|e| CheckpointError::Corrupt {
            path: self.manifest_path(),
            reason: e.to_string(),
        })
    }

    /// The whole of tensor `name`.
    pub fn read_whole(&self, name: &str) -> Result<HostTensor, CheckpointError> {
        let shape = self.tensor(name)?.shape.clone();
        let block: Vec<BlockDim> = shape
            .iter()
            .map(|&n| BlockDim {
                offset: 0,
                len: n,
                padded: n,
            })
            .collect();
        self.read_block(name, &block)
    }
}

/// A shard's bytes, one verified chunk at a time.
struct ChunkReader<'a> {
    file: &'a File,
    path: &'a Path,
    dir: &'a Path,
    tensor: &'a str,
    shard: &'a ShardEntry,
    /// The chunk in `buf`.
    loaded: Option<u64>,
    buf: &'a mut Vec<u8>,
}

impl ChunkReader<'_> {
    /// Load chunk `c` of the shard and check its hash.
    fn load(&mut self, c: u64) -> Result<(), CheckpointError> {
        if self.loaded == Some(c) {
            return Ok(());
        }
        let len = self.shard.end - self.shard.start;
        let from = c * CHUNK_BYTES;
        let n = CHUNK_BYTES.min(len - from) as usize;
        self.buf.resize(n, 0);
        let at = self.shard.start + from;
        self.file
            .read_exact_at(self.buf, at)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => CheckpointError::Truncated {
                    path: self.path.to_path_buf(),
                    got: self.file.metadata().map(|m| m.len()).unwrap_or(0),
                    want: self.shard.end,
                    dir: self.dir.to_path_buf(),
                },
                _ => io_err(self.path)(e),
            })?;
        if hex(Sha256::digest(&self.buf[..])) != self.shard.chunks[c as usize] {
            self.loaded = None;
            return Err(CheckpointError::Checksum {
                path: self.path.to_path_buf(),
                tensor: self.tensor.to_string(),
                at,
                dir: self.dir.to_path_buf(),
            });
        }
        self.loaded = Some(c);
        Ok(())
    }

    /// Copy the shard's bytes from `at` (relative to its start) into `out`.
    fn copy(&mut self, mut at: u64, mut out: &mut [u8]) -> Result<(), CheckpointError> {
        while !out.is_empty() {
            let c = at / CHUNK_BYTES;
            self.load(c)?;
            let inner = (at - c * CHUNK_BYTES) as usize;
            let take = (self.buf.len() - inner).min(out.len());
            let (head, rest) = out.split_at_mut(take);
            head.copy_from_slice(&self.buf[inner..inner + take]);
            out = rest;
            at += take as u64;
        }
        Ok(())
    }
}

/// `got` holds exactly the tensors of `expected`, with their types.
fn check_types(
    path: &Path,
    got: &[(String, Type)],
    expected: &[(String, Type)],
) -> Result<(), CheckpointError> {
    let mismatch = |reason: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        reason,
    };
    for (name, ty) in expected {
        match got.iter().find(|(n, _)| n == name) {
            None => return Err(mismatch(format!("tensor `{name}` is missing"))),
            Some((_, t)) if t != ty => {
                return Err(mismatch(format!(
                    "tensor `{name}` is {t} but the model needs {ty}"
                )))
            }
            Some(_) => {}
        }
    }
    if let Some((extra, _)) = got
        .iter()
        .find(|(n, _)| !expected.iter().any(|(e, _)| e == n))
    {
        return Err(mismatch(format!(
            "it holds tensor `{extra}`, which the model does not have"
        )));
    }
    Ok(())
}

/// A checkpoint of either format, for loading and the tools.
pub enum Source {
    Sharded(ShardedReader),
    /// A single file, read whole.
    Single {
        path: PathBuf,
        ck: Checkpoint,
    },
}

impl Source {
    /// A directory holding `manifest.json`, or a single safetensors file.
    pub fn open(path: &Path) -> Result<Source, CheckpointError> {
        if path.is_dir() {
            Ok(Source::Sharded(ShardedReader::open(path)?))
        } else {
            let ck = single::load(path)?;
            Ok(Source::Single {
                path: path.to_path_buf(),
                ck,
            })
        }
    }

    pub fn step(&self) -> u64 {
        match self {
            Source::Sharded(r) => r.manifest.step,
            Source::Single { ck, .. } => ck.step,
        }
    }

    pub fn config(&self) -> &str {
        match self {
            Source::Sharded(r) => &r.manifest.config,
            Source::Single { ck, .. } => &ck.config,
        }
    }

    /// The generation of the commit (0 for a single file).
    pub fn generation(&self) -> u64 {
        match self {
            Source::Sharded(r) => r.manifest.generation,
            Source::Single { .. } => 0,
        }
    }

    /// Every tensor's global type, by name (sorted).
    pub fn types(&self) -> Vec<(String, Type)> {
        match self {
            Source::Sharded(r) => r.manifest.types(),
            Source::Single { ck, .. } => {
                let mut v: Vec<(String, Type)> = ck
                    .tensors
                    .iter()
                    .map(|(n, t)| (n.clone(), t.ty.clone()))
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            }
        }
    }

    /// Where the checkpoint is (for messages).
    pub fn path(&self) -> PathBuf {
        match self {
            Source::Sharded(r) => r.dir.clone(),
            Source::Single { path, .. } => path.clone(),
        }
    }

    /// Check that it holds exactly `expected`.
    pub fn check_model(&self, expected: &[(String, Type)]) -> Result<(), CheckpointError> {
        match self {
            Source::Sharded(r) => r.check_model(expected),
            Source::Single { path, .. } => check_types(path, &self.types(), expected),
        }
    }

    /// Every tensor whole, by name (small checkpoints: tests and tools).
    pub fn tensors(
        &self,
    ) -> Result<std::collections::HashMap<String, HostTensor>, CheckpointError> {
        self.types()
            .into_iter()
            .map(|(name, ty)| {
                let block: Vec<BlockDim> = ty
                    .shape
                    .iter()
                    .map(|&n| BlockDim {
                        offset: 0,
                        len: n,
                        padded: n,
                    })
                    .collect();
                let t = self.read_block(&name, &block)?;
                Ok((name, t))
            })
            .collect()
    }

    /// Tensor `name`'s block `block`.
    pub fn read_block(
        &self,
        name: &str,
        block: &[BlockDim],
    ) -> Result<HostTensor, CheckpointError> {
        match self {
            Source::Sharded(r) => r.read_block(name, block),
            Source::Single { path, ck } => {
                ck.tensors.get(name).map(|t| t.block(block)).ok_or_else(|| {
                    CheckpointError::Mismatch {
                        path: path.clone(),
                        reason: format!("tensor `{name}` is missing"),
                    }
                })
            }
        }
    }
}
