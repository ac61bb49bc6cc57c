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
//! The devices run behind a [`Communicator`]: all of them in this process ([`InProcess`],
//! the default) or one per MPI rank. Every process runs the same loop on the same batches;
//! only process 0 writes files (config, tokenizer, metrics, checkpoints, plots, decodes),
//! and it shares what the others need (the tokenizer, a resumed checkpoint) as bytes.

use crate::checkpoint::{self, Checkpoint};
use crate::config::TrainConfig;
use crate::data::{Corpus, LangSampler, Pair, Split};
use crate::devices;
use crate::metrics::MetricsLog;
use crate::tokenizer::Tokenizer;
use ir::{Builder, DType, RngDist, Type};
use nn::params::{Init, ParamSpec};
use nn::transformer::{build, BatchShape};
use runtime::comm::gather_positions;
use runtime::{Communicator, HostTensor, InProcess};
use serde_json::json;
use spmd::Partitioned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("data: {0}")]
    Data(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("building the model: {0}")]
    Model(String),
    #[error("partitioning: {0}")]
    Partition(#[from] spmd::SpmdError),
    #[error("running a step: {0}")]
    Run(String),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One tokenized pair.
#[derive(Clone, Debug)]
pub struct Example {
    pub lang: String,
    /// `<lang> pieces </s>`.
    pub src: Vec<u32>,
    /// `pieces </s>`.
    pub tgt: Vec<u32>,
    pub english: String,
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
}

/// The two programs of a run, partitioned once.
pub struct Programs {
    pub step: Partitioned,
    pub eval: Partitioned,
    pub params: Vec<ParamSpec>,
    pub state: Vec<ParamSpec>,
    pub moe_layers: Vec<String>,
    pub partition_seconds: f64,
}

/// The data of a run.
pub struct Data {
    pub langs: Vec<String>,
    pub train: Vec<Vec<Example>>,
    pub dev: Vec<Example>,
    pub sampler: LangSampler,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
    x ^ (x >> 31)
}

/// Choose languages, train the tokenizer on their training pairs, tokenize.
pub fn tokenizer_for(
    cfg: &TrainConfig,
    corpus: &Corpus,
) -> Result<(Vec<String>, Tokenizer), TrainError> {
    let langs = select_langs(cfg, corpus)?;
    let mut texts: Vec<String> = Vec::new();
    for l in &langs {
        for p in corpus
            .split(l, Split::Train)
            .iter()
            .take(cfg.data.tokenizer_pairs_per_lang)
        {
            texts.push(p.english.clone());
            texts.push(p.source.clone());
        }
    }
    let refs: Vec<&str> = langs.iter().map(String::as_str).collect();
    let tok = Tokenizer::train(texts, &refs, cfg.data.vocab_size)
        .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
    Ok((langs, tok))
}

fn select_langs(cfg: &TrainConfig, corpus: &Corpus) -> Result<Vec<String>, TrainError> {
    if !cfg.data.langs.is_empty() {
        for l in &cfg.data.langs {
            if corpus.get(l).is_none_or(|d| d.train.is_empty()) {
                return Err(TrainError::Data(format!(
                    "language `{l}` has no training pairs in the corpus; pick from {:?}",
                    corpus.languages()
                )));
            }
        }
        return Ok(cfg.data.langs.clone());
    }
    // Largest first by training pairs; ties (a corpus capped per language) by held-out
    // pairs, which are never capped; then by tag.
    let held: HashMap<String, usize> = corpus
        .iter()
        .map(|(l, d)| (l.to_string(), d.dev.len() + d.test.len()))
        .collect();
    let mut sizes = corpus.sizes(Split::Train);
    sizes.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(held[&b.0].cmp(&held[&a.0]))
            .then(a.0.cmp(&b.0))
    });
    let langs: Vec<String> = sizes
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .take(cfg.data.max_langs)
        .map(|(l, _)| l)
        .collect();
    if langs.is_empty() {
        return Err(TrainError::Data(
            "the corpus has no training pairs; run `gshard data`".into(),
        ));
    }
    Ok(langs)
}

fn encode(tok: &Tokenizer, p: &Pair, max_len: usize) -> Result<Example, TrainError> {
    let t = |e: crate::tokenizer::TokenizerError| TrainError::Tokenizer(e.to_string());
    Ok(Example {
        lang: p.lang.to_string(),
        src: tok.encode_source(&p.lang, &p.source, max_len).map_err(t)?,
        tgt: tok.encode_target(&p.english, max_len - 1).map_err(t)?,
        english: p.english.clone(),
    })
}

/// Tokenize the chosen languages' train pairs and a fixed, language-balanced dev set.
pub fn prepare_data(
    cfg: &TrainConfig,
    corpus: &Corpus,
    langs: &[String],
    tok: &Tokenizer,
) -> Result<Data, TrainError> {
    let min_words = cfg.data.min_english_words;
    let keep = |p: &&Pair| p.english.split_whitespace().count() >= min_words;
    let mut train = Vec::new();
    let mut sizes = Vec::new();
    for l in langs {
        let ex: Vec<Example> = corpus
            .split(l, Split::Train)
            .iter()
            .filter(keep)
            .map(|p| encode(tok, p, cfg.data.max_len))
            .collect::<Result<_, _>>()?;
        if ex.is_empty() {
            return Err(TrainError::Data(format!(
                "language `{l}` has no training pair with >= {min_words} English words"
            )));
        }
        sizes.push((l.clone(), ex.len()));
        train.push(ex);
    }
    // Dev: round-robin over languages, in corpus order, up to dev_size.
    let devs: Vec<Vec<&Pair>> = langs
        .iter()
        .map(|l| corpus.split(l, Split::Dev).iter().filter(keep).collect())
        .collect();
    let mut dev = Vec::new();
    let mut i = 0;
    while dev.len() < cfg.data.dev_size && devs.iter().any(|d| i < d.len()) {
        for d in &devs {
            if dev.len() < cfg.data.dev_size && i < d.len() {
                dev.push(encode(tok, d[i], cfg.data.max_len)?);
            }
        }
        i += 1;
    }
    let sampler = LangSampler::new(&sizes, cfg.data.temperature, cfg.seed as i32)
        .map_err(|e| TrainError::Data(e.to_string()))?;
    Ok(Data {
        langs: langs.to_vec(),
        train,
        dev,
        sampler,
    })
}

/// Host tensors of a batch (padding rows have zero weight).
pub fn batch_tensors(
    cfg: &TrainConfig,
    tok: &Tokenizer,
    rows: &[Option<&Example>],
) -> HashMap<String, HostTensor> {
    let (b, l) = (cfg.data.batch_size, cfg.data.max_len);
    let pad = tok.pad_id() as f64;
    let mut src = vec![pad; b * l];
    let mut src_pad = vec![1.0; b * l];
    let mut tgt_in = vec![pad; b * l];
    let mut tgt_out = vec![pad; b * l];
    let mut w = vec![0.0; b * l];
    for (r, ex) in rows.iter().enumerate().take(b) {
        let Some(ex) = ex else { continue };
        for (k, &id) in ex.src.iter().take(l).enumerate() {
            src[r * l + k] = id as f64;
            src_pad[r * l + k] = 0.0;
        }
        tgt_in[r * l] = tok.bos_id() as f64;
        for (k, &id) in ex.tgt.iter().take(l).enumerate() {
            tgt_out[r * l + k] = id as f64;
            w[r * l + k] = 1.0;
            if k + 1 < l {
                tgt_in[r * l + k + 1] = id as f64;
            }
        }
    }
    let i32t = Type::new(DType::I32, vec![b, l]);
    let f32t = Type::new(DType::F32, vec![b, l]);
    HashMap::from([
        (
            "src".to_string(),
            HostTensor::from_f64_values(i32t.clone(), &src),
        ),
        (
            "src_pad".to_string(),
            HostTensor::from_f64_values(f32t.clone(), &src_pad),
        ),
        (
            "tgt_in".to_string(),
            HostTensor::from_f64_values(i32t.clone(), &tgt_in),
        ),
        (
            "tgt_out".to_string(),
            HostTensor::from_f64_values(i32t, &tgt_out),
        ),
        (
            "tgt_weight".to_string(),
            HostTensor::from_f64_values(f32t, &w),
        ),
    ])
}

/// The examples of step `step`: a pure function of `(seed, step)`.
pub fn batch_at<'a>(cfg: &TrainConfig, data: &'a Data, step: u64) -> Vec<Option<&'a Example>> {
    let b = cfg.data.batch_size as u64;
    (0..b)
        .map(|r| {
            let draw = step * b + r;
            let li = data.sampler.index_at(draw);
            let ex = &data.train[li];
            let k = splitmix(cfg.seed ^ splitmix(draw.wrapping_add(0x5EED))) as usize % ex.len();
            Some(&ex[k])
        })
        .collect()
}

/// Build and partition the training-step and evaluation programs.
pub fn build_programs(cfg: &TrainConfig, vocab: usize) -> Result<Programs, TrainError> {
    let mesh = cfg.mesh()?;
    let model = cfg.transformer(vocab)?;
    let shape = BatchShape {
        batch: cfg.data.batch_size,
        src_len: cfg.data.max_len,
        tgt_len: cfg.data.max_len,
    };
    let model_err = |e: &dyn std::fmt::Display| TrainError::Model(e.to_string());
    let t0 = Instant::now();

    let b = Builder::with_mesh(mesh.clone());
    let built = build(&b, &model, &shape, &cfg.layout(), true).map_err(|e| model_err(&e))?;
    b.output("loss", &built.loss);
    b.output("ce", &built.ce);
    let mut moe_layers = Vec::new();
    for (i, (name, st)) in built.moe.iter().enumerate() {
        b.output(&format!("moe{i}/load"), &st.load);
        b.output(&format!("moe{i}/aux"), &st.aux_loss);
        b.output(&format!("moe{i}/dropped_1"), &st.dropped_1);
        b.output(&format!("moe{i}/dropped_2"), &st.dropped_2);
        moe_layers.push(name.trim_end_matches('/').to_string());
    }
    let fwd = b.finish();
    let names: Vec<String> = built.params.iter().map(|s| s.name.clone()).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let with_grads = autodiff::grad(&fwd, "loss", &wrt).map_err(|e| model_err(&e))?;
    let b = Builder::from_program(with_grads);
    cfg.optimizer
        .append_update(&b, &built.params)
        .map_err(|e| model_err(&e))?;
    let mut step_prog = b.program();
    // Keep only what the loop reads: metrics and the new state (the gradients themselves
    // are consumed by the update).
    step_prog.outputs.retain(|(n, _)| !n.starts_with("grad_"));
    step_prog.prune();
    let state = cfg.optimizer.state_specs(&built.params);

    let eb = Builder::with_mesh(mesh);
    let ebuilt = build(&eb, &model, &shape, &cfg.layout(), false).map_err(|e| model_err(&e))?;
    eb.output("ce", &ebuilt.ce);
    eb.output("logits", &ebuilt.logits);
    let eval_prog = eb.finish();

    let step = spmd::compile(&step_prog)?;
    let eval = spmd::compile(&eval_prog)?;
    // State must flow from `new/x` back into `x` without moving.
    for l in &step.outputs {
        if let Some(x) = l.name.strip_prefix("new/") {
            let p = step.params.iter().find(|p| p.name == x);
            if p.is_none_or(|p| p.sharding != l.sharding) {
                return Err(TrainError::Model(format!(
                    "state `{x}` changes layout across a step ({:?} -> {})",
                    p.map(|p| p.sharding.to_string()),
                    l.sharding
                )));
            }
        }
    }
    Ok(Programs {
        step,
        eval,
        params: built.params,
        state,
        moe_layers,
        partition_seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Initial value of a parameter (counter-based RNG: independent of the mesh).
pub fn init_tensor(spec: &ParamSpec, seed: u64, stream: u64) -> HostTensor {
    let n = spec.ty.num_elements();
    let s = seed as i32;
    let v: Vec<f64> = match spec.init {
        Init::Normal(std) => (0..n)
            .map(|i| std * runtime::rng::sample(RngDist::Normal, DType::F64, s, stream, i as u64))
            .collect(),
        Init::Uniform(lim) => (0..n)
            .map(|i| {
                lim * (2.0
                    * runtime::rng::sample(RngDist::Uniform, DType::F64, s, stream, i as u64)
                    - 1.0)
            })
            .collect(),
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
    };
    HostTensor::from_f64_values(spec.ty.clone(), &v)
}

/// A training run in memory: programs, device-resident state, the step counter.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub programs: Programs,
    comm: Arc<dyn Communicator>,
    /// Per local device (`comm.local_positions()`): its parameter and optimizer-state shards.
    state: Vec<HashMap<String, HostTensor>>,
    pub step: u64,
    pub peak_bytes_per_device: usize,
    /// The step and eval programs prepared once (fusion plan, liveness, buffer pools kept
    /// across steps, so a step allocates nothing once warm).
    step_exe: OnceLock<runtime::Executable>,
    eval_exe: OnceLock<runtime::Executable>,
}

/// The executable of `p` in `cell`, prepared on first use.
fn prepared<'a>(
    cell: &'a OnceLock<runtime::Executable>,
    p: &ir::Program,
) -> Result<&'a runtime::Executable, TrainError> {
    if let Some(e) = cell.get() {
        return Ok(e);
    }
    let e = runtime::Executable::new(p).map_err(|e| TrainError::Run(e.to_string()))?;
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
        Trainer::with_comm(cfg, programs, global, step, Arc::new(InProcess::new(n)))
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
                .params
                .iter()
                .chain(programs.state.iter())
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
                    m.insert(l.name.clone(), t.block(&devices::block(l, &mesh, pos)));
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
        })
    }

    fn mesh(&self) -> ir::Mesh {
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
                    m.insert(l.name.clone(), t.block(&devices::block(l, &mesh, pos)));
                }
            }
        }
        per
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
        let exe = prepared(&self.step_exe, &self.programs.step.program)?;
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
                    let b = t.block(&devices::block(l, &mesh, pos));
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
        let r = r.map_err(|e| TrainError::Run(e.to_string()))?;
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
        let all = gather_positions(self.comm.as_ref(), &self.state, mesh.num_devices())
            .map_err(|e| TrainError::Run(e.to_string()))?;
        Ok(self
            .programs
            .step
            .params
            .iter()
            .filter(|l| all[0].contains_key(&l.name))
            .map(|l| {
                let shards: Vec<&HostTensor> = all.iter().map(|m| &m[&l.name]).collect();
                (l.name.clone(), devices::assemble(l, &mesh, &shards))
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
        let r = prepared(&self.eval_exe, &part.program)?
            .run_shared(self.comm.as_ref(), &inputs, None)
            .map_err(|e| TrainError::Run(e.to_string()))?;
        let n = self.mesh().num_devices();
        let all = gather_positions(self.comm.as_ref(), &r.outputs, n)
            .map_err(|e| TrainError::Run(e.to_string()))?;
        let outs = devices::assemble_outputs(part, &all);
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

/// Translate `srcs` (source id sequences) by beam search (`beam` = 1: greedy), recomputing
/// the whole model per output position with the evaluation program.
pub fn translate(
    tr: &Trainer,
    tok: &Tokenizer,
    srcs: &[Vec<u32>],
    beam: usize,
    alpha: f64,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let (b, l) = (tr.cfg.data.batch_size, tr.cfg.data.max_len);
    let k = beam.clamp(1, b);
    let per_run = b / k;
    let mut out = Vec::new();
    for chunk in srcs.chunks(per_run) {
        out.extend(beam_chunk(tr, tok, chunk, k, alpha, b, l)?);
    }
    Ok(out)
}

#[derive(Clone)]
struct Hyp {
    tokens: Vec<u32>,
    score: f64,
}

fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

fn beam_chunk(
    tr: &Trainer,
    tok: &Tokenizer,
    srcs: &[Vec<u32>],
    k: usize,
    alpha: f64,
    b: usize,
    l: usize,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let eos = tok.eos_id();
    let v = tok.vocab_size();
    // beams[s]: live hypotheses of sentence s; done[s]: finished ones.
    let mut beams: Vec<Vec<Hyp>> = srcs
        .iter()
        .map(|_| {
            vec![Hyp {
                tokens: Vec::new(),
                score: 0.0,
            }]
        })
        .collect();
    let mut done: Vec<Vec<Hyp>> = vec![Vec::new(); srcs.len()];
    for t in 0..l {
        if beams.iter().all(|bs| bs.is_empty()) {
            break;
        }
        // Rows: sentence s, beam j -> row s*k + j.
        let dummy = Example {
            lang: String::new(),
            src: Vec::new(),
            tgt: Vec::new(),
            english: String::new(),
        };
        let mut rows_ex: Vec<Example> = Vec::with_capacity(b);
        for r in 0..b {
            let (s, j) = (r / k, r % k);
            match (srcs.get(s), beams.get(s).and_then(|bs| bs.get(j))) {
                (Some(src), Some(h)) => rows_ex.push(Example {
                    lang: String::new(),
                    src: src.clone(),
                    tgt: h.tokens.clone(),
                    english: String::new(),
                }),
                _ => rows_ex.push(dummy.clone()),
            }
        }
        let rows: Vec<Option<&Example>> = rows_ex.iter().map(Some).collect();
        let batch = batch_tensors(&tr.cfg, tok, &rows);
        let (_, logits) = tr.evaluate(&batch)?;
        for s in 0..srcs.len() {
            let mut cands: Vec<Hyp> = Vec::new();
            for (j, h) in beams[s].iter().enumerate() {
                let row = s * k + j;
                // Only position `t` of this row is read: convert just its `v` logits.
                let slice = logits.data.range_f64((row * l + t) * v, v);
                let m = slice.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + slice.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                // The `k` best ids (highest logit, lower id first on ties), in that order:
                // selected, then only those sorted.
                let mut ids: Vec<usize> = (0..v).collect();
                let better =
                    |&a: &usize, &b2: &usize| slice[b2].total_cmp(&slice[a]).then(a.cmp(&b2));
                if k < v {
                    ids.select_nth_unstable_by(k, better);
                    ids.truncate(k);
                }
                ids.sort_by(better);
                for &id in ids.iter().take(k) {
                    let mut tokens = h.tokens.clone();
                    tokens.push(id as u32);
                    cands.push(Hyp {
                        tokens,
                        score: h.score + slice[id] - lse,
                    });
                }
            }
            cands.sort_by(|a, c| c.score.total_cmp(&a.score));
            let mut next = Vec::new();
            for c in cands {
                if next.len() >= k {
                    break;
                }
                if *c.tokens.last().unwrap() == eos || t + 1 == l {
                    done[s].push(c);
                } else {
                    next.push(c);
                }
            }
            // Stop a sentence once k hypotheses are finished and none alive can beat them.
            if done[s].len() >= k {
                next.clear();
            }
            beams[s] = next;
        }
    }
    Ok(done
        .into_iter()
        .zip(beams)
        .map(|(d, live)| {
            let all = if d.is_empty() { live } else { d };
            all.into_iter()
                .max_by(|a, c| {
                    (a.score / length_penalty(a.tokens.len(), alpha))
                        .total_cmp(&(c.score / length_penalty(c.tokens.len(), alpha)))
                })
                .map(|h| h.tokens)
                .unwrap_or_default()
        })
        .collect())
}

/// Files of a run directory.
pub struct RunDir {
    pub dir: PathBuf,
}

impl RunDir {
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("checkpoint.safetensors")
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
}

/// Options of [`run`] that are not part of the config.
pub struct RunOptions {
    pub out: PathBuf,
    pub resume: bool,
    /// Stop after this step (a simulated crash in tests); `None` runs to the end.
    pub stop_after: Option<u64>,
    /// Where the devices run; `None`: all of them in this process.
    pub comm: Option<Arc<dyn Communicator>>,
    /// Write a Chrome trace (Perfetto) of this many steps to this file, after one warm-up
    /// step (written by process 0; every process's devices are in it).
    pub profile: Option<(PathBuf, u64)>,
}

/// Process 0's bytes on every process (`make` runs on process 0 only).
fn share(
    comm: &dyn Communicator,
    make: impl FnOnce() -> Result<Vec<u8>, TrainError>,
) -> Result<Vec<u8>, TrainError> {
    if comm.num_processes() == 1 {
        return make();
    }
    let mine = if comm.process_index() == 0 {
        make()?
    } else {
        Vec::new()
    };
    let mut all = comm
        .all_gather_bytes(mine)
        .map_err(|e| TrainError::Run(e.to_string()))?;
    Ok(all.swap_remove(0))
}

/// A checkpoint's step and tensors as bytes (for [`share`]).
fn checkpoint_bytes(
    step: u64,
    tensors: &HashMap<String, HostTensor>,
) -> Result<Vec<u8>, TrainError> {
    let named: Vec<(String, &HostTensor)> = tensors.iter().map(|(k, v)| (k.clone(), v)).collect();
    let meta = HashMap::from([("step".to_string(), step.to_string())]);
    runtime::write_safetensors(&named, Some(meta)).map_err(|e| TrainError::Run(e.to_string()))
}

fn checkpoint_from_bytes(bytes: &[u8]) -> Result<(u64, HashMap<String, HostTensor>), TrainError> {
    let bad = |e: String| TrainError::Run(format!("the checkpoint shared by rank 0: {e}"));
    let (tensors, meta) = runtime::read_safetensors(bytes).map_err(|e| bad(e.to_string()))?;
    let step = meta
        .as_ref()
        .and_then(|m| m.get("step"))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no step".into()))?;
    Ok((step, tensors.into_iter().collect()))
}

/// What a finished run reports.
pub struct Report {
    pub steps: u64,
    pub final_loss: f64,
    pub dev_loss: f64,
    pub bleu: Option<crate::bleu::Bleu>,
    pub tokens_per_s: f64,
    pub partition_seconds: f64,
    pub peak_bytes_per_device: usize,
    /// Per MoE layer: (name, mean load per expert over the last logged steps, dropped fractions).
    pub expert_load: Vec<(String, Vec<f64>, f64, f64)>,
    pub examples: Vec<(String, String, String, String)>,
    pub langs: Vec<String>,
    pub devices: usize,
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
        None => Arc::new(InProcess::new(cfg.devices())),
    };
    let root = comm.process_index() == 0;
    let rd = RunDir {
        dir: opts.out.clone(),
    };
    if root {
        std::fs::create_dir_all(&rd.dir).map_err(io(&rd.dir))?;
    }
    // Process 0 decides whether to resume and shares its tokenizer with the others.
    let resume = share(comm.as_ref(), || {
        Ok(vec![(opts.resume && rd.checkpoint().exists()) as u8])
    })?
    .first()
        == Some(&1);
    if !resume {
        on(Event::Status("training the tokenizer"));
    }
    let tok_err = |e: crate::tokenizer::TokenizerError| TrainError::Tokenizer(e.to_string());
    // Process 0 loads or trains the tokenizer; with several processes it shares it as JSON.
    let make_tok = || -> Result<Tokenizer, TrainError> {
        if resume {
            Tokenizer::load(rd.tokenizer()).map_err(tok_err)
        } else {
            let (_, tok) = tokenizer_for(cfg, corpus)?;
            tok.save(rd.tokenizer()).map_err(tok_err)?;
            Ok(tok)
        }
    };
    let tok = if comm.num_processes() == 1 {
        make_tok()?
    } else {
        let json = share(comm.as_ref(), || {
            Ok(make_tok()?.to_json().map_err(tok_err)?.into_bytes())
        })?;
        Tokenizer::from_json(&String::from_utf8_lossy(&json)).map_err(tok_err)?
    };
    let langs = if resume {
        tok.langs().to_vec()
    } else {
        select_langs(cfg, corpus)?
    };
    if root {
        std::fs::write(rd.config(), cfg.to_toml()).map_err(io(&rd.config()))?;
    }
    on(Event::Status("tokenizing"));
    let data = prepare_data(cfg, corpus, &langs, &tok)?;
    on(Event::Status(
        "building, differentiating and partitioning the training step",
    ));
    let programs = build_programs(cfg, tok.vocab_size())?;
    let partition_seconds = programs.partition_seconds;
    let (global, first) = if resume {
        let bytes = share(comm.as_ref(), || {
            let ck = checkpoint::load(&rd.checkpoint())?;
            let expected: Vec<(String, Type)> = programs
                .params
                .iter()
                .chain(programs.state.iter())
                .map(|s| (s.name.clone(), s.ty.clone()))
                .collect();
            ck.check(&rd.checkpoint(), &expected)?;
            checkpoint_bytes(ck.step, &ck.tensors)
        })?;
        let (step, tensors) = checkpoint_from_bytes(&bytes)?;
        (Some(tensors), step)
    } else {
        (None, 0)
    };
    let mut tr = Trainer::with_comm(cfg, programs, global, first, comm.clone())?;
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
    let mut tok_rate = 0.0;
    let mut loads: Vec<Vec<f64>> = vec![Vec::new(); tr.programs.moe_layers.len()];
    let mut drops: Vec<(f64, f64)> = vec![(0.0, 0.0); tr.programs.moe_layers.len()];
    while tr.step < cfg.steps {
        let step = tr.step;
        let rows = batch_at(cfg, &data, step);
        let batch = batch_tensors(cfg, &tok, &rows);
        let tokens: f64 = batch["tgt_weight"].to_f64_vec().iter().sum::<f64>()
            + batch["src_pad"]
                .to_f64_vec()
                .iter()
                .filter(|&&p| p == 0.0)
                .count() as f64;
        // Step `first + 1` warms the caches and pools; the next `count` are traced.
        let profiling = opts
            .profile
            .as_ref()
            .is_some_and(|&(_, count)| step > first && step <= first + count);
        let t0 = Instant::now();
        let out = tr.train_step_profiled(&batch, profiler.as_ref().filter(|_| profiling))?;
        let dt = t0.elapsed().as_secs_f64();
        let rate = tokens / dt.max(1e-9);
        tok_rate = if step == first {
            rate
        } else {
            0.9 * tok_rate + 0.1 * rate
        };
        let s = |n: &str| out.get(n).map(|t| t.to_f64_vec()[0]).unwrap_or(f64::NAN);
        last_loss = s("ce");
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
        let done = tr.step;
        on(Event::Step {
            step: done,
            loss: last_loss,
            tokens_per_s: tok_rate,
            dropped: d1,
        });
        if done % cfg.log_every.max(1) == 0 || done == cfg.steps {
            let mut rec = json!({
                "step": done, "loss": s("loss"), "ce": last_loss, "lr": s("lr"),
                "tokens_per_s": rate, "step_seconds": dt,
            });
            if nl > 0 {
                rec["dropped_1"] = json!(d1);
                rec["dropped_2"] = json!(d2);
                rec["aux"] = json!((0..nl).map(|i| s(&format!("moe{i}/aux"))).sum::<f64>());
                rec["load"] = json!(loads);
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
        if (cfg.checkpoint_every > 0 && done % cfg.checkpoint_every == 0) || done == cfg.steps {
            let tensors = tr.global_state()?;
            if root {
                let ck = Checkpoint {
                    step: done,
                    config: cfg.to_toml(),
                    tensors,
                };
                checkpoint::save(&rd.checkpoint(), &ck)?;
            }
        }
        if opts.stop_after.is_some_and(|s| done >= s) {
            break;
        }
    }
    if let (Some(prof), Some((path, _))) = (&profiler, &opts.profile) {
        let traces = comm
            .all_gather_bytes(prof.chrome_trace().into_bytes())
            .map_err(|e| TrainError::Run(e.to_string()))?;
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
    on(Event::Status("evaluating: dev loss and BLEU"));
    let dl = dev_loss(&tr, &tok, &data.dev)?;
    if let Some(log) = &mut log {
        log.write(&json!({"step": tr.step, "loss": last_loss, "dev_loss": dl}))
            .map_err(io(log.path()))?;
    }
    let srcs: Vec<Vec<u32>> = data.dev.iter().map(|e| e.src.clone()).collect();
    let hyps_ids = translate(&tr, &tok, &srcs, cfg.eval.beam, cfg.eval.length_penalty)?;
    let hyps: Vec<String> = hyps_ids.iter().map(|h| tok.decode(h)).collect();
    let refs: Vec<&str> = data.dev.iter().map(|e| e.english.as_str()).collect();
    let hyp_refs: Vec<&str> = hyps.iter().map(String::as_str).collect();
    let bleu = crate::bleu::corpus_bleu(&hyp_refs, &refs).ok();
    if root {
        std::fs::write(rd.dir.join("dev.hyp"), hyps.join("\n") + "\n").map_err(io(&rd.dir))?;
        std::fs::write(rd.dir.join("dev.ref"), refs.join("\n") + "\n").map_err(io(&rd.dir))?;
    }
    let examples = data
        .dev
        .iter()
        .zip(&hyps)
        .take(4)
        .map(|(e, h)| {
            (
                e.lang.clone(),
                tok.decode(&e.src),
                e.english.clone(),
                h.clone(),
            )
        })
        .collect();
    if root {
        plots(&rd, &tr.programs.moe_layers)?;
    }
    let expert_load = tr
        .programs
        .moe_layers
        .iter()
        .cloned()
        .zip(loads)
        .zip(drops)
        .map(|((n, l), (d1, d2))| (n, l, d1, d2))
        .collect();
    Ok(Report {
        steps: tr.step,
        final_loss: last_loss,
        dev_loss: dl,
        bleu,
        tokens_per_s: tok_rate,
        partition_seconds,
        peak_bytes_per_device: tr.peak_bytes_per_device,
        expert_load,
        examples,
        langs: data.langs,
        devices: cfg.devices(),
    })
}

/// loss.png and expert_load.png from metrics.jsonl.
fn plots(rd: &RunDir, layers: &[String]) -> Result<(), TrainError> {
    let recs = crate::metrics::read(&rd.metrics()).map_err(io(&rd.metrics()))?;
    let mut train = Vec::new();
    let mut dev = Vec::new();
    let mut load: Vec<crate::plots::LoadSeries> =
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
    }
    crate::plots::loss_curve(&rd.dir.join("loss.png"), &train, &dev).map_err(TrainError::Run)?;
    if !layers.is_empty() {
        crate::plots::expert_load(&rd.dir.join("expert_load.png"), &load)
            .map_err(TrainError::Run)?;
    }
    Ok(())
}

/// A finished (or checkpointed) run, loaded for evaluation and translation.
pub struct LoadedRun {
    pub cfg: TrainConfig,
    pub tok: Tokenizer,
    pub trainer: Trainer,
}

/// Load `dir`'s config, tokenizer and checkpoint onto the devices of its mesh.
pub fn load_run(dir: &Path) -> Result<LoadedRun, TrainError> {
    let rd = RunDir {
        dir: dir.to_path_buf(),
    };
    let ck = checkpoint::load(&rd.checkpoint())?;
    let cfg = TrainConfig::from_toml(&ck.config, &rd.checkpoint().display().to_string())?;
    let tok = Tokenizer::load(rd.tokenizer()).map_err(|e| TrainError::Tokenizer(e.to_string()))?;
    let programs = build_programs(&cfg, tok.vocab_size())?;
    let expected: Vec<(String, Type)> = programs
        .params
        .iter()
        .chain(programs.state.iter())
        .map(|s| (s.name.clone(), s.ty.clone()))
        .collect();
    ck.check(&rd.checkpoint(), &expected)?;
    let trainer = Trainer::new(&cfg, programs, Some(ck.tensors), ck.step)?;
    Ok(LoadedRun { cfg, tok, trainer })
}

/// Loss and BLEU of a loaded run on `pairs`.
pub fn evaluate_pairs(
    run: &LoadedRun,
    pairs: &[&Pair],
    beam: usize,
) -> Result<(f64, Option<crate::bleu::Bleu>, Vec<String>), TrainError> {
    let ex: Vec<Example> = pairs
        .iter()
        .map(|p| encode(&run.tok, p, run.cfg.data.max_len))
        .collect::<Result<_, _>>()?;
    let loss = dev_loss(&run.trainer, &run.tok, &ex)?;
    let srcs: Vec<Vec<u32>> = ex.iter().map(|e| e.src.clone()).collect();
    let hyps: Vec<String> = translate(
        &run.trainer,
        &run.tok,
        &srcs,
        beam,
        run.cfg.eval.length_penalty,
    )?
    .iter()
    .map(|h| run.tok.decode(h))
    .collect();
    let refs: Vec<&str> = ex.iter().map(|e| e.english.as_str()).collect();
    let hr: Vec<&str> = hyps.iter().map(String::as_str).collect();
    Ok((loss, crate::bleu::corpus_bleu(&hr, &refs).ok(), hyps))
}
