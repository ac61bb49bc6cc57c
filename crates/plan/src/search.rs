//! Searching for a layout (`gshard plan --search`): every way to run a config on `N`
//! devices within a memory limit, fastest first.
//!
//! The candidates are every mesh `data x expert x model` whose product is `N` (meshes the
//! config's validation refuses, because an axis does not divide the dims it splits, are
//! counted and skipped), weight-update sharding off or over each axis of size above 1,
//! rematerialisation `none`, `layer` or `dots` (and `marked` when the config's
//! `model.checkpoint` marks sublayers), and the config's capacity factor with 1.0 and 2.0
//! where they differ. Each is planned by [`crate::plan`] (the same program,
//! memory plan and time model as `gshard plan`), in parallel over the pool; those whose
//! per-device peak plus the inputs held between their uses fits the limit are ranked by
//! predicted step time. When none fits, the error names the smallest footprint found and
//! the fix.

use crate::{plan, PlanError, PlanOptions, Report};
use rayon::prelude::*;
use serde::Serialize;
use thiserror::Error;
use train::config::TrainConfig;
use train::memory::human;

/// What to search.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    pub devices: usize,
    /// Bytes one device may hold (peak plus held inputs).
    pub memory_bytes: u64,
    /// How many of the fitting layouts to return, fastest first.
    pub top: usize,
}

/// One layout and its plan.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub data: usize,
    pub expert: usize,
    pub model: usize,
    /// The axis weights are sharded over ("" = none).
    pub shard_weights: String,
    pub remat: String,
    pub capacity_factor: f64,
    /// `--mesh` as `gshard train` and `gshard plan` take it.
    pub mesh: String,
    pub step_seconds: f64,
    pub compute_seconds: f64,
    pub collective_seconds: f64,
    pub peak_bytes_per_device: u64,
    /// Peak plus the inputs held between their uses: what must fit.
    pub resident_bytes_per_device: u64,
    /// The largest part of the step and its seconds.
    pub dominant: String,
    pub dominant_seconds: f64,
    /// One line of why it ranks where it does.
    pub why: String,
}

/// What the search found.
#[derive(Clone, Debug, Serialize)]
pub struct Found {
    /// The fitting layouts, fastest first (at most `top`).
    pub candidates: Vec<Candidate>,
    /// Layouts planned, refused by the config's validation, and fitting the limit.
    pub planned: usize,
    pub refused: usize,
    pub fitting: usize,
}

/// Why a search found nothing.
#[derive(Debug, Error)]
pub enum SearchError {
    #[error("--devices 0: search at least 1 device")]
    NoDevices,
    #[error("no layout of {devices} devices is valid for this config ({reason}); use a device count its dims divide")]
    NoneValid { devices: usize, reason: String },
    #[error("no layout of {devices} devices fits {limit} per device: the smallest found needs {smallest} ({layout}); raise --memory to at least {smallest} or search more devices")]
    NoneFits {
        devices: usize,
        limit: String,
        smallest: String,
        layout: String,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Every `(data, expert, model)` with product `n`.
pub fn meshes(n: usize) -> Vec<(usize, usize, usize)> {
    let divisors = |x: usize| (1..=x).filter(move |d| x.is_multiple_of(*d));
    let mut out = Vec::new();
    for d in divisors(n) {
        for e in divisors(n / d) {
            out.push((d, e, n / d / e));
        }
    }
    out
}

/// The configs searched (see the module doc), before validation.
pub fn layouts(cfg: &TrainConfig, devices: usize) -> Vec<TrainConfig> {
    let mut factors = vec![cfg.model.capacity_factor];
    for f in [1.0, 2.0] {
        if !factors.contains(&f) {
            factors.push(f);
        }
    }
    let mut remats = vec!["none", "layer", "dots"];
    if !cfg.model.checkpoint.is_empty() {
        remats.push("marked");
    }
    let mut out = Vec::new();
    for (d, e, m) in meshes(devices) {
        let mut shard = vec![String::new()];
        for (axis, size) in [("data", d), ("expert", e), ("model", m)] {
            if size > 1 {
                shard.push(axis.to_string());
            }
        }
        for s in &shard {
            for &remat in &remats {
                for &f in &factors {
                    let mut c = cfg.clone();
                    c.mesh.data = d;
                    c.mesh.expert = e;
                    c.mesh.model = m;
                    c.mesh.shard_weights = s.clone();
                    c.model.remat = remat.to_string();
                    c.model.capacity_factor = f;
                    out.push(c);
                }
            }
        }
    }
    out
}

/// The mesh of `c` as `--mesh` takes it.
fn mesh_spec(c: &TrainConfig) -> String {
    format!(
        "data={},expert={},model={}",
        c.mesh.data, c.mesh.expert, c.mesh.model
    )
}

/// A layout in words: `data=2,expert=4,model=1, remat none, capacity 2, weights sharded over data`.
fn describe(c: &TrainConfig) -> String {
    let mut s = format!(
        "{}, remat {}, capacity {}",
        mesh_spec(c),
        c.model.remat,
        c.model.capacity_factor
    );
    if !c.mesh.shard_weights.is_empty() {
        s += &format!(", weights sharded over {}", c.mesh.shard_weights);
    }
    s
}

fn candidate(c: &TrainConfig, r: &Report, limit: u64) -> Candidate {
    let (dominant, dominant_seconds) = r.time.dominant();
    let share = 100.0 * dominant_seconds / r.step_seconds.max(1e-300);
    let why = format!(
        "step {:.4} s (compute {:.4} s, collectives {:.4} s); peak {} + {} held = {} of {}; largest part {dominant} {:.4} s ({share:.0} %)",
        r.step_seconds,
        r.time.compute_seconds,
        r.time.collective_seconds,
        human(r.peak_bytes_per_device),
        human(r.inputs_elsewhere_bytes),
        human(r.resident_bytes_per_device),
        human(limit),
        dominant_seconds,
    );
    Candidate {
        data: c.mesh.data,
        expert: c.mesh.expert,
        model: c.mesh.model,
        shard_weights: c.mesh.shard_weights.clone(),
        remat: c.model.remat.clone(),
        capacity_factor: c.model.capacity_factor,
        mesh: mesh_spec(c),
        step_seconds: r.step_seconds,
        compute_seconds: r.time.compute_seconds,
        collective_seconds: r.time.collective_seconds,
        peak_bytes_per_device: r.peak_bytes_per_device,
        resident_bytes_per_device: r.resident_bytes_per_device,
        dominant,
        dominant_seconds,
        why,
    }
}

/// Search the layouts of `cfg` on `s.devices` devices (see the module doc).
pub fn search(
    cfg: &TrainConfig,
    opts: &PlanOptions,
    s: &SearchOptions,
) -> Result<Found, SearchError> {
    if s.devices == 0 {
        return Err(SearchError::NoDevices);
    }
    let all = layouts(cfg, s.devices);
    let (valid, refused): (Vec<_>, Vec<_>) = all.into_iter().partition(|c| c.validate().is_ok());
    if valid.is_empty() {
        let reason = refused
            .first()
            .and_then(|c| c.validate().err())
            .map_or_else(String::new, |e| e.to_string());
        return Err(SearchError::NoneValid {
            devices: s.devices,
            reason,
        });
    }
    let plans: Vec<(TrainConfig, Report)> = valid
        .into_par_iter()
        .with_max_len(1)
        .map(|c| plan(&c, opts).map(|r| (c, r)))
        .collect::<Result<_, _>>()?;
    let planned = plans.len();
    let mut fit: Vec<&(TrainConfig, Report)> = plans
        .iter()
        .filter(|(_, r)| r.resident_bytes_per_device <= s.memory_bytes)
        .collect();
    if fit.is_empty() {
        let (c, r) = plans
            .iter()
            .min_by_key(|(_, r)| r.resident_bytes_per_device)
            .expect("at least one plan");
        return Err(SearchError::NoneFits {
            devices: s.devices,
            limit: human(s.memory_bytes),
            smallest: human(r.resident_bytes_per_device),
            layout: describe(c),
        });
    }
    fit.sort_by(|a, b| a.1.step_seconds.total_cmp(&b.1.step_seconds));
    let fitting = fit.len();
    let candidates = fit
        .into_iter()
        .take(s.top)
        .map(|(c, r)| candidate(c, r, s.memory_bytes))
        .collect();
    Ok(Found {
        candidates,
        planned,
        refused: refused.len(),
        fitting,
    })
}

/// Bytes from `16GiB`, `2GB`, `512MiB`, `1.5GiB` or plain `1073741824` (a `B` alone is
/// bytes; decimal units are powers of 1,000, binary ones of 1,024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => f64::NAN,
    };
    let v: f64 = num.parse().unwrap_or(f64::NAN);
    let bytes = v * scale;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(format!(
            "--memory {text}: use a size such as 16GiB, 2GB, 512MiB or a byte count"
        ));
    }
    Ok(bytes as u64)
}

/// The search as text: a header, then one line per candidate.
pub fn render(found: &Found, s: &SearchOptions) -> String {
    let mut out = format!(
        "{} layouts of {} devices planned ({} refused by the config), {} fit {} per device; fastest first:\n",
        found.planned,
        s.devices,
        found.refused,
        found.fitting,
        human(s.memory_bytes)
    );
    for (i, c) in found.candidates.iter().enumerate() {
        let mut layout = format!(
            "--mesh {} --remat {} capacity {}",
            c.mesh, c.remat, c.capacity_factor
        );
        if !c.shard_weights.is_empty() {
            layout += &format!(" --shard-weights {}", c.shard_weights);
        }
        out += &format!("{}. {layout}: {}\n", i + 1, c.why);
    }
    out
}
