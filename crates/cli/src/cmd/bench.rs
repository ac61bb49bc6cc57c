//! `gshard bench`: measurements, printed as text or one JSON object per line (`--json`).
//!
//! `moe-layer`: the step time of one GShard MoE layer with its gradients (the program of
//! `gshard export moe-layer`, same flags) on `--devices N` in this process (mesh `expert=N`),
//! or one device per rank with `--backend mpi`, run by the executor: median forward+backward seconds after warm-up, GFLOP/s (FLOPs of the
//! layer's einsums counting the one-hot dispatch/combine as dense, x3 for fwd+bwd, as the JAX
//! harness's `moe_flops`), peak bytes per device, collective bytes (measured and analytic),
//! and the time to propagate + partition + prepare the executor. `--profile FILE` writes a
//! Chrome trace of one extra step. `core_fma_gflops` and `core_gemm_gflops`: the lowest
//! rate of the pool's threads, probed all at once just before and just after the timed
//! steps, of FMA chains in registers and of the GEMM micro-kernel on operands in L2
//! ([`runtime::probe`]; a shared host's spells that take the FMA pipes show in both, those
//! that slow the caches in the second); `core_clock_ghz`, the lowest clock of the same
//! threads (a chain of dependent adds), tells a spell of a lower clock from one of shared
//! pipes (the FMA rate falls with the clock in the first, alone in the second).
//!
//! `collectives`: all-to-all and all-reduce bandwidth per backend (`bench_comm`).
//!
//! `probe`: the FMA, GEMM and clock probes once on every pool thread at once, the lowest
//! reading of each (null where a probe does not run on this CPU), to tag another program's runs the
//! way `moe-layer` tags its own (`bench/compare_jax.sh` runs it around the JAX anchor).
//!
//! `gemm`: dense products through the executor's `dot` on one thread, each timed in bursts
//! that alternate with bursts of the FMA chains, so its share of the core's FMA peak is
//! read pair by pair at one clock ([`runtime::probe::gemm_against_peak`]); the dense
//! GEMM's share of the peak. `--shapes` takes `MxNxK` (`tMxNxK`: `A` stored transposed).
//!
//! `partition`: builds one transformer-sized MoE training step (forward + backward) once,
//! then propagates and partitions it for 2, 8, 64, 512 and 2048 devices (mesh `expert=N`;
//! experts and groups are 2048 so every count divides) and reports the median time of each.
//! GShard's claim is that this does not grow with the device count; the per-device texts
//! are also compared with every number masked out, to show they differ only in constants.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use ir::{Builder, DType, Mesh, Program};
use nn::moe::{Activation, SecondPolicy};
use nn::transformer::{
    build, Balance, BatchShape, Layout, MoeConfig, MoeGating, Packing, TransformerConfig,
};
use serde_json::json;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Time propagation + partitioning of one transformer training step at several device counts.
    Partition(PartitionArgs),
    /// Step time of one MoE layer with gradients on N devices (the `export moe-layer` program).
    MoeLayer(MoeBenchArgs),
    /// All-to-all and all-reduce bandwidth of a backend (`--backend inprocess|mpi`).
    Collectives(crate::cmd::bench_comm::CollectiveBenchArgs),
    /// The cores' FMA and GEMM rates now (the probes `moe-layer` runs around its steps), to
    /// tag another program's runs on a shared host. A developer probe: hidden from --help.
    #[command(hide = true)]
    Probe(ProbeArgs),
    /// Dense GEMM rates on one thread against the core's FMA peak, measured in alternating
    /// bursts (each product's share of the peak at one clock). A developer probe: hidden
    /// from --help.
    #[command(hide = true)]
    Gemm(GemmArgs),
}

#[derive(clap::Args)]
pub struct GemmArgs {
    /// Products as `MxNxK` (`C` is `M x N`, `K` summed); a leading `t` stores `A`
    /// transposed (`K x M`, a weight gradient's `x^T dy`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512x512x512,1024x1024x1024,256x1024x256,256x256x1024,128x512x128,128x128x512,t512x128x128"
    )]
    shapes: Vec<String>,
    /// Pairs of bursts per product (medians and quartiles are over these).
    #[arg(long, default_value_t = 30)]
    pairs: usize,
    /// Milliseconds per burst.
    #[arg(long, default_value_t = 10.0)]
    burst_ms: f64,
    /// One JSON object per product.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct MoeBenchArgs {
    #[command(flatten)]
    layer: crate::cmd::export::MoeLayerArgs,
    /// Devices in this process (1-D mesh `expert=N`).
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Timed steps (the median is reported).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Repetitions of propagate + partition + prepare (the median is reported).
    #[arg(long, default_value_t = 5)]
    prepare_reps: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace (Perfetto) of one extra step to this file.
    #[arg(long)]
    profile: Option<std::path::PathBuf>,
    /// Write the per-device program that runs (after partitioning) to this file: the `%N`
    /// names in the profile are its instructions.
    #[arg(long)]
    program_out: Option<std::path::PathBuf>,
    /// What the timed program returns: `grads`, the loss and the four gradients (a training
    /// step's work, as the JAX harness's `jax.grad`), or `all`, every value the exported
    /// program names (the routing, the expert buffers: kept alive to the end of the step).
    #[arg(long, value_enum, default_value_t = BenchOutputs::Grads)]
    outputs: BenchOutputs,
    /// With --overlap K > 1: keep the all-to-alls blocking (the chunks alone, without the
    /// executor's start/wait and the communication thread).
    #[arg(long)]
    blocking: bool,
    /// Where the devices run: with `--backend mpi` one per rank (the rank count replaces
    /// `--devices`); rank 0 prints its own device's times.
    #[command(flatten)]
    backend: crate::backend::BackendArgs,
}

/// The outputs of the benchmarked MoE program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchOutputs {
    Grads,
    All,
}

#[derive(clap::Args)]
pub struct PartitionArgs {
    /// Device counts to partition for.
    #[arg(long, value_delimiter = ',', default_value = "2,8,64,512,2048")]
    devices: Vec<usize>,
    /// Encoder and decoder layers each.
    #[arg(long, default_value_t = 6)]
    layers: usize,
    /// Timed repetitions per device count (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Write each per-device program to DIR/partitioned-N.gsir.
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
}

pub fn main(a: Args) -> Result<()> {
    match a.what {
        What::Partition(p) => partition(p),
        What::MoeLayer(m) => moe_layer(m),
        What::Collectives(c) => crate::cmd::bench_comm::main(c),
        What::Probe(p) => probe(p),
        What::Gemm(g) => gemm(g),
    }
}

/// `(m, n, k, a_transposed)` of a `--shapes` entry: `MxNxK`, or `tMxNxK` with `A` stored
/// transposed.
fn parse_gemm_shape(s: &str) -> Result<(usize, usize, usize, bool)> {
    let (t, dims) = match s.strip_prefix('t') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let parts: Vec<&str> = dims.split('x').collect();
    let bad = || {
        anyhow::anyhow!(
            "--shapes entry {s:?}: expected MxNxK of positive integers (e.g. 512x512x512), \
             with a leading t for A stored transposed (t512x128x128)"
        )
    };
    if parts.len() != 3 {
        return Err(bad());
    }
    let mut d = [0usize; 3];
    for (x, p) in d.iter_mut().zip(&parts) {
        *x = p.parse().map_err(|_| bad())?;
        if *x == 0 {
            return Err(bad());
        }
    }
    // The three operands, f32: refuse what cannot be allocated rather than abort.
    const MAX_BYTES: u128 = 8 << 30;
    let [m, n, k] = d.map(|x| x as u128);
    let need = 4 * (m * k + k * n + m * n);
    if need > MAX_BYTES {
        bail!(
            "--shapes entry {s:?}: its operands need {:.1} GiB; at most {} GiB are allowed",
            need as f64 / (1u64 << 30) as f64,
            MAX_BYTES >> 30
        );
    }
    Ok((d[0], d[1], d[2], t))
}

/// `gshard bench gemm`: each product's share of the FMA peak, pair by pair.
fn gemm(a: GemmArgs) -> Result<()> {
    let shapes: Vec<_> = a
        .shapes
        .iter()
        .map(|s| parse_gemm_shape(s))
        .collect::<Result<_>>()?;
    if a.pairs == 0 || !(a.burst_ms > 0.0 && a.burst_ms.is_finite()) {
        bail!("--pairs must be at least 1 and --burst-ms a positive number of milliseconds");
    }
    if !a.json {
        println!(
            "{:>16} {:>10} {:>10} {:>8} {:>15}",
            "m x n x k", "GFLOP/s", "peak", "share", "quartiles"
        );
    }
    let mut cycles = Vec::new();
    for (name, &(m, n, k, t)) in a.shapes.iter().zip(&shapes) {
        let Some(g) = runtime::probe::gemm_against_peak(m, n, k, t, a.pairs, a.burst_ms / 1e3)
        else {
            bail!("the GEMM kernel does not run on this CPU (it needs AVX2 and FMA)");
        };
        cycles.extend(g.clock_ghz.zip(g.peak_flops_per_cycle));
        if a.json {
            println!(
                "{}",
                json!({
                    "shape": name, "m": m, "n": n, "k": k, "a_transposed": t,
                    "gemm_gflops": g.gemm_gflops, "peak_gflops": g.peak_gflops,
                    "peak_lanes": if g.wide { 16 } else { 8 },
                    "share_of_peak": g.share, "share_q1": g.share_q1, "share_q3": g.share_q3,
                    "pairs": g.pairs, "sampled_error": g.sampled_error,
                    "clock_ghz": g.clock_ghz, "peak_flops_per_cycle": g.peak_flops_per_cycle,
                })
            );
        } else {
            println!(
                "{:>16} {:>10.1} {:>10.1} {:>7.1}% {:>7.1}-{:.1}%",
                name,
                g.gemm_gflops,
                g.peak_gflops,
                100.0 * g.share,
                100.0 * g.share_q1,
                100.0 * g.share_q3
            );
        }
    }
    if !a.json {
        println!(
            "one thread, operands in cache; peak: FMA chains of {} lanes, timed in bursts \
             alternating with the product's ({} pairs of {} ms)",
            if runtime::probe::fma_burst_wide(0).is_some() {
                16
            } else {
                8
            },
            a.pairs,
            a.burst_ms
        );
        let range = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[0], v[v.len() - 1])
        };
        let (mut clocks, mut per): (Vec<f64>, Vec<f64>) = cycles.into_iter().unzip();
        if !clocks.is_empty() {
            let ((c0, c1), (p0, p1)) = (range(&mut clocks), range(&mut per));
            println!(
                "the peak ran {p0:.1}-{p1:.1} flops per cycle at {c0:.2}-{c1:.2} GHz (the clock \
                 of a chain of dependent adds, one a cycle; 64 is two 512-bit FMA units)"
            );
        }
    }
    Ok(())
}

/// `gshard bench probe`: each probe once on every pool thread at once, the lowest rate of
/// each (null where a probe does not run on this CPU).
fn probe(a: ProbeArgs) -> Result<()> {
    let Probes { fma, gemm, clock } = probe_all();
    let threads = rayon::current_num_threads();
    if a.json {
        println!(
            "{}",
            json!({
                "core_fma_gflops": fma, "core_gemm_gflops": gemm, "core_clock_ghz": clock,
                "threads": threads,
            })
        );
    } else {
        let show = |g: Option<f64>| {
            g.map_or("n/a (no AVX2 and FMA)".to_string(), |g| {
                format!("{g:.1} GFLOP/s")
            })
        };
        println!(
            "lowest of {threads} threads probed at once: FMA chains {}, \
             GEMM micro-kernel on operands in L2 {}, clock {}",
            show(fma),
            show(gemm),
            clock.map_or("n/a (not x86-64)".to_string(), |c| format!("{c:.2} GHz"))
        );
    }
    Ok(())
}

/// The benchmark model: a 6+6-layer GShard MoE Transformer (M=1024, 16 heads, H=4096, MoE
/// every other layer with `experts` experts), GShard's scaling of one group of 1024 tokens per
/// expert (2M tokens per step at 2048 experts, C = 2S/E = 1), training step with gradients.
pub fn transformer_step(layers: usize, experts: usize) -> Result<Program> {
    let cfg = TransformerConfig {
        vocab: 32000,
        src_vocab: None,
        model_dim: 1024,
        heads: 16,
        head_dim: 64,
        ffn_dim: 4096,
        enc_layers: layers,
        dec_layers: layers,
        moe_every: 2,
        moe: Some(MoeConfig {
            experts,
            expert_dim: 4096,
            group_size: 1024,
            capacity: nn::capacity::gshard(1024, experts, 1.0),
            policy: SecondPolicy::All,
            aux_loss_coef: 0.01,
            gating: MoeGating::Top2,
            balance: Balance::AuxLoss,
            overlap_chunks: 1,
        }),
        activation: Activation::Relu,
        dropout: 0.0,
        label_smoothing: 0.1,
        dtype: DType::F32,
        precision: nn::transformer::Precision::Full,
        checkpoint: Default::default(),
    };
    let b = Builder::with_mesh(Mesh::new(&[("expert", experts)])?);
    let layout = Layout {
        batch_axes: vec!["expert".into()],
        expert_axes: vec!["expert".into()],
        model_axes: Vec::new(),
        weight_axes: Vec::new(),
    };
    let shape = BatchShape {
        batch: experts * 16,
        src_len: 64,
        tgt_len: 64,
        packing: Packing::Padded,
    };
    let built = build(&b, &cfg, &shape, &layout, true)?;
    b.output("loss", &built.loss);
    let fwd = b.finish();
    let names: Vec<String> = built.params.iter().map(|s| s.name.clone()).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    Ok(autodiff::grad(&fwd, "loss", &wrt)?)
}

/// The program text with every run of digits replaced by `#`.
fn mask_numbers(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_num = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('#');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
}

fn partition(a: PartitionArgs) -> Result<()> {
    let max_d = *a.devices.iter().max().context("--devices is empty")?;
    if a.devices.iter().any(|&d| d == 0 || max_d % d != 0) {
        bail!("every device count must divide the largest ({max_d})");
    }
    let t0 = Instant::now();
    let p = transformer_step(a.layers, max_d)?;
    let build_s = t0.elapsed().as_secs_f64();
    if !a.json {
        println!(
            "program: {}+{}-layer MoE Transformer training step, {} instructions (built and differentiated in {build_s:.2} s)",
            a.layers,
            a.layers,
            p.len()
        );
    }
    let mut reference_text: Option<String> = None;
    let mut first: Option<f64> = None;
    for &d in &a.devices {
        let mut q = p.clone();
        q.mesh = Some(Mesh::new(&[("expert", d)])?);
        let mut times = Vec::new();
        let mut part = None;
        for _ in 0..a.reps.max(1) {
            let t = Instant::now();
            let r = spmd::compile(&q)?;
            times.push(t.elapsed().as_secs_f64());
            part = Some(r);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let part = part.unwrap();
        let printed = ir::text::print(&part.program);
        if let Some(dir) = &a.dump {
            std::fs::create_dir_all(dir)?;
            crate::files::write_atomic(
                &dir.join(format!("partitioned-{d}.gsir")),
                printed.as_bytes(),
            )?;
        }
        let text = mask_numbers(&printed);
        let same = match &reference_text {
            None => {
                reference_text = Some(text);
                true
            }
            Some(r) => *r == text,
        };
        let ratio = median / *first.get_or_insert(median);
        let collectives = spmd::report::collectives(&part.program).len();
        if a.json {
            println!(
                "{}",
                json!({"devices": d, "seconds": median, "instructions": part.program.len(), "collectives": collectives, "same_text_modulo_numbers": same})
            );
        } else {
            println!(
                "devices {d:>5}: {median:.3} s (x{ratio:.2} of the first), {} instructions per device, {collectives} collectives, text {}",
                part.program.len(),
                if same { "identical up to numbers" } else { "DIFFERS beyond numbers" }
            );
        }
    }
    Ok(())
}

/// Forward FLOPs of the layer's einsums (2 per MAC; dispatch and combine counted dense), as
/// `moe_flops` in the JAX harness (`bench/jax/moe.py`).
pub fn moe_flops(g: usize, s: usize, e: usize, m: usize, h: usize, c: usize) -> f64 {
    let (g, s, e, m, h, c) = (g as f64, s as f64, e as f64, m as f64, h as f64, c as f64);
    let gate = 2.0 * g * s * m * e;
    let dispatch = 2.0 * g * s * e * c * m;
    let experts = 2.0 * e * g * c * m * h * 2.0;
    let combine = 2.0 * g * s * e * c * m;
    gate + dispatch + experts + combine
}

/// Gaussian-ish inputs like the JAX harness: x and loss_weight N(0,1), wg N(0,1)*0.1,
/// wi and wo N(0,1)*0.05, noise U[0,1).
fn moe_inputs(p: &Program) -> std::collections::HashMap<String, runtime::HostTensor> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut unit = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    p.params()
        .into_iter()
        .map(|(name, v)| {
            let ty = p.ty(v).clone();
            let scale = match name {
                "wg" => 0.1,
                "wi" | "wo" => 0.05,
                _ => 1.0,
            };
            let vals: Vec<f64> = (0..ty.num_elements())
                .map(|_| {
                    if name == "noise" {
                        unit()
                    } else {
                        let (u1, u2) = (unit(), unit());
                        scale * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
                    }
                })
                .collect();
            (
                name.to_string(),
                runtime::HostTensor::from_f64_values(ty, &vals),
            )
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds of each probe around the timed steps ([`runtime::probe`]).
const PROBE_SECONDS: f64 = 0.02;

/// The lowest rate of the pool's threads on `probe`, run on all of them at once (as a step
/// keeps them all busy); `None` where the probe does not run on this CPU.
fn probe_cores(probe: fn(f64) -> Option<f64>) -> Option<f64> {
    rayon::broadcast(|_| probe(PROBE_SECONDS))
        .into_iter()
        .try_fold(f64::INFINITY, |lo, g| g.map(|g| lo.min(g)))
}

/// The lowest readings of the pool's threads: FMA chains and GEMM micro-kernel in GFLOP/s,
/// clock in GHz.
#[derive(Clone, Copy)]
struct Probes {
    fma: Option<f64>,
    gemm: Option<f64>,
    clock: Option<f64>,
}

/// Every probe once, each on all the pool's threads at once.
fn probe_all() -> Probes {
    Probes {
        fma: probe_cores(runtime::probe::fma_gflops),
        gemm: probe_cores(runtime::probe::gemm_gflops),
        clock: probe_cores(runtime::probe::clock_ghz),
    }
}

/// The lower of two probe readings (`None` if either is).
fn lower(x: Option<f64>, y: Option<f64>) -> Option<f64> {
    x.zip(y).map(|(x, y)| x.min(y))
}

fn moe_layer(a: MoeBenchArgs) -> Result<()> {
    let b = a.backend.clone();
    crate::backend::with_backend(&b, |mpi| moe_layer_on(a, mpi))
}

fn moe_layer_on(a: MoeBenchArgs, mpi: crate::backend::Mpi) -> Result<()> {
    use runtime::Communicator;
    use std::sync::Arc;
    let overlap = a.layer.overlap > 1 && !a.blocking;
    let (d, comm): (usize, Arc<dyn Communicator>) = match &mpi {
        Some(c) => (c.size(), c.clone()),
        None => (
            a.devices,
            Arc::new(runtime::InProcess::new(a.devices).with_comm_thread(overlap)),
        ),
    };
    if d == 0 {
        bail!("--devices must be at least 1");
    }
    let (mut p, c, _) = crate::cmd::export::moe_program(&a.layer)?;
    if a.outputs == BenchOutputs::Grads {
        p.outputs
            .retain(|(name, _)| name == "loss" || name.starts_with("grad_"));
        p.prune();
    }
    let l = &a.layer;
    let (g, s, e, m, h) = (l.groups, l.group_size, l.experts, l.model_dim, l.hidden_dim);
    if g % d != 0 || e % d != 0 {
        bail!("--devices {d} must divide --groups {g} and --experts {e}");
    }
    let mut q = p.clone();
    q.mesh = Some(Mesh::new(&[("expert", d)])?);
    let mut prep = Vec::new();
    let mut built = None;
    for _ in 0..a.prepare_reps.max(1) {
        let t = Instant::now();
        let part = spmd::compile(&q).context("partitioning the MoE layer")?;
        let opts = runtime::ExecOptions::native().with_overlap(overlap);
        let exe = runtime::Executable::with_options(&part.program, opts)?;
        prep.push(t.elapsed().as_secs_f64());
        built = Some((part, exe));
    }
    let (part, exe) = built.expect("at least one repetition");
    if let Some(path) = &a.program_out {
        crate::files::write_atomic(path, part.program.to_string().as_bytes())?;
    }
    let global = moe_inputs(&p);
    let local = comm.local_positions();
    let per_dev: Vec<std::collections::HashMap<String, Arc<runtime::HostTensor>>> =
        driver::shard_inputs(&part, &global)?
            .into_iter()
            .enumerate()
            .filter(|(i, _)| local.contains(i))
            .map(|(_, m)| m.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
            .collect();
    let comm = &*comm;
    // Each step's outputs go back to the executor's buffer pool (an allocator cache).
    for _ in 0..a.warmup {
        exe.recycle(exe.run_shared(comm, &per_dev, None)?.outputs);
    }
    // The cores' FMA and GEMM rates just before and just after the timed steps (the
    // lowest of each is reported): a shared host's slow spell shows there.
    let before = probe_all();
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..a.steps.max(1) {
        let t = Instant::now();
        let mut r = exe.run_shared(comm, &per_dev, None)?;
        times.push(t.elapsed().as_secs_f64());
        exe.recycle(std::mem::take(&mut r.outputs));
        last = Some(r);
    }
    let after = probe_all();
    let core_fma_gflops = lower(before.fma, after.fma);
    let core_gemm_gflops = lower(before.gemm, after.gemm);
    let core_clock_ghz = lower(before.clock, after.clock);
    let r = last.expect("at least one step");
    let step = median(times.clone());
    let min = times.iter().copied().fold(f64::INFINITY, f64::min);
    let flops = 3.0 * moe_flops(g, s, e, m, h, c);
    // One profiled step: per-op totals and the GEMM rate.
    let prof = runtime::Profiler::new();
    exe.run_shared(comm, &per_dev, Some(&prof))?;
    if let Some(path) = &a.profile {
        crate::files::write_atomic(path, prof.chrome_trace().as_bytes())?;
    }
    let threads = rayon::current_num_threads();
    let totals = prof.totals();
    let dot = totals.get("dot_general");
    let dot_flops = dot.map_or(0.0, |t| t.flops);
    let dot_secs = dot.map_or(0.0, |t| t.seconds);
    // With one device its dots use every pool thread; per-thread rate = rate / threads.
    let dot_gflops_per_thread =
        (d == 1 && dot_secs > 0.0).then(|| dot_flops / dot_secs / threads as f64 / 1e9);
    let dtype_bytes = p.ty(p.param("x").expect("x")).dtype.size_bytes();
    let a2a_analytic = 4 * (d - 1) * e * g * c * m * dtype_bytes / d;
    let measured_a2a = r
        .collectives
        .iter()
        .find(|x| x.kind == "all_to_all")
        .map_or(0, |x| x.bytes);
    // Time this device blocked in all-to-alls in the profiled step: a blocking one's whole
    // time, a started one's time at its wait (its flight while the device computed is
    // hidden).
    let a2a_blocking_seconds = totals.get("all_to_all").map_or(0.0, |t| t.seconds);
    let (groups, fused_ops) = exe.fusion_stats();
    let out = json!({
        "devices": d, "groups": g, "group_size": s, "experts": e, "model_dim": m, "hidden_dim": h,
        "capacity": c, "threads": threads,
        "step_seconds": step, "step_seconds_min": min, "steps": times.len(),
        "gflop": flops / 1e9, "gflops": flops / step / 1e9,
        "peak_bytes_per_device": r.peak_bytes_per_device,
        "peak_resident_bytes_per_device": r.peak_resident_bytes_per_device,
        "collective_bytes": r.collective_bytes,
        "all_to_all_bytes": measured_a2a,
        "all_to_all_bytes_analytic": a2a_analytic,
        "collectives": r.collectives.iter().map(|x| json!({"kind": x.kind, "count": x.count, "bytes": x.bytes})).collect::<Vec<_>>(),
        "partition_seconds": median(prep),
        "instructions": part.program.len(), "executor_steps": exe.num_steps(),
        "collective_rounds": exe.collective_rounds(),
        "outputs": match a.outputs { BenchOutputs::Grads => "grads", BenchOutputs::All => "all" },
        "program_outputs": part.program.outputs.len(),
        "fused_groups": groups, "fused_ops": fused_ops,
        "dot_seconds": dot_secs, "dot_gflops_per_thread": dot_gflops_per_thread,
        "core_fma_gflops": core_fma_gflops,
        "core_gemm_gflops": core_gemm_gflops,
        "core_clock_ghz": core_clock_ghz,
        "overlap": a.layer.overlap, "overlapped": overlap,
        "all_to_all_blocking_seconds": a2a_blocking_seconds,
        "backend": if mpi.is_some() { "mpi" } else { "inprocess" },
        "all_to_all_algo": a.backend.all_to_all_name(),
        "compress": a.backend.compress_names(),
    });
    if !crate::backend::is_root(&mpi) {
        return Ok(());
    }
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
        let mut rows: Vec<(String, runtime::profile::OpTotal)> = totals.into_iter().collect();
        rows.sort_by(|x, y| y.1.seconds.total_cmp(&x.1.seconds));
        println!("profile of one step (sum over this process's devices):");
        for (name, t) in rows.iter().take(15) {
            println!(
                "  {name:<24} {:>10} {:>5}x {:>9.2} ms{}",
                t.cat,
                t.count,
                t.seconds * 1e3,
                if t.flops > 0.0 {
                    format!("  {:.1} GFLOP/s", t.flops / t.seconds / 1e9)
                } else {
                    String::new()
                }
            );
        }
    }
    Ok(())
}
