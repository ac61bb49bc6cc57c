//! Corpus chrF (Popović 2015), exactly as sacrebleu 2.x computes its default `CHRF()`:
//! character n-grams of orders 1..=6 with whitespace removed, no word n-grams, beta = 2.
//! Per order, the hypothesis, reference and matched n-gram counts are summed over the
//! corpus (a hypothesis order counts 0 when its reference has no n-gram of that order);
//! precision and recall are averaged over the orders both sides have, and combined into
//! `F_beta = (1 + beta^2) P R / (beta^2 P + R)`, reported in `[0, 100]`.

use std::collections::HashMap;

/// Character n-gram orders (sacrebleu's `char_order`).
pub const CHAR_ORDER: usize = 6;
/// Recall weighs `BETA^2` times precision (sacrebleu's `beta`).
pub const BETA: f64 = 2.0;

/// Per order `n = 1..=6`: `[hypothesis n-grams, reference n-grams, matches]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChrfStats(pub [[u64; 3]; CHAR_ORDER]);

impl ChrfStats {
    /// The statistics of one segment.
    pub fn segment(hyp: &str, reference: &str) -> ChrfStats {
        let (h, r) = (letters(hyp), letters(reference));
        let mut out = [[0u64; 3]; CHAR_ORDER];
        for (n, slot) in (1..=CHAR_ORDER).zip(out.iter_mut()) {
            let (hc, rc) = (ngrams(&h, n), ngrams(&r, n));
            let hyp_count: u64 = hc.values().sum();
            let ref_count: u64 = rc.values().sum();
            let matches: u64 = hc
                .iter()
                .map(|(g, &c)| rc.get(g).map_or(0, |&rn| c.min(rn)))
                .sum();
            // sacrebleu counts no hypothesis n-grams when the reference has none.
            *slot = [
                if rc.is_empty() { 0 } else { hyp_count },
                ref_count,
                matches,
            ];
        }
        ChrfStats(out)
    }

    /// Sum of two corpora's statistics.
    pub fn add(&mut self, o: &ChrfStats) {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            for k in 0..3 {
                a[k] += b[k];
            }
        }
    }

    /// The chrF score in `[0, 100]`.
    pub fn score(&self) -> f64 {
        let factor = BETA * BETA;
        let (mut p, mut r, mut orders) = (0.0, 0.0, 0usize);
        for &[hyp, reference, matches] in &self.0 {
            if hyp > 0 && reference > 0 {
                p += matches as f64 / hyp as f64;
                r += matches as f64 / reference as f64;
                orders += 1;
            }
        }
        if orders == 0 {
            return 0.0;
        }
        let (p, r) = (p / orders as f64, r / orders as f64);
        if p + r == 0.0 {
            return 0.0;
        }
        100.0 * (1.0 + factor) * p * r / (factor * p + r)
    }
}

/// Corpus chrF of `hyps` against one reference each (sacrebleu `corpus_chrf(hyps, [refs])`);
/// `None` when the line counts differ.
pub fn corpus_chrf<H: AsRef<str>, R: AsRef<str>>(hyps: &[H], refs: &[R]) -> Option<f64> {
    if hyps.len() != refs.len() {
        return None;
    }
    let mut total = ChrfStats::default();
    for (h, r) in hyps.iter().zip(refs) {
        total.add(&ChrfStats::segment(h.as_ref(), r.as_ref()));
    }
    Some(total.score())
}

/// The characters of `line` without its whitespace, as Python's `''.join(line.split())`
/// leaves them (Python also splits on the separators U+001C..U+001F).
fn letters(line: &str) -> Vec<char> {
    line.chars()
        .filter(|c| !(c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(c)))
        .collect()
}

/// Counts of the character n-grams of order `n`.
fn ngrams(chars: &[char], n: usize) -> HashMap<&[char], u64> {
    let mut m = HashMap::new();
    for g in chars.windows(n) {
        *m.entry(g).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_text_scores_100_and_disjoint_text_0() {
        assert_eq!(corpus_chrf(&["Open file"], &["Open file"]), Some(100.0));
        assert_eq!(corpus_chrf(&["xyz"], &["abc"]), Some(0.0));
        assert_eq!(corpus_chrf(&["a"], &["a", "b"]), None);
    }

    #[test]
    fn whitespace_does_not_count() {
        let a = corpus_chrf(&["Open  the\tfile"], &["Openthe file"]).unwrap();
        assert_eq!(a, 100.0);
    }
}
