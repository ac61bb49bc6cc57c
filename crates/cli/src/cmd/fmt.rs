//! `gshard fmt`: parse a program, verify it, and print its canonical text.

use crate::files;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Program in text form (.gsir).
    program: PathBuf,
    /// Only check: exit 2 if the program is invalid or not in canonical form; print nothing.
    #[arg(long)]
    check: bool,
    /// Rewrite the file in place with its canonical form.
    #[arg(long, conflicts_with = "check")]
    write: bool,
}

pub fn main(a: Args) -> Result<()> {
    let p = files::read_program(&a.program)?;
    let text = ir::text::print(&p);
    if a.check {
        let src = std::fs::read_to_string(&a.program)
            .with_context(|| format!("cannot read {}", a.program.display()))?;
        if src != text {
            bail!(
                "{} is valid but not in canonical form; run `gshard fmt --write`",
                a.program.display()
            );
        }
    } else if a.write {
        let src = std::fs::read_to_string(&a.program)
            .with_context(|| format!("cannot read {}", a.program.display()))?;
        if src == text {
            return Ok(());
        }
        if let Some(why) = what_write_would_lose(&src, &text) {
            bail!(
                "{}: not rewritten, since the canonical form would {why}; print it with `gshard fmt {}` and edit by hand",
                a.program.display(),
                a.program.display()
            );
        }
        files::write_atomic(&a.program, text.as_bytes())?;
    } else {
        print!("{text}");
    }
    Ok(())
}

/// What rewriting `src` as `canonical` would lose, if anything: its comments, or its value
/// names (the canonical form numbers values `%0, %1, ...`).
fn what_write_would_lose(src: &str, canonical: &str) -> Option<String> {
    let (src_names, src_comments) = scan(src);
    let (canon_names, canon_comments) = scan(canonical);
    if let Some((line, _)) = src_comments
        .iter()
        .find(|(_, c)| !canon_comments.iter().any(|(_, k)| k == c))
    {
        return Some(format!("drop its comments (the first on line {line})"));
    }
    let renamed = src_names
        .iter()
        .zip(&canon_names)
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("rename its values (`%{a}` becomes `%{b}`)"));
    renamed
        .or_else(|| (src_names.len() != canon_names.len()).then(|| "change its values".to_string()))
}

/// The `%name`s of a program text in order, and its comments (from a `#` outside a string
/// literal to the end of the line) with their line numbers.
fn scan(text: &str) -> (Vec<String>, Vec<(usize, String)>) {
    let mut names = Vec::new();
    let mut comments = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut chars = line.chars().peekable();
        let mut in_string = false;
        while let Some(c) = chars.next() {
            match c {
                '\\' if in_string => {
                    chars.next();
                }
                '"' => in_string = !in_string,
                '#' if !in_string => {
                    comments.push((i + 1, chars.by_ref().collect::<String>().trim().to_string()));
                    break;
                }
                '%' if !in_string => {
                    let mut name = String::new();
                    while let Some(&n) = chars.peek() {
                        if n.is_alphanumeric() || n == '_' {
                            name.push(n);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    names.push(name);
                }
                _ => {}
            }
        }
    }
    (names, comments)
}
