//! The run loop: train (or resume) a run in its directory, with metrics, checkpoints,
//! evaluation, decoding and BLEU, and the [`Report`] it ends with.

use super::batches::{
    batch_at, batch_tensors, langs_by_size, packed_batch_at, packed_tensors, prepare_data,
    real_tokens, select_langs, tokenizer_for,
};
use super::decode::{translate, DecodeOptions};
use super::programs::build_programs;
use super::programs::Programs;
use super::rundir::{RunDir, RunLock};
use super::step::{dev_loss, Trainer};
use super::{io, Event, StopRequest, TrainError};
use crate::checkpoint;
use crate::config::{Packing, TrainConfig};
use crate::data::Corpus;
use crate::metrics::MetricsLog;
use crate::tokenizer::Tokenizer;
use runtime::{Communicator, HostTensor, InProcess};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// A Chrome trace (Perfetto) of `steps` steps, after one warm-up step, written to `path` by
/// process 0 (every process's devices are in it).
#[derive(Clone, Debug)]
pub struct ProfileRequest {
    pub path: PathBuf,
    pub steps: u64,
}

/// Options of [`run`] that are not part of the config.
pub struct RunOptions {
    pub out: PathBuf,
    /// Continue the run in `out` from its checkpoint (an error if it has none).
    pub resume: bool,
    /// Replace the run `out` holds (without it, a directory holding a run is refused).
    pub overwrite: bool,
    /// Stop after this step (a simulated crash in tests); `None` runs to the end.
    pub stop_after: Option<u64>,
    /// Where the devices run; `None`: all of them in this process.
    pub comm: Option<Arc<dyn Communicator>>,
    /// Write a Chrome trace (Perfetto) of some steps; `None`: no trace.
    pub profile: Option<ProfileRequest>,
    /// Set (by a signal handler) to stop cleanly after the step in flight.
    pub stop: Option<StopRequest>,
    /// The memory this process may use; `None`: what the host has available.
    pub max_memory: Option<u64>,
    /// Stop the checkpoint save after step `.0` at point `.1`, as a process killed there
    /// would (tests); the run returns the error.
    pub crash_save: Option<(u64, checkpoint::CrashPoint)>,
}

impl RunOptions {
    /// A new run in `out`, everything else off.
    pub fn new(out: impl Into<PathBuf>) -> RunOptions {
        RunOptions {
            out: out.into(),
            resume: false,
            overwrite: false,
            stop_after: None,
            comm: None,
            profile: None,
            stop: None,
            max_memory: None,
            crash_save: None,
        }
    }
}

/// Process 0's bytes on every process (`make` runs on process 0 only). When `make` fails,
/// the others get an error too instead of waiting for bytes that never come.
fn share(
    comm: &dyn Communicator,
    make: impl FnOnce() -> Result<Vec<u8>, TrainError>,
) -> Result<Vec<u8>, TrainError> {
    if comm.num_processes() == 1 {
        return make();
    }
    let (mine, failed) = if comm.process_index() == 0 {
        match make() {
            Ok(mut b) => {
                b.insert(0, 1);
                (b, None)
            }
            Err(e) => (vec![0], Some(e)),
        }
    } else {
        (Vec::new(), None)
    };
    let mut all = comm.all_gather_bytes(mine)?;
    if let Some(e) = failed {
        return Err(e);
    }
    let mut bytes = all.swap_remove(0);
    if bytes.first() != Some(&1) {
        return Err(TrainError::Run(
            "process 0 failed (its error is above); stopping this one too".into(),
        ));
    }
    bytes.remove(0);
    Ok(bytes)
}

/// What a finished run reports.
pub struct Report {
    pub steps: u64,
    pub final_loss: f64,
    pub dev_loss: f64,
    /// BLEU, chrF and their split by language of the dev set's greedy (or beam) decoding.
    pub scores: Option<crate::scores::Scores>,
    pub tokens_per_s: f64,
    pub partition_seconds: f64,
    pub peak_bytes_per_device: usize,
    /// The step's planned per-device memory (its peak is the measured one) and what it holds.
    pub memory: crate::memory::PlannedMemory,
    /// Per MoE layer, at the last step.
    pub expert_load: Vec<ExpertLoad>,
    /// The first dev sentences with their reference and the model's translation.
    pub examples: Vec<Sample>,
    pub langs: Vec<String>,
    pub devices: usize,
}

/// How one MoE layer spread its tokens.
pub struct ExpertLoad {
    /// The layer (`encoder/layer1/moe`).
    pub layer: String,
    /// Per expert, its share of the first choices.
    pub share: Vec<f64>,
    /// Shares of first and second choices dropped for lack of capacity.
    pub dropped_first: f64,
    pub dropped_second: f64,
}

/// One translated dev sentence.
pub struct Sample {
    pub lang: String,
    pub source: String,
    pub reference: String,
    pub hypothesis: String,
}

/// Config fields that may differ between a run and its resumption: how long it runs, where
/// the corpus lives, the mesh and the weight sharding (a checkpoint loads on any mesh) and
/// what the step recomputes (rematerialisation and the checkpoint regions it recomputes
/// change no value).
const MAY_CHANGE_ON_RESUME: [&str; 9] = [
    "steps",
    "data.dir",
    "mesh.data",
    "mesh.expert",
    "mesh.model",
    "mesh.shard_weights",
    "model.remat",
    "model.checkpoint",
    "model.overlap",
];

/// The dotted names of the fields in which two configs differ.
pub fn config_diff(a: &TrainConfig, b: &TrainConfig) -> Vec<String> {
    fn walk(prefix: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y))
                if x.get("kind") == y.get("kind") =>
            {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let name = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    let null = serde_json::Value::Null;
                    walk(
                        &name,
                        x.get(k).unwrap_or(&null),
                        y.get(k).unwrap_or(&null),
                        out,
                    );
                }
            }
            _ if a != b => out.push(prefix.to_string()),
            _ => {}
        }
    }
    let (a, b) = (
        serde_json::to_value(a).expect("configs serialise"),
        serde_json::to_value(b).expect("configs serialise"),
    );
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out
}

/// Process 0's preparation of the run directory (lock held): is this a resumption, and may
/// it write here? Returns the lock, to hold for the whole run.
fn prepare_dir(
    rd: &RunDir,
    cfg: &TrainConfig,
    opts: &RunOptions,
    on: &mut dyn FnMut(Event),
) -> Result<RunLock, TrainError> {
    std::fs::create_dir_all(&rd.dir).map_err(io(&rd.dir))?;
    let lock = rd.lock()?;
    if let Some(pid) = lock.stale_pid {
        on(Event::Status(&format!(
            "the lock of {} was left by process {pid}, which ended without releasing it; taken over",
            rd.dir.display()
        )));
    }
    let removed = rd.remove_stale_temporaries()?;
    if removed > 0 {
        on(Event::Status(&format!(
            "removed {removed} half-written checkpoint file(s) left by a killed run"
        )));
    }
    if opts.resume {
        if !rd.has_checkpoint() {
            return Err(TrainError::NoCheckpoint {
                dir: rd.dir.clone(),
            });
        }
        let open = || {
            rd.open_checkpoint()?
                .ok_or_else(|| TrainError::NoCheckpoint {
                    dir: rd.dir.clone(),
                })
        };
        let theirs = match std::fs::read_to_string(rd.config()) {
            Ok(text) => TrainConfig::from_run_toml(&text, &rd.config().display().to_string())?,
            Err(_) => {
                let src = open()?;
                TrainConfig::from_run_toml(src.config(), &src.path().display().to_string())?
            }
        };
        let fields: Vec<String> = config_diff(&theirs, cfg)
            .into_iter()
            .filter(|f| !MAY_CHANGE_ON_RESUME.contains(&f.as_str()))
            .collect();
        if !fields.is_empty() {
            return Err(TrainError::ConfigChanged {
                dir: rd.dir.clone(),
                fields,
            });
        }
        if let Some(first) = cooldown_moved_from(&theirs, cfg) {
            let done = open()?.step();
            if done >= first {
                on(Event::Status(&format!(
                    "note: steps = {} instead of {} moves the learning rate's cool-down \
                     (optimizer.lr.cooldown) to the new end, and {done} steps have run, some \
                     of them (from step {first}) below the full rate: from here on the rate \
                     is the {}-step schedule's, not the uninterrupted run's",
                    cfg.steps, theirs.steps, cfg.steps
                )));
            }
        }
    } else if rd.holds_run() {
        if !opts.overwrite {
            let step = rd.open_checkpoint().ok().flatten().map(|c| c.step());
            return Err(TrainError::RunExists {
                dir: rd.dir.clone(),
                step,
            });
        }
        rd.clear()?;
    }
    Ok(lock)
}

/// A run whose learning rate cools down over its last steps, resumed with another `steps`:
/// the cool-down moves to the new end. The first step whose rate differs between the two
/// lengths (the first either runs below the full rate); the resumed run is the
/// uninterrupted run of the new length while the steps taken so far are before it. `None`:
/// the same length, or no cool-down.
fn cooldown_moved_from(theirs: &TrainConfig, cfg: &TrainConfig) -> Option<u64> {
    if theirs.steps == cfg.steps {
        return None;
    }
    let lr = cfg.optimizer.lr();
    Some(
        lr.first_cooled_step(theirs.steps)?
            .min(lr.first_cooled_step(cfg.steps)?),
    )
}

/// Refuse a run that cannot fit: the global state held on the host while it is sharded,
/// plus every local device's planned peak (the larger of the step's and eval's).
fn check_memory(
    cfg: &TrainConfig,
    programs: &Programs,
    local_devices: usize,
    max: Option<u64>,
) -> Result<(), TrainError> {
    let specs = || programs.all_state();
    let state: u64 = specs().map(|s| s.ty.size_bytes() as u64).sum();
    // The largest tensor is first made in f64 (`init_tensor`), twice its f32 size.
    let init_temp: u64 = specs()
        .map(|s| 2 * s.ty.size_bytes() as u64)
        .max()
        .unwrap_or(0);
    let per_device = crate::memory::program_peak(&programs.step.program)
        .max(crate::memory::program_peak(&programs.eval.program));
    let devices = per_device.saturating_mul(local_devices as u64);
    let need = state.saturating_add(init_temp).saturating_add(devices);
    crate::memory::check(
        &format!(
            "training (model_dim {}, vocabulary {}, {} device(s) here)",
            cfg.model.model_dim, cfg.data.vocab_size, local_devices
        ),
        need,
        format!(
            "{} of parameters and optimizer state, {} per device at its peak",
            crate::memory::human(state),
            crate::memory::human(per_device)
        ),
        max,
        || crate::memory::biggest(specs().map(|s| (s.name.as_str(), &s.ty)), 3),
    )?;
    Ok(())
}

/// The scalar output `name` of a step (NaN if absent).
fn scalar(out: &HashMap<String, HostTensor>, name: &str) -> f64 {
    out.get(name).map(|t| t.to_f64_vec()[0]).unwrap_or(f64::NAN)
}

/// Writes the run's checkpoints: the sharded directory, each commit one generation on.
struct Saver<'a> {
    rd: &'a RunDir,
    config: String,
    generation: u64,
    crash: Option<(u64, checkpoint::CrashPoint)>,
}

impl Saver<'_> {
    /// Write the state after step `done` as the run's checkpoint, unless any of it is not
    /// finite (collective: every process writes its own devices' shards).
    fn save(
        &mut self,
        tr: &Trainer,
        done: u64,
        last_finite: Option<(u64, f64)>,
    ) -> Result<(), TrainError> {
        if let Some(bad) = tr.first_nonfinite()? {
            return Err(TrainError::NonFinite {
                step: done,
                what: format!("the state `{bad}` after this step"),
                last_finite,
                skipped: 0,
            });
        }
        let dir = self.rd.checkpoint_dir();
        let opts = super::SaveOptions {
            dir: &dir,
            generation: self.generation + 1,
            config: &self.config,
            crash_at: self.crash.filter(|c| c.0 == done).map(|c| c.1),
        };
        tr.save_sharded(&opts)?;
        self.generation += 1;
        // The single file of a run resumed from it is replaced by the committed directory.
        let single = self.rd.checkpoint();
        if tr.is_root() && single.exists() {
            std::fs::remove_file(&single).map_err(io(&single))?;
        }
        Ok(())
    }
}

/// Train (or resume) a run in `opts.out` on `corpus`.
pub fn run(
    cfg: &TrainConfig,
    corpus: &Corpus,
    opts: &RunOptions,
    on: &mut dyn FnMut(Event),
) -> Result<Report, TrainError> {
    cfg.validate()?;
    let comm: Arc<dyn Communicator> = match &opts.comm {
        Some(c) => c.clone(),
        None => {
            crate::memory::check_in_process_devices(
                cfg.devices(),
                &format!("mesh {}", cfg.mesh.describe()),
            )
            .map_err(|m| TrainError::Config(crate::config::ConfigError::Invalid(m)))?;
            Arc::new(InProcess::new(cfg.devices()).with_comm_thread(cfg.model.overlap > 1))
        }
    };
    let root = comm.process_index() == 0;
    let rd = RunDir::new(opts.out.clone());
    // Whether to stop after this step; every process must agree (a signal may reach the MPI
    // ranks between two steps), so with several processes they share what they saw.
    let stopped = || -> Result<Option<i32>, TrainError> {
        let mine = opts.stop.as_ref().and_then(StopRequest::requested);
        if comm.num_processes() == 1 {
            return Ok(mine);
        }
        let all = comm.all_gather_bytes(mine.unwrap_or(0).to_le_bytes().to_vec())?;
        Ok(all
            .iter()
            .filter_map(|b| Some(i32::from_le_bytes(b.as_slice().try_into().ok()?)))
            .find(|&s| s != 0))
    };
    // Process 0 prepares the directory (holding its lock until the run ends) and decides
    // whether this is a resumption.
    let mut lock = None;
    let resume = share(comm.as_ref(), || {
        lock = Some(prepare_dir(&rd, cfg, opts, on)?);
        Ok(vec![opts.resume as u8])
    })?
    .first()
        == Some(&1);
    let _lock = lock;
    let interrupted =
        |signal: i32, step: u64, checkpoint: Option<PathBuf>| TrainError::Interrupted {
            signal,
            step,
            dir: rd.dir.clone(),
            checkpoint,
        };
    if !resume {
        on(Event::Status("training the tokenizer"));
    }
    // Process 0 loads or trains the tokenizer; with several processes it shares it as JSON.
    let make_tok = || -> Result<Tokenizer, TrainError> {
        if resume {
            Ok(Tokenizer::load(rd.tokenizer())?)
        } else {
            let (_, tok) = tokenizer_for(cfg, corpus)?;
            tok.save(rd.tokenizer())?;
            Ok(tok)
        }
    };
    let tok = if comm.num_processes() == 1 {
        make_tok()?
    } else {
        let json = share(comm.as_ref(), || Ok(make_tok()?.to_json()?.into_bytes()))?;
        Tokenizer::from_json(&String::from_utf8_lossy(&json))?
    };
    // The languages in the corpus's order (largest first), also on resume: the sampler and
    // the dev set depend on it, and the tokenizer keeps them sorted. A resumed `langs = []`
    // run takes its tokenizer's: the rule that chose them may have changed since.
    let langs = if resume && cfg.data.langs.is_empty() {
        langs_by_size(corpus, tok.langs())
    } else {
        select_langs(cfg, corpus)?
    };
    let mut sorted = langs.clone();
    sorted.sort();
    let mut known = tok.langs().to_vec();
    known.sort();
    if sorted != known {
        return Err(TrainError::Data(format!(
            "the run's tokenizer ({}) covers the languages {known:?} but this config and corpus give {sorted:?}; resume with the corpus and data.langs the run was started with",
            rd.tokenizer().display()
        )));
    }
    if root {
        std::fs::write(rd.config(), cfg.to_toml()).map_err(io(&rd.config()))?;
    }
    on(Event::Status("tokenizing"));
    let data = prepare_data(cfg, corpus, &langs, &tok)?;
    on(Event::Status(
        "building, differentiating and partitioning the training step",
    ));
    let programs = build_programs(cfg, tok.vocab_size())?;
    check_memory(
        cfg,
        &programs,
        comm.local_positions().len(),
        opts.max_memory,
    )?;
    let partition_seconds = programs.partition_seconds;
    // Every process opens the checkpoint and reads its own devices' blocks.
    let mut saver = Saver {
        rd: &rd,
        config: cfg.to_toml(),
        generation: 0,
        crash: opts.crash_save,
    };
    let mut tr = if resume {
        let src = super::ckpt::agree(
            comm.as_ref(),
            rd.open_checkpoint().and_then(|src| {
                src.ok_or_else(|| TrainError::NoCheckpoint {
                    dir: rd.dir.clone(),
                })
            }),
        )?;
        saver.generation = src.generation();
        Trainer::from_source(cfg, programs, &src, comm.clone())?
    } else {
        Trainer::with_comm(cfg, programs, None, 0, comm.clone())?
    };
    let first = tr.step;
    if let Some(signal) = stopped()? {
        return Err(interrupted(signal, first, None));
    }
    let mut log = if root {
        Some(MetricsLog::open(&rd.metrics(), resume.then_some(first)).map_err(io(&rd.metrics()))?)
    } else {
        None
    };
    on(Event::Started {
        total_steps: cfg.steps,
        first_step: first,
    });
    let profiler = opts.profile.as_ref().map(|_| runtime::Profiler::new());
    let mut last_loss = f64::NAN;
    let mut last_finite: Option<(u64, f64)> = None;
    let mut nonfinite_in_a_row = 0u64;
    let mut tok_rate = 0.0;
    let mut loads: Vec<Vec<f64>> = vec![Vec::new(); tr.programs.moe_layers.len()];
    let mut drops: Vec<(f64, f64)> = vec![(0.0, 0.0); tr.programs.moe_layers.len()];
    while tr.step < cfg.steps {
        let step = tr.step;
        let batch = match cfg.data.packing {
            Packing::Packed => packed_tensors(cfg, &tok, &packed_batch_at(cfg, &data, step)),
            Packing::Padded => batch_tensors(cfg, &tok, &batch_at(cfg, &data, step)),
        };
        let tokens = real_tokens(&batch);
        // Step `first + 1` warms the caches and pools; the next `count` are traced.
        let profiling = opts
            .profile
            .as_ref()
            .is_some_and(|r| step > first && step <= first + r.steps);
        let t0 = Instant::now();
        let out = tr.train_step_profiled(&batch, profiler.as_ref().filter(|_| profiling))?;
        let dt = t0.elapsed().as_secs_f64();
        let rate = tokens / dt.max(1e-9);
        tok_rate = if step == first {
            rate
        } else {
            0.9 * tok_rate + 0.1 * rate
        };
        let s = |n: &str| scalar(&out, n);
        let done = tr.step;
        let applied = s(super::APPLIED) != 0.0;
        let loss = s("ce");
        if !applied {
            nonfinite_in_a_row += 1;
            on(Event::Skipped {
                step: done,
                loss: s("loss"),
                grad_norm: s(super::GRAD_NORM),
            });
            if let Some(log) = &mut log {
                let rec = json!({"step": done, "loss": s("loss"), "grad_norm": s(super::GRAD_NORM), "applied": false});
                log.write(&rec).map_err(io(log.path()))?;
            }
            if nonfinite_in_a_row >= cfg.nonfinite_limit {
                let what = if s("loss").is_finite() {
                    "the gradient norm"
                } else {
                    "the loss"
                };
                return Err(TrainError::NonFinite {
                    step: done,
                    what: what.to_string(),
                    last_finite,
                    skipped: nonfinite_in_a_row,
                });
            }
            if let Some(signal) = stopped()? {
                saver.save(&tr, done, last_finite)?;
                return Err(interrupted(signal, done, Some(rd.checkpoint_dir())));
            }
            continue;
        }
        nonfinite_in_a_row = 0;
        last_loss = loss;
        last_finite = Some((done, loss));
        let nl = loads.len();
        let (mut d1, mut d2) = (0.0, 0.0);
        for (i, l) in loads.iter_mut().enumerate() {
            *l = out[&format!("moe{i}/load")].to_f64_vec();
            drops[i] = (
                s(&format!("moe{i}/dropped_1")),
                s(&format!("moe{i}/dropped_2")),
            );
            d1 += drops[i].0 / nl as f64;
            d2 += drops[i].1 / nl as f64;
        }
        on(Event::Step {
            step: done,
            loss: last_loss,
            tokens_per_s: tok_rate,
            dropped: d1,
        });
        if done % cfg.log_every.max(1) == 0 || done == cfg.steps {
            let mut rec = json!({
                "step": done, "loss": s("loss"), "ce": last_loss, "lr": s("lr"),
                "grad_norm": s(super::GRAD_NORM),
                "tokens_per_s": rate, "step_seconds": dt,
            });
            if nl > 0 {
                rec["dropped_1"] = json!(d1);
                rec["dropped_2"] = json!(d2);
                rec["aux"] = json!((0..nl).map(|i| s(&format!("moe{i}/aux"))).sum::<f64>());
                rec["load"] = json!(loads);
                rec["dropped_layers"] = json!(drops.iter().map(|d| [d.0, d.1]).collect::<Vec<_>>());
            }
            if cfg.eval_every > 0 && done % cfg.eval_every == 0 && done < cfg.steps {
                let dl = dev_loss(&tr, &tok, &data.dev)?;
                rec["dev_loss"] = json!(dl);
                on(Event::Eval {
                    step: done,
                    dev_loss: dl,
                });
            }
            if let Some(log) = &mut log {
                log.write(&rec).map_err(io(log.path()))?;
            }
        }
        let signal = stopped()?;
        if (cfg.checkpoint_every > 0 && done % cfg.checkpoint_every == 0)
            || done == cfg.steps
            || signal.is_some()
        {
            saver.save(&tr, done, last_finite)?;
        }
        if let Some(signal) = signal {
            return Err(interrupted(signal, done, Some(rd.checkpoint_dir())));
        }
        if opts.stop_after.is_some_and(|s| done >= s) {
            break;
        }
    }
    if let (Some(prof), Some(ProfileRequest { path, .. })) = (&profiler, &opts.profile) {
        let traces = comm.all_gather_bytes(prof.chrome_trace().into_bytes())?;
        if root {
            let texts: Vec<String> = traces
                .iter()
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let merged = runtime::merge_chrome_traces(&refs)
                .ok_or_else(|| TrainError::Run("a process's trace is malformed".into()))?;
            std::fs::write(path, merged).map_err(io(path))?;
        }
    }
    if let Some(signal) = stopped()? {
        // The last step's checkpoint is written; the evaluation is what is skipped.
        return Err(interrupted(signal, tr.step, Some(rd.checkpoint_dir())));
    }
    on(Event::Status("evaluating: dev loss and BLEU"));
    let dl = dev_loss(&tr, &tok, &data.dev)?;
    if let Some(log) = &mut log {
        log.write(&json!({"step": tr.step, "loss": last_loss, "dev_loss": dl}))
            .map_err(io(log.path()))?;
    }
    let srcs: Vec<Vec<u32>> = data.dev.iter().map(|e| e.src.clone()).collect();
    let opts = DecodeOptions::new(cfg.eval.beam, cfg.eval.length_penalty);
    let hyps_ids = translate(&tr, &tok, &srcs, &opts)?;
    let hyps: Vec<String> = hyps_ids.iter().map(|h| tok.decode(h)).collect();
    let refs: Vec<&str> = data.dev.iter().map(|e| e.english.as_str()).collect();
    let hyp_refs: Vec<&str> = hyps.iter().map(String::as_str).collect();
    let langs: Vec<&str> = data.dev.iter().map(|e| e.lang.as_str()).collect();
    let scores = crate::scores::score(&langs, &hyp_refs, &refs).ok();
    if let (Some(log), Some(s)) = (&mut log, &scores) {
        log.write(
            &json!({"step": tr.step, "bleu": s.bleu.score, "chrf": s.chrf, "distinct": s.distinct}),
        )
        .map_err(io(log.path()))?;
    }
    if root {
        std::fs::write(rd.dir.join("dev.hyp"), hyps.join("\n") + "\n").map_err(io(&rd.dir))?;
        std::fs::write(rd.dir.join("dev.ref"), refs.join("\n") + "\n").map_err(io(&rd.dir))?;
    }
    let examples = data
        .dev
        .iter()
        .zip(&hyps)
        .take(4)
        .map(|(e, h)| Sample {
            lang: e.lang.clone(),
            source: tok.decode(&e.src),
            reference: e.english.clone(),
            hypothesis: h.clone(),
        })
        .collect();
    if root {
        plots(&rd, &tr.programs)?;
    }
    let expert_load = tr
        .programs
        .moe_layers
        .iter()
        .cloned()
        .zip(loads)
        .zip(drops)
        .map(|((layer, share), (d1, d2))| ExpertLoad {
            layer,
            share,
            dropped_first: d1,
            dropped_second: d2,
        })
        .collect();
    Ok(Report {
        steps: tr.step,
        final_loss: last_loss,
        dev_loss: dl,
        scores,
        tokens_per_s: tok_rate,
        partition_seconds,
        peak_bytes_per_device: tr.peak_bytes_per_device,
        memory: tr.planned_memory()?,
        expert_load,
        examples,
        langs: data.langs,
        devices: cfg.devices(),
    })
}

/// loss.png, expert_load.png (heatmaps), dropped.png and expert_placement.png (shaded by
/// the last measured load) from metrics.jsonl.
fn plots(rd: &RunDir, programs: &super::programs::Programs) -> Result<(), TrainError> {
    let layers = &programs.moe_layers;
    let recs = crate::metrics::read(&rd.metrics()).map_err(io(&rd.metrics()))?;
    let mut train = Vec::new();
    let mut dev = Vec::new();
    let mut load: Vec<crate::plots::LoadSeries> =
        layers.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut dropped: Vec<crate::plots::DroppedSeries> =
        layers.iter().map(|n| (n.clone(), Vec::new())).collect();
    for r in &recs {
        let step = r["step"].as_f64().unwrap_or(0.0);
        if let Some(l) = r["ce"].as_f64() {
            train.push((step, l));
        }
        if let Some(d) = r["dev_loss"].as_f64() {
            dev.push((step, d));
        }
        if let Some(ls) = r["load"].as_array() {
            for (i, l) in ls.iter().enumerate() {
                if let (Some(slot), Some(v)) = (load.get_mut(i), l.as_array()) {
                    slot.1
                        .push((step, v.iter().filter_map(|x| x.as_f64()).collect()));
                }
            }
        }
        if let Some(ds) = r["dropped_layers"].as_array() {
            for (i, d) in ds.iter().enumerate() {
                if let (Some(slot), Some(d1), Some(d2)) =
                    (dropped.get_mut(i), d[0].as_f64(), d[1].as_f64())
                {
                    slot.1.push((step, d1, d2));
                }
            }
        }
    }
    crate::plots::loss_curve(&rd.dir.join("loss.png"), &train, &dev)?;
    if !layers.is_empty() {
        crate::plots::expert_load(&rd.dir.join("expert_load.png"), &load)?;
        crate::plots::dropped(&rd.dir.join("dropped.png"), &dropped)?;
        let last: Vec<Vec<f64>> = load
            .iter()
            .map(|(_, series)| series.last().map(|(_, v)| v.clone()).unwrap_or_default())
            .collect();
        let shaded = last.iter().all(|v| !v.is_empty()).then_some(&last[..]);
        let path = rd.dir.join("expert_placement.png");
        crate::pictures::draw_placement(&path, &programs.expert_placement(), shaded)?;
    }
    Ok(())
}
