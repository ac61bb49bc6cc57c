//! The single-file checkpoint (`checkpoint.safetensors`, formats gshard-checkpoint-1 and 2,
//! and what `gshard checkpoint consolidate` writes): every parameter and optimizer-state
//! tensor in one safetensors file, with the
//! step, the run's config and a SHA-256 over the format, step, config and tensor data in its
//! metadata (so an edited step or config is caught like a flipped bit). Written
//! atomically (temporary file in the same directory, fsync, rename), so a crash mid-write
//! leaves the previous checkpoint intact; a truncated, corrupt or mismatched file is a clear
//! error, never a panic or silently wrong numbers.

use super::CheckpointError;
use runtime::HostTensor;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// The format written. Version 1 files (whose checksum covers the tensors only) still load.
pub(crate) const FORMAT: &str = "gshard-checkpoint-2";
pub(crate) const FORMAT_V1: &str = "gshard-checkpoint-1";

/// The contents of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Steps completed.
    pub step: u64,
    /// The run's config (TOML), so a checkpoint is self-describing.
    pub config: String,
    pub tensors: HashMap<String, HostTensor>,
}

/// The checksum, fed one tensor at a time: over `(format, step, config)` when given
/// (version 2), then each tensor's name, type and values (as f64), in name order.
pub(crate) struct Digester(Sha256);

impl Digester {
    pub(crate) fn new(header: Option<(&str, u64, &str)>) -> Digester {
        let mut h = Sha256::new();
        if let Some((format, step, config)) = header {
            for field in [format.as_bytes(), &step.to_le_bytes(), config.as_bytes()] {
                h.update((field.len() as u64).to_le_bytes());
                h.update(field);
            }
        }
        Digester(h)
    }

    pub(crate) fn add(&mut self, name: &str, t: &HostTensor) {
        let h = &mut self.0;
        h.update(name.as_bytes());
        h.update([0]);
        h.update(t.ty.to_string().as_bytes());
        h.update([0]);
        for v in t.to_f64_vec() {
            h.update(v.to_le_bytes());
        }
    }

    pub(crate) fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The checksum of `tensors` (sorted by name) under `header`.
fn digest(header: Option<(&str, u64, &str)>, tensors: &[(String, &HostTensor)]) -> String {
    let mut d = Digester::new(header);
    for (name, t) in tensors {
        d.add(name, t);
    }
    d.finish()
}

pub(crate) fn sorted(tensors: &HashMap<String, HostTensor>) -> Vec<(String, &HostTensor)> {
    let mut v: Vec<(String, &HostTensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Write `ck` to `path` atomically.
pub fn save(path: &Path, ck: &Checkpoint) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tensors = sorted(&ck.tensors);
    let meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("step".to_string(), ck.step.to_string()),
        ("config".to_string(), ck.config.clone()),
        (
            "sha256".to_string(),
            digest(Some((FORMAT, ck.step, &ck.config)), &tensors),
        ),
    ]);
    let bytes = runtime::io::write_safetensors(&tensors, Some(meta)).map_err(|e| {
        CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // The rename itself is durable once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        // A full disk or a failed rename leaves the previous checkpoint, and no half file.
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// Whether `name` is a temporary file that [`save`] writes before its rename (left behind
/// only by a process that was killed mid-write).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.contains(".safetensors.tmp")
}

/// Read and verify a checkpoint.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |reason: String| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let (list, meta) = runtime::io::read_safetensors(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let meta = meta.ok_or_else(|| corrupt("no metadata".into()))?;
    let format = meta.get("format").map(String::as_str);
    if format != Some(FORMAT) && format != Some(FORMAT_V1) {
        return Err(corrupt(format!(
            "not a gshard checkpoint (format {format:?})"
        )));
    }
    let step: u64 = meta
        .get("step")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt("missing or bad step".into()))?;
    let config = meta
        .get("config")
        .cloned()
        .ok_or_else(|| corrupt("missing config".into()))?;
    let tensors: HashMap<String, HostTensor> = list.into_iter().collect();
    let want = meta
        .get("sha256")
        .ok_or_else(|| corrupt("missing checksum".into()))?;
    let header = (format == Some(FORMAT)).then_some((FORMAT, step, config.as_str()));
    if digest(header, &sorted(&tensors)) != *want {
        return Err(corrupt(
            "its step, config or tensor data does not match its checksum".into(),
        ));
    }
    Ok(Checkpoint {
        step,
        config,
        tensors,
    })
}

impl Checkpoint {
    /// Check that every expected tensor is present with its type.
    pub fn check(
        &self,
        path: &Path,
        expected: &[(String, ir::Type)],
    ) -> Result<(), CheckpointError> {
        for (name, ty) in expected {
            match self.tensors.get(name) {
                None => {
                    return Err(CheckpointError::Mismatch {
                        path: path.to_path_buf(),
                        reason: format!("tensor `{name}` is missing"),
                    })
                }
                Some(t) if t.ty != *ty => {
                    return Err(CheckpointError::Mismatch {
                        path: path.to_path_buf(),
                        reason: format!("tensor `{name}` is {} but the model needs {ty}", t.ty),
                    })
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
