//! Measurements of this machine through the executor itself, for the `this-cpu` profile
//! ([`crate::hardware::Hardware::this_cpu`]); a few tenths of a second in all. Each figure
//! is the median of repeated runs of a small per-device program (text format, parsed and
//! prepared once) on in-process devices:
//!
//! - the fixed time of one executor step: a chain of [`CHAIN`] dependent `4 x 4` products on
//!   one device, less the same program with one product, over the steps between them;
//! - the rate of `n x n x n` f32 products for `n` in [`GEMM_SIZES`]: a chain of products
//!   on one device (the pool's threads split each) less a chain of one, per product less
//!   its fixed step time; and the same on one device per pool thread, each running its own
//!   chain at once, per thread (how in-process devices run their dots);
//! - the bandwidth of fused elementwise chains: [`ELEMENTWISE_GROUPS`] groups
//!   `y = exp(x * w) + y` of `f32[`[`ELEMENTWISE_N`]`, `[`ELEMENTWISE_N`]`]` on one device per
//!   pool thread at once, their bytes counted as the plan counts them
//!   ([`crate::cost::StepCost`]), over the time less a chain of one group and the groups'
//!   fixed step times (the executor's fused kernels run well below a memory copy's rate);
//! - the start-up of an in-process collective: [`CHAIN`] pairs of a `4 x 4` product and a
//!   sum all-reduce on [`COLLECTIVE_DEVICES`] devices, less the fixed time of the products
//!   (each of the devices' steps, `ceil(devices / threads)` at a time), per all-reduce: the
//!   fork and join of a segment across the pool and the collective's barrier.

use crate::cost::{Family, StepCost};
use runtime::{Data, Executable, HostTensor, InProcess};
use std::collections::HashMap;
use std::time::Instant;

/// Steps of the chains.
pub const CHAIN: usize = 200;
/// Sizes of the product probe.
pub const GEMM_SIZES: [usize; 4] = [16, 64, 192, 512];
/// Side of the elementwise probe's operands (64 KiB each: the per-device size of the main
/// job's activations at width 64 on 8 devices, a few times below today's).
pub const ELEMENTWISE_N: usize = 128;
/// Groups of the elementwise probe's chain.
pub const ELEMENTWISE_GROUPS: usize = 40;
/// Devices of the collective probe (the mesh of the bench runs: data=2 x expert=4).
pub const COLLECTIVE_DEVICES: usize = 8;

/// What the probes measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub step_seconds: f64,
    /// `[n, FLOP/s]`, increasing `n`: one device, and per thread with one device a thread.
    pub gemm_rates: Vec<[f64; 2]>,
    pub gemm_rates_per_thread: Vec<[f64; 2]>,
    pub collective_seconds: f64,
    /// Bytes per second of fused elementwise chains, all pool threads together.
    pub elementwise_bytes_per_s: f64,
}

/// A prepared program and its inputs on `devices` in-process devices.
struct Bench {
    exe: Executable,
    comm: InProcess,
    inputs: Vec<HashMap<String, HostTensor>>,
}

impl Bench {
    /// `text` (a per-device program whose parameters are `x`, `w` of `f32[n, n]`).
    fn new(text: &str, n: usize, devices: usize) -> Option<Bench> {
        let p = ir::text::parse(text).ok()?;
        let exe = Executable::new(&p).ok()?;
        let ty = ir::Type::new(ir::DType::F32, vec![n, n]);
        // Values near `1 / sqrt(n devices)`, none zero: a product (and its sum over the
        // devices) grows a value by a factor within 1.04 of 1, far from overflow and
        // subnormals over the chains.
        let v = 1.0 / ((n * devices) as f32).sqrt();
        let vals = |s: usize| -> Vec<f32> {
            (0..n * n)
                .map(|i| v * (1.0 + ((i * 7 + s) % 13) as f32 / 600.0))
                .collect()
        };
        let one = |s| HostTensor::new(ty.clone(), Data::F32(vals(s))).ok();
        let mut inputs = Vec::new();
        for _ in 0..devices {
            let mut m = HashMap::new();
            m.insert("x".to_string(), one(1)?);
            m.insert("w".to_string(), one(2)?);
            inputs.push(m);
        }
        Some(Bench {
            exe,
            comm: InProcess::new(devices),
            inputs,
        })
    }

    /// The median seconds of `reps` runs after one untimed run.
    fn median(&self, reps: usize) -> Option<f64> {
        let run = || -> Option<f64> {
            let t0 = Instant::now();
            let r = self.exe.run(&self.comm, &self.inputs, None).ok()?;
            let s = t0.elapsed().as_secs_f64();
            self.exe.recycle(r.outputs);
            Some(s)
        };
        run()?;
        let mut t: Vec<f64> = (0..reps).map(|_| run()).collect::<Option<_>>()?;
        t.sort_by(f64::total_cmp);
        Some(t[t.len() / 2])
    }
}

/// A chain of `len` products `y_{i+1} = y_i w` of `f32[n, n]` (with an all-reduce after
/// each when `mesh` names one), output the last.
fn chain(n: usize, len: usize, mesh: Option<usize>) -> String {
    chain_of(n, len, mesh, true)
}

/// [`chain`], with an all-reduce after each product only when `reduce`.
fn chain_of(n: usize, len: usize, mesh: Option<usize>, reduce: bool) -> String {
    let mut s = String::new();
    if let Some(d) = mesh {
        s += &format!("mesh [data={d}]\n");
    }
    s += &format!("%y0 = f32[{n},{n}] parameter(\"x\")\n%w = f32[{n},{n}] parameter(\"w\")\n");
    for i in 0..len {
        let (a, b) = (i, i + 1);
        if mesh.is_some() && reduce {
            s += &format!(
                "%p{b} = f32[{n},{n}] dot_general(%y{a}, %w) lhs_contract=[1] rhs_contract=[0]\n\
                 %y{b} = f32[{n},{n}] all_reduce(%p{b}) op=sum axes=[data]\n"
            );
        } else {
            s += &format!(
                "%y{b} = f32[{n},{n}] dot_general(%y{a}, %w) lhs_contract=[1] rhs_contract=[0]\n"
            );
        }
    }
    s += &format!("output \"y\" = %y{len}\n");
    s
}

/// A chain of `len` fused groups `y_{i+1} = exp(x * w) + y_i` of `f32[n, n]`, each group's
/// result passed through a `reshape`, which ends the fusion, so the groups run one after
/// another; on a mesh of `devices` when above 1 (no collective).
fn elementwise_chain(n: usize, len: usize, devices: usize) -> String {
    let mut s = String::new();
    if devices > 1 {
        s += &format!("mesh [data={devices}]\n");
    }
    s += &format!("%y0 = f32[{n},{n}] parameter(\"x\")\n%w = f32[{n},{n}] parameter(\"w\")\n");
    for i in 0..len {
        let (a, b) = (i, i + 1);
        s += &format!(
            "%m{b} = f32[{n},{n}] mul(%y0, %w)\n%e{b} = f32[{n},{n}] exp(%m{b})\n\
             %s{b} = f32[{n},{n}] add(%e{b}, %y{a})\n%y{b} = f32[{n},{n}] reshape(%s{b})\n"
        );
    }
    s += &format!("output \"y\" = %y{len}\n");
    s
}

/// Measure (see the module doc) with `threads` pool threads; `None` where a program does
/// not run.
pub fn measure(threads: usize) -> Option<Measured> {
    let reps = 9;
    // Fixed time of a step.
    let one = Bench::new(&chain(4, 1, None), 4, 1)?.median(reps * 4)?;
    let long = Bench::new(&chain(4, CHAIN, None), 4, 1)?.median(reps)?;
    let step_seconds = ((long - one) / (CHAIN - 1) as f64).max(0.0);
    // Products: a chain of `len` products of n a device less a chain of one, per product
    // less its step's fixed time (the pool's threads stay awake through a run, as in a
    // step); on one device, then on one device per thread.
    let rates = |devices: usize| -> Option<Vec<[f64; 2]>> {
        let mesh = (devices > 1).then_some(devices);
        let mut out = Vec::new();
        for n in GEMM_SIZES {
            let flops = 2.0 * (n * n * n) as f64;
            // About 8 ms of products a run at 50 GFLOP/s, at least 4 and at most 50.
            let len = ((4e8 / flops) as usize).clamp(4, 50);
            let reps = if n >= 256 { 5 } else { reps };
            let one = Bench::new(&chain_of(n, 1, mesh, false), n, devices)?.median(reps)?;
            let many = Bench::new(&chain_of(n, len, mesh, false), n, devices)?.median(reps)?;
            let each = (many - one) / (len - 1) as f64 - step_seconds;
            out.push([n as f64, flops / each.max(1e-9)]);
        }
        Some(out)
    };
    let gemm_rates = rates(1)?;
    let gemm_rates_per_thread = if threads > 1 {
        rates(threads)?
    } else {
        gemm_rates.clone()
    };
    // Collective start-up, past the devices' steps.
    let d = COLLECTIVE_DEVICES;
    let short = Bench::new(&chain(4, 1, Some(d)), 4, d)?.median(reps)?;
    let long = Bench::new(&chain(4, CHAIN / 4, Some(d)), 4, d)?.median(reps)?;
    let per_pair = (long - short) / (CHAIN / 4 - 1) as f64;
    let rounds = d.div_ceil(threads.max(1)) as f64;
    let collective_seconds = (per_pair - rounds * step_seconds).max(0.0);
    // Fused elementwise chains, one device per thread, bytes as the plan counts them.
    let (n, devices) = (ELEMENTWISE_N, threads.max(1));
    let chain = |len: usize| -> Option<(f64, f64)> {
        let text = elementwise_chain(n, len, devices);
        let cost = StepCost::of(&ir::text::parse(&text).ok()?);
        let elementwise = cost.ops.iter().filter(|o| o.family == Family::Elementwise);
        let bytes: f64 = elementwise.map(|o| o.bytes as f64).sum();
        Some((Bench::new(&text, n, devices)?.median(reps)?, bytes))
    };
    let ((short, short_bytes), (long, long_bytes)) = (chain(1)?, chain(ELEMENTWISE_GROUPS)?);
    // Each group is a fused kernel and a reshape: two steps per device.
    let fixed = 2.0 * (ELEMENTWISE_GROUPS - 1) as f64 * step_seconds;
    let seconds = (long - short - fixed).max(1e-9);
    let elementwise_bytes_per_s = (long_bytes - short_bytes) * devices as f64 / seconds;
    Some(Measured {
        step_seconds,
        gemm_rates,
        gemm_rates_per_thread,
        collective_seconds,
        elementwise_bytes_per_s,
    })
}
