//! The files of a run directory, and its protection: one process at a time holds the
//! directory's lock (`flock` on `.lock`, released by the kernel when the process ends, so a
//! lock cannot outlive its holder), a directory that holds a run is never replaced without
//! `--overwrite`, and what a killed process left half-written is removed at start.
//!
//! The checkpoint is the sharded directory `checkpoint/` ([`crate::checkpoint`]); a run
//! directory holding only the single file `checkpoint.safetensors` (the format before it)
//! resumes from that file, which the first sharded commit then replaces.

use super::TrainError;
use crate::checkpoint;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

/// Files of a run directory.
pub struct RunDir {
    pub dir: PathBuf,
}

/// The run directory's lock, held until dropped (or the process ends). The lock file holds
/// the holder's pid while it runs and is emptied on a clean release, so a pid found there
/// by the next holder names a process that ended without releasing it (killed or crashed).
pub struct RunLock {
    file: File,
    /// The pid of a previous holder that ended without releasing the lock.
    pub stale_pid: Option<u32>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// The files a run directory holds (and the directory `checkpoint/`).
pub const RUN_FILES: [&str; 10] = [
    "config.toml",
    "metrics.jsonl",
    "checkpoint.safetensors",
    "tokenizer.json",
    "loss.png",
    "expert_load.png",
    "dropped.png",
    "expert_placement.png",
    "dev.hyp",
    "dev.ref",
];

impl RunDir {
    pub fn new(dir: impl Into<PathBuf>) -> RunDir {
        RunDir { dir: dir.into() }
    }
    /// The sharded checkpoint's directory.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }
    /// The single-file checkpoint of a run directory written before the sharded format.
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors")
    }
    /// Whether the directory holds a checkpoint of either format.
    pub fn has_checkpoint(&self) -> bool {
        self.checkpoint_dir().join(checkpoint::MANIFEST).exists() || self.checkpoint().exists()
    }
    /// The run's checkpoint: the sharded one if committed, else the single file; `None`
    /// when there is neither.
    pub fn open_checkpoint(&self) -> Result<Option<checkpoint::Source>, TrainError> {
        let dir = self.checkpoint_dir();
        if dir.join(checkpoint::MANIFEST).exists() {
            return Ok(Some(checkpoint::Source::open(&dir)?));
        }
        if self.checkpoint().exists() {
            return Ok(Some(checkpoint::Source::open(&self.checkpoint())?));
        }
        Ok(None)
    }
    pub fn tokenizer(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn metrics(&self) -> PathBuf {
        self.dir.join("metrics.jsonl")
    }
    fn lock_path(&self) -> PathBuf {
        self.dir.join(".lock")
    }

    /// Whether the directory holds (part of) a run: a config, metrics or a checkpoint.
    pub fn holds_run(&self) -> bool {
        [
            self.config(),
            self.metrics(),
            self.checkpoint(),
            self.checkpoint_dir(),
        ]
        .iter()
        .any(|p| p.exists())
    }

    /// Take the directory's lock, or say which process holds it.
    pub fn lock(&self) -> Result<RunLock, TrainError> {
        let path = self.lock_path();
        let io = super::io(&path);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut previous = String::new();
        let _ = file.read_to_string(&mut previous);
        let previous: Option<u32> = previous.trim().parse().ok();
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(TrainError::Locked {
                    dir: self.dir.clone(),
                    pid: previous,
                })
            }
            Err(TryLockError::Error(e)) => return Err(super::io(&path)(e)),
        }
        let io = super::io(&path);
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(super::io(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(super::io(&path))?;
        Ok(RunLock {
            file,
            stale_pid: previous.filter(|&p| p != std::process::id()),
        })
    }

    /// Remove the temporary files a killed process left mid-write, and the shard files of
    /// a commit it did not finish or of one it replaced (call with the lock held: no live
    /// process is writing them then). A checkpoint directory whose manifest cannot be read
    /// is left as it is (loading it says what is wrong). Returns how many were removed.
    pub fn remove_stale_temporaries(&self) -> Result<usize, TrainError> {
        let dir = self.checkpoint_dir();
        let mut n = match checkpoint::Manifest::read(&dir) {
            Ok(m) => checkpoint::remove_unreferenced(&dir, Some(&m))?,
            Err(_) if !dir.join(checkpoint::MANIFEST).exists() => {
                checkpoint::remove_unreferenced(&dir, None)?
            }
            Err(_) => 0,
        };
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if checkpoint::is_temporary(&name.to_string_lossy()) {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(super::io(&path))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Remove the files of the run the directory holds (`--overwrite`; lock held).
    pub fn clear(&self) -> Result<(), TrainError> {
        for f in RUN_FILES {
            let path = self.dir.join(f);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(super::io(&path)(e)),
            }
        }
        let dir = self.checkpoint_dir();
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(super::io(&dir)(e)),
        }
    }
}
