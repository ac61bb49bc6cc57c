//! Cleaning catalog strings into training pairs.
//!
//! 1. Accelerator markers (`_File`, `~File`, `&File`, CJK `(_F)`) are removed from both sides
//!    when the English has one; HTML entities such as `&amp;` are not markers.
//! 2. Tags are stripped, entities decoded, whitespace collapsed to single spaces, NFC.
//! 3. Placeholders (`%s %1$s %(name)s {0} {$x} ${x} %1 #1 %PRODUCTNAME%` ...) are kept
//!    verbatim, and both sides must carry the same multiset of them.
//! 4. Pairs are dropped when empty, letterless, key-like (`DATE_FORMAT`), identical up to
//!    case, longer than 2000 characters, or with a length ratio above 6.
//!
//! Character classes follow Python's `re` on `str`: a word character is a letter (`\p{L}`),
//! a number (`\p{N}`) or `_`; whitespace is `\s` plus U+001C..U+001F.

use super::casefold::casefold;
use super::entities;
use regex::Regex;
use std::sync::LazyLock;
use unicode_normalization::UnicodeNormalization;

/// printf / Python / brace / Qt / shell / Mozilla placeholders, in priority order.
pub static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"%\([A-Za-z0-9_.]+\)[-+ #0]*\d*(?:\.\d+)?[a-zA-Z]", // %(name)s
        r"|%\d+\$[-+ #0]*\d*(?:\.\d+)?(?:l{0,2}|h{0,2}|z|j|t|L|I64)[a-zA-Z]", // %1$s
        r"|%[-+ #0]*\d*(?:\.\d+)?(?:ll|l|hh|h|z|j|t|L|q|I64)?[diouxXeEfFgGcsSpaAn@]", // %5.2f
        r"|%\d+",                                            // Qt %1
        r"|\{\{?[$-]?[A-Za-z0-9_.\[\]-]*(?:![rsa])?(?::[^{}]*)?\}\}?", // {0} {name} {{x}} {$v}
        r"|#\d\b",                                           // Mozilla plural #1
        r"|\$\{[A-Za-z0-9_]+\}|\$[A-Za-z_][A-Za-z0-9_]*\$|\$\d+", // ${x} $x$ $1
        r"|%[A-Z][A-Z0-9_]+%",                               // %PRODUCTNAME%
    ))
    .expect("placeholder regex")
});

static TAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"</?[A-Za-z][A-Za-z0-9:-]*(?:[\s\x1C-\x1F][^<>]*)?/?>").expect("tag regex")
});
static ACCEL_PAREN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[\s\x1C-\x1F]*[(（][_&~][A-Za-z0-9][)）]").expect("accel regex"));
static SPACES: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[\s\x1C-\x1F]+").expect("space regex"));
static LETTER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\p{L}").expect("letter regex"));
static WORD_CHAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A[\p{L}\p{N}_]\z").expect("word regex"));
static DECIMAL: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\A\d\z").expect("digit regex"));
static KEY_LIKE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A[A-Za-z0-9]+(?:[_.:-][A-Za-z0-9]+)*\z").expect("key regex"));

/// Why a pair was dropped (the keys of `stats.json`'s `dropped`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// A side is empty after cleaning.
    Empty,
    /// A side has no letter outside its placeholders (`%s`, `…`, numbers).
    NoLetters,
    /// The English looks like a key (`DATE_FORMAT`, `menu.file.open`).
    KeyLikeMsgid,
    /// Source and translation are equal ignoring case (untranslated fall-back).
    Identical,
    /// A side is longer than 2000 characters.
    TooLong,
    /// `(len(tr) + 5) / (len(en) + 5)` is above 6 or below 1/6.
    LengthRatio,
    /// The placeholder multisets differ.
    PlaceholderMismatch,
    /// A fuzzy (unreviewed) .po entry.
    Fuzzy,
    /// An entry without any translation.
    Untranslated,
}

impl DropReason {
    /// The snake_case name used in `stats.json`.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Empty => "empty",
            DropReason::NoLetters => "no_letters",
            DropReason::KeyLikeMsgid => "key_like_msgid",
            DropReason::Identical => "identical",
            DropReason::TooLong => "too_long",
            DropReason::LengthRatio => "length_ratio",
            DropReason::PlaceholderMismatch => "placeholder_mismatch",
            DropReason::Fuzzy => "fuzzy",
            DropReason::Untranslated => "untranslated",
        }
    }
}

/// A word character in Python's sense: letter, number or `_`.
pub fn is_word_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    let mut buf = [0u8; 4];
    WORD_CHAR.is_match(c.encode_utf8(&mut buf))
}

fn is_decimal(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    let mut buf = [0u8; 4];
    DECIMAL.is_match(c.encode_utf8(&mut buf))
}

/// The placeholders of `s`, sorted (a multiset).
pub fn placeholders(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = PLACEHOLDER.find_iter(s).map(|m| m.as_str()).collect();
    v.sort_unstable();
    v
}

/// True if an `&` at byte `i` of `s` is a mnemonic marker candidate: not the start of an
/// entity (`&name;`, `&#123;`, `&#x1F;`), not followed by another `&`, followed by a word
/// character.
fn amp_is_marker(s: &str, i: usize) -> bool {
    let rest = &s[i + 1..];
    let b = rest.as_bytes();
    let letters = b.iter().take_while(|c| c.is_ascii_alphabetic()).count();
    if letters > 0 && b.get(letters) == Some(&b';') {
        return false;
    }
    if b.first() == Some(&b'#') {
        let dec: usize = rest[1..]
            .chars()
            .take_while(|&c| is_decimal(c))
            .map(char::len_utf8)
            .sum();
        if dec > 0 && rest[1 + dec..].starts_with(';') {
            return false;
        }
        if b.get(1) == Some(&b'x') {
            let hex = b[2..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
            if hex > 0 && b.get(2 + hex) == Some(&b';') {
                return false;
            }
        }
    }
    if b.first() == Some(&b'&') {
        return false;
    }
    rest.chars().next().is_some_and(is_word_char)
}

/// Byte offsets in `s` of the marker characters (`marker` followed by a word character).
fn marker_positions(s: &str, marker: char) -> Vec<usize> {
    s.char_indices()
        .filter(|&(i, c)| {
            c == marker
                && if marker == '&' {
                    amp_is_marker(s, i)
                } else {
                    s[i + c.len_utf8()..]
                        .chars()
                        .next()
                        .is_some_and(is_word_char)
                }
        })
        .map(|(i, _)| i)
        .collect()
}

/// True if `s` has a mnemonic marker (one of `markers`) outside its placeholders.
pub fn has_accel(s: &str, markers: &str) -> bool {
    if markers.is_empty() {
        return false;
    }
    let plain = PLACEHOLDER.replace_all(s, "");
    markers
        .chars()
        .any(|m| !marker_positions(&plain, m).is_empty())
}

fn strip_accel_plain(s: &str, markers: &str) -> String {
    let mut s = s.to_string();
    for m in markers.chars() {
        let pos = marker_positions(&s, m);
        if pos.is_empty() && m != '&' {
            continue;
        }
        let mut out = String::with_capacity(s.len());
        let mut last = 0;
        for p in pos {
            out.push_str(&s[last..p]);
            last = p + m.len_utf8();
        }
        out.push_str(&s[last..]);
        s = if m == '&' {
            out.replace("&&", "&")
        } else {
            out
        };
    }
    s
}

/// Removes mnemonic markers (`_File`, `Ne_u`, `&File`, `~File`, CJK `(_F)`) outside
/// placeholders. `markers` is the set of marker characters, e.g. `"_~"`.
pub fn strip_accel(s: &str, markers: &str) -> String {
    if markers.is_empty() {
        return s.to_string();
    }
    let s = ACCEL_PAREN.replace_all(s, "");
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for m in PLACEHOLDER.find_iter(&s) {
        out.push_str(&strip_accel_plain(&s[last..m.start()], markers));
        out.push_str(m.as_str());
        last = m.end();
    }
    out.push_str(&strip_accel_plain(&s[last..], markers));
    out
}

/// One line of tag-free, entity-decoded, whitespace-collapsed NFC text.
pub fn clean_text(s: &str) -> String {
    let mut s = if s.contains('<') {
        TAG.replace_all(s, " ").into_owned()
    } else {
        s.to_string()
    };
    if s.contains('&') {
        s = entities::unescape(&s);
    }
    let s = s.replace('\u{a0}', " ").replace('\u{200b}', "");
    let s = SPACES.replace_all(&s, " ");
    s.trim_matches(' ').nfc().collect()
}

/// True if `s` has a letter outside its placeholders.
pub fn has_letters(s: &str) -> bool {
    LETTER.is_match(&PLACEHOLDER.replace_all(s, ""))
}

/// Cleans one (English, translation) pair with the accelerator `markers` of its catalog, or
/// says why it is dropped. Filters run in a fixed order, so each drop has one reason.
pub fn clean_pair(en: &str, tr: &str, markers: &str) -> Result<(String, String), DropReason> {
    let (en, tr) = if !markers.is_empty() && has_accel(en, markers) {
        (
            clean_text(&strip_accel(en, markers)),
            clean_text(&strip_accel(tr, markers)),
        )
    } else {
        (clean_text(en), clean_text(tr))
    };
    if en.is_empty() || tr.is_empty() {
        return Err(DropReason::Empty);
    }
    if !has_letters(&en) || !has_letters(&tr) {
        return Err(DropReason::NoLetters);
    }
    if KEY_LIKE.is_match(&en) && en.contains(['_', '.', ':']) {
        return Err(DropReason::KeyLikeMsgid);
    }
    if casefold(&en) == casefold(&tr) {
        return Err(DropReason::Identical);
    }
    let (ne, nt) = (en.chars().count(), tr.chars().count());
    if ne > 2000 || nt > 2000 {
        return Err(DropReason::TooLong);
    }
    let ratio = (nt as f64 + 5.0) / (ne as f64 + 5.0);
    if !(1.0 / 6.0..=6.0).contains(&ratio) {
        return Err(DropReason::LengthRatio);
    }
    if placeholders(&en) != placeholders(&tr) {
        return Err(DropReason::PlaceholderMismatch);
    }
    Ok((en, tr))
}
