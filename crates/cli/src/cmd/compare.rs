//! `gshard compare`: the dense baseline against MoE models with several expert counts (and
//! Shazeer's hierarchical MoE), on the same data and steps, each row trained with several
//! seeds. Every MoE model has top-2 experts of half the dense FFN's hidden size, so it
//! computes per token what the dense FFN computes. Prints one markdown table of
//! mean +- standard deviation over the seeds (dev loss, BLEU, chrF, tokens/s), the
//! parameters and training FLOPs per token, and says which differences exceed their error
//! bars.

use super::train::{ensure_corpus, load_config};
use anyhow::{bail, Result};
use std::path::PathBuf;
use train::config::TrainConfig;
use train::tokenizer::Tokenizer;
use train::trainer::{self, RunOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Base config (defaults: the main job's).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Steps per run.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Models to compare: 0 is the dense baseline, N a flat MoE of N experts, GxE a
    /// hierarchical MoE of G groups of E experts (e.g. `0,4,16,64,8x8`).
    #[arg(long, value_delimiter = ',', default_value = "0,4,16,64")]
    experts: Vec<String>,
    /// Seeds per model (the config's seed and the ones after it).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Parent directory of the runs.
    #[arg(long, default_value = "runs/compare")]
    out: PathBuf,
    /// Corpus directory.
    #[arg(long)]
    data: Option<String>,
}

/// One row of the comparison: which model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Model {
    Dense,
    Flat { experts: usize },
    Hierarchical { groups: usize, per_group: usize },
}

impl Model {
    fn parse(s: &str) -> Result<Model> {
        let num = |t: &str| -> Result<usize> {
            t.trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "--experts {s:?}: use 0 (dense), a number of experts (16) or groups x experts per group (8x8)"
                )
            })
        };
        Ok(match s.split_once('x') {
            Some((g, e)) => {
                let (groups, per_group) = (num(g)?, num(e)?);
                if groups < 2 || per_group < 2 {
                    bail!("--experts {s:?}: a hierarchical MoE needs at least 2 groups of at least 2 experts");
                }
                Model::Hierarchical { groups, per_group }
            }
            None => match num(s)? {
                0 => Model::Dense,
                experts => Model::Flat { experts },
            },
        })
    }

    fn name(self) -> String {
        match self {
            Model::Dense => "dense".into(),
            Model::Flat { experts } => format!("moe{experts}"),
            Model::Hierarchical { groups, per_group } => format!("moe{groups}x{per_group}"),
        }
    }

    fn experts_cell(self) -> String {
        match self {
            Model::Dense => "-".into(),
            Model::Flat { experts } => experts.to_string(),
            Model::Hierarchical { groups, per_group } => {
                format!("{} ({groups} groups of {per_group})", groups * per_group)
            }
        }
    }

    /// `base` with this model.
    fn config(self, base: &TrainConfig) -> TrainConfig {
        let mut cfg = base.clone();
        let half = (cfg.model.ffn_dim / 2).max(1);
        match self {
            Model::Dense => cfg.model.experts = 0,
            Model::Flat { experts } => {
                cfg.model.experts = experts;
                cfg.model.expert_dim = half;
                cfg.model.gating = "top2".into();
            }
            Model::Hierarchical { groups, per_group } => {
                cfg.model.experts = groups * per_group;
                cfg.model.expert_dim = half;
                cfg.model.gating = "hierarchical".into();
                cfg.model.expert_groups = groups;
                // One group per token, two experts in it: top-2 work per token.
                cfg.model.primary_k = 1;
                cfg.model.secondary_k = 2;
                cfg.model.balance = "aux_loss".into();
            }
        }
        cfg
    }
}

/// Mean and sample standard deviation (0 for a single value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeanStd {
    pub mean: f64,
    pub std: f64,
}

impl MeanStd {
    pub fn of(xs: &[f64]) -> MeanStd {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let std = if xs.len() > 1 {
            (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        MeanStd { mean, std }
    }

    /// Whether `self` and `other` differ by more than the sum of their standard deviations
    /// (their one-sigma error bars do not overlap).
    pub fn clearly_differs(self, other: MeanStd) -> bool {
        (self.mean - other.mean).abs() > self.std + other.std
    }

    fn cell(self, digits: usize) -> String {
        format!("{:.*} ± {:.*}", digits, self.mean, digits, self.std)
    }
}

/// What the runs of one model measured.
struct Row {
    model: Model,
    dev_loss: MeanStd,
    bleu: MeanStd,
    chrf: MeanStd,
    tokens_per_s: MeanStd,
    params: usize,
    flops_per_token: f64,
}

pub fn main(a: Args) -> Result<()> {
    if a.seeds == 0 {
        bail!("--seeds 0: give at least 1 (3 or more for error bars)");
    }
    let models: Vec<Model> = a
        .experts
        .iter()
        .map(|s| Model::parse(s))
        .collect::<Result<_>>()?;
    let mut base = load_config(a.config.as_deref())?;
    base.steps = a.steps;
    base.checkpoint_every = 0;
    if let Some(d) = &a.data {
        base.data.dir = d.clone();
    }
    for m in &models {
        m.config(&base).validate()?;
    }
    let corpus = ensure_corpus(&base.data.dir)?;
    let mut rows = Vec::new();
    for &model in &models {
        let (mut loss, mut bleu, mut chrf, mut tps) = (vec![], vec![], vec![], vec![]);
        let mut cost = None;
        for k in 0..a.seeds {
            let mut cfg = model.config(&base);
            cfg.seed = base.seed + k;
            let dir = a.out.join(model.name()).join(format!("seed{}", cfg.seed));
            eprintln!(
                "training {} seed {} ({} steps)",
                model.name(),
                cfg.seed,
                cfg.steps
            );
            // Each run is a fresh one in a directory of its own that `compare` owns.
            let opts = RunOptions {
                overwrite: true,
                ..RunOptions::new(dir.clone())
            };
            let r = trainer::run(&cfg, &corpus, &opts, &mut |_| {})?;
            let (b, c) = r
                .scores
                .as_ref()
                .map_or((f64::NAN, f64::NAN), |s| (s.bleu.score, s.chrf));
            eprintln!(
                "  dev loss {:.3}, BLEU {b:.2}, chrF {c:.1}, {:.0} tokens/s",
                r.dev_loss, r.tokens_per_s
            );
            loss.push(r.dev_loss);
            bleu.push(b);
            chrf.push(c);
            tps.push(r.tokens_per_s);
            if cost.is_none() {
                let vocab = Tokenizer::load(dir.join("tokenizer.json"))?.vocab_size();
                cost = Some(model_cost(&cfg, vocab)?);
            }
        }
        let (params, flops_per_token) = cost.expect("at least one seed ran");
        rows.push(Row {
            model,
            dev_loss: MeanStd::of(&loss),
            bleu: MeanStd::of(&bleu),
            chrf: MeanStd::of(&chrf),
            tokens_per_s: MeanStd::of(&tps),
            params,
            flops_per_token,
        });
    }
    print!("{}", table(&rows, &base, a.seeds));
    Ok(())
}

/// Trainable parameters and training-step FLOPs per token slot of `cfg`'s model.
fn model_cost(cfg: &TrainConfig, vocab: usize) -> Result<(usize, f64)> {
    let step = trainer::step_program(cfg, vocab)?;
    let params = step.params.iter().map(|p| p.ty.num_elements()).sum();
    let p = &step.program;
    let flops: u64 = (0..p.instrs.len())
        .map(|i| spmd::report::summary::flops(p, i))
        .sum();
    let slots = (cfg.data.batch_size * cfg.data.max_len) as f64;
    Ok((params, flops as f64 / slots))
}

/// The markdown table, its footnote, and which differences exceed their error bars.
fn table(rows: &[Row], base: &TrainConfig, seeds: u64) -> String {
    let mut s = String::from(
        "| model | experts | parameters | train MFLOP/token | dev loss | dev BLEU | dev chrF | tokens/s |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} |\n",
            r.model.name(),
            r.model.experts_cell(),
            r.params,
            r.flops_per_token / 1e6,
            r.dev_loss.cell(3),
            r.bleu.cell(2),
            r.chrf.cell(1),
            r.tokens_per_s.cell(0),
        ));
    }
    s.push_str(&format!(
        "\n(mean ± sample standard deviation over {seeds} seed(s); same data and {} steps on mesh {}; MoE every {} FFN, top-2 experts of hidden size {} vs the dense FFN's {})\n",
        base.steps,
        base.mesh.describe(),
        base.model.moe_every,
        (base.model.ffn_dim / 2).max(1),
        base.model.ffn_dim
    ));
    if seeds < 2 {
        s.push_str("one seed per model: no error bars, so no difference can be called clear\n");
        return s;
    }
    s.push_str("\ndifferences larger than their error bars (the one-sigma bars do not overlap):\n");
    let mut any = false;
    for (i, a) in rows.iter().enumerate() {
        for b in &rows[i + 1..] {
            for (what, x, y, lower_better) in [
                ("dev loss", a.dev_loss, b.dev_loss, true),
                ("dev BLEU", a.bleu, b.bleu, false),
                ("dev chrF", a.chrf, b.chrf, false),
            ] {
                if x.clearly_differs(y) {
                    any = true;
                    let better = if (x.mean < y.mean) == lower_better {
                        a
                    } else {
                        b
                    };
                    s.push_str(&format!(
                        "- {what}: {} {} vs {} {} ({} is better)\n",
                        a.model.name(),
                        x.cell(3),
                        b.model.name(),
                        y.cell(3),
                        better.model.name()
                    ));
                }
            }
        }
    }
    if !any {
        s.push_str("- none: every difference is within the error bars\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_parse_dense_flat_and_hierarchical() {
        assert_eq!(Model::parse("0").unwrap(), Model::Dense);
        assert_eq!(Model::parse("16").unwrap(), Model::Flat { experts: 16 });
        assert_eq!(
            Model::parse("8x8").unwrap(),
            Model::Hierarchical {
                groups: 8,
                per_group: 8
            }
        );
        for bad in ["x", "8x", "1x8", "-3", "many"] {
            let e = Model::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--experts"), "{bad}: {e}");
        }
        let h = Model::parse("4x2").unwrap().config(&TrainConfig::default());
        assert_eq!(
            (
                h.model.experts,
                h.model.expert_groups,
                h.model.gating.as_str()
            ),
            (8, 4, "hierarchical")
        );
    }

    #[test]
    fn mean_and_sample_standard_deviation() {
        let m = MeanStd::of(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m.mean - 2.5).abs() < 1e-12);
        assert!((m.std - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(MeanStd::of(&[7.0]).std, 0.0);
        let a = MeanStd {
            mean: 1.0,
            std: 0.1,
        };
        assert!(a.clearly_differs(MeanStd {
            mean: 1.3,
            std: 0.1
        }));
        assert!(!a.clearly_differs(MeanStd {
            mean: 1.15,
            std: 0.1
        }));
    }
}
