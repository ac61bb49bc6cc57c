//! The training run: data -> tokenizer -> examples -> one partitioned training-step program
//! (forward, loss, gradients, optimizer update) and one evaluation program -> the step loop
//! on the devices of the mesh, with metrics, checkpoints, evaluation, decoding and BLEU.
//!
//! State stays on the devices between steps: every step's outputs `new/<x>` are the next
//! step's inputs `<x>` (same sharding), so only a batch is cut and fed per step. Everything
//! random is a pure function of `(seed, step)`: the batch composition (temperature sampling
//! over languages, then an example), dropout and random routing. A run resumed from a
//! checkpoint therefore continues bit-for-bit.
//!
//! The devices run behind a [`runtime::Communicator`]: all of them in this process
//! ([`runtime::InProcess`], the default) or one per MPI rank. Every process runs the same loop on the same batches;
//! only process 0 writes the run's files (config, tokenizer, metrics, plots, decodes, a
//! checkpoint's manifest) and shares what the others need (the tokenizer) as bytes; every
//! process writes and reads its own devices' checkpoint shards.
//!
//! A run protects its work: process 0 holds the run directory's lock ([`RunDir::lock`]); a
//! step whose loss or gradient norm is not finite is not applied (the guard is part of the
//! step program, [`APPLIED`]); a [`StopRequest`] (SIGINT, SIGTERM) ends the run after the
//! step in flight with a checkpoint; the memory a run needs is checked before anything is
//! allocated ([`crate::memory`]).
//!
//! The parts: `batches` (languages, tokenizer, examples, the batch of a step), `programs`
//! (the step and eval programs), `step` (the [`Trainer`] and its steps), `decode` (greedy
//! and beam search), `incremental` (the encoder once per batch, then one decoder position
//! per step with cached keys and values), `run` (the loop), `rundir` (the run directory),
//! `load` (a saved run for eval and translate), `ckpt` (the state to and from sharded
//! checkpoints, each device its own shards).

mod batches;
mod ckpt;
mod decode;
mod incremental;
mod load;
mod programs;
mod run;
mod rundir;
mod step;

pub use batches::{
    batch_at, batch_tensors, held_out, langs_by_size, packed_batch_at, packed_tensors,
    prepare_data, select_langs, tokenizer_for, Data, Example, FIRST_LANGS,
};
pub use ckpt::SaveOptions;
pub use decode::{translate, DecodeMode, DecodeOptions};
pub use load::{evaluate_pairs, load_run, LoadedRun};
pub use programs::{build_programs, init_tensor, step_program, Programs, StepProgram};
pub use programs::{APPLIED, GRAD_NORM};
pub use run::{config_diff, run, ExpertLoad, ProfileRequest, Report, RunOptions, Sample};
pub use rundir::{RunDir, RunLock};
pub use step::{dev_loss, Trainer};

use crate::checkpoint;
pub use crate::memory::MemoryError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data: {0}")]
    Data(String),
    #[error("data: {0}")]
    Corpus(#[from] crate::data::DataError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("building the model: {0}")]
    Build(#[from] sharding::ShardingError),
    #[error("differentiating the model: {0}")]
    Grad(#[from] autodiff::GradError),
    #[error("rematerialising the step: {0}")]
    Remat(#[from] autodiff::remat::RematError),
    #[error("building the optimizer's update: {0}")]
    Optimizer(#[from] crate::optim::OptimError),
    #[error("building the model: {0}")]
    Model(String),
    #[error("partitioning: {0}")]
    Partition(#[from] spmd::SpmdError),
    #[error("running a step: {0}")]
    Run(String),
    #[error("the checkpoint shared by rank 0: {0}")]
    Shared(#[source] runtime::IoError),
    #[error(transparent)]
    Plot(#[from] crate::plots::PlotError),
    #[error("running a step: {0}")]
    Exec(#[from] runtime::ExecError),
    #[error("between the devices: {0}")]
    Comm(#[from] runtime::CommError),
    #[error("encoding state: {0}")]
    Encode(#[from] runtime::IoError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("run directory {dir} is in use by another gshard process{}; wait for it to finish, or choose another --out", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Locked { dir: PathBuf, pid: Option<u32> },
    #[error("{dir} already holds a run{}; pass --resume to continue it, --overwrite to replace it, or choose another --out", step.map(|s| format!(" (checkpoint at step {s})")).unwrap_or_default())]
    RunExists { dir: PathBuf, step: Option<u64> },
    #[error("--resume: {dir} has no checkpoint (checkpoint/manifest.json or checkpoint.safetensors) to resume from; drop --resume to start a new run there")]
    NoCheckpoint { dir: PathBuf },
    #[error("--resume: the config differs from the run's own ({dir}/config.toml) in {}; only `steps`, `data.dir`, `mesh`, `model.remat`, `model.checkpoint` and `model.overlap` may change when resuming (drop --config to use the run's), or start a new run with another --out", fields.join(", "))]
    ConfigChanged { dir: PathBuf, fields: Vec<String> },
    #[error("step {step}: {what} is not finite{}; {skipped} step(s) in a row were not applied and no checkpoint of them was written (the last good one stays); lower the learning rate (optimizer.lr), enable clipping, or raise nonfinite_limit to skip more such steps", last_finite.map(|(s, l)| format!(" (last finite loss {l:.4} at step {s})")).unwrap_or_default())]
    NonFinite {
        step: u64,
        what: String,
        last_finite: Option<(u64, f64)>,
        skipped: u64,
    },
    #[error("interrupted by {} after step {step}: {}", signal_name(*signal), match checkpoint { Some(p) => format!("wrote {}; continue with `gshard train --out {} --resume`", p.display(), dir.display()), None => "no step had finished, nothing to save".to_string() })]
    Interrupted {
        signal: i32,
        step: u64,
        dir: PathBuf,
        checkpoint: Option<PathBuf>,
    },
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// The name of a stop signal.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        2 => "SIGINT",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

/// A request to stop a run cleanly, set from a signal handler (or a test): the loop finishes
/// the step in flight, writes a checkpoint and returns [`TrainError::Interrupted`].
#[derive(Clone, Debug, Default)]
pub struct StopRequest(Arc<AtomicUsize>);

impl StopRequest {
    pub fn new() -> StopRequest {
        StopRequest::default()
    }
    /// The flag a signal handler stores the signal's number into (0: none).
    pub fn flag(&self) -> Arc<AtomicUsize> {
        self.0.clone()
    }
    /// Ask the run to stop, as `signal` would.
    pub fn request(&self, signal: i32) {
        self.0.store(signal as usize, Ordering::SeqCst);
    }
    /// The signal that asked the run to stop, if any.
    pub fn requested(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the trainer reports as it goes.
pub enum Event<'a> {
    Status(&'a str),
    Started {
        total_steps: u64,
        first_step: u64,
    },
    Step {
        step: u64,
        loss: f64,
        tokens_per_s: f64,
        dropped: f64,
    },
    Eval {
        step: u64,
        dev_loss: f64,
    },
    /// A step whose loss or gradient norm was not finite: it was not applied.
    Skipped {
        step: u64,
        loss: f64,
        grad_norm: f64,
    },
}
