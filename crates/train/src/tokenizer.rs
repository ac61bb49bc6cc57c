//! The subword tokenizer: a byte-level BPE trained with Hugging Face `tokenizers` (pure Rust
//! build) on the English side and every source language of the parallel corpus.
//!
//! - **Byte-level**: the 256 byte symbols are always in the vocabulary, so any UTF-8 text
//!   encodes without `<unk>` (unseen scripts fall back to bytes) and `decode(encode(t)) == t`
//!   exactly. No normalizer, no prefix space: nothing is lost.
//! - **Special tokens**, fixed ids: `<pad>` = 0, `<s>` = 1, `</s>` = 2, `<unk>` = 3, then one
//!   source-language tag per language, `<de>`, `<fr>`, ... in sorted order from id 4. They are
//!   HF special tokens (never split, skipped by [`Tokenizer::decode`]), but text is encoded
//!   with special-token matching off, so a literal `<s>` in a sentence is ordinary text.
//! - **Sequences** (GShard M4): a source is `<lang> pieces </s>`, a target `pieces </s>`;
//!   the decoder input is `<s>` followed by the target without its last id.
//! - **Deterministic**: BPE training has no randomness (ties are broken by token id, the
//!   initial alphabet is sorted), so the same texts and languages give the same
//!   `tokenizer.json`, byte for byte, whatever the thread count; hence no seed.
//! - **Fast**: HF's own feeding path pre-tokenizes with a backtracking regex and one hash
//!   map per sentence; here the GPT-2 split runs on the plain `regex` crate (the one
//!   lookahead emulated by hand), words are counted in parallel chunks, and HF's
//!   `BpeTrainer::do_train` learns the merges. Encoding takes the same shortcut straight to
//!   the BPE model. Tests pin both to HF's pipeline: identical `tokenizer.json` and ids.
//!
//! The file written by [`Tokenizer::save`] is a standard HF `tokenizer.json` (Python
//! `tokenizers` loads it; set `encode_special_tokens = True` there for the same treatment of
//! literal special-token text).

use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::LazyLock;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Model};

/// Padding token (id 0).
pub const PAD: &str = "<pad>";
/// Beginning of sequence (id 1): the first decoder input.
pub const BOS: &str = "<s>";
/// End of sequence (id 2): closes every source and target.
pub const EOS: &str = "</s>";
/// Unknown (id 3): reserved; byte-level BPE never emits it.
pub const UNK: &str = "<unk>";
/// The reserved specials, in id order.
pub const RESERVED: [&str; 4] = [PAD, BOS, EOS, UNK];
/// Default vocabulary size (specials, 256 bytes and merges together).
pub const DEFAULT_VOCAB_SIZE: usize = 8000;

/// Errors of the tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `lang` has no tag in this tokenizer.
    #[error("unknown source language {0:?}: the tokenizer has no tag for it")]
    UnknownLanguage(String),
    /// A language code that cannot become a tag.
    #[error("invalid language code {lang:?}: {reason}")]
    InvalidLanguage {
        /// The code as given.
        lang: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// The vocabulary cannot even hold the specials and the 256 byte symbols.
    #[error("vocab_size {vocab_size} is below the minimum {min} (specials + 256 bytes)")]
    VocabTooSmall {
        /// Requested size.
        vocab_size: usize,
        /// Smallest usable size.
        min: usize,
    },
    /// A tokenizer.json that is not one of ours.
    #[error("not a gshard tokenizer: {0}")]
    Format(String),
    /// Reading or writing tokenizer.json.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An error inside the `tokenizers` library.
    #[error("tokenizers: {0}")]
    Hf(String),
    /// A tokenizer file that cannot be used.
    #[error("{path} is not a usable tokenizer ({reason}); it is written by `gshard train` next to the checkpoint: restore it from a copy of the run")]
    BadFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, TokenizerError>;

fn hf(e: tokenizers::Error) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}

/// The tag token of a language: `de` -> `<de>`.
pub fn lang_tag(lang: &str) -> String {
    format!("<{lang}>")
}

fn check_lang(lang: &str) -> Result<()> {
    let bad = |reason| {
        Err(TokenizerError::InvalidLanguage {
            lang: lang.to_string(),
            reason,
        })
    };
    if lang.is_empty() {
        return bad("empty");
    }
    if !lang
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return bad("only ASCII letters, digits, '-' and '_' are allowed");
    }
    if RESERVED.contains(&lang_tag(lang).as_str()) {
        return bad("its tag collides with a reserved special token");
    }
    Ok(())
}

/// A trained byte-level BPE tokenizer with GShard's special and language-tag tokens.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Sorted language codes; the tag of `langs[i]` has id `RESERVED.len() + i`.
    langs: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("langs", &self.langs)
            .finish()
    }
}

impl Tokenizer {
    /// Trains a byte-level BPE of `vocab_size` ids in total (specials, the 256 bytes and the
    /// merges) on `texts`, with one tag per language of `langs` (sorted, deduplicated).
    /// Training may stop below `vocab_size` when the corpus has no pair seen twice left to
    /// merge. The items of `texts` are collected first (borrowed `&str`s cost little), then
    /// counted in parallel; the result does not depend on the thread count.
    pub fn train<I, S>(texts: I, langs: &[&str], vocab_size: usize) -> Result<Tokenizer>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str> + Sync,
    {
        let mut langs: Vec<String> = langs.iter().map(|l| l.to_string()).collect();
        langs.sort();
        langs.dedup();
        for l in &langs {
            check_lang(l)?;
        }
        let specials: Vec<AddedToken> = RESERVED
            .iter()
            .map(|s| s.to_string())
            .chain(langs.iter().map(|l| lang_tag(l)))
            .map(|s| AddedToken::from(s, true))
            .collect();
        let min = specials.len() + 256;
        if vocab_size < min {
            return Err(TokenizerError::VocabTooSmall { vocab_size, min });
        }
        let words = count_words(texts);
        let trainer = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(specials.clone())
            .build();
        let mut bpe = BPE::default();
        trainer.do_train(&words, &mut bpe).map_err(hf)?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        inner.add_special_tokens(specials).map_err(hf)?;
        Self::from_inner(inner)
    }

    /// Wraps a loaded HF tokenizer after checking the special-token layout.
    fn from_inner(mut inner: tokenizers::Tokenizer) -> Result<Tokenizer> {
        for (i, s) in RESERVED.iter().enumerate() {
            if inner.token_to_id(s) != Some(i as u32) {
                return Err(TokenizerError::Format(format!("{s} is not id {i}")));
            }
        }
        let mut added: Vec<(u32, AddedToken)> =
            inner.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        let mut langs = Vec::new();
        for (id, tok) in added {
            if !tok.special || (id as usize) < RESERVED.len() {
                continue;
            }
            let lang = tok
                .content
                .strip_prefix('<')
                .and_then(|t| t.strip_suffix('>'))
                .ok_or_else(|| {
                    TokenizerError::Format(format!("special token {:?} is no tag", tok.content))
                })?;
            if id as usize != RESERVED.len() + langs.len() {
                return Err(TokenizerError::Format(format!(
                    "language tags are not contiguous from id {}",
                    RESERVED.len()
                )));
            }
            langs.push(lang.to_string());
        }
        // Text is text: a literal "<s>" or "<de>" in a sentence must not become a special id.
        inner.set_encode_special_tokens(true);
        Ok(Tokenizer { inner, langs })
    }

    /// Serialises to the `tokenizer.json` format of HF `tokenizers`.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(hf)
    }

    /// Parses what [`Tokenizer::to_json`] wrote.
    pub fn from_json(json: &str) -> Result<Tokenizer> {
        let inner: tokenizers::Tokenizer = json.parse().map_err(hf)?;
        Self::from_inner(inner)
    }

    /// Writes `tokenizer.json` to `path`.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|source| TokenizerError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Reads a `tokenizer.json` written by [`Tokenizer::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&json).map_err(|e| match e {
            TokenizerError::Hf(reason) | TokenizerError::Format(reason) => {
                TokenizerError::BadFile {
                    path: path.display().to_string(),
                    reason,
                }
            }
            other => other,
        })
    }

    /// Total number of ids (specials included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of `<pad>` (0).
    pub fn pad_id(&self) -> u32 {
        0
    }

    /// Id of `<s>` (1).
    pub fn bos_id(&self) -> u32 {
        1
    }

    /// Id of `</s>` (2).
    pub fn eos_id(&self) -> u32 {
        2
    }

    /// Id of `<unk>` (3).
    pub fn unk_id(&self) -> u32 {
        3
    }

    /// The source languages with a tag, sorted.
    pub fn langs(&self) -> &[String] {
        &self.langs
    }

    /// Id of the tag `<lang>`.
    pub fn lang_id(&self, lang: &str) -> Result<u32> {
        self.langs
            .binary_search_by(|l| l.as_str().cmp(lang))
            .map(|i| (RESERVED.len() + i) as u32)
            .map_err(|_| TokenizerError::UnknownLanguage(lang.to_string()))
    }

    /// Whether `id` is a special token (reserved or a language tag).
    pub fn is_special(&self, id: u32) -> bool {
        (id as usize) < RESERVED.len() + self.langs.len()
    }

    /// The subword ids of `text`, without any special token. Same ids as HF's
    /// `Tokenizer::encode` of the saved `tokenizer.json` (with special-token matching off),
    /// without its offset bookkeeping.
    pub fn encode_pieces(&self, text: &str) -> Result<Vec<u32>> {
        let model = self.inner.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut word = String::new();
        for piece in pre_tokenize(text) {
            byte_level(piece, &mut word);
            ids.extend(model.tokenize(&word).map_err(hf)?.iter().map(|t| t.id));
        }
        Ok(ids)
    }

    /// A source sequence `<lang> pieces </s>`, at most `max_len` ids. Truncation drops
    /// pieces and keeps the tag and `</s>` (for `max_len` < 2, the prefix of `<lang> </s>`).
    pub fn encode_source(&self, lang: &str, text: &str, max_len: usize) -> Result<Vec<u32>> {
        let tag = self.lang_id(lang)?;
        let pieces = self.encode_pieces(text)?;
        let keep = pieces.len().min(max_len.saturating_sub(2));
        let mut ids = Vec::with_capacity(keep + 2);
        ids.push(tag);
        ids.extend_from_slice(&pieces[..keep]);
        ids.push(self.eos_id());
        ids.truncate(max_len);
        Ok(ids)
    }

    /// A target sequence `pieces </s>`, at most `max_len` ids. Truncation drops pieces and
    /// keeps `</s>` (empty for `max_len` = 0).
    pub fn encode_target(&self, text: &str, max_len: usize) -> Result<Vec<u32>> {
        let pieces = self.encode_pieces(text)?;
        let keep = pieces.len().min(max_len.saturating_sub(1));
        let mut ids = Vec::with_capacity(keep + 1);
        ids.extend_from_slice(&pieces[..keep]);
        ids.push(self.eos_id());
        ids.truncate(max_len);
        Ok(ids)
    }

    /// Text of `ids`, skipping special tokens and ids out of range. Byte sequences that are
    /// not valid UTF-8 (a model output cut inside a character) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let vocab = self.vocab_size();
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| !self.is_special(id) && (id as usize) < vocab)
            .collect();
        // The byte-level decoder cannot fail on in-vocabulary ids.
        self.inner.decode(&kept, false).unwrap_or_default()
    }

    /// The token strings of `ids` (byte-level symbols), for inspection.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}

/// GPT-2's pre-tokenizer regex (HF `ByteLevel`), without its `\s+(?!\S)` lookahead branch,
/// which [`pre_tokenize`] emulates; the plain `regex` crate then runs it, far faster than
/// the backtracking engine.
static SPLIT: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
        .expect("valid regex")
});

/// The byte-level "words" of `text`, exactly as HF's `ByteLevel` pre-tokenizer splits it
/// (before the byte mapping): the pattern `... |\s+(?!\S)|\s+` means that a run of
/// two or more whitespace characters followed by a non-space leaves its last character to
/// start the next word (so `"a  b"` gives `"a"`, `" "`, `" b"`).
fn pre_tokenize(text: &str) -> impl Iterator<Item = &str> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let m = SPLIT.find_at(text, pos)?;
        let (start, mut end) = (m.start(), m.end());
        // Only the `\s+` branch yields an all-whitespace match; being greedy, it stops
        // before a non-space character or at the end of the text.
        if end < text.len() && m.as_str().chars().all(char::is_whitespace) {
            if let Some((last, _)) = m.as_str().char_indices().next_back() {
                if last > 0 {
                    end = start + last;
                }
            }
        }
        pos = end;
        Some(&text[start..end])
    })
}

/// GPT-2's reversible byte-to-character map: printable bytes `!`..`~`, `\u{a1}`..`\u{ac}`,
/// `\u{ae}`..`\u{ff}` stand for themselves, the other 68 bytes for U+0100 + their rank.
static BYTE_CHARS: LazyLock<[char; 256]> = LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below the surrogates")
        };
    }
    table
});

/// Writes the byte-level form of `piece` into `out`.
fn byte_level(piece: &str, out: &mut String) {
    out.clear();
    out.extend(piece.bytes().map(|b| BYTE_CHARS[b as usize]));
}

/// Counts the byte-level words of `texts`, in parallel chunks.
fn count_words<I, S>(texts: I) -> ahash::AHashMap<compact_str::CompactString, u64>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str> + Sync,
{
    let texts: Vec<S> = texts.into_iter().collect();
    let counts = texts
        .par_chunks(2048)
        .map(|chunk| {
            let mut counts: HashMap<String, u64> = HashMap::new();
            let mut word = String::new();
            for t in chunk {
                for piece in pre_tokenize(t.as_ref()) {
                    byte_level(piece, &mut word);
                    match counts.get_mut(word.as_str()) {
                        Some(c) => *c += 1,
                        None => {
                            counts.insert(word.clone(), 1);
                        }
                    }
                }
            }
            counts
        })
        .reduce(HashMap::new, |a, b| {
            let (mut a, b) = if a.len() < b.len() { (b, a) } else { (a, b) };
            for (w, c) in b {
                *a.entry(w).or_insert(0) += c;
            }
            a
        });
    counts
        .into_iter()
        .map(|(w, c)| (compact_str::CompactString::from(w), c))
        .collect()
}

#[cfg(test)]
mod tests {
    //! The fast paths (pre-tokenizer, byte map, word counting, encoding) against the HF
    //! pipeline they replace.
    use super::*;
    use proptest::prelude::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn hf_words(text: &str) -> Vec<String> {
        let mut p = PreTokenizedString::from(text);
        ByteLevel::new(false, false, true)
            .pre_tokenize(&mut p)
            .unwrap();
        p.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    fn our_words(text: &str) -> Vec<String> {
        let mut w = String::new();
        pre_tokenize(text)
            .map(|p| {
                byte_level(p, &mut w);
                w.clone()
            })
            .collect()
    }

    const TRICKY: &[&str] = &[
        "",
        " ",
        "  ",
        "a  b",
        "a \t b",
        "a\u{3000}\u{3000}b  ",
        "\n\nx\n",
        "don't 's'S 'll've're'd'm 't",
        "123abc a1 ½ ²³",
        "…!? «»  ‹› -- ...",
        "  leading",
        "trailing \t",
        "中文 日本語\u{a0}\u{a0}x",
        "🎉👍🏽 \u{200b}\u{feff}",
        "\u{0}\u{1}\u{7f}\u{85}",
    ];

    #[test]
    fn byte_map_is_hf_alphabet() {
        let ours: std::collections::HashSet<char> = BYTE_CHARS.iter().copied().collect();
        let hf: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, hf);
    }

    #[test]
    fn pre_tokenizer_matches_hf() {
        for t in TRICKY {
            assert_eq!(our_words(t), hf_words(t), "{t:?}");
        }
    }

    proptest! {
        #[test]
        fn pre_tokenizer_matches_hf_on_random_text(
            chars in proptest::collection::vec(
                proptest::sample::select(vec![
                    ' ', ' ', '\t', '\n', '\u{3000}', '\u{a0}', 'a', 'B', 's', 't', '\'', '1',
                    '.', ',', '-', 'é', '中', '🎉', '\u{301}', '_',
                ]),
                0..40,
            )
        ) {
            let text: String = chars.into_iter().collect();
            prop_assert_eq!(our_words(&text), hf_words(&text));
        }
    }

    fn corpus() -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..300 {
            out.push(format!(
                "Line {i}: the file {} could not be opened, die Datei {} nicht.  中文{}",
                i % 7,
                i % 11,
                i % 5
            ));
            out.push(format!(
                "  {}'s value is {}\t{}",
                i % 13,
                i * 37,
                "é".repeat(i % 4)
            ));
        }
        out
    }

    #[test]
    fn training_matches_hf_train() {
        let texts = corpus();
        let ours = Tokenizer::train(texts.iter(), &["de", "zh"], 500).unwrap();

        // The same configuration through HF's own feeding path.
        let specials: Vec<AddedToken> = ["<pad>", "<s>", "</s>", "<unk>", "<de>", "<zh>"]
            .iter()
            .map(|s| AddedToken::from(*s, true))
            .collect();
        let trainer = BpeTrainer::builder()
            .vocab_size(500)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(specials)
            .build();
        let mut trainer = tokenizers::models::TrainerWrapper::BpeTrainer(trainer);
        let mut hf = tokenizers::Tokenizer::new(BPE::default());
        hf.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
        hf.with_decoder(Some(ByteLevelDecoder::default()));
        hf.train(&mut trainer, texts.iter()).unwrap();
        assert_eq!(ours.to_json().unwrap(), hf.to_string(false).unwrap());
    }

    #[test]
    fn encode_matches_hf_encode() {
        let texts = corpus();
        let t = Tokenizer::train(texts.iter(), &["de"], 500).unwrap();
        for s in texts
            .iter()
            .map(|s| s.as_str())
            .chain(TRICKY.iter().copied())
        {
            let hf = t.inner.encode(s, false).unwrap();
            assert_eq!(t.encode_pieces(s).unwrap(), hf.get_ids(), "{s:?}");
        }
        // Special-token text is not matched, in both paths.
        let hf = t.inner.encode("<s><de></s>", false).unwrap();
        assert_eq!(t.encode_pieces("<s><de></s>").unwrap(), hf.get_ids());
        assert!(!hf.get_ids().iter().any(|&id| t.is_special(id)));
    }
}
