//! What the training tests share: a small parallel corpus built from the test kit's
//! phrases, so every test trains on the same kind of data without files.

use std::sync::Arc;
use train::data::{Corpus, Pair};

/// `phrases` test phrases, each in every language of `langs` ("de", "fr") against English.
pub fn corpus(phrases: usize, langs: &[&str]) -> Corpus {
    let mut pairs = Vec::new();
    for p in testkit::phrases::phrases(phrases) {
        for &lang in langs {
            let source = match lang {
                "de" => &p.de,
                "fr" => &p.fr,
                other => panic!("the test phrases have no {other}"),
            };
            pairs.push(Pair {
                lang: Arc::from(lang),
                origin: Arc::from("test"),
                english: p.en.clone(),
                source: source.clone(),
            });
        }
    }
    Corpus::from_pairs(pairs)
}
