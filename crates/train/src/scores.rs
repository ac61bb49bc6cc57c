//! What a set of translations scores: corpus BLEU ([`crate::bleu`]) and chrF
//! ([`crate::chrf`]) over all of them and per source language, and the share of distinct
//! hypotheses (a model that answers every sentence with the same frequent string scores a
//! little BLEU and almost no distinct hypotheses).

use crate::bleu::{corpus_bleu, Bleu, BleuError};
use crate::chrf::corpus_chrf;
use std::collections::HashSet;
use std::fmt;

/// The scores of one source language's sentences.
#[derive(Clone, Debug, PartialEq)]
pub struct LangScore {
    pub lang: String,
    pub sentences: usize,
    pub bleu: f64,
    pub chrf: f64,
}

/// The scores of a set of translations.
#[derive(Clone, Debug, PartialEq)]
pub struct Scores {
    pub bleu: Bleu,
    pub chrf: f64,
    /// Distinct hypotheses over hypotheses, in `[0, 1]`.
    pub distinct: f64,
    /// Per source language, in the order languages first appear.
    pub by_lang: Vec<LangScore>,
}

/// Score `hyps` against `refs`, the `i`-th sentence being of source language `langs[i]`.
pub fn score<L, H, R>(langs: &[L], hyps: &[H], refs: &[R]) -> Result<Scores, BleuError>
where
    L: AsRef<str>,
    H: AsRef<str>,
    R: AsRef<str>,
{
    let bleu = corpus_bleu(hyps, refs)?;
    if langs.len() != hyps.len() {
        return Err(BleuError::LineCountMismatch {
            hyps: hyps.len(),
            refs: langs.len(),
        });
    }
    let chrf = corpus_chrf(hyps, refs).unwrap_or(0.0);
    let distinct = hyps
        .iter()
        .map(AsRef::as_ref)
        .collect::<HashSet<&str>>()
        .len() as f64
        / hyps.len().max(1) as f64;
    let mut order: Vec<&str> = Vec::new();
    for l in langs {
        if !order.contains(&l.as_ref()) {
            order.push(l.as_ref());
        }
    }
    let by_lang = order
        .into_iter()
        .map(|lang| {
            let at: Vec<usize> = (0..langs.len())
                .filter(|&i| langs[i].as_ref() == lang)
                .collect();
            let h: Vec<&str> = at.iter().map(|&i| hyps[i].as_ref()).collect();
            let r: Vec<&str> = at.iter().map(|&i| refs[i].as_ref()).collect();
            LangScore {
                lang: lang.to_string(),
                sentences: at.len(),
                bleu: corpus_bleu(&h, &r).map_or(0.0, |b| b.score),
                chrf: corpus_chrf(&h, &r).unwrap_or(0.0),
            }
        })
        .collect();
    Ok(Scores {
        bleu,
        chrf,
        distinct,
        by_lang,
    })
}

impl fmt::Display for Scores {
    /// `BLEU 15.20  chrF 41.3  distinct 87%`, then the per-language table, four to a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "BLEU {:.2}  chrF {:.1}  distinct hypotheses {:.0}%",
            self.bleu.score,
            self.chrf,
            100.0 * self.distinct
        )?;
        write!(f, "by language (BLEU / chrF):")?;
        for (i, l) in self.by_lang.iter().enumerate() {
            if i % 4 == 0 {
                write!(f, "\n ")?;
            }
            write!(f, "  {:<8}{:>5.1} / {:>4.1}", l.lang, l.bleu, l.chrf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_split_by_language_and_count_distinct_hypotheses() {
        let langs = ["de", "fr", "de", "fr"];
        let hyps = [
            "Open the file",
            "Save",
            "Open the file",
            "Delete all items now",
        ];
        let refs = [
            "Open the file",
            "Save all",
            "Close the window",
            "Delete all items now",
        ];
        let s = score(&langs, &hyps, &refs).unwrap();
        assert_eq!(s.distinct, 0.75);
        assert_eq!(s.by_lang.len(), 2);
        assert_eq!(
            (s.by_lang[0].lang.as_str(), s.by_lang[0].sentences),
            ("de", 2)
        );
        let de = corpus_bleu(
            &["Open the file", "Open the file"],
            &["Open the file", "Close the window"],
        );
        assert_eq!(s.by_lang[0].bleu, de.unwrap().score);
        assert_eq!(s.bleu.score, corpus_bleu(&hyps, &refs).unwrap().score);
        assert_eq!(s.chrf, corpus_chrf(&hyps, &refs).unwrap());
        assert!(score(&langs[..3], &hyps, &refs).is_err());
        let text = s.to_string();
        assert!(text.contains("by language") && text.contains("de") && text.contains("chrF"));
    }
}
