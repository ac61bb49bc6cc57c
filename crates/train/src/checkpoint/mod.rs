//! Checkpoints. Two formats:
//!
//! - **Sharded** (what `gshard train` writes): a directory holding `manifest.json` and one
//!   safetensors file per device with that device's shards only ([`sharded`]). Every device
//!   (every MPI rank) writes its own file, in parallel, with nothing gathered; the manifest
//!   names, for every tensor, its global shape, dtype and sharding, and for each shard its
//!   file, byte range and SHA-256. A checkpoint loads on any mesh: each device reads only
//!   the byte ranges its own shards need ([`ShardedReader`]).
//! - **Single file** (`checkpoint.safetensors`, formats gshard-checkpoint-1 and 2, and what
//!   `gshard checkpoint consolidate` writes): every tensor whole, under its plain name
//!   ([`save`], [`load`]). Run directories holding one keep resuming.
//!
//! A commit is atomic: shard files are written under temporary names, synced and renamed,
//! then the manifest is written the same way and renamed last, and the previous
//! checkpoint's files are removed only after that. A crash at any point leaves a complete
//! checkpoint (the previous or the new one). Bad input (a missing or truncated shard, a
//! checksum mismatch, an unknown format, a mesh that cannot hold the state, another model's
//! checkpoint) is a one-line [`CheckpointError`] naming the file and the fix.

mod boxes;
mod manifest;
mod read;
mod save;
mod single;
mod stfile;
pub mod tools;

pub use manifest::{FileEntry, Manifest, MeshAxisEntry, ShardEntry, TensorEntry, MANIFEST_FORMAT};
pub use read::{ShardedReader, Source};
pub use save::{file_name, remove_unreferenced, save_sharded, CrashPoint, SaveRequest};
pub use single::{is_temporary, load, save, Checkpoint};

use std::path::PathBuf;
use thiserror::Error;

/// The name of a checkpoint directory's manifest.
pub const MANIFEST: &str = "manifest.json";

/// Bytes per verified chunk of a shard: a partial read checks the SHA-256 of every chunk it
/// touches, so a device never reads a shard it does not need in full to verify it.
pub const CHUNK_BYTES: u64 = 1 << 20;

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {path} is corrupt or truncated ({reason}); delete it to start over, or restore a copy")]
    Corrupt { path: PathBuf, reason: String },
    #[error("checkpoint {path} does not fit this model: {reason}; use the config the checkpoint was written with")]
    Mismatch { path: PathBuf, reason: String },
    #[error("checkpoint shard {path} is missing; restore the checkpoint directory {} from a copy, or delete it to start over", dir.display())]
    MissingShard { path: PathBuf, dir: PathBuf },
    #[error("checkpoint shard {path} is truncated ({got} bytes, its manifest says {want}); restore the checkpoint directory {} from a copy, or delete it to start over", dir.display())]
    Truncated {
        path: PathBuf,
        got: u64,
        want: u64,
        dir: PathBuf,
    },
    #[error("checkpoint shard {path}: the bytes of `{tensor}` near byte {at} do not match the manifest's SHA-256; the file is corrupt: restore the checkpoint directory {} from a copy, or delete it to start over", dir.display())]
    Checksum {
        path: PathBuf,
        tensor: String,
        at: u64,
        dir: PathBuf,
    },
    #[error("checkpoint manifest {path} has format `{found}`, which this gshard does not read (it reads `{MANIFEST_FORMAT}`); load it with the gshard that wrote it, or `gshard checkpoint consolidate` it there")]
    Version { path: PathBuf, found: String },
    #[error("checkpoint {path} cannot be laid out on mesh {mesh}: {reason}; choose mesh axis sizes that divide the tensor's dims")]
    Mesh {
        path: PathBuf,
        mesh: String,
        reason: String,
    },
    #[error("{path} already exists; choose another output path, or remove it first")]
    Exists { path: PathBuf },
    #[error("checkpoint save in {path} stopped {point} (a simulated crash)")]
    SimulatedCrash { path: PathBuf, point: CrashPoint },
    #[error("between the devices while checkpointing: {0}")]
    Comm(#[from] runtime::CommError),
    #[error("checkpoint {path}: process {process} failed to write its shards (its error is on its own output); the previous checkpoint stays")]
    Peer { path: PathBuf, process: usize },
}

/// `Io` for `path`.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_path_buf();
    move |source| CheckpointError::Io { path, source }
}
