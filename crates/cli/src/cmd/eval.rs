//! `gshard eval` and `gshard translate`: use a run directory's checkpoint.

use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::path::PathBuf;
use train::data::{Corpus, Split};
use train::trainer;

#[derive(clap::Args)]
pub struct EvalArgs {
    /// Run directory (config.toml, tokenizer.json, checkpoint/).
    #[arg(long, default_value = "runs/default")]
    run: PathBuf,
    /// Which held-out split.
    #[arg(long, default_value = "test", value_parser = ["dev", "test"])]
    split: String,
    /// Pairs to evaluate (spread over the run's languages; at least 1).
    #[arg(long, default_value_t = 512, value_parser = at_least_one())]
    limit: usize,
    /// Beam width (default: the run's; 1 is greedy).
    #[arg(long, value_parser = at_least_one())]
    beam: Option<usize>,
    /// How to decode: `incremental` (cached keys and values) or `full` (the whole model
    /// re-run per output position; the same tokens, for checking).
    #[arg(long, value_enum, default_value_t = Decode::Incremental)]
    decode: Decode,
}

/// `--decode`: the decoding mode.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Decode {
    Incremental,
    Full,
}

impl Decode {
    fn options(self, beam: usize, length_penalty: f64) -> trainer::DecodeOptions {
        let mode = match self {
            Decode::Incremental => trainer::DecodeMode::Incremental,
            Decode::Full => trainer::DecodeMode::Full,
        };
        trainer::DecodeOptions::new(beam, length_penalty).mode(mode)
    }
}

#[derive(clap::Args)]
pub struct TranslateArgs {
    /// Run directory.
    #[arg(long, default_value = "runs/default")]
    run: PathBuf,
    /// Source language tag (one the run was trained on, e.g. `de`).
    #[arg(long)]
    lang: String,
    /// Sentences to translate; none = one per line on stdin.
    text: Vec<String>,
    /// Beam width (default: the run's; 1 is greedy).
    #[arg(long, value_parser = at_least_one())]
    beam: Option<usize>,
    /// How to decode: `incremental` (cached keys and values) or `full` (the whole model
    /// re-run per output position; the same tokens, for checking).
    #[arg(long, value_enum, default_value_t = Decode::Incremental)]
    decode: Decode,
}

/// A count of at least 1 (a beam of 0, or 0 pairs, is refused by the argument parser).
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

pub fn eval(a: EvalArgs) -> Result<()> {
    let run =
        trainer::load_run(&a.run).with_context(|| format!("loading run {}", a.run.display()))?;
    let langs = run.tok.langs().to_vec();
    let refs: Vec<&str> = langs.iter().map(String::as_str).collect();
    let corpus = Corpus::load_langs(std::path::Path::new(&run.cfg.data.dir), Some(&refs))
        .with_context(|| format!("loading the corpus from {}", run.cfg.data.dir))?;
    let split = if a.split == "dev" {
        Split::Dev
    } else {
        Split::Test
    };
    // The trainer's dev set: its rule for held-out pairs over its language order.
    let langs = trainer::select_langs(&run.cfg, &corpus)?;
    let min_words = run.cfg.data.min_english_words;
    let keep = |p: &&train::data::Pair| p.english.split_whitespace().count() >= min_words;
    let pairs = trainer::held_out(&corpus, &langs, split, a.limit, &keep);
    if pairs.is_empty() {
        bail!(
            "no {} pairs for the run's languages in {}",
            a.split,
            run.cfg.data.dir
        );
    }
    let opts = a.decode.options(
        a.beam.unwrap_or(run.cfg.eval.beam),
        run.cfg.eval.length_penalty,
    );
    let t0 = std::time::Instant::now();
    let (loss, scores, _) = trainer::evaluate_pairs(&run, &pairs, &opts)?;
    let seconds = t0.elapsed().as_secs_f64();
    println!(
        "{} pairs ({} split, {} languages), step {}, evaluated in {seconds:.2} s ({:.1} sentences/s, loss and decoding)",
        pairs.len(),
        a.split,
        langs.len(),
        run.trainer.step,
        pairs.len() as f64 / seconds.max(1e-9)
    );
    println!("loss {loss:.4}   perplexity {:.2}", loss.exp());
    match scores {
        Some(s) => println!("{s}\n{}", s.bleu),
        None => println!("BLEU n/a"),
    }
    Ok(())
}

pub fn translate(a: TranslateArgs) -> Result<()> {
    let run =
        trainer::load_run(&a.run).with_context(|| format!("loading run {}", a.run.display()))?;
    if !run.tok.langs().contains(&a.lang) {
        bail!(
            "the run was not trained on `{}`; its languages are {}",
            a.lang,
            run.tok.langs().join(", ")
        );
    }
    let texts: Vec<String> = if a.text.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    } else {
        a.text.clone()
    };
    let srcs: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| run.tok.encode_source(&a.lang, t, run.cfg.data.max_len))
        .collect::<Result<_, _>>()?;
    let opts = a.decode.options(
        a.beam.unwrap_or(run.cfg.eval.beam),
        run.cfg.eval.length_penalty,
    );
    for h in trainer::translate(&run.trainer, &run.tok, &srcs, &opts)? {
        println!("{}", run.tok.decode(&h));
    }
    Ok(())
}
