//! Decoding: greedy and beam search with the evaluation program, recomputing the whole model
//! per output position.

use super::batches::{batch_tensors, Example};
use super::step::Trainer;
use super::TrainError;
use crate::tokenizer::Tokenizer;

/// Translate `srcs` (source id sequences) by beam search (`beam` = 1: greedy), recomputing
/// the whole model per output position with the evaluation program.
pub fn translate(
    tr: &Trainer,
    tok: &Tokenizer,
    srcs: &[Vec<u32>],
    beam: usize,
    alpha: f64,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let (b, l) = (tr.cfg.data.batch_size, tr.cfg.data.max_len);
    let k = beam.clamp(1, b);
    let per_run = b / k;
    let mut out = Vec::new();
    for chunk in srcs.chunks(per_run) {
        out.extend(beam_chunk(tr, tok, chunk, k, alpha, b, l)?);
    }
    Ok(out)
}

#[derive(Clone)]
struct Hyp {
    tokens: Vec<u32>,
    score: f64,
}

fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

fn beam_chunk(
    tr: &Trainer,
    tok: &Tokenizer,
    srcs: &[Vec<u32>],
    k: usize,
    alpha: f64,
    b: usize,
    l: usize,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let eos = tok.eos_id();
    let v = tok.vocab_size();
    // beams[s]: live hypotheses of sentence s; done[s]: finished ones.
    let mut beams: Vec<Vec<Hyp>> = srcs
        .iter()
        .map(|_| {
            vec![Hyp {
                tokens: Vec::new(),
                score: 0.0,
            }]
        })
        .collect();
    let mut done: Vec<Vec<Hyp>> = vec![Vec::new(); srcs.len()];
    for t in 0..l {
        if beams.iter().all(|bs| bs.is_empty()) {
            break;
        }
        // Rows: sentence s, beam j -> row s*k + j.
        let dummy = Example {
            lang: String::new(),
            src: Vec::new(),
            tgt: Vec::new(),
            english: String::new(),
        };
        let mut rows_ex: Vec<Example> = Vec::with_capacity(b);
        for r in 0..b {
            let (s, j) = (r / k, r % k);
            match (srcs.get(s), beams.get(s).and_then(|bs| bs.get(j))) {
                (Some(src), Some(h)) => rows_ex.push(Example {
                    lang: String::new(),
                    src: src.clone(),
                    tgt: h.tokens.clone(),
                    english: String::new(),
                }),
                _ => rows_ex.push(dummy.clone()),
            }
        }
        let rows: Vec<Option<&Example>> = rows_ex.iter().map(Some).collect();
        let batch = batch_tensors(&tr.cfg, tok, &rows);
        let (_, logits) = tr.evaluate(&batch)?;
        for s in 0..srcs.len() {
            let mut cands: Vec<Hyp> = Vec::new();
            for (j, h) in beams[s].iter().enumerate() {
                let row = s * k + j;
                // Only position `t` of this row is read: convert just its `v` logits.
                let slice = logits.data.range_f64((row * l + t) * v, v);
                let m = slice.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + slice.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
                // The `k` best ids (highest logit, lower id first on ties), in that order:
                // selected, then only those sorted.
                let mut ids: Vec<usize> = (0..v).collect();
                let better =
                    |&a: &usize, &b2: &usize| slice[b2].total_cmp(&slice[a]).then(a.cmp(&b2));
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
                        score: h.score + slice[id] - lse,
                    });
                }
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
                    (a.score / length_penalty(a.tokens.len(), alpha))
                        .total_cmp(&(c.score / length_penalty(c.tokens.len(), alpha)))
                })
                .map(|h| h.tokens)
                .unwrap_or_default()
        })
        .collect())
}
