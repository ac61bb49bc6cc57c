//! Decoding: greedy and beam search, one output position per step for a whole batch of
//! rows (sentence `s`, beam `j` in row `s * k + j`).
//!
//! A step's next-token logits come from a [`Scorer`]: by default the incremental decoder
//! ([`DecodeMode::Incremental`]: the encoder once per batch, then one decoder position per
//! step with cached keys and values, `super::incremental`), or the whole model re-run per
//! position ([`DecodeMode::Full`], the oracle the incremental decoder is tested against).
//! Both route MoE tokens dropless, so they choose the same tokens (their logits differ only
//! by the rounding of f32 dot products of different shapes), and a sentence's translation
//! does not depend on the other sentences of its batch.

use super::batches::{batch_tensors, Example};
use super::incremental::{decoder, DecodeParams, Incremental, Prepared};
use super::step::{DeviceInputs, Trainer};
use super::TrainError;
use crate::tokenizer::Tokenizer;

/// How decoding computes a step's logits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeMode {
    /// The encoder once per batch, then one decoder position per step with cached keys and
    /// values.
    #[default]
    Incremental,
    /// The whole model (encoder and decoder over every position) re-run per output
    /// position: the oracle of [`DecodeMode::Incremental`], `max_len` times slower.
    Full,
}

/// How to decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeOptions {
    /// Beam width (1: greedy), at most the batch size (clamped to it).
    pub beam: usize,
    /// Length penalty alpha: hypotheses are ranked by `score / ((5 + len) / 6)^alpha`.
    pub length_penalty: f64,
    pub mode: DecodeMode,
}

impl DecodeOptions {
    /// Incremental decoding with beam `beam` and length penalty `alpha`.
    pub fn new(beam: usize, length_penalty: f64) -> DecodeOptions {
        DecodeOptions {
            beam,
            length_penalty,
            mode: DecodeMode::Incremental,
        }
    }

    /// These options with `mode`.
    pub fn mode(self, mode: DecodeMode) -> DecodeOptions {
        DecodeOptions { mode, ..self }
    }
}

/// Translate `srcs` (source id sequences) by beam search (`beam` = 1: greedy): one id
/// sequence per source, ending in `</s>` when the model ended it within `max_len`.
pub fn translate(
    tr: &Trainer,
    tok: &Tokenizer,
    srcs: &[Vec<u32>],
    opts: &DecodeOptions,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let b = tr.cfg.data.batch_size;
    let k = opts.beam.clamp(1, b);
    let per_run = b / k;
    let mut out = Vec::new();
    let dec = decoder(tr, tok.vocab_size())?;
    let mut scorer = match opts.mode {
        DecodeMode::Incremental => Mode::Incremental(DecodeParams::new(tr, dec)?),
        DecodeMode::Full => Mode::Full(match dec.full()? {
            Some(p) => Some((p, tr.params_for(&p.part)?)),
            None => None,
        }),
    };
    let search = Search {
        k,
        alpha: opts.length_penalty,
        eos: tok.eos_id(),
        max_len: tr.cfg.data.max_len,
    };
    for chunk in srcs.chunks(per_run) {
        let hyps = match &mut scorer {
            Mode::Incremental(params) => {
                let rows: Vec<Option<&[u32]>> = (0..b)
                    .map(|r| chunk.get(r / k).map(Vec::as_slice))
                    .collect();
                let mut inc = Incremental::start(tr, dec, params, tok, &rows)?;
                search.run(&mut inc, chunk)?
            }
            Mode::Full(program) => {
                let mut full = Full {
                    tr,
                    tok,
                    program: program.as_ref().map(|(p, params)| (*p, params)),
                };
                search.run(&mut full, chunk)?
            }
        };
        out.extend(hyps);
    }
    Ok(out)
}

/// What a [`translate`] call keeps across its batches.
enum Mode<'a> {
    Incremental(DecodeParams),
    /// The dropless re-decode program and its parameters (`None`: the evaluation program).
    Full(Option<(&'a Prepared, DeviceInputs)>),
}

/// One live row of a decoding step.
pub(super) struct Row<'a> {
    /// The sentence's source ids.
    pub src: &'a [u32],
    /// The hypothesis so far (`t` ids at step `t`).
    pub tokens: &'a [u32],
    /// The row that held this hypothesis's prefix at the step before.
    pub parent: usize,
}

/// Next-token logits for a decoding step.
pub(super) trait Scorer {
    /// The logits of position `t` of every live row (`None`: an unused row, whose logits
    /// are not read).
    fn logits(
        &mut self,
        t: usize,
        rows: &[Option<Row>],
    ) -> Result<Vec<Option<Vec<f64>>>, TrainError>;
}

/// The whole model re-run per position: the evaluation program, or its dropless copy.
struct Full<'a> {
    tr: &'a Trainer,
    tok: &'a Tokenizer,
    program: Option<(&'a Prepared, &'a DeviceInputs)>,
}

impl Scorer for Full<'_> {
    fn logits(
        &mut self,
        t: usize,
        rows: &[Option<Row>],
    ) -> Result<Vec<Option<Vec<f64>>>, TrainError> {
        let (b, l) = (self.tr.cfg.data.batch_size, self.tr.cfg.data.max_len);
        let examples: Vec<Example> = (0..b)
            .map(|r| {
                let row = rows.get(r).and_then(|x| x.as_ref());
                Example {
                    lang: String::new(),
                    src: row.map(|x| x.src.to_vec()).unwrap_or_default(),
                    tgt: row.map(|x| x.tokens.to_vec()).unwrap_or_default(),
                    english: String::new(),
                }
            })
            .collect();
        let refs: Vec<Option<&Example>> = examples.iter().map(Some).collect();
        let batch = batch_tensors(&self.tr.cfg, self.tok, &refs);
        let logits = match self.program {
            None => self.tr.evaluate(&batch)?.1,
            Some((p, params)) => self
                .tr
                .run_global(&p.part, p.exe()?, params, &batch)?
                .remove("logits")
                .ok_or_else(|| TrainError::Run("the re-decode has no output `logits`".into()))?,
        };
        let v = logits.shape()[2];
        // Only position `t` of a row is read: convert just its `v` logits.
        Ok((0..b)
            .map(|r| {
                rows.get(r)
                    .and_then(|x| x.as_ref())
                    .map(|_| logits.data.range_f64((r * l + t) * v, v))
            })
            .collect())
    }
}

#[derive(Clone)]
struct Hyp {
    tokens: Vec<u32>,
    score: f64,
    /// The beam (index in its sentence's list) this one extends.
    parent: usize,
}

fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

/// Beam search over one batch of sentences.
struct Search {
    k: usize,
    alpha: f64,
    eos: u32,
    max_len: usize,
}

impl Search {
    fn run(&self, scorer: &mut dyn Scorer, srcs: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, TrainError> {
        let (k, l, eos) = (self.k, self.max_len, self.eos);
        // beams[s]: live hypotheses of sentence s; done[s]: finished ones.
        let mut beams: Vec<Vec<Hyp>> = srcs
            .iter()
            .map(|_| {
                vec![Hyp {
                    tokens: Vec::new(),
                    score: 0.0,
                    parent: 0,
                }]
            })
            .collect();
        let mut done: Vec<Vec<Hyp>> = vec![Vec::new(); srcs.len()];
        for t in 0..l {
            if beams.iter().all(|bs| bs.is_empty()) {
                break;
            }
            // Rows: sentence s, beam j -> row s*k + j.
            let rows: Vec<Option<Row>> = (0..srcs.len() * k)
                .map(|r| {
                    let (s, j) = (r / k, r % k);
                    beams[s].get(j).map(|h| Row {
                        src: &srcs[s],
                        tokens: &h.tokens,
                        parent: s * k + h.parent,
                    })
                })
                .collect();
            let logits = scorer.logits(t, &rows)?;
            for s in 0..srcs.len() {
                let mut cands: Vec<Hyp> = Vec::new();
                for (j, h) in beams[s].iter().enumerate() {
                    let row = s * k + j;
                    let slice = logits[row]
                        .as_deref()
                        .ok_or_else(|| TrainError::Run(format!("no logits for row {row}")))?;
                    extend(h, j, slice, k, &mut cands);
                }
                cands.sort_by(|a, c| c.score.total_cmp(&a.score));
                let mut next = Vec::new();
                for c in cands {
                    if next.len() >= k {
                        break;
                    }
                    if *c.tokens.last().unwrap() == eos || t + 1 == l {
                        done[s].push(c);
                    } else {
                        next.push(c);
                    }
                }
                // Stop a sentence once k hypotheses are finished and none alive can beat them.
                if done[s].len() >= k {
                    next.clear();
                }
                beams[s] = next;
            }
        }
        Ok(done
            .into_iter()
            .zip(beams)
            .map(|(d, live)| {
                let all = if d.is_empty() { live } else { d };
                all.into_iter()
                    .max_by(|a, c| {
                        (a.score / length_penalty(a.tokens.len(), self.alpha))
                            .total_cmp(&(c.score / length_penalty(c.tokens.len(), self.alpha)))
                    })
                    .map(|h| h.tokens)
                    .unwrap_or_default()
            })
            .collect())
    }
}

/// Push the `k` best extensions of `h` (beam `j`) by `logits` onto `cands`, best first.
fn extend(h: &Hyp, j: usize, logits: &[f64], k: usize, cands: &mut Vec<Hyp>) {
    let v = logits.len();
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + logits.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    // The `k` best ids (highest logit, lower id first on ties), in that order: selected,
    // then only those sorted.
    let mut ids: Vec<usize> = (0..v).collect();
    let better = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
    if k < v {
        ids.select_nth_unstable_by(k, better);
        ids.truncate(k);
    }
    ids.sort_by(better);
    for &id in ids.iter().take(k) {
        let mut tokens = h.tokens.clone();
        tokens.push(id as u32);
        cands.push(Hyp {
            tokens,
            score: h.score + logits[id] - lse,
            parent: j,
        });
    }
}
