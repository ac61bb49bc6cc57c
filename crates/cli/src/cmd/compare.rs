//! `gshard compare`: the dense baseline against MoE models with several expert counts, on
//! the same data, steps and seed, at equal per-token FLOPs (each expert has half the dense
//! FFN's hidden size, so top-2 routing computes what the dense FFN computes). Prints one
//! markdown table: dev loss, dev BLEU, tokens/s.

use super::train::{ensure_corpus, load_config};
use anyhow::Result;
use std::path::PathBuf;
use train::trainer::{self, RunOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Base config (defaults: the main job's).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Steps per model.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Expert counts to compare; 0 is the dense baseline.
    #[arg(long, value_delimiter = ',', default_value = "0,4,16,64")]
    experts: Vec<usize>,
    /// Parent directory of the runs.
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Corpus directory.
    #[arg(long)]
    data: Option<String>,
}

pub fn main(a: Args) -> Result<()> {
    let mut base = load_config(a.config.as_deref())?;
    base.steps = a.steps;
    base.checkpoint_every = 0;
    if let Some(d) = &a.data {
        base.data.dir = d.clone();
    }
    let corpus = ensure_corpus(&base.data.dir)?;
    let mut rows = Vec::new();
    for &e in &a.experts {
        let mut cfg = base.clone();
        cfg.model.experts = e;
        if e > 0 {
            cfg.model.expert_dim = (cfg.model.ffn_dim / 2).max(1);
        }
        cfg.validate()?;
        let name = if e == 0 {
            "dense".to_string()
        } else {
            format!("moe{e}")
        };
        eprintln!("training {name} ({} steps)", cfg.steps);
        // Each row is a fresh run in a directory of its own that `compare` owns.
        let opts = RunOptions {
            overwrite: true,
            ..RunOptions::new(a.out.join(&name))
        };
        let r = trainer::run(&cfg, &corpus, &opts, &mut |_| {})?;
        let bleu = r.scores.as_ref().map_or(f64::NAN, |s| s.bleu.score);
        eprintln!(
            "  dev loss {:.3}, BLEU {bleu:.2}, {:.0} tokens/s",
            r.dev_loss, r.tokens_per_s
        );
        rows.push((name, e, r.dev_loss, bleu, r.tokens_per_s));
    }
    println!("| model | experts | dev loss | dev BLEU | tokens/s |\n|---|---|---|---|---|");
    for (name, e, dl, bleu, tps) in rows {
        println!(
            "| {name} | {} | {dl:.3} | {bleu:.2} | {tps:.0} |",
            if e == 0 { "-".into() } else { e.to_string() }
        );
    }
    println!(
        "\n(same data, seed and {} steps on mesh {}; MoE every {} FFN, top-2 experts of hidden size {} vs the dense FFN's {})",
        base.steps,
        base.mesh.describe(),
        base.model.moe_every,
        (base.model.ffn_dim / 2).max(1),
        base.model.ffn_dim
    );
    Ok(())
}
