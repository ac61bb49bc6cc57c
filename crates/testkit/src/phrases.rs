//! A synthetic parallel corpus for training tests: random phrases of 2-4 words with their
//! word-by-word German and French "translations", from a fixed linear congruential
//! generator (the same phrases on every machine, without a data download).

const WORDS: [(&str, &str, &str); 10] = [
    ("one", "eins", "un"),
    ("two", "zwei", "deux"),
    ("three", "drei", "trois"),
    ("four", "vier", "quatre"),
    ("five", "fünf", "cinq"),
    ("six", "sechs", "six"),
    ("red", "rot", "rouge"),
    ("blue", "blau", "bleu"),
    ("cat", "Katze", "chat"),
    ("dog", "Hund", "chien"),
];

/// One phrase in English, German and French.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phrase {
    pub en: String,
    pub de: String,
    pub fr: String,
}

/// The first `n` phrases (the same for every caller).
pub fn phrases(n: usize) -> Vec<Phrase> {
    let mut x: u64 = 12345;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let len = 2 + next() % 3;
            let idx: Vec<usize> = (0..len).map(|_| next() % WORDS.len()).collect();
            let side = |pick: fn(&(&'static str, &'static str, &'static str)) -> &'static str| {
                idx.iter()
                    .map(|&j| pick(&WORDS[j]))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            Phrase {
                en: side(|w| w.0),
                de: side(|w| w.1),
                fr: side(|w| w.2),
            }
        })
        .collect()
}
