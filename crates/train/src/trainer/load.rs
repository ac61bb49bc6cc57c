//! A finished (or checkpointed) run loaded back for evaluation and translation.

use super::batches::{encode, Example};
use super::decode::{translate, DecodeOptions};
use super::programs::build_programs;
use super::rundir::RunDir;
use super::step::{dev_loss, Trainer};
use super::TrainError;
use crate::config::TrainConfig;
use crate::data::Pair;
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// A finished (or checkpointed) run, loaded for evaluation and translation.
pub struct LoadedRun {
    pub cfg: TrainConfig,
    pub tok: Tokenizer,
    pub trainer: Trainer,
}

/// Load `dir`'s config, tokenizer and checkpoint onto the devices of its mesh.
pub fn load_run(dir: &Path) -> Result<LoadedRun, TrainError> {
    let rd = RunDir {
        dir: dir.to_path_buf(),
    };
    let src = rd
        .open_checkpoint()?
        .ok_or_else(|| TrainError::NoCheckpoint {
            dir: rd.dir.clone(),
        })?;
    let cfg = TrainConfig::from_run_toml(src.config(), &src.path().display().to_string())?;
    let tok = Tokenizer::load(rd.tokenizer())?;
    let programs = build_programs(&cfg, tok.vocab_size())?;
    let comm = std::sync::Arc::new(
        runtime::InProcess::new(cfg.devices()).with_comm_thread(cfg.model.overlap > 1),
    );
    let trainer = Trainer::from_source(&cfg, programs, &src, comm)?;
    Ok(LoadedRun { cfg, tok, trainer })
}

/// Loss and scores (BLEU, chrF, by language) of a loaded run on `pairs`, decoded with
/// `opts`; and the hypotheses.
pub fn evaluate_pairs(
    run: &LoadedRun,
    pairs: &[&Pair],
    opts: &DecodeOptions,
) -> Result<(f64, Option<crate::scores::Scores>, Vec<String>), TrainError> {
    let ex: Vec<Example> = pairs
        .iter()
        .map(|p| encode(&run.tok, p, run.cfg.data.max_len))
        .collect::<Result<_, _>>()?;
    let loss = dev_loss(&run.trainer, &run.tok, &ex)?;
    let srcs: Vec<Vec<u32>> = ex.iter().map(|e| e.src.clone()).collect();
    let hyps: Vec<String> = translate(&run.trainer, &run.tok, &srcs, opts)?
        .iter()
        .map(|h| run.tok.decode(h))
        .collect();
    let refs: Vec<&str> = ex.iter().map(|e| e.english.as_str()).collect();
    let hr: Vec<&str> = hyps.iter().map(String::as_str).collect();
    let langs: Vec<&str> = ex.iter().map(|e| e.lang.as_str()).collect();
    let scores = crate::scores::score(&langs, &hr, &refs).ok();
    Ok((loss, scores, hyps))
}
