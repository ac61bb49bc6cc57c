//! [`Trainer`]: the state of a run on its devices and one training or evaluation step.
//! State stays on the devices between steps: every step's outputs `new/<x>` are the next
//! step's inputs `<x>` (same sharding), so only a batch is cut and fed per step.

use super::batches::{batch_tensors, splitmix, Example};
use super::incremental::Decoder;
use super::programs::{init_tensor, Programs};
use super::TrainError;
use crate::config::TrainConfig;
use crate::tokenizer::Tokenizer;
use ir::{DType, Type};
use runtime::comm::gather_positions;
use runtime::{Communicator, HostTensor, InProcess};
use spmd::Partitioned;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// A training run in memory: programs, device-resident state, the step counter.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub programs: Programs,
    comm: Arc<dyn Communicator>,
    /// Per local device (`comm.local_positions()`): its parameter and optimizer-state shards.
    pub(super) state: Vec<HashMap<String, HostTensor>>,
    pub step: u64,
    pub peak_bytes_per_device: usize,
    /// The step and eval programs prepared once (fusion plan, liveness, buffer pools kept
    /// across steps, so a step allocates nothing once warm).
    step_exe: OnceLock<runtime::Executable>,
    eval_exe: OnceLock<runtime::Executable>,
    /// The incremental decoding programs, built and prepared on first use.
    pub(super) decoder: OnceLock<Decoder>,
}

/// Per local device, its shards of a program's inputs (shared, not copied, by the runs).
pub(super) type DeviceInputs = Vec<HashMap<String, Arc<HostTensor>>>;

/// The executable of `p` in `cell`, prepared on first use with `opts`.
pub(super) fn prepared<'a>(
    cell: &'a OnceLock<runtime::Executable>,
    p: &ir::Program,
    opts: runtime::ExecOptions,
) -> Result<&'a runtime::Executable, TrainError> {
    if let Some(e) = cell.get() {
        return Ok(e);
    }
    let e = runtime::Executable::with_options(p, opts)?;
    Ok(cell.get_or_init(|| e))
}

impl Trainer {
    /// Fresh parameters (or the given global tensors) on the devices.
    pub fn new(
        cfg: &TrainConfig,
        programs: Programs,
        global: Option<HashMap<String, HostTensor>>,
        step: u64,
    ) -> Result<Trainer, TrainError> {
        let n = programs
            .step
            .program
            .mesh
            .as_ref()
            .map_or(1, |m| m.num_devices());
        let comm = InProcess::new(n).with_comm_thread(cfg.model.overlap > 1);
        Trainer::with_comm(cfg, programs, global, step, Arc::new(comm))
    }

    /// How the step and evaluation programs are prepared: with `model.overlap` chunks, the
    /// executor starts the MoE all-to-alls early and waits for them late (its `overlap`
    /// pass), so chunks overlap where the communicator can.
    pub fn exec_options(&self) -> runtime::ExecOptions {
        runtime::ExecOptions::native().with_overlap(self.cfg.model.overlap > 1)
    }

    /// [`Trainer::new`] on the local devices of `comm` (e.g. one MPI rank's).
    pub fn with_comm(
        cfg: &TrainConfig,
        programs: Programs,
        global: Option<HashMap<String, HostTensor>>,
        step: u64,
        comm: Arc<dyn Communicator>,
    ) -> Result<Trainer, TrainError> {
        let global = match global {
            Some(g) => g,
            None => programs
                .all_state()
                .enumerate()
                .map(|(i, s)| (s.name.clone(), init_tensor(s, cfg.seed, 1000 + i as u64)))
                .collect(),
        };
        let mesh = programs.step.program.mesh.clone().expect("partitioned");
        let positions = comm.local_positions();
        if let Some(&bad) = positions.iter().find(|&&p| p >= mesh.num_devices()) {
            return Err(TrainError::Run(format!(
                "this process runs mesh position {bad}, but the mesh {mesh} has {} devices; launch as many MPI ranks as the mesh has devices",
                mesh.num_devices()
            )));
        }
        let mut state = vec![HashMap::new(); positions.len()];
        for l in &programs.step.params {
            if let Some(t) = global.get(&l.name) {
                for (&pos, m) in positions.iter().zip(state.iter_mut()) {
                    m.insert(l.name.clone(), t.block(&driver::block(l, &mesh, pos)));
                }
            }
        }
        Ok(Trainer {
            cfg: cfg.clone(),
            comm,
            programs,
            state,
            step,
            peak_bytes_per_device: 0,
            step_exe: OnceLock::new(),
            eval_exe: OnceLock::new(),
            decoder: OnceLock::new(),
        })
    }

    pub fn mesh(&self) -> ir::Mesh {
        self.programs
            .step
            .program
            .mesh
            .clone()
            .expect("partitioned")
    }

    /// Per-device inputs: state shards plus the shards of `batch`.
    fn inputs(
        &self,
        part: &Partitioned,
        batch: &HashMap<String, HostTensor>,
    ) -> Vec<HashMap<String, HostTensor>> {
        let mesh = self.mesh();
        let mut per = self.state.clone();
        let positions = self.comm.local_positions();
        for l in &part.params {
            if let Some(t) = batch.get(&l.name) {
                for (&pos, m) in positions.iter().zip(per.iter_mut()) {
                    m.insert(l.name.clone(), t.block(&driver::block(l, &mesh, pos)));
                }
            }
        }
        per
    }

    /// The step's per-device memory planned by the executor's buffer planning: its peak is
    /// the one a step measures ([`Trainer::peak_bytes_per_device`]), with what it holds.
    pub fn planned_memory(&self) -> Result<crate::memory::PlannedMemory, TrainError> {
        let exe = prepared(
            &self.step_exe,
            &self.programs.step.program,
            self.exec_options(),
        )?;
        let opts = runtime::MemoryOptions {
            shared_memory: self.comm.shared_memory(),
        };
        Ok(crate::memory::plan_of(exe, opts))
    }

    /// Run one optimizer step on `batch`; returns the step's scalar outputs (device 0).
    pub fn train_step(
        &mut self,
        batch: &HashMap<String, HostTensor>,
    ) -> Result<HashMap<String, HostTensor>, TrainError> {
        self.train_step_profiled(batch, None)
    }

    /// [`Trainer::train_step`] recording per-op and per-collective timings into `profiler`.
    pub fn train_step_profiled(
        &mut self,
        batch: &HashMap<String, HostTensor>,
        profiler: Option<&runtime::Profiler>,
    ) -> Result<HashMap<String, HostTensor>, TrainError> {
        let mut batch = batch.clone();
        let seed = (splitmix(self.cfg.seed.wrapping_mul(0x9E37) ^ self.step) & 0x7fff_ffff) as f64;
        batch.insert(
            "seed".into(),
            HostTensor::from_f64_values(Type::scalar(DType::I32), &[seed]),
        );
        let exe = prepared(
            &self.step_exe,
            &self.programs.step.program,
            self.exec_options(),
        )?;
        // The state moves into the run (shared, not copied) and back out of it; the batch
        // shards join it for the run only.
        let mesh = self.mesh();
        let positions = self.comm.local_positions();
        let mut shared: Vec<HashMap<String, Arc<HostTensor>>> = std::mem::take(&mut self.state)
            .into_iter()
            .map(|m| m.into_iter().map(|(k, t)| (k, Arc::new(t))).collect())
            .collect();
        let mut fed = Vec::new();
        for l in &self.programs.step.params {
            if let Some(t) = batch.get(&l.name) {
                fed.push(l.name.clone());
                for (&pos, m) in positions.iter().zip(shared.iter_mut()) {
                    let b = t.block(&driver::block(l, &mesh, pos));
                    m.insert(l.name.clone(), Arc::new(b));
                }
            }
        }
        let r = exe.run_shared(self.comm.as_ref(), &shared, profiler);
        // Back to owned tensors (the run kept no reference); batch shards are spare buffers.
        let mut spare: Vec<HashMap<String, HostTensor>> = Vec::with_capacity(shared.len());
        for m in shared {
            let mut own: HashMap<String, HostTensor> = m
                .into_iter()
                .map(|(k, a)| (k, Arc::try_unwrap(a).unwrap_or_else(|a| (*a).clone())))
                .collect();
            spare.push(
                fed.iter()
                    .filter_map(|n| own.remove_entry(n.as_str()))
                    .collect(),
            );
            self.state.push(own);
        }
        let r = r?;
        self.peak_bytes_per_device = self.peak_bytes_per_device.max(r.peak_bytes_per_device);
        let mut scalars = HashMap::new();
        for (j, outs) in r.outputs.into_iter().enumerate() {
            for (name, t) in outs {
                if let Some(x) = name.strip_prefix("new/") {
                    // The replaced tensor's buffer goes back to the device's pool.
                    if let Some(old) = self.state[j].insert(x.to_string(), t) {
                        spare[j].insert(name, old);
                    }
                } else if j == 0 {
                    scalars.insert(name, t);
                }
            }
        }
        exe.recycle(spare);
        self.step += 1;
        Ok(scalars)
    }

    /// The global parameter and optimizer-state tensors (for checkpoints). Collective: every
    /// process calls it, and every process gets them.
    pub fn global_state(&self) -> Result<HashMap<String, HostTensor>, TrainError> {
        let mesh = self.mesh();
        let all = gather_positions(self.comm.as_ref(), &self.state, mesh.num_devices())?;
        Ok(self
            .programs
            .step
            .params
            .iter()
            .filter(|l| all[0].contains_key(&l.name))
            .map(|l| {
                let shards: Vec<&HostTensor> = all.iter().map(|m| &m[&l.name]).collect();
                (l.name.clone(), driver::assemble(l, &mesh, &shards))
            })
            .collect())
    }

    /// The communicator the devices run behind.
    pub fn comm(&self) -> &dyn Communicator {
        self.comm.as_ref()
    }

    /// Whether this process writes the run's files (process 0).
    pub fn is_root(&self) -> bool {
        self.comm.process_index() == 0
    }

    /// This process's devices' shards of the parameters `part` reads (for a program other
    /// than the step's, e.g. decoding's). A parameter that `part` lays out differently from
    /// the step program is cut again from the gathered global tensor (collective: every
    /// process takes the same branch, since the programs are the same).
    pub(super) fn params_for(&self, part: &Partitioned) -> Result<DeviceInputs, TrainError> {
        let mesh = self.mesh();
        let is_param = |name: &str| {
            self.programs.params.iter().any(|s| s.name == name)
                || self.programs.buffers.iter().any(|s| s.name == name)
        };
        let moved = part.params.iter().any(|l| {
            is_param(&l.name)
                && !self
                    .programs
                    .step
                    .params
                    .iter()
                    .any(|s| s.name == l.name && s.sharding == l.sharding)
        });
        let global = if moved {
            Some(self.global_state()?)
        } else {
            None
        };
        let positions = self.comm.local_positions();
        let mut out: DeviceInputs = vec![HashMap::new(); positions.len()];
        for l in part.params.iter().filter(|l| is_param(&l.name)) {
            for (j, (&pos, m)) in positions.iter().zip(out.iter_mut()).enumerate() {
                let t = match &global {
                    Some(g) => g
                        .get(&l.name)
                        .map(|t| t.block(&driver::block(l, &mesh, pos))),
                    None => self.state[j].get(&l.name).cloned(),
                };
                let t = t.ok_or_else(|| {
                    TrainError::Run(format!("the model has no parameter `{}`", l.name))
                })?;
                m.insert(l.name.clone(), Arc::new(t));
            }
        }
        Ok(out)
    }

    /// `part`'s input shards of the global tensors in `inputs` added to `base` (per local
    /// device).
    pub(super) fn with_inputs(
        &self,
        part: &Partitioned,
        base: &[HashMap<String, Arc<HostTensor>>],
        inputs: &HashMap<String, HostTensor>,
    ) -> DeviceInputs {
        let mesh = self.mesh();
        let positions = self.comm.local_positions();
        let mut per = base.to_vec();
        for l in &part.params {
            if let Some(t) = inputs.get(&l.name) {
                for (&pos, m) in positions.iter().zip(per.iter_mut()) {
                    m.insert(
                        l.name.clone(),
                        Arc::new(t.block(&driver::block(l, &mesh, pos))),
                    );
                }
            }
        }
        per
    }

    /// Run `exe` (prepared from `part`) on `base` (per local device, e.g. from
    /// [`Trainer::params_for`]) plus the shards of the global `inputs`: `part`'s global
    /// outputs, on every process.
    pub(super) fn run_global(
        &self,
        part: &Partitioned,
        exe: &runtime::Executable,
        base: &[HashMap<String, Arc<HostTensor>>],
        inputs: &HashMap<String, HostTensor>,
    ) -> Result<HashMap<String, HostTensor>, TrainError> {
        let per = self.with_inputs(part, base, inputs);
        let r = exe.run_shared(self.comm.as_ref(), &per, None)?;
        let all = gather_positions(self.comm.as_ref(), &r.outputs, self.mesh().num_devices())?;
        Ok(driver::assemble_outputs(part, &all))
    }

    /// Run the evaluation program on `batch`: (mean cross-entropy, logits).
    pub fn evaluate(
        &self,
        batch: &HashMap<String, HostTensor>,
    ) -> Result<(f64, HostTensor), TrainError> {
        let part = &self.programs.eval;
        // One copy of the state, shared with the run (`run` would copy it again).
        let inputs: Vec<HashMap<String, Arc<HostTensor>>> = self
            .inputs(part, batch)
            .into_iter()
            .map(|m| m.into_iter().map(|(k, t)| (k, Arc::new(t))).collect())
            .collect();
        let r = prepared(&self.eval_exe, &part.program, self.exec_options())?.run_shared(
            self.comm.as_ref(),
            &inputs,
            None,
        )?;
        let n = self.mesh().num_devices();
        let all = gather_positions(self.comm.as_ref(), &r.outputs, n)?;
        let outs = driver::assemble_outputs(part, &all);
        Ok((outs["ce"].to_f64_vec()[0], outs["logits"].clone()))
    }
}

/// Mean dev cross-entropy (token-weighted over batches).
pub fn dev_loss(tr: &Trainer, tok: &Tokenizer, dev: &[Example]) -> Result<f64, TrainError> {
    let b = tr.cfg.data.batch_size;
    let (mut sum, mut n) = (0.0, 0.0);
    for chunk in dev.chunks(b) {
        let rows: Vec<Option<&Example>> = (0..b).map(|i| chunk.get(i)).collect();
        let batch = batch_tensors(&tr.cfg, tok, &rows);
        let w: f64 = batch["tgt_weight"].to_f64_vec().iter().sum();
        let (ce, _) = tr.evaluate(&batch)?;
        sum += ce * w;
        n += w;
    }
    Ok(if n > 0.0 { sum / n } else { f64::NAN })
}
