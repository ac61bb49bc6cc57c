//! Memory before running: what a program (or a training run) will hold, from its planned
//! per-device peak (the executor's policy: every value freed after its last use), checked
//! against the memory this host has available, so a program that cannot fit is refused with
//! one line naming its size and its biggest tensors, before a byte is allocated.

use ir::{Program, Type};
use thiserror::Error;

/// Most devices one process runs as tasks (more is not a mesh this host can step through in
/// useful time: run them as MPI ranks across machines).
pub const MAX_IN_PROCESS_DEVICES: usize = 4096;

/// Refuse `devices` in-process devices beyond [`MAX_IN_PROCESS_DEVICES`], naming `flag`.
pub fn check_in_process_devices(devices: usize, flag: &str) -> Result<(), String> {
    if devices > MAX_IN_PROCESS_DEVICES {
        Err(format!(
            "{flag} asks for {devices} devices in this process; one process runs at most {MAX_IN_PROCESS_DEVICES} (as tasks on its cores): use fewer, or one device per MPI rank across machines (`mpirun -np N ... --backend mpi`)"
        ))
    } else {
        Ok(())
    }
}

/// A program or run that does not fit.
#[derive(Debug, Error)]
#[error("{what} needs about {} ({breakdown}) but {}; its biggest tensors: {biggest}; use a smaller model or batch, more devices, or --max-memory to set the limit", human(*need), limit.describe())]
pub struct MemoryError {
    pub what: String,
    pub need: u64,
    pub breakdown: String,
    pub limit: Limit,
    pub biggest: String,
}

/// The memory a check allows, and where that figure comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `--max-memory`.
    Given(u64),
    /// What the host has available now.
    Available(u64),
}

impl Limit {
    pub fn bytes(self) -> u64 {
        match self {
            Limit::Given(b) | Limit::Available(b) => b,
        }
    }
    fn describe(self) -> String {
        match self {
            Limit::Given(b) => format!("--max-memory allows {}", human(b)),
            Limit::Available(b) => format!("this host has {} available", human(b)),
        }
    }
}

/// Bytes as a short human string (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    runtime::alloc::human_bytes(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// The memory this host has available now (`MemAvailable` of `/proc/meminfo`), if known.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The limit to check against: `max` if given, else what the host has available. `None`
/// when neither is known (then nothing is refused).
pub fn limit(max: Option<u64>) -> Option<Limit> {
    match max {
        Some(m) => Some(Limit::Given(m)),
        None => available_bytes().map(Limit::Available),
    }
}

/// Planned peak bytes on one device of a (per-device) program.
pub fn program_peak(p: &Program) -> u64 {
    spmd::report::peak_bytes(p) as u64
}

/// `names` with their types, the largest first, as `name f32[..] 1.0 GiB` (at most `n`).
pub fn biggest<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Type)>, n: usize) -> String {
    let mut v: Vec<(&str, &Type)> = tensors.into_iter().collect();
    v.sort_by_key(|(_, t)| std::cmp::Reverse(t.size_bytes()));
    v.iter()
        .take(n)
        .map(|(name, t)| format!("`{name}` {t} {}", human(t.size_bytes() as u64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Refuse `need` bytes when over the limit (`max`, or the host's available memory).
pub fn check(
    what: &str,
    need: u64,
    breakdown: String,
    max: Option<u64>,
    biggest: impl FnOnce() -> String,
) -> Result<(), MemoryError> {
    match limit(max) {
        Some(limit) if need > limit.bytes() => Err(MemoryError {
            what: what.to_string(),
            need,
            breakdown,
            limit,
            biggest: biggest(),
        }),
        _ => Ok(()),
    }
}
