//! The fixed train / dev / test split (the prepared corpus's rule): a function of the English side only.
//!
//! ```text
//! key(en) = casefold(en); placeholders -> '#'; [\W_]+ -> ' '; collapse spaces; trim
//! b       = u64::from_be_bytes(sha256(key.utf8)[..8]) % 1000
//! split   = test if b < 20, dev if b < 40, else train          (2 % / 2 % / 96 %)
//! ```
//!
//! So "Save file", "Save File:" and "_Save file" share one split in every language, dev and
//! test are multi-way parallel, and adding sources never moves an existing pair.

use super::casefold::casefold;
use super::clean::PLACEHOLDER;
use regex::Regex;
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

static NON_WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[^\p{L}\p{N}]+").expect("non-word regex"));

/// One of the three splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// 96 % of English keys.
    Train,
    /// 2 %: model selection.
    Dev,
    /// 2 %: evaluation.
    Test,
}

impl Split {
    /// All splits, in file order.
    pub const ALL: [Split; 3] = [Split::Train, Split::Dev, Split::Test];

    /// The name used in corpus files: `train`, `dev` or `test`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Dev => "dev",
            Split::Test => "test",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "train" => Ok(Split::Train),
            "dev" => Ok(Split::Dev),
            "test" => Ok(Split::Test),
            other => Err(format!(
                "unknown split {other:?} (expected train, dev or test)"
            )),
        }
    }
}

/// The key that decides the split: case-, space- and punctuation-insensitive English with
/// every placeholder replaced by `#`.
pub fn english_key(en: &str) -> String {
    let folded = casefold(en);
    let s = PLACEHOLDER.replace_all(&folded, "#");
    let s = NON_WORD.replace_all(&s, " ");
    s.trim_matches(' ').to_string()
}

/// The first 8 bytes of sha256([`english_key`]), big-endian: a stable pseudo-random order of
/// English strings (variants of one string hash alike).
pub fn english_hash(en: &str) -> u64 {
    let digest = Sha256::digest(english_key(en).as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The bucket `0..1000` of an English string: [`english_hash`] modulo 1000.
pub fn bucket(en: &str) -> u64 {
    english_hash(en) % 1000
}

/// The split of a pair with English side `en`.
pub fn split_of(en: &str) -> Split {
    match bucket(en) {
        0..20 => Split::Test,
        20..40 => Split::Dev,
        _ => Split::Train,
    }
}
