//! The README's load-balancing comparison: the main job's earlier settings (`bench/rows32.toml`:
//! width 64 on 8 devices, 64 rows of 32 tokens, long pairs cut, no dropout) trained twice on the
//! same corpus, seed and steps, once with GShard's auxiliary loss (`model.balance = "aux_loss"`,
//! the default) and once with DeepSeek-V3's bias balancing (`model.balance = "bias"`, `bias_rate =
//! 0.001`), through `trainer::run` as `gshard train` does. The table comes from the runs' metrics:
//! `bench/balance_table.py OUT/aux_loss OUT/bias` (`bench/balance.sh` runs both).
//!
//! `cargo run --release -p train --example balance -- DATA_DIR STEPS OUT_DIR`

use train::config::TrainConfig;
use train::data::Corpus;
use train::trainer::{run, Event, RunOptions};

/// The settings the README's comparison was measured with.
const ROWS32: &str = include_str!("../../../bench/rows32.toml");

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = args.get(1).map_or("data", String::as_str);
    let steps: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    let out = std::path::PathBuf::from(args.get(3).map_or("runs/balance", String::as_str));
    let corpus = Corpus::load(std::path::Path::new(data)).expect("a corpus (gshard data)");
    for balance in ["aux_loss", "bias"] {
        let mut cfg = TrainConfig::from_toml(ROWS32, "bench/rows32.toml").expect("rows32.toml");
        cfg.steps = steps;
        cfg.data.dir = data.to_string();
        cfg.model.balance = balance.to_string();
        let opts = RunOptions {
            overwrite: true,
            ..RunOptions::new(out.join(balance))
        };
        let r = run(&cfg, &corpus, &opts, &mut |e| {
            if let Event::Step { step, loss, .. } = e {
                if step % 50 == 0 {
                    eprintln!("{balance}: step {step} loss {loss:.3}");
                }
            }
        })
        .expect("the run");
        println!(
            "{balance}: dev loss {:.3}, BLEU {:.2}, {:.0} tokens/s",
            r.dev_loss,
            r.scores.as_ref().map_or(f64::NAN, |s| s.bleu.score),
            r.tokens_per_s
        );
    }
}
