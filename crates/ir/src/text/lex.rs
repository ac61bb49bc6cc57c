//! The lexer and the token cursor: one line at a time, columns in characters.

use super::print::Quoted;
use crate::error::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// A word starting with a letter or `_`: keywords, dtypes, op and attribute names.
    Ident(String),
    /// `%name` (the name without `%`).
    Value(String),
    /// A word starting with a digit, or `-` then a word: validated where it is used.
    Num(String),
    /// A string literal, unescaped.
    Str(String),
    Punct(char),
    End,
}

impl Tok {
    /// How the token reads in an error message.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Num(s) => format!("number `{s}`"),
            Tok::Str(s) => format!("string {}", Quoted(s)),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::End => "end of line".to_string(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Token {
    pub(super) tok: Tok,
    /// 1-based column in characters.
    pub(super) col: usize,
}

const PUNCT: [char; 10] = ['=', '[', ']', '(', ')', ',', '{', '}', '@', '|'];

pub(super) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// End (exclusive) of the run of word characters starting at `start`.
fn word_end(chars: &[char], start: usize) -> usize {
    let mut j = start;
    while chars.get(j).is_some_and(|&c| is_word_char(c)) {
        j += 1;
    }
    j
}

/// End of a number starting at `start` (a digit or `-`): word characters, `.`, and a sign
/// right after an exponent `e`.
fn number_end(chars: &[char], start: usize) -> usize {
    let mut j = start + 1;
    while let Some(&c) = chars.get(j) {
        let after_e = j > start && matches!(chars.get(j - 1), Some('e' | 'E'));
        if is_word_char(c) || c == '.' || (after_e && (c == '+' || c == '-')) {
            j += 1;
        } else {
            break;
        }
    }
    j
}

/// Split one line into tokens, ending with [`Tok::End`] (at the comment, if any).
pub(super) fn lex_line(text: &str, line: usize) -> Result<Vec<Token>, ParseError> {
    let chars: Vec<char> = text.chars().collect();
    let err = |col: usize, msg: String| ParseError { line, col, msg };
    let mut toks = Vec::new();
    let mut i = 0;
    while let Some(&ch) = chars.get(i) {
        let col = i + 1;
        let tok = if ch.is_whitespace() || ch == '\u{feff}' {
            i += 1;
            continue;
        } else if ch == '#' {
            break;
        } else if PUNCT.contains(&ch) {
            i += 1;
            Tok::Punct(ch)
        } else if ch == '"' {
            let (s, next) = lex_string(&chars, i, line)?;
            i = next;
            Tok::Str(s)
        } else if ch == '%' {
            let end = word_end(&chars, i + 1);
            if end == i + 1 {
                return Err(err(
                    col,
                    "expected a value name after `%` (letters, digits and `_`, e.g. `%0` or `%x`)"
                        .into(),
                ));
            }
            let name = chars[i + 1..end].iter().collect();
            i = end;
            Tok::Value(name)
        } else if ch.is_ascii_alphabetic() || ch == '_' {
            let end = word_end(&chars, i);
            let word = chars[i..end].iter().collect();
            i = end;
            Tok::Ident(word)
        } else if ch.is_ascii_digit()
            || (ch == '-' && chars.get(i + 1).is_some_and(|&c| is_word_char(c)))
        {
            let end = number_end(&chars, i);
            let word = chars[i..end].iter().collect();
            i = end;
            Tok::Num(word)
        } else {
            return Err(err(
                col,
                format!("unexpected character `{}`", ch.escape_debug()),
            ));
        };
        toks.push(Token { tok, col });
    }
    toks.push(Token {
        tok: Tok::End,
        col: i + 1,
    });
    Ok(toks)
}

/// Lex the string literal whose opening `"` is at `start`; returns it and the index after
/// the closing `"`.
fn lex_string(chars: &[char], start: usize, line: usize) -> Result<(String, usize), ParseError> {
    let err = |col: usize, msg: String| ParseError { line, col, msg };
    let unterminated = || {
        err(
            start + 1,
            "unterminated string: expected a closing `\"` on the same line".into(),
        )
    };
    let mut s = String::new();
    let mut j = start + 1;
    loop {
        match chars.get(j) {
            None => return Err(unterminated()),
            Some('"') => return Ok((s, j + 1)),
            Some('\\') => {
                let bad = |what: &str| {
                    err(
                        j + 1,
                        format!(
                            "bad escape {what} in string: expected one of \\\" \\\\ \\n \\r \\t \\u{{hex}}"
                        ),
                    )
                };
                let (c, len) = match chars.get(j + 1) {
                    None => return Err(unterminated()),
                    Some('"') => ('"', 2),
                    Some('\\') => ('\\', 2),
                    Some('n') => ('\n', 2),
                    Some('r') => ('\r', 2),
                    Some('t') => ('\t', 2),
                    Some('u') => lex_unicode_escape(chars, j).ok_or_else(|| bad("`\\u`"))?,
                    Some(&other) => return Err(bad(&format!("`\\{}`", other.escape_debug()))),
                };
                s.push(c);
                j += len;
            }
            Some(&c) => {
                s.push(c);
                j += 1;
            }
        }
    }
}

/// `\u{hex}` at `start` (the backslash): the character and the escape's length.
fn lex_unicode_escape(chars: &[char], start: usize) -> Option<(char, usize)> {
    if chars.get(start + 2) != Some(&'{') {
        return None;
    }
    let digits_start = start + 3;
    let mut j = digits_start;
    while chars.get(j).is_some_and(|c| c.is_ascii_hexdigit()) {
        j += 1;
    }
    if j == digits_start || j - digits_start > 6 || chars.get(j) != Some(&'}') {
        return None;
    }
    let hex: String = chars[digits_start..j].iter().collect();
    let c = char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?;
    Some((c, j + 1 - start))
}

// ---------------------------------------------------------------------------------------
// Token cursor
// ---------------------------------------------------------------------------------------

static END: Token = Token {
    tok: Tok::End,
    col: 1,
};

/// A position in the tokens of one line.
pub(super) struct Cursor<'t> {
    pub(super) toks: &'t [Token],
    pub(super) pos: usize,
    pub(super) line: usize,
}

impl<'t> Cursor<'t> {
    pub(super) fn peek(&self) -> &'t Token {
        self.toks.get(self.pos).unwrap_or(&END)
    }

    /// The current token; moves past it unless it is the end of the line.
    pub(super) fn bump(&mut self) -> &'t Token {
        let t = self.peek();
        if t.tok != Tok::End {
            self.pos += 1;
        }
        t
    }

    pub(super) fn err(&self, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col,
            msg: msg.into(),
        }
    }

    /// "expected {expected}, found {the current token}".
    pub(super) fn unexpected(&self, expected: &str) -> ParseError {
        let t = self.peek();
        self.err(
            t.col,
            format!("expected {expected}, found {}", t.tok.describe()),
        )
    }

    pub(super) fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    /// Consume `c` if it is next; returns its column.
    pub(super) fn eat_punct(&mut self, c: char) -> Option<usize> {
        self.is_punct(c).then(|| self.bump().col)
    }

    pub(super) fn expect_punct(&mut self, c: char, expected: &str) -> Result<usize, ParseError> {
        self.eat_punct(c).ok_or_else(|| self.unexpected(expected))
    }

    pub(super) fn ident(&mut self, expected: &str) -> Result<(&'t str, usize), ParseError> {
        match &self.peek().tok {
            Tok::Ident(s) => Ok((s.as_str(), self.bump().col)),
            _ => Err(self.unexpected(expected)),
        }
    }

    pub(super) fn string(&mut self, expected: &str) -> Result<(&'t str, usize), ParseError> {
        match &self.peek().tok {
            Tok::Str(s) => Ok((s.as_str(), self.bump().col)),
            _ => Err(self.unexpected(expected)),
        }
    }

    pub(super) fn expect_end(&self, expected: &str) -> Result<(), ParseError> {
        match self.peek().tok {
            Tok::End => Ok(()),
            _ => Err(self.unexpected(expected)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip() {
        let s = "a\"b\\c\nd\te\r\u{1b}é€🙂";
        let printed = Quoted(s).to_string();
        let toks = lex_line(&printed, 1).unwrap();
        assert_eq!(toks[0].tok, Tok::Str(s.to_string()));
        assert_eq!(toks[1].tok, Tok::End);
    }
}
