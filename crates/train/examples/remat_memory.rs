//! Rematerialisation measured: for the main job's model (2+2 layers) and a 12+12-layer one,
//! each `model.remat` policy's (`marked` with the model marking its feed-forward, then also
//! its attention sublayers) executor-measured peak memory per device over a training
//! step on the main job's mesh (data=1 x expert=2, in process), the share of the step's
//! FLOPs that recomputes forward values, and the step time. The batch is synthetic (packed
//! rows of four 8-token pairs); memory and FLOPs do not depend on the tokens, the build
//! profile or the host (step times do: read them from a release build on an idle host).
//!
//! ```text
//! cargo run -p train --example remat_memory [-- STEPS]
//! ```

use ir::{DType, Type};
use runtime::HostTensor;
use spmd::report::summary::flops;
use std::collections::HashMap;
use std::time::Instant;
use train::config::TrainConfig;
use train::trainer::{build_programs, step_program, Trainer};

/// A packed batch of `cfg`'s shape: four pairs of 8 tokens per row.
fn batch(cfg: &TrainConfig, vocab: usize) -> HashMap<String, HostTensor> {
    let (b, l) = (cfg.data.batch_size, cfg.data.max_len);
    let n = b * l;
    let tok = |i: usize| (4 + (i * 7919 + 13) % (vocab - 4)) as f64;
    let seg: Vec<f64> = (0..n).map(|i| (1 + (i % l) / 8) as f64).collect();
    let pos: Vec<f64> = (0..n).map(|i| ((i % l) % 8) as f64).collect();
    let src: Vec<f64> = (0..n).map(tok).collect();
    let tgt: Vec<f64> = (0..n).map(|i| tok(i + 3)).collect();
    let int = |v: &[f64]| HostTensor::from_f64_values(Type::new(DType::I32, vec![b, l]), v);
    HashMap::from([
        ("src".to_string(), int(&src)),
        ("src_seg".to_string(), int(&seg)),
        ("src_pos".to_string(), int(&pos)),
        ("tgt_in".to_string(), int(&tgt)),
        ("tgt_out".to_string(), int(&src)),
        ("tgt_seg".to_string(), int(&seg)),
        ("tgt_pos".to_string(), int(&pos)),
        (
            "tgt_weight".to_string(),
            HostTensor::from_f64_values(Type::new(DType::F32, vec![b, l]), &vec![1.0; n]),
        ),
    ])
}

fn mib(b: usize) -> String {
    format!("{:.2}", b as f64 / (1u64 << 20) as f64)
}

fn main() {
    let steps: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("STEPS is a number"))
        .unwrap_or(5);
    println!("| model | remat | peak memory per device (MiB) | recomputed FLOPs / step FLOPs | step (s, median of {steps}) |");
    println!("|---|---|---|---|---|");
    for (layers, name) in [(2, "main job, 2+2 layers"), (12, "12+12 layers")] {
        let policies: [(&str, &[&str]); 5] = [
            ("none", &[]),
            ("layer", &[]),
            ("dots", &[]),
            ("marked", &["ffn"]),
            ("marked", &["attention", "ffn"]),
        ];
        for (policy, marks) in policies {
            let mut cfg = TrainConfig::default();
            cfg.model.enc_layers = layers;
            cfg.model.dec_layers = layers;
            cfg.model.remat = policy.to_string();
            cfg.model.checkpoint = marks.iter().map(|m| m.to_string()).collect();
            let policy = if marks.is_empty() {
                policy.to_string()
            } else {
                format!("{policy} {marks:?}")
            };
            cfg.validate().expect("valid config");
            let vocab = cfg.data.vocab_size;
            let step = step_program(&cfg, vocab).expect("step program");
            let p = &step.program;
            let total: u64 = (0..p.len()).map(|i| flops(p, i)).sum();
            let again: u64 = step.recomputed.iter().map(|v| flops(p, v.index())).sum();
            let programs = build_programs(&cfg, vocab).expect("programs");
            let mut tr = Trainer::new(&cfg, programs, None, 0).expect("trainer");
            let b = batch(&cfg, vocab);
            let mut times = Vec::new();
            for _ in 0..steps {
                let t0 = Instant::now();
                tr.train_step(&b).expect("step");
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            println!(
                "| {name} | {policy} | {} | {:.1} % | {:.3} |",
                mib(tr.peak_bytes_per_device),
                100.0 * again as f64 / total as f64,
                times[times.len() / 2]
            );
        }
    }
}
