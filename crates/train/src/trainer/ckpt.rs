//! The trainer's state to and from checkpoints without gathering it: every local device
//! writes its own shards ([`Trainer::save_sharded`]) and reads only its own blocks back
//! ([`Trainer::from_source`]), on whatever mesh the run now has. Both are collective: every
//! process calls them, and a failure on one process is an error on all of them.

use super::programs::Programs;
use super::step::Trainer;
use super::TrainError;
use crate::checkpoint::{self, CheckpointError, CrashPoint, Manifest, SaveRequest, Source};
use crate::config::TrainConfig;
use rayon::prelude::*;
use runtime::{Communicator, HostTensor};
use spmd::IoLayout;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// `result` on every process: when any process failed, the others fail too (the failing
/// one keeps its own error).
pub(super) fn agree<T>(
    comm: &dyn Communicator,
    result: Result<T, TrainError>,
) -> Result<T, TrainError> {
    if comm.num_processes() == 1 {
        return result;
    }
    let all = comm.all_gather_bytes(vec![result.is_ok() as u8])?;
    match result {
        Err(e) => Err(e),
        Ok(_) if all.iter().any(|b| b.first() != Some(&1)) => {
            let p = all.iter().position(|b| b.first() != Some(&1)).unwrap_or(0);
            Err(TrainError::Run(format!(
                "process {p} failed (its error is on its own output); stopping this one too"
            )))
        }
        Ok(v) => Ok(v),
    }
}

/// The layouts of the state (parameters, optimizer state, buffers) in `programs`' step.
pub(super) fn state_layouts(programs: &Programs) -> Vec<IoLayout> {
    let names: std::collections::HashSet<&str> =
        programs.all_state().map(|s| s.name.as_str()).collect();
    programs
        .step
        .params
        .iter()
        .filter(|l| names.contains(l.name.as_str()))
        .cloned()
        .collect()
}

/// Where and how [`Trainer::save_sharded`] writes.
pub struct SaveOptions<'a> {
    /// The checkpoint directory.
    pub dir: &'a Path,
    /// The commit's generation (the previous one's plus one).
    pub generation: u64,
    /// The run's config (TOML).
    pub config: &'a str,
    /// Stop the save there (tests).
    pub crash_at: Option<CrashPoint>,
}

/// Whether every value of `t` is finite (read in place: no copy of a large tensor).
fn all_finite(t: &HostTensor) -> bool {
    use runtime::Data;
    match &t.data {
        Data::F32(v) => v.iter().all(|x| x.is_finite()),
        Data::F64(v) => v.iter().all(|x| x.is_finite()),
        Data::BF16(v) => v.iter().all(|x| x.is_finite()),
        Data::I32(_) | Data::Bool(_) => true,
    }
}

impl Trainer {
    /// The state of the checkpoint `src` on the devices of this process (its own blocks,
    /// read from the shards that hold them), at the checkpoint's step.
    pub fn from_source(
        cfg: &TrainConfig,
        programs: Programs,
        src: &Source,
        comm: Arc<dyn Communicator>,
    ) -> Result<Trainer, TrainError> {
        let layouts = state_layouts(&programs);
        let mesh = programs.step.program.mesh.clone().expect("partitioned");
        let positions = comm.local_positions();
        let read = || -> Result<Vec<HashMap<String, HostTensor>>, TrainError> {
            src.check_model(&programs.state_types())?;
            if let Some(&bad) = positions.iter().find(|&&p| p >= mesh.num_devices()) {
                return Err(TrainError::Run(format!(
                    "this process runs mesh position {bad}, but the mesh {mesh} has {} devices; launch as many MPI ranks as the mesh has devices",
                    mesh.num_devices()
                )));
            }
            let jobs: Vec<(usize, &IoLayout)> = (0..positions.len())
                .flat_map(|j| layouts.iter().map(move |l| (j, l)))
                .collect();
            let blocks: Vec<(usize, String, HostTensor)> = jobs
                .par_iter()
                .map(|&(j, l)| {
                    let block = driver::block(l, &mesh, positions[j]);
                    Ok((j, l.name.clone(), src.read_block(&l.name, &block)?))
                })
                .collect::<Result<_, CheckpointError>>()?;
            let mut state = vec![HashMap::new(); positions.len()];
            for (j, name, t) in blocks {
                state[j].insert(name, t);
            }
            Ok(state)
        };
        let state = agree(comm.as_ref(), read())?;
        let mut tr = Trainer::with_comm(cfg, programs, Some(HashMap::new()), src.step(), comm)?;
        tr.state = state;
        Ok(tr)
    }

    /// The state's layouts in the step program.
    pub fn state_layouts(&self) -> Vec<IoLayout> {
        state_layouts(&self.programs)
    }

    /// Save the state after step `self.step` as a sharded checkpoint: each local device
    /// writes its own file (collective). Returns the committed manifest.
    pub fn save_sharded(&self, opts: &SaveOptions) -> Result<Manifest, TrainError> {
        let layouts = self.state_layouts();
        let mesh = self.mesh();
        let req = SaveRequest {
            dir: opts.dir,
            step: self.step,
            generation: opts.generation,
            config: opts.config,
            mesh: &mesh,
            layouts: &layouts,
            crash_at: opts.crash_at,
        };
        let shard = |j: usize, l: &IoLayout| -> Result<Cow<'_, HostTensor>, CheckpointError> {
            self.state[j]
                .get(&l.name)
                .map(Cow::Borrowed)
                .ok_or_else(|| CheckpointError::Mismatch {
                    path: opts.dir.to_path_buf(),
                    reason: format!("the state has no tensor `{}`", l.name),
                })
        };
        Ok(checkpoint::save_sharded(&req, self.comm(), &shard)?)
    }

    /// The first state tensor (by name) holding a value that is not finite, on any process
    /// (collective).
    pub fn first_nonfinite(&self) -> Result<Option<String>, TrainError> {
        let mut names: Vec<&String> = self.state.iter().flat_map(|m| m.keys()).collect();
        names.sort();
        names.dedup();
        let mine = names
            .into_iter()
            .find(|n| {
                self.state
                    .iter()
                    .any(|m| m.get(n.as_str()).is_some_and(|t| !all_finite(t)))
            })
            .cloned();
        if self.comm().num_processes() == 1 {
            return Ok(mine);
        }
        let all = self
            .comm()
            .all_gather_bytes(mine.unwrap_or_default().into_bytes())?;
        let mut bad: Vec<String> = all
            .into_iter()
            .filter(|b| !b.is_empty())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect();
        bad.sort();
        Ok(bad.into_iter().next())
    }
}
