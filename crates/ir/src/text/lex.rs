//! The lexer and the token cursor: one line at a time, columns in characters.
//!
//! Tokens are lexed on demand from the line itself and borrow their text from it (a string
//! literal keeps its escapes until it is read), so parsing a line holds no copy of it:
//! only what the parser keeps (values of a dense constant, names) grows with the line. A
//! line is lexed once through before it is parsed, so that, as when whole lines were
//! tokenized up front, a lexical error anywhere on a line is the error that line reports.

use std::borrow::Cow;

use super::print::Quoted;
use crate::error::ParseError;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Tok<'a> {
    /// A word starting with a letter or `_`: keywords, dtypes, op and attribute names.
    Ident(&'a str),
    /// `%name` (the name without `%`).
    Value(&'a str),
    /// A word starting with a digit, or `-` then a word: validated where it is used.
    Num(&'a str),
    /// A string literal as written between its quotes: escapes checked, not yet replaced
    /// ([`unescape`]).
    Str(&'a str),
    Punct(char),
    End,
}

impl Tok<'_> {
    /// How the token reads in an error message.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Num(s) => format!("number `{s}`"),
            Tok::Str(s) => format!("string {}", Quoted(&unescape(s))),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::End => "end of line".to_string(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Token<'a> {
    pub(super) tok: Tok<'a>,
    /// 1-based column in characters.
    pub(super) col: usize,
}

const PUNCT: [char; 10] = ['=', '[', ']', '(', ')', ',', '{', '}', '@', '|'];

pub(super) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_word_byte(b: u8) -> bool {
    is_word_char(char::from(b))
}

/// A position in one line: the next token starts at or after it.
#[derive(Clone, Copy)]
struct Lexer<'a> {
    text: &'a str,
    /// Byte offset in `text`.
    at: usize,
    /// Characters before `at` (the 0-based column).
    chars: usize,
    line: usize,
}

impl<'a> Lexer<'a> {
    fn err(&self, col: usize, msg: String) -> ParseError {
        ParseError {
            line: self.line,
            col,
            msg,
        }
    }

    /// Move past `n` bytes that are `n` characters (ASCII).
    fn skip_ascii(&mut self, n: usize) {
        self.at += n;
        self.chars += n;
    }

    /// End (exclusive byte offset) of the run of word characters from byte `start`.
    fn word_end(&self, start: usize) -> usize {
        let b = self.text.as_bytes();
        let mut j = start;
        while b.get(j).is_some_and(|&c| is_word_byte(c)) {
            j += 1;
        }
        j
    }

    /// End of a number starting at byte `start` (a digit or `-`): word characters, `.`, and
    /// a sign right after an exponent `e`.
    fn number_end(&self, start: usize) -> usize {
        let b = self.text.as_bytes();
        let mut j = start + 1;
        while let Some(&c) = b.get(j) {
            let after_e = matches!(b[j - 1], b'e' | b'E');
            if is_word_byte(c) || c == b'.' || (after_e && (c == b'+' || c == b'-')) {
                j += 1;
            } else {
                break;
            }
        }
        j
    }

    /// The next token, or [`Tok::End`] at the end of the line or at a comment (and from
    /// then on).
    fn next(&mut self) -> Result<Token<'a>, ParseError> {
        let b = self.text.as_bytes();
        while let Some(ch) = self.text[self.at..].chars().next() {
            let col = self.chars + 1;
            if ch.is_whitespace() || ch == '\u{feff}' {
                self.at += ch.len_utf8();
                self.chars += 1;
                continue;
            }
            if ch == '#' {
                break;
            }
            let start = self.at;
            let tok = if PUNCT.contains(&ch) {
                self.skip_ascii(1);
                Tok::Punct(ch)
            } else if ch == '"' {
                Tok::Str(self.string()?)
            } else if ch == '%' {
                let end = self.word_end(start + 1);
                if end == start + 1 {
                    return Err(self.err(
                        col,
                        "expected a value name after `%` (letters, digits and `_`, e.g. `%0` or `%x`)"
                            .into(),
                    ));
                }
                self.skip_ascii(end - start);
                Tok::Value(&self.text[start + 1..end])
            } else if ch.is_ascii_alphabetic() || ch == '_' {
                let end = self.word_end(start);
                self.skip_ascii(end - start);
                Tok::Ident(&self.text[start..end])
            } else if ch.is_ascii_digit()
                || (ch == '-' && b.get(start + 1).is_some_and(|&c| is_word_byte(c)))
            {
                let end = self.number_end(start);
                self.skip_ascii(end - start);
                Tok::Num(&self.text[start..end])
            } else {
                return Err(self.err(col, format!("unexpected character `{}`", ch.escape_debug())));
            };
            return Ok(Token { tok, col });
        }
        Ok(Token {
            tok: Tok::End,
            col: self.chars + 1,
        })
    }

    /// The string literal whose opening `"` is next: checks its escapes and moves past its
    /// closing `"`; returns the text between the quotes.
    fn string(&mut self) -> Result<&'a str, ParseError> {
        let open_col = self.chars + 1;
        let unterminated = || {
            self.err(
                open_col,
                "unterminated string: expected a closing `\"` on the same line".into(),
            )
        };
        let start = self.at + 1;
        let mut chars = self.text[start..].char_indices();
        // The column of the character being looked at.
        let mut col = open_col;
        loop {
            col += 1;
            match chars.next() {
                None => return Err(unterminated()),
                Some((k, '"')) => {
                    self.at = start + k + 1;
                    self.chars = col;
                    return Ok(&self.text[start..start + k]);
                }
                Some((k, '\\')) => {
                    let bad = |what: &str| {
                        self.err(
                            col,
                            format!(
                                "bad escape {what} in string: expected one of \\\" \\\\ \\n \\r \\t \\u{{hex}}"
                            ),
                        )
                    };
                    let len = match chars.next() {
                        None => return Err(unterminated()),
                        Some((_, '"' | '\\' | 'n' | 'r' | 't')) => 2,
                        Some((_, 'u')) => {
                            let rest = &self.text[start + k..];
                            let (_, len) = unicode_escape(rest).ok_or_else(|| bad("`\\u`"))?;
                            // Past the escape's `{hex}` (ASCII: one character a byte).
                            for _ in 2..len {
                                chars.next();
                            }
                            len
                        }
                        Some((_, other)) => {
                            return Err(bad(&format!("`\\{}`", other.escape_debug())))
                        }
                    };
                    col += len - 1;
                }
                Some(_) => {}
            }
        }
    }
}

/// `\u{hex}` at the start of `s` (the backslash): the character and the escape's length
/// (in bytes, which are characters: the escape is ASCII).
fn unicode_escape(s: &str) -> Option<(char, usize)> {
    let b = s.as_bytes();
    if b.get(2) != Some(&b'{') {
        return None;
    }
    let digits = b[3..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 6 || b.get(3 + digits) != Some(&b'}') {
        return None;
    }
    let c = char::from_u32(u32::from_str_radix(&s[3..3 + digits], 16).ok()?)?;
    Some((c, digits + 4))
}

/// The value of a string literal lexed as [`Tok::Str`] (its escapes already checked).
pub(super) fn unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    let mut s = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(k) = rest.find('\\') {
        s.push_str(&rest[..k]);
        let esc = &rest[k..];
        let (c, len) = match esc.as_bytes().get(1) {
            Some(b'"') => ('"', 2),
            Some(b'\\') => ('\\', 2),
            Some(b'n') => ('\n', 2),
            Some(b'r') => ('\r', 2),
            Some(b't') => ('\t', 2),
            // The lexer admits no other escape; a stray one is kept as written.
            _ => unicode_escape(esc).unwrap_or(('\\', 1)),
        };
        s.push(c);
        rest = &esc[len..];
    }
    s.push_str(rest);
    Cow::Owned(s)
}

/// The tokens of one line, lexed one at a time as the parser moves on.
pub(super) struct Cursor<'a> {
    lex: Lexer<'a>,
    cur: Token<'a>,
    /// Byte offset where `cur` starts (the line's length at its end).
    cur_at: usize,
    pub(super) line: usize,
}

impl<'a> Cursor<'a> {
    /// The cursor at the first token of `text`, line number `line`; the first lexical error
    /// of the line, if it has one.
    pub(super) fn new(text: &'a str, line: usize) -> Result<Cursor<'a>, ParseError> {
        let start = Lexer {
            text,
            at: 0,
            chars: 0,
            line,
        };
        let mut check = start;
        while check.next()?.tok != Tok::End {}
        let mut lex = start;
        let cur = lex.next()?;
        let mut c = Cursor {
            lex,
            cur,
            cur_at: 0,
            line,
        };
        c.cur_at = c.start_of_cur();
        Ok(c)
    }

    /// Byte offset of the current token: the lexer's position less the token's length.
    fn start_of_cur(&self) -> usize {
        let len = match self.cur.tok {
            Tok::Ident(s) | Tok::Num(s) => s.len(),
            Tok::Value(s) => s.len() + 1,
            Tok::Str(s) => s.len() + 2,
            Tok::Punct(_) => 1,
            Tok::End => 0,
        };
        match self.cur.tok {
            // At a comment or the end: nothing after it is read.
            Tok::End => self.lex.text.len(),
            _ => self.lex.at - len,
        }
    }

    pub(super) fn peek(&self) -> Token<'a> {
        self.cur
    }

    /// Bytes of the line from the current token on: a bound on how many more items a list
    /// can have (each takes at least one byte).
    pub(super) fn bytes_left(&self) -> usize {
        self.lex.text.len() - self.cur_at
    }

    /// The current token; moves past it unless it is the end of the line.
    pub(super) fn bump(&mut self) -> Token<'a> {
        let t = self.cur;
        if t.tok != Tok::End {
            // `new` lexed the whole line once: lexing it again cannot fail.
            self.cur = self.lex.next().unwrap_or(Token {
                tok: Tok::End,
                col: self.lex.chars + 1,
            });
            self.cur_at = self.start_of_cur();
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

    pub(super) fn ident(&mut self, expected: &str) -> Result<(&'a str, usize), ParseError> {
        match self.peek().tok {
            Tok::Ident(s) => Ok((s, self.bump().col)),
            _ => Err(self.unexpected(expected)),
        }
    }

    /// A string literal's value (its escapes replaced) and column.
    pub(super) fn string(&mut self, expected: &str) -> Result<(Cow<'a, str>, usize), ParseError> {
        match self.peek().tok {
            Tok::Str(s) => Ok((unescape(s), self.bump().col)),
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

    fn tokens(text: &str) -> Result<Vec<Token<'_>>, ParseError> {
        let mut c = Cursor::new(text, 1)?;
        let mut out = vec![];
        loop {
            let t = c.bump();
            out.push(t);
            if t.tok == Tok::End {
                return Ok(out);
            }
        }
    }

    #[test]
    fn strings_round_trip() {
        let s = "a\"b\\c\nd\te\r\u{1b}é€🙂";
        let printed = Quoted(s).to_string();
        let toks = tokens(&printed).unwrap();
        let Tok::Str(raw) = toks[0].tok else {
            panic!("{toks:?}")
        };
        assert_eq!(unescape(raw), s);
        assert_eq!(toks[1].tok, Tok::End);
    }

    /// Columns count characters (a string of wide ones included); each token's text is a
    /// slice of the line.
    #[test]
    fn columns_count_characters() {
        let toks = tokens("\u{feff}%é = \"é\\u{e9}\" f32 -1.5e+3 # x").unwrap_err();
        assert_eq!(
            (toks.col, toks.msg.as_str()),
            (
                2,
                "expected a value name after `%` (letters, digits and `_`, e.g. `%0` or `%x`)"
            )
        );
        let toks = tokens("\u{feff}%v = \"é\\u{e9}\\n\"\tf32[2] -1.5e+3 # x").unwrap();
        let got: Vec<(Tok, usize)> = toks.iter().map(|t| (t.tok, t.col)).collect();
        assert_eq!(
            got,
            [
                (Tok::Value("v"), 2),
                (Tok::Punct('='), 5),
                (Tok::Str("é\\u{e9}\\n"), 7),
                (Tok::Ident("f32"), 19),
                (Tok::Punct('['), 22),
                (Tok::Num("2"), 23),
                (Tok::Punct(']'), 24),
                (Tok::Num("-1.5e+3"), 26),
                (Tok::End, 34),
            ]
        );
        assert_eq!(unescape("é\\u{e9}\\n"), "éé\n");
    }

    /// The cursor knows how many bytes of the line are left from its token on.
    #[test]
    fn bytes_left_count_from_the_current_token() {
        let mut c = Cursor::new("ab [1, 22] # c", 1).unwrap();
        assert_eq!(c.bytes_left(), 14);
        c.bump();
        assert_eq!(c.bytes_left(), 11);
        for _ in 0..4 {
            c.bump();
        }
        assert_eq!(c.peek().tok, Tok::Punct(']'));
        assert_eq!(c.bytes_left(), 5);
        c.bump();
        assert_eq!(c.bytes_left(), 0);
    }
}
