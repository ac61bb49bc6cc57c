//! The plan as text: what `gshard plan` prints without `--json`.

use crate::Report;
use std::fmt::Write;
use train::memory::human;

/// Seconds as a short string (`1.23 s`, `45.6 ms`, `7.8 us`).
pub fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

/// A count with an SI suffix (`600.1 G`).
pub fn si(x: f64) -> String {
    let (v, unit) = if x >= 1e12 {
        (x / 1e12, "T")
    } else if x >= 1e9 {
        (x / 1e9, "G")
    } else if x >= 1e6 {
        (x / 1e6, "M")
    } else if x >= 1e3 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    format!("{v:.1} {unit}")
}

/// The whole report.
pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}: {} parameters, mesh {} ({} devices), hardware {}",
        r.label,
        si(r.params as f64),
        r.mesh,
        r.devices,
        r.hardware
    );
    if let Some(p) = &r.preset {
        let _ = write!(
            o,
            "paper (GShard Table 1): {} parameters (ours {:.3}x)",
            si(p.paper_params),
            r.params as f64 / p.paper_params
        );
        // Table 3's rate is for the paper's mesh: one expert per device.
        if let Some(s) = p.paper_steps_per_s.filter(|_| r.devices == p.experts) {
            let ours = 1.0 / r.step_seconds.max(1e-300);
            let _ = write!(
                o,
                "; Table 3: {s:.2} steps/s (predicted {ours:.2}, {:.2}x)",
                ours / s
            );
        }
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "memory per device: peak {} at {} (+ {} of inputs held between their uses) = {} of {} ({})",
        human(r.peak_bytes_per_device),
        r.peak_at,
        human(r.inputs_elsewhere_bytes),
        human(r.resident_bytes_per_device),
        human(r.memory_bytes),
        if r.fits { "fits" } else { "does NOT fit" },
    );
    for (name, b) in r.breakdown.parts() {
        if b > 0 {
            let share = 100.0 * b as f64 / r.peak_bytes_per_device.max(1) as f64;
            let _ = writeln!(o, "  {name:<20} {:>12}  {share:5.1}%", human(b));
        }
    }
    if !r.largest_at_peak.is_empty() {
        let _ = writeln!(o, "largest buffers at the peak:");
        for b in &r.largest_at_peak {
            let _ = writeln!(
                o,
                "  {:>12}  {:<24} {} {}",
                human(b.bytes),
                b.ty,
                b.value,
                b.scope
            );
        }
    }
    let _ = writeln!(
        o,
        "compute per device: {}FLOP",
        si(r.flops_per_device as f64)
    );
    for (fam, f) in &r.flops_by_family {
        let _ = writeln!(o, "  {fam:<20} {:>12}FLOP", si(*f as f64));
    }
    let _ = writeln!(o, "collectives per device (bytes sent):");
    for c in &r.collective_bytes {
        let _ = writeln!(
            o,
            "  {:<20} [{}] x{:<4} {:>12}",
            c.kind,
            c.axes,
            c.count,
            human(c.bytes)
        );
    }
    let t = &r.time;
    let _ = writeln!(
        o,
        "step time {}: compute {}, collectives {} (largest part: {})",
        seconds(r.step_seconds),
        seconds(t.compute_seconds),
        seconds(t.collective_seconds),
        r.dominant
    );
    let mut parts: Vec<(String, f64)> = t
        .compute
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .chain(t.collectives.iter().map(|(k, v)| (k.clone(), *v)))
        .collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, s) in parts {
        let share = 100.0 * s / r.step_seconds.max(1e-300);
        let _ = writeln!(o, "  {name:<28} {:>10}  {share:5.1}%", seconds(s));
    }
    if r.comm_options.len() > 1 && r.time.collective_seconds > 0.0 {
        let _ = writeln!(
            o,
            "communication options (MPI backend), predicted step | all-to-all | all-reduce | hidden:"
        );
        let base = r.comm_options[0].step_seconds.max(1e-300);
        for c in &r.comm_options {
            let _ = writeln!(
                o,
                "  {:<34} {:>9} ({:>5.2}x) | {:>9} | {:>9} | {:>9}{}",
                c.option,
                seconds(c.step_seconds),
                base / c.step_seconds.max(1e-300),
                seconds(c.all_to_all_seconds),
                seconds(c.all_reduce_seconds),
                seconds(c.hidden_seconds),
                if c.note.is_empty() {
                    String::new()
                } else {
                    format!("\n      {}", c.note)
                }
            );
        }
    }
    let _ = writeln!(
        o,
        "MFU {:.1}%, {} tokens/step, {}tokens/s, {:.1} days for {}tokens",
        100.0 * r.mfu,
        r.tokens_per_step,
        si(r.tokens_per_s),
        r.days,
        si(r.tokens)
    );
    if !r.advice.is_empty() {
        let _ = writeln!(o, "to fit, largest first:");
        for a in &r.advice {
            let _ = writeln!(o, "  - {a}");
        }
    }
    let _ = writeln!(
        o,
        "planned in {:.2} s ({} instructions per device, {} plan steps)",
        r.plan_seconds, r.instructions, r.plan_steps
    );
    o
}
