//! Hardware profiles: a device's memory, memory bandwidth and peak FLOP rate per dtype, and
//! the links between devices with their topology. The built-in profiles are documented TOML
//! files (`crates/plan/hardware/*.toml`, each number with its source), embedded here; a user
//! file of the same form is read by the CLI and parsed by [`Hardware::from_toml`].
//! `this-cpu` is measured when asked for ([`Hardware::this_cpu`]).

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A hardware profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub name: String,
    pub description: String,
    pub device: Device,
    pub network: Network,
}

/// One device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Memory one device has, in bytes.
    pub memory_bytes: f64,
    /// Its memory bandwidth, bytes per second.
    pub memory_bytes_per_s: f64,
    /// Peak FLOP rate per dtype of the operands.
    pub peak_flops: PeakFlops,
    /// Every device of the mesh runs on this one machine's compute and memory (in-process
    /// devices): a step's work is every device's, and the memory is the machine's.
    #[serde(default)]
    pub shared_by_devices: bool,
    /// The fixed time of one executor step on a device (an instruction or a fused group of
    /// them), whatever its size: dispatch and buffer management on a CPU, a kernel launch
    /// on an accelerator. Seconds.
    #[serde(default)]
    pub step_seconds: f64,
    /// Cores the in-process devices share ([`Device::shared_by_devices`]): a device runs its
    /// steps one after another on one of them, so `d` devices pay the fixed step times of
    /// `ceil(d / threads)` devices.
    #[serde(default = "one")]
    pub threads: u32,
    /// The rate of `n x n x n` f32 products through the executor, `[n, FLOP/s]` pairs in
    /// increasing `n`: a dot of `M x K` by `K x N` runs at the rate of
    /// `n = 3 / (1/M + 1/N + 1/K)` (its FLOPs per element of its operands and result, as
    /// a cube's), interpolated in `log n` and held at the ends; other dtypes scale it by
    /// their peak over f32's. Empty: every dot at the peak.
    #[serde(default)]
    pub gemm_rates: Vec<[f64; 2]>,
    /// As `gemm_rates`, per thread while every thread runs a product of its own: the rate
    /// of in-process devices ([`Device::shared_by_devices`]) when a step has more than
    /// one, `min(devices, threads)` of them at once. Empty: `gemm_rates`.
    #[serde(default)]
    pub gemm_rates_per_thread: Vec<[f64; 2]>,
    /// Bytes per second of fused elementwise chains (all of the device's memory traffic
    /// at once): below `memory_bytes_per_s` where the kernels compute more than they
    /// move, as the executor's do. 0: `memory_bytes_per_s`.
    #[serde(default)]
    pub elementwise_bytes_per_s: f64,
}

impl Device {
    /// The memory rate of an instruction of `family`: fused elementwise chains at their
    /// measured rate where the profile has one, everything else at the memory bandwidth.
    pub fn bytes_per_s(&self, family: crate::cost::Family) -> f64 {
        let chains = self.elementwise_bytes_per_s;
        if family == crate::cost::Family::Elementwise && chains > 0.0 {
            chains.min(self.memory_bytes_per_s)
        } else {
            self.memory_bytes_per_s
        }
    }

    /// The FLOP rate of products of `m x k` by `k x n` with operands of `dtype`, on a
    /// step of `devices` devices.
    pub fn dot_flops_per_s(&self, dtype: ir::DType, m: u64, n: u64, k: u64, devices: usize) -> f64 {
        let peak = self.peak_flops.of(dtype);
        let concurrent = self.shared_by_devices && devices > 1;
        let (r, scale) = if concurrent && !self.gemm_rates_per_thread.is_empty() {
            let at_once = devices.min(self.threads.max(1) as usize) as f64;
            (&self.gemm_rates_per_thread, at_once)
        } else {
            (&self.gemm_rates, 1.0)
        };
        if r.is_empty() || m == 0 || n == 0 || k == 0 {
            return peak;
        }
        let cube = 3.0 / (1.0 / m as f64 + 1.0 / n as f64 + 1.0 / k as f64);
        let f32_rate = if cube <= r[0][0] {
            r[0][1]
        } else if cube >= r[r.len() - 1][0] {
            r[r.len() - 1][1]
        } else {
            let i = r.iter().position(|p| p[0] >= cube).unwrap_or(r.len() - 1);
            let (a, b) = (r[i - 1], r[i]);
            let t = (cube.ln() - a[0].ln()) / (b[0].ln() - a[0].ln());
            a[1] + t * (b[1] - a[1])
        };
        scale * f32_rate * peak / self.peak_flops.f32
    }
}

/// Peak FLOP rates, per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeakFlops {
    pub bf16: f64,
    pub f32: f64,
    pub f64: f64,
    pub i32: f64,
}

impl PeakFlops {
    /// The peak for operands of `dtype` (bool counts as i32).
    pub fn of(&self, dtype: ir::DType) -> f64 {
        match dtype {
            ir::DType::BF16 => self.bf16,
            ir::DType::F32 => self.f32,
            ir::DType::F64 => self.f64,
            ir::DType::I32 | ir::DType::Bool => self.i32,
        }
    }
}

/// How devices are connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// A bidirectional ring of the group's devices.
    Ring,
    /// A square 2-D torus of the group's devices (TPU's inter-chip interconnect).
    Torus2d,
    /// Islands of `island_size` devices on a switch (NVLink), joined by a network.
    Islands,
    /// Devices in one process: a collective copies through the machine's memory.
    SharedMemory,
}

/// The links between devices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub topology: Topology,
    /// One link's bandwidth each way, bytes per second (the network's, for islands).
    pub link_bytes_per_s: f64,
    /// Links per device (4 on a 2-D torus).
    #[serde(default = "one")]
    pub links: u32,
    /// A collective step's start-up time, seconds (alpha).
    pub latency_s: f64,
    /// Devices per island ([`Topology::Islands`]).
    #[serde(default)]
    pub island_size: Option<usize>,
    /// Bandwidth each way of a device inside its island, bytes per second.
    #[serde(default)]
    pub island_bytes_per_s: Option<f64>,
}

fn one() -> u32 {
    1
}

/// A profile that cannot be used.
#[derive(Debug, Error)]
pub enum HardwareError {
    #[error("unknown hardware `{name}`: use one of {known}, or a profile file ending in .toml")]
    Unknown { name: String, known: String },
    #[error("hardware profile {path}: {msg}")]
    Parse { path: String, msg: String },
}

/// The built-in profiles: `(name, TOML text)`.
pub const BUILT_IN: [(&str, &str); 5] = [
    ("tpu-v3", include_str!("../hardware/tpu-v3.toml")),
    ("a100-80gb", include_str!("../hardware/a100-80gb.toml")),
    ("h100-80gb", include_str!("../hardware/h100-80gb.toml")),
    ("h200", include_str!("../hardware/h200.toml")),
    ("this-cpu", include_str!("../hardware/this-cpu.toml")),
];

impl Hardware {
    /// Parse a profile; errors name the file and the field.
    pub fn from_toml(text: &str, path: &str) -> Result<Hardware, HardwareError> {
        let h: Hardware = toml::from_str(text).map_err(|e| HardwareError::Parse {
            path: path.to_string(),
            msg: e.to_string().replace('\n', " ").trim().to_string(),
        })?;
        h.validate().map_err(|msg| HardwareError::Parse {
            path: path.to_string(),
            msg,
        })?;
        Ok(h)
    }

    fn validate(&self) -> Result<(), String> {
        let rates = [
            ("device.memory_bytes", self.device.memory_bytes),
            ("device.memory_bytes_per_s", self.device.memory_bytes_per_s),
            ("device.peak_flops.bf16", self.device.peak_flops.bf16),
            ("device.peak_flops.f32", self.device.peak_flops.f32),
            ("device.peak_flops.f64", self.device.peak_flops.f64),
            ("device.peak_flops.i32", self.device.peak_flops.i32),
            ("network.link_bytes_per_s", self.network.link_bytes_per_s),
        ];
        for (field, v) in rates {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{field} = {v}: use a finite value > 0"));
            }
        }
        if !(self.device.step_seconds.is_finite() && self.device.step_seconds >= 0.0) {
            return Err("device.step_seconds: use a finite value >= 0".into());
        }
        let chains = self.device.elementwise_bytes_per_s;
        if !(chains.is_finite() && chains >= 0.0) {
            return Err(format!(
                "device.elementwise_bytes_per_s = {chains}: use a finite value >= 0 (0: the memory bandwidth)"
            ));
        }
        if self.device.threads == 0 {
            return Err("device.threads = 0: use at least 1".into());
        }
        for (field, rates) in [
            ("gemm_rates", &self.device.gemm_rates),
            ("gemm_rates_per_thread", &self.device.gemm_rates_per_thread),
        ] {
            if rates
                .iter()
                .any(|p| !(p[0] >= 1.0 && p[1].is_finite() && p[1] > 0.0))
                || rates.windows(2).any(|w| w[1][0] <= w[0][0])
            {
                return Err(format!(
                    "device.{field}: use [n, FLOP/s] pairs with n >= 1 increasing and rates > 0"
                ));
            }
        }
        if !(self.network.latency_s.is_finite() && self.network.latency_s >= 0.0) {
            return Err("network.latency_s: use a finite value >= 0".into());
        }
        if self.network.links == 0 {
            return Err("network.links = 0: use at least 1".into());
        }
        if self.network.topology == Topology::Islands
            && (self.network.island_size.is_none_or(|s| s == 0)
                || self.network.island_bytes_per_s.is_none_or(|b| b <= 0.0))
        {
            return Err(
                "topology \"islands\" needs network.island_size >= 1 and network.island_bytes_per_s > 0"
                    .into(),
            );
        }
        Ok(())
    }

    /// A built-in profile by name (`this-cpu` as written in its file, unmeasured: see
    /// [`Hardware::this_cpu`]).
    pub fn built_in(name: &str) -> Result<Hardware, HardwareError> {
        let (_, text) =
            BUILT_IN
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| HardwareError::Unknown {
                    name: name.to_string(),
                    known: BUILT_IN.map(|(n, _)| n).join(", "),
                })?;
        Hardware::from_toml(text, &format!("{name}.toml"))
    }

    /// This machine, measured now (about a second): the GEMM micro-kernel's rate on every
    /// pool thread (`runtime::probe::gemm_gflops`, as `gshard bench probe`), the rate of
    /// copying a buffer larger than the caches (memory and collectives), the memory
    /// available, and through the executor itself ([`crate::probe`]): the fixed time of a
    /// step, the rate of products from small to large, and the start-up of an in-process
    /// collective. A probe that cannot run here keeps the file's figure.
    pub fn this_cpu() -> Hardware {
        let mut h = Hardware::built_in("this-cpu").expect("the built-in profile parses");
        let threads = rayon::current_num_threads().max(1);
        h.device.threads = threads as u32;
        if let Some(g) = runtime::probe::gemm_gflops(0.3) {
            let f32 = g * 1e9 * threads as f64;
            h.device.peak_flops = PeakFlops {
                bf16: f32,
                f32,
                f64: f32 / 2.0,
                i32: f32 / 2.0,
            };
        }
        let copy = copy_bytes_per_s();
        h.device.memory_bytes_per_s = copy;
        h.network.link_bytes_per_s = copy;
        if let Some(avail) = train::memory::available_bytes() {
            h.device.memory_bytes = avail as f64;
        }
        if let Some(m) = crate::probe::measure(threads) {
            h.device.step_seconds = m.step_seconds;
            // No product runs faster than the micro-kernel on operands in cache: a rate
            // above it is the noise of a short timing.
            let f32 = h.device.peak_flops.f32;
            let threads_f = threads as f64;
            let cap = |r: Vec<[f64; 2]>, peak: f64| -> Vec<[f64; 2]> {
                r.into_iter().map(|[n, v]| [n, v.min(peak)]).collect()
            };
            h.device.gemm_rates = cap(m.gemm_rates, f32);
            h.device.gemm_rates_per_thread = cap(m.gemm_rates_per_thread, f32 / threads_f);
            h.network.latency_s = m.collective_seconds;
            h.device.elementwise_bytes_per_s = m.elementwise_bytes_per_s.min(copy);
        }
        h
    }
}

/// Bytes per second read plus written by copying 64 MiB buffers on every pool thread at
/// once, the best of a few rounds.
fn copy_bytes_per_s() -> f64 {
    use rayon::prelude::*;
    const LEN: usize = 16 << 20;
    let threads = rayon::current_num_threads().max(1);
    let src: Vec<Vec<f32>> = (0..threads).map(|t| vec![t as f32; LEN]).collect();
    let mut dst: Vec<Vec<f32>> = (0..threads).map(|_| vec![0.0f32; LEN]).collect();
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t0 = std::time::Instant::now();
        dst.par_iter_mut()
            .zip(src.par_iter())
            .for_each(|(d, s)| d.copy_from_slice(s));
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    (2 * LEN * 4 * threads) as f64 / best.max(1e-9)
}
