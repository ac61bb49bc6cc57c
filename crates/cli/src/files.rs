//! File access for the commands: reading programs and tensors, writing outputs atomically.

use anyhow::{Context, Result};
use ir::Program;
use runtime::HostTensor;
use std::collections::HashMap;
use std::path::Path;

/// Read and parse a program in text form.
pub fn read_program(path: &Path) -> Result<Program> {
    let src = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read program {}", path.display()))?;
    ir::text::parse(&src).with_context(|| format!("{}", path.display()))
}

/// Read every tensor of a safetensors file.
pub fn read_tensors(path: &Path) -> Result<HashMap<String, HostTensor>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read tensors {}", path.display()))?;
    let (tensors, _meta) = runtime::io::read_safetensors(&bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    Ok(tensors.into_iter().collect())
}

/// Write bytes to `path` atomically: a temporary file in the same directory, then rename.
/// On failure nothing is left behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "{} is a directory; give a file path such as {}",
            path.display(),
            path.join("out.safetensors").display()
        );
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::write(&tmp, bytes)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot move output into {}", path.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Refuse to run `p` (a per-device program) on `devices` devices of this process when its
/// planned peak, plus `extra` bytes the command holds besides, exceeds the memory available
/// (or `max`).
pub fn check_memory(
    what: &str,
    p: &Program,
    devices: usize,
    extra: u64,
    max: Option<u64>,
) -> Result<()> {
    let peak = train::memory::program_peak(p);
    let need = peak.saturating_mul(devices as u64).saturating_add(extra);
    let names: Vec<(String, &ir::Type)> = p
        .instrs
        .iter()
        .enumerate()
        .map(|(i, ins)| {
            let name = match &ins.op {
                ir::Op::Parameter { name } => name.clone(),
                _ => format!("%{i} ({})", ins.op.name()),
            };
            (name, &ins.ty)
        })
        .collect();
    train::memory::check(
        what,
        need,
        format!(
            "{} per device at its peak x {devices} device(s), {} besides",
            train::memory::human(peak),
            train::memory::human(extra)
        ),
        max,
        || train::memory::biggest(names.iter().map(|(n, t)| (n.as_str(), *t)), 3),
    )?;
    Ok(())
}

/// A size in bytes: a number with an optional unit (`B`, `K`/`KB`/`KiB`, `M`.., `G`.., `T`..;
/// all powers of 1024), e.g. `16GiB`, `512M`, `1.5T`.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write e.g. 16GiB, 512M or 1000000"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}`; use B, K, M, G or T"
            ))
        }
    };
    let bytes = value * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("`{text}` is not a usable size"));
    }
    Ok(bytes as u64)
}

/// Write named tensors as one safetensors file, atomically.
pub fn write_tensors(path: &Path, tensors: &[(String, &HostTensor)]) -> Result<()> {
    let bytes = runtime::io::write_safetensors(tensors, None)
        .with_context(|| format!("cannot encode {}", path.display()))?;
    write_atomic(path, &bytes)
}
