//! Saving a sharded checkpoint without gathering: every device writes its own file, in
//! parallel (threads in one process, ranks under MPI), then the processes exchange only
//! their files' descriptions (names, byte ranges, hashes), and process 0 commits the
//! manifest.
//!
//! The commit sequence, and why a crash anywhere leaves a complete checkpoint:
//! 1. each device writes `.<file>.tmp` and syncs it (the manifest names none of them);
//! 2. each renames it to `<file>`, a name of this commit's generation that the current
//!    manifest does not name, and syncs the directory;
//! 3. process 0 writes `.manifest.json.tmp`, syncs it, renames it over `manifest.json`
//!    (atomic: readers see the old or the new one) and syncs the directory;
//! 4. then removes every file the new manifest does not name (the previous checkpoint's).
//!
//! Until 3 the previous manifest and its files are untouched; after 3 the new one is
//! complete. What 1, 2 or 4 leave behind is removed by [`remove_unreferenced`].

use super::boxes::{for_each_run, Frame, Region};
use super::manifest::{FileEntry, Manifest, MeshAxisEntry, ShardEntry, TensorEntry};
use super::stfile::{self, Entry};
use super::{io_err, CheckpointError, MANIFEST, MANIFEST_FORMAT};
use ir::Mesh;
use rayon::prelude::*;
use runtime::{Communicator, HostTensor};
use serde::{Deserialize, Serialize};
use spmd::IoLayout;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// Where a save may be stopped by [`SaveRequest::crash_at`] (a test hook standing in for a
/// killed process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// Every device's temporary file written and synced, none renamed.
    ShardsWritten,
    /// Every device's file renamed, no manifest written.
    ShardsRenamed,
    /// The temporary manifest written and synced, not renamed.
    ManifestWritten,
    /// The manifest renamed, the previous checkpoint's files not yet removed.
    Committed,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 4] = [
        CrashPoint::ShardsWritten,
        CrashPoint::ShardsRenamed,
        CrashPoint::ManifestWritten,
        CrashPoint::Committed,
    ];
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CrashPoint::ShardsWritten => "after writing the shards' temporary files",
            CrashPoint::ShardsRenamed => "after renaming the shard files",
            CrashPoint::ManifestWritten => "after writing the temporary manifest",
            CrashPoint::Committed => "after committing the manifest",
        })
    }
}

/// What to save, and where.
pub struct SaveRequest<'a> {
    /// The checkpoint directory (created if absent).
    pub dir: &'a Path,
    pub step: u64,
    /// The previous manifest's generation plus one (1 for a directory's first commit).
    pub generation: u64,
    /// The run's config (TOML).
    pub config: &'a str,
    pub mesh: &'a Mesh,
    /// The layout of every tensor to save.
    pub layouts: &'a [IoLayout],
    /// Stop the save there, leaving its files as a killed process would (tests).
    pub crash_at: Option<CrashPoint>,
}

/// The file of device `pos` in commit `generation`.
pub fn file_name(generation: u64, pos: usize) -> String {
    format!("g{generation:06}.d{pos:05}.safetensors")
}

fn temporary(name: &str) -> String {
    format!(".{name}.tmp")
}

/// What one process wrote: its files and their shards (tensor name, shard).
#[derive(Serialize, Deserialize, Default)]
struct Part {
    files: Vec<FileEntry>,
    shards: Vec<(String, ShardEntry)>,
}

/// Write device `pos`'s temporary file: the tiles of which it is the canonical holder
/// (rank 0 of every axis that does not split the tensor), their data only.
fn write_device<'t>(
    req: &SaveRequest,
    pos: usize,
    tensor: &(dyn Fn(&IoLayout) -> Result<Cow<'t, HostTensor>, CheckpointError> + Sync),
) -> Result<Part, CheckpointError> {
    let mut mine: Vec<(&IoLayout, Vec<runtime::BlockDim>)> = req
        .layouts
        .iter()
        .filter(|l| spmd::layout::is_canonical_holder(&l.sharding, req.mesh, pos))
        .map(|l| (l, driver::block(l, req.mesh, pos)))
        .filter(|(_, b)| b.iter().all(|d| d.len > 0))
        .collect();
    mine.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let entries: Vec<Entry> = mine
        .iter()
        .map(|(l, b)| Entry {
            name: l.name.clone(),
            dtype: l.global.dtype,
            shape: b.iter().map(|d| d.len).collect(),
        })
        .collect();
    let name = file_name(req.generation, pos);
    let tmp = req.dir.join(temporary(&name));
    let meta = BTreeMap::from([
        ("format".to_string(), "gshard-shard-1".to_string()),
        ("step".to_string(), req.step.to_string()),
        ("device".to_string(), pos.to_string()),
    ]);
    let written = stfile::write_file(&tmp, &entries, &meta, |i, sink| {
        let (l, block) = &mine[i];
        let t = tensor(l)?;
        let padded: Vec<usize> = block.iter().map(|d| d.padded).collect();
        if t.ty.shape != padded || t.ty.dtype != l.global.dtype {
            return Err(CheckpointError::Mismatch {
                path: tmp.clone(),
                reason: format!(
                    "device {pos}'s shard of `{}` is {}, its layout needs {:?}",
                    l.name, t.ty, padded
                ),
            });
        }
        let region = Region::of_block(block);
        let w = l.global.dtype.size_bytes();
        let bytes = t.data.as_bytes();
        let dense = &entries[i].shape;
        let device = Frame {
            origin: &region.offset,
            shape: &padded,
        };
        let file = Frame {
            origin: &region.offset,
            shape: dense,
        };
        for_each_run(&region, device, file, |a, _, n| {
            sink.write(&bytes[a * w..(a + n) * w]).map_err(io_err(&tmp))
        })
    })?;
    let shards = mine
        .iter()
        .zip(written.tensors)
        .map(|((l, b), p)| {
            let r = Region::of_block(b);
            (
                l.name.clone(),
                ShardEntry {
                    file: name.clone(),
                    offset: r.offset,
                    len: r.len,
                    start: p.start,
                    end: p.end,
                    sha256: p.sha256,
                    chunks: p.chunks,
                },
            )
        })
        .collect();
    Ok(Part {
        files: vec![FileEntry {
            name,
            device: pos,
            bytes: written.bytes,
            sha256: written.sha256,
        }],
        shards,
    })
}

/// Each process's result, on every process: `Ok(parts)` when all succeeded, else the first
/// failure (this process's own error if it failed).
fn exchange(
    comm: &dyn Communicator,
    dir: &Path,
    mine: Result<Vec<u8>, CheckpointError>,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    if comm.num_processes() == 1 {
        return mine.map(|b| vec![b]);
    }
    let (bytes, err) = match mine {
        Ok(mut b) => {
            b.insert(0, 1);
            (b, None)
        }
        Err(e) => (vec![0], Some(e)),
    };
    let all = comm.all_gather_bytes(bytes)?;
    if let Some(e) = err {
        return Err(e);
    }
    if let Some(p) = all.iter().position(|b| b.first() != Some(&1)) {
        return Err(CheckpointError::Peer {
            path: dir.to_path_buf(),
            process: p,
        });
    }
    Ok(all.into_iter().map(|mut b| b.split_off(1)).collect())
}

/// A device's shard of a tensor, borrowed or built.
pub type Shard<'t> = Result<Cow<'t, HostTensor>, CheckpointError>;

/// Save this process's devices' state as part of a sharded checkpoint (collective: every
/// process calls it). `tensor(j, layout)` is local device `j`'s shard of a tensor (its
/// padded block). Returns the committed manifest.
pub fn save_sharded<'t>(
    req: &SaveRequest,
    comm: &dyn Communicator,
    tensor: &(dyn Fn(usize, &IoLayout) -> Shard<'t> + Sync),
) -> Result<Manifest, CheckpointError> {
    let positions = comm.local_positions();
    let crash = |point| -> Result<(), CheckpointError> {
        if req.crash_at == Some(point) {
            return Err(CheckpointError::SimulatedCrash {
                path: req.dir.to_path_buf(),
                point,
            });
        }
        Ok(())
    };
    let mine = (|| -> Result<Vec<u8>, CheckpointError> {
        std::fs::create_dir_all(req.dir).map_err(io_err(req.dir))?;
        let parts: Vec<Part> = positions
            .par_iter()
            .enumerate()
            .map(|(j, &pos)| write_device(req, pos, &|l: &IoLayout| tensor(j, l)))
            .collect::<Result<_, _>>()?;
        crash(CrashPoint::ShardsWritten)?;
        for p in &parts {
            for f in &p.files {
                let (from, to) = (req.dir.join(temporary(&f.name)), req.dir.join(&f.name));
                std::fs::rename(&from, &to).map_err(io_err(&to))?;
            }
        }
        stfile::sync_dir(req.dir)?;
        let merged = Part {
            files: parts.iter().flat_map(|p| p.files.clone()).collect(),
            shards: parts.into_iter().flat_map(|p| p.shards).collect(),
        };
        Ok(serde_json::to_vec(&merged).expect("parts serialise"))
    })();
    let all = exchange(comm, req.dir, mine)?;
    crash(CrashPoint::ShardsRenamed)?;
    let manifest = build_manifest(req, &all)?;
    let committed = if comm.process_index() == 0 {
        commit(req, &manifest).map(|_| Vec::new())
    } else {
        Ok(Vec::new())
    };
    exchange(comm, req.dir, committed)?;
    Ok(manifest)
}

fn build_manifest(req: &SaveRequest, all: &[Vec<u8>]) -> Result<Manifest, CheckpointError> {
    let mut tensors: BTreeMap<String, TensorEntry> = req
        .layouts
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                TensorEntry {
                    dtype: l.global.dtype.name().to_string(),
                    shape: l.global.shape.clone(),
                    sharding: l.sharding.dims.clone(),
                    shards: Vec::new(),
                },
            )
        })
        .collect();
    let mut files = Vec::new();
    for bytes in all {
        let part: Part = serde_json::from_slice(bytes).map_err(|e| CheckpointError::Corrupt {
            path: req.dir.to_path_buf(),
            reason: format!("a process's shard list is unreadable: {e}"),
        })?;
        files.extend(part.files);
        for (name, s) in part.shards {
            if let Some(t) = tensors.get_mut(&name) {
                t.shards.push(s);
            }
        }
    }
    files.sort_by_key(|f| f.device);
    for t in tensors.values_mut() {
        t.shards.sort_by(|a, b| a.offset.cmp(&b.offset));
    }
    Ok(Manifest {
        format: MANIFEST_FORMAT.to_string(),
        step: req.step,
        generation: req.generation,
        config: req.config.to_string(),
        mesh: req
            .mesh
            .axes
            .iter()
            .map(|a| MeshAxisEntry {
                name: a.name.clone(),
                size: a.size,
            })
            .collect(),
        files,
        tensors,
    })
}

/// Steps 3 and 4: the manifest, then the previous checkpoint's files go.
fn commit(req: &SaveRequest, manifest: &Manifest) -> Result<(), CheckpointError> {
    let tmp = req.dir.join(temporary(MANIFEST));
    let path = req.dir.join(MANIFEST);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, manifest.to_json().as_bytes())?;
        f.sync_all()
    })();
    written.map_err(io_err(&tmp))?;
    if req.crash_at == Some(CrashPoint::ManifestWritten) {
        return Err(CheckpointError::SimulatedCrash {
            path: req.dir.to_path_buf(),
            point: CrashPoint::ManifestWritten,
        });
    }
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    stfile::sync_dir(req.dir)?;
    if req.crash_at == Some(CrashPoint::Committed) {
        return Err(CheckpointError::SimulatedCrash {
            path: req.dir.to_path_buf(),
            point: CrashPoint::Committed,
        });
    }
    remove_unreferenced(req.dir, Some(manifest))?;
    Ok(())
}

/// Remove what a save left that `manifest` (the committed one; `None`: there is none) does
/// not name: temporary files, and shard files of other commits. Only files of the forms a
/// save writes are touched. Call with the run's lock held. Returns how many were removed.
pub fn remove_unreferenced(
    dir: &Path,
    manifest: Option<&Manifest>,
) -> Result<usize, CheckpointError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = (name.starts_with('.') && name.ends_with(".tmp"))
            || (name.starts_with('g') && name.ends_with(".safetensors"));
        let named = manifest.is_some_and(|m| m.files.iter().any(|f| f.name == name));
        if ours && !named {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(io_err(&path))?;
            n += 1;
        }
    }
    Ok(n)
}
