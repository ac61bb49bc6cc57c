//! `gshard plan`: plan a training run without running it (the `plan` crate): per-device
//! peak memory and what it holds, whether it fits the hardware, FLOPs and collective bytes
//! per device, and the step time on a hardware profile. A run config (`--config`) or a
//! preset of GShard's models (`--preset`), a mesh, a hardware profile (a built-in name or
//! a TOML file); `--remat`, `--precision` and `--shard-weights` change the run config as
//! they do for `gshard train`; `--json` prints one object; `--png FILE` also draws the
//! memory and step-time breakdowns as bar charts. `--search --devices N --memory 16GiB`
//! plans every layout of the config on N devices (`plan::search`) and prints the fastest
//! that fit.

use anyhow::{Context, Result};
use plan::hardware::Hardware;
use plan::{PlanOptions, Preset};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The run config (TOML) to plan; without it and --preset, the default run.
    #[arg(long, conflicts_with = "preset")]
    config: Option<PathBuf>,
    /// One of GShard's models at full size: gshard-128e-12l ... gshard-2048e-36l
    /// (gshard-600b), gshard-2048e-60l (gshard-1t).
    #[arg(long)]
    preset: Option<String>,
    /// The mesh, e.g. `expert=2048` or `data=2,expert=4` (default: the config's or preset's).
    #[arg(long)]
    mesh: Option<String>,
    /// Weight-update sharding over this mesh axis (`mesh.shard_weights`), as in `gshard train`.
    #[arg(long)]
    shard_weights: Option<String>,
    /// Rematerialisation (`model.remat`): `none`, `layer`, `dots`, `marked` (the sublayers
    /// `model.checkpoint` marks) or `scopes:PATH,PATH`, as in `gshard train`.
    #[arg(long, value_name = "POLICY")]
    remat: Option<String>,
    /// `bf16` (mixed precision) or `f32`: overrides `model.precision`, as in `gshard train`.
    #[arg(long, value_name = "f32|bf16")]
    precision: Option<train::config::Precision>,
    /// A hardware profile: tpu-v3, a100-80gb, h100-80gb, h200, this-cpu (measured now), or
    /// a profile file ending in .toml.
    #[arg(long, default_value = "tpu-v3")]
    hardware: String,
    /// Tokens the training-days figure is for.
    #[arg(long, default_value_t = 1e12)]
    tokens: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Also draw the memory and step-time breakdowns as bar charts to this PNG file.
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    /// Search the layouts (mesh, weight sharding, remat, capacity factor) of the config on
    /// --devices devices that fit --memory, fastest first.
    #[arg(long, conflicts_with_all = ["mesh", "png"])]
    search: bool,
    /// Devices to search over (default: the config's).
    #[arg(long, requires = "search")]
    devices: Option<usize>,
    /// Memory per device for --search: 16GiB, 2GB, 512MiB or bytes (default: the
    /// hardware's per device).
    #[arg(long, requires = "search")]
    memory: Option<String>,
    /// How many layouts --search prints.
    #[arg(long, default_value_t = 5, requires = "search")]
    top: usize,
}

/// The report's memory breakdown (peak per device) and step-time breakdown as bar charts.
fn draw(report: &plan::Report, path: &std::path::Path) -> Result<()> {
    let (mem_unit, mem_scale) = if report.peak_bytes_per_device >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let memory: Vec<(String, f64)> = report
        .breakdown
        .parts()
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(name, b)| (name.to_string(), *b as f64 / mem_scale))
        .collect();
    let t = &report.time;
    let (time_unit, time_scale) = if report.step_seconds >= 1.0 {
        ("s", 1.0)
    } else {
        ("ms", 1e-3)
    };
    let mut time: Vec<(String, f64)> = t
        .compute
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .chain(t.collectives.iter().map(|(k, v)| (k.clone(), *v)))
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, v)| (k, v / time_scale))
        .collect();
    time.sort_by(|a, b| b.1.total_cmp(&a.1));
    let title = format!(
        "{}: mesh {} on {}",
        report.label, report.mesh, report.hardware
    );
    let panels = [
        (
            format!("memory per device at the peak ({mem_unit})"),
            mem_unit.to_string(),
            memory,
        ),
        (
            format!("step time by part ({time_unit})"),
            time_unit.to_string(),
            time,
        ),
    ];
    train::plots::bars(path, &title, &panels)?;
    Ok(())
}

/// The hardware profile `name`: a built-in, `this-cpu` measured now, or a TOML file.
pub fn hardware(name: &str) -> Result<Hardware> {
    if name.ends_with(".toml") {
        let text = std::fs::read_to_string(name)
            .with_context(|| format!("cannot read hardware profile {name}"))?;
        return Ok(Hardware::from_toml(&text, name)?);
    }
    if name == "this-cpu" {
        Hardware::built_in(name)?;
        return Ok(Hardware::this_cpu());
    }
    Ok(Hardware::built_in(name)?)
}

pub fn main(a: Args) -> Result<()> {
    let (mut cfg, label) = match (&a.preset, &a.config) {
        (Some(name), _) => {
            let cfg = plan::preset_config(name)?;
            let label = Preset::find(name).map_or(name.as_str(), |p| p.name);
            (cfg, label.to_string())
        }
        (None, config) => {
            let cfg = crate::cmd::train::load_config(config.as_deref())?;
            let label = config
                .as_ref()
                .map_or("the default run".to_string(), |p| p.display().to_string());
            (cfg, label)
        }
    };
    crate::cmd::train::apply_mesh(&mut cfg, None, a.mesh.as_deref())?;
    if let Some(axis) = &a.shard_weights {
        cfg.mesh.shard_weights = axis.clone();
    }
    if let Some(r) = &a.remat {
        cfg.model.remat = r.clone();
    }
    if let Some(p) = a.precision {
        cfg.model.precision = p;
    }
    if !(a.tokens.is_finite() && a.tokens > 0.0) {
        anyhow::bail!("--tokens {}: use a finite count > 0", a.tokens);
    }
    if let Some(path) = &a.png {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            anyhow::bail!(
                "--png {}: the directory {} does not exist; create it or write elsewhere",
                path.display(),
                dir.display()
            );
        }
    }
    let memory = match &a.memory {
        Some(text) => Some(plan::search::parse_bytes(text).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let hw = hardware(&a.hardware)?;
    let mut opts = PlanOptions::new(hw, &label);
    opts.tokens = a.tokens;
    opts.preset = a.preset.as_deref().and_then(Preset::find).copied();
    if a.search {
        let devices = a.devices.unwrap_or_else(|| cfg.devices());
        let d = &opts.hardware.device;
        let memory_bytes = memory.unwrap_or(if d.shared_by_devices {
            (d.memory_bytes / devices.max(1) as f64) as u64
        } else {
            d.memory_bytes as u64
        });
        let s = plan::search::SearchOptions {
            devices,
            memory_bytes,
            top: a.top,
        };
        let found = plan::search::search(&cfg, &opts, &s)?;
        if a.json {
            println!("{}", serde_json::to_string(&found.candidates)?);
        } else {
            print!("{}", plan::search::render(&found, &s));
        }
        return Ok(());
    }
    let report = plan::plan(&cfg, &opts)?;
    if let Some(path) = &a.png {
        draw(&report, path)?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", plan::text::render(&report));
    }
    Ok(())
}
