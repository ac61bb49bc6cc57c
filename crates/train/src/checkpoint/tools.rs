//! What `gshard checkpoint` does: describe a checkpoint ([`info`]), check every byte of it
//! against its hashes ([`verify`]), write it as one safetensors file with plain tensor names
//! ([`consolidate`], the gshard-checkpoint-2 format, which any safetensors reader loads and
//! which `gshard train --resume` accepts), and lay it out on another mesh ([`reshard`]).
//! Each reads one tensor (or one device block) at a time, and none writes over an existing
//! path.

use super::read::Source;
use super::save::{save_sharded, SaveRequest};
use super::single::{Digester, FORMAT};
use super::stfile::{self, hex, Entry};
use super::{io_err, CheckpointError, Manifest, CHUNK_BYTES};
use ir::{Mesh, Sharding};
use runtime::{HostTensor, InProcess};
use sha2::{Digest, Sha256};
use spmd::IoLayout;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A few lines describing a checkpoint: format, step, mesh, files, and every tensor with
/// its type, sharding and number of shards.
pub fn info(src: &Source) -> String {
    let mut out = String::new();
    match src {
        Source::Sharded(r) => {
            let m = &r.manifest;
            let mesh = m
                .mesh
                .iter()
                .map(|a| format!("{}={}", a.name, a.size))
                .collect::<Vec<_>>()
                .join(" x ");
            out += &format!(
                "{} ({}): step {}, generation {}, mesh {mesh}, {} files, {}\n",
                r.dir.display(),
                m.format,
                m.step,
                m.generation,
                m.files.len(),
                crate::memory::human(m.total_bytes())
            );
            for (name, t) in &m.tensors {
                let sharding: Vec<String> = t
                    .sharding
                    .iter()
                    .map(|axes| {
                        if axes.is_empty() {
                            "_".to_string()
                        } else {
                            axes.join("*")
                        }
                    })
                    .collect();
                out += &format!(
                    "  {name}  {}  [{}]  {} shard(s)\n",
                    t.ty(),
                    sharding.join(", "),
                    t.shards.len()
                );
            }
        }
        Source::Single { path, ck } => {
            let bytes: usize = ck.tensors.values().map(|t| t.size_bytes()).sum();
            out += &format!(
                "{} (single file): step {}, {} tensors, {}\n",
                path.display(),
                ck.step,
                ck.tensors.len(),
                crate::memory::human(bytes as u64)
            );
            for (name, ty) in src.types() {
                out += &format!("  {name}  {ty}\n");
            }
        }
    }
    out
}

/// What [`verify`] checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub files: usize,
    pub bytes: u64,
    pub tensors: usize,
}

/// The SHA-256 of `len` bytes of `file` from `at`, with the hashes of its chunks.
fn hash_range(
    file: &File,
    path: &Path,
    at: u64,
    len: u64,
    buf: &mut Vec<u8>,
) -> Result<(String, Vec<String>), CheckpointError> {
    let mut whole = Sha256::new();
    let mut chunks = Vec::new();
    let mut done = 0;
    while done < len {
        let n = CHUNK_BYTES.min(len - done) as usize;
        buf.resize(n, 0);
        file.read_exact_at(buf, at + done).map_err(io_err(path))?;
        whole.update(&buf[..]);
        chunks.push(hex(Sha256::digest(&buf[..])));
        done += n as u64;
    }
    Ok((hex(whole.finalize()), chunks))
}

/// Check every file of a checkpoint against its manifest's hashes (a single file: its own
/// checksum).
pub fn verify(src: &Source) -> Result<Verified, CheckpointError> {
    let r = match src {
        Source::Sharded(r) => r,
        Source::Single { ck, .. } => {
            // `Source::open` has checked its checksum.
            return Ok(Verified {
                files: 1,
                bytes: ck.tensors.values().map(|t| t.size_bytes() as u64).sum(),
                tensors: ck.tensors.len(),
            });
        }
    };
    let m = &r.manifest;
    let mut buf = Vec::new();
    for f in &m.files {
        let path = r.dir.join(&f.name);
        let file = File::open(&path).map_err(io_err(&path))?;
        let (sha, _) = hash_range(&file, &path, 0, f.bytes, &mut buf)?;
        if sha != f.sha256 {
            return Err(CheckpointError::Checksum {
                path,
                tensor: "(the whole file)".into(),
                at: 0,
                dir: r.dir.clone(),
            });
        }
    }
    for (name, t) in &m.tensors {
        for s in &t.shards {
            let path = r.dir.join(&s.file);
            let file = File::open(&path).map_err(io_err(&path))?;
            let (sha, chunks) = hash_range(&file, &path, s.start, s.end - s.start, &mut buf)?;
            if sha != s.sha256 || chunks != s.chunks {
                return Err(CheckpointError::Checksum {
                    path,
                    tensor: name.clone(),
                    at: s.start,
                    dir: r.dir.clone(),
                });
            }
        }
    }
    Ok(Verified {
        files: m.files.len(),
        bytes: m.total_bytes(),
        tensors: m.tensors.len(),
    })
}

/// Refuse to write over `path`.
fn fresh(path: &Path) -> Result<(), CheckpointError> {
    let busy = match std::fs::read_dir(path) {
        Ok(mut d) => d.next().is_some(),
        Err(_) => path.exists(),
    };
    if busy {
        return Err(CheckpointError::Exists {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Tensor `name` whole.
fn whole(src: &Source, name: &str, shape: &[usize]) -> Result<HostTensor, CheckpointError> {
    match src {
        Source::Sharded(r) => r.read_whole(name),
        Source::Single { .. } => {
            let block: Vec<runtime::BlockDim> = shape
                .iter()
                .map(|&n| runtime::BlockDim {
                    offset: 0,
                    len: n,
                    padded: n,
                })
                .collect();
            src.read_block(name, &block)
        }
    }
}

/// Write `src` to `out` as one safetensors file in the gshard-checkpoint-2 format: plain
/// tensor names, the step, the config and the checksum in its metadata. Holds one tensor
/// at a time (each is read twice: once for the checksum, once to write it).
pub fn consolidate(src: &Source, out: &Path) -> Result<(), CheckpointError> {
    fresh(out)?;
    let types = src.types();
    let mut d = Digester::new(Some((FORMAT, src.step(), src.config())));
    for (name, ty) in &types {
        d.add(name, &whole(src, name, &ty.shape)?);
    }
    let meta = BTreeMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("step".to_string(), src.step().to_string()),
        ("config".to_string(), src.config().to_string()),
        ("sha256".to_string(), d.finish()),
    ]);
    let entries: Vec<Entry> = types
        .iter()
        .map(|(name, ty)| Entry {
            name: name.clone(),
            dtype: ty.dtype,
            shape: ty.shape.clone(),
        })
        .collect();
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let written = stfile::write_file(&tmp, &entries, &meta, |i, sink| {
        let (name, ty) = &types[i];
        let t = whole(src, name, &ty.shape)?;
        sink.write(&t.data.as_bytes()).map_err(io_err(&tmp))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(io_err(out))?;
    stfile::sync_dir(dir)
}

/// The layouts of `src`'s tensors on `mesh`: each dim keeps the saved axes that `mesh` has
/// (a single file, which records no sharding, is replicated).
pub fn layouts_on(src: &Source, mesh: &Mesh) -> Vec<IoLayout> {
    src.types()
        .into_iter()
        .map(|(name, ty)| {
            let sharding = match src {
                Source::Sharded(r) => Sharding {
                    dims: r.manifest.tensors[&name]
                        .sharding
                        .iter()
                        .map(|axes| {
                            axes.iter()
                                .filter(|a| mesh.axis_index(a).is_some())
                                .cloned()
                                .collect()
                        })
                        .collect(),
                    partial: Vec::new(),
                },
                Source::Single { .. } => Sharding::replicated(ty.shape.len()),
            };
            IoLayout {
                name,
                global: ty,
                sharding,
            }
        })
        .collect()
}

/// The config with its mesh set to `mesh` when it is a training config over axes `data`
/// and `expert`; otherwise unchanged.
fn config_on(config: &str, mesh: &Mesh) -> String {
    let Ok(mut cfg) = crate::config::TrainConfig::parse_toml(config, "checkpoint") else {
        return config.to_string();
    };
    if mesh
        .axes
        .iter()
        .any(|a| a.name != "data" && a.name != "expert")
    {
        return config.to_string();
    }
    cfg.mesh.data = mesh.axis_size("data").unwrap_or(1);
    cfg.mesh.expert = mesh.axis_size("expert").unwrap_or(1);
    cfg.to_toml()
}

/// Write `src` laid out on `mesh` as a sharded checkpoint in `out` (a new or empty
/// directory), one file per device, each device's blocks read from `src` one at a time.
pub fn reshard(src: &Source, mesh: &Mesh, out: &Path) -> Result<Manifest, CheckpointError> {
    fresh(out)?;
    let layouts = layouts_on(src, mesh);
    if let Source::Sharded(r) = src {
        r.check_mesh(mesh, &layouts)?;
    }
    let comm = InProcess::new(mesh.num_devices());
    let config = config_on(src.config(), mesh);
    let req = SaveRequest {
        dir: out,
        step: src.step(),
        generation: 1,
        config: &config,
        mesh,
        layouts: &layouts,
        crash_at: None,
    };
    let read = |j: usize, l: &IoLayout| -> Result<Cow<'_, HostTensor>, CheckpointError> {
        let block = driver::block(l, mesh, j);
        src.read_block(&l.name, &block).map(Cow::Owned)
    };
    save_sharded(&req, &comm, &read)
}

/// Open a sharded checkpoint directory or a single file (for the tools).
pub fn open(path: &Path) -> Result<Source, CheckpointError> {
    Source::open(path)
}
