//! Token-level parsers: numbers, lists, axis names, keywords, types, shardings and
//! attribute values.

use super::attrs::{slots, Slot};
use super::lex::{is_word_char, Cursor, Tok};
use super::{MAX_ELEMENTS, MAX_RANK};
use crate::dtype::{DType, Type};
use crate::error::ParseError;
use crate::mesh::Sharding;
use crate::op::{Op, ReduceOp, RngDist};

/// A non-negative integer that fits `u64`.
pub(super) fn parse_u64(c: &mut Cursor, what: &str) -> Result<(u64, usize), ParseError> {
    let t = c.peek();
    let Tok::Num(s) = t.tok else {
        return Err(c.unexpected(what));
    };
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(c.err(
            t.col,
            format!("expected {what} (a non-negative integer), found `{s}`"),
        ));
    }
    let n = s
        .parse::<u64>()
        .map_err(|_| c.err(t.col, format!("{what} `{s}` is too large")))?;
    c.bump();
    Ok((n, t.col))
}

/// A non-negative integer of at most 2^40 (dims, sizes, indices).
fn parse_index(c: &mut Cursor, what: &str) -> Result<(usize, usize), ParseError> {
    let (n, col) = parse_u64(c, what)?;
    match usize::try_from(n) {
        Ok(n) if n as u64 <= MAX_ELEMENTS => Ok((n, col)),
        _ => Err(c.err(col, format!("{what} `{n}` is too large (at most 2^40)"))),
    }
}

/// A float: an integer, a decimal with optional exponent, `inf`, `-inf`, `nan` or `NaN`.
fn float_from_str(s: &str) -> Result<f64, &'static str> {
    const EXPECTED: &str = "expected a number such as `1`, `-2.5`, `1e-3`, `inf`, `-inf` or `nan`";
    match s {
        "inf" => return Ok(f64::INFINITY),
        "-inf" => return Ok(f64::NEG_INFINITY),
        "nan" | "NaN" => return Ok(f64::NAN),
        _ => {}
    }
    let bytes = s.strip_prefix('-').unwrap_or(s).as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while bytes.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    if !digits(&mut i) {
        return Err(EXPECTED);
    }
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        digits(&mut i);
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return Err(EXPECTED);
        }
    }
    if i != bytes.len() {
        return Err(EXPECTED);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err("is out of range for f64"),
    }
}

pub(super) fn parse_float(c: &mut Cursor) -> Result<f64, ParseError> {
    let t = c.peek();
    let text = match t.tok {
        Tok::Num(s) | Tok::Ident(s) => s,
        _ => return Err(c.unexpected("a number")),
    };
    let v =
        float_from_str(text).map_err(|why| c.err(t.col, format!("bad number `{text}`: {why}")))?;
    c.bump();
    Ok(v)
}

/// `[item, item, ...]`, calling `item(c, k)` to read the `k`-th; returns the number of
/// items and the column of `[`. The caller keeps what it needs of each.
pub(super) fn parse_each<'a>(
    c: &mut Cursor<'a>,
    what: &str,
    mut item: impl FnMut(&mut Cursor<'a>, usize) -> Result<(), ParseError>,
) -> Result<(usize, usize), ParseError> {
    let open = c.expect_punct('[', &format!("`[` starting {what}"))?;
    if c.eat_punct(']').is_some() {
        return Ok((0, open));
    }
    let mut k = 0;
    loop {
        item(c, k)?;
        k += 1;
        if c.eat_punct(']').is_some() {
            return Ok((k, open));
        }
        c.expect_punct(',', "`,` or `]`")?;
    }
}

/// `[item, item, ...]`; returns the items and the column of `[`. Room for at most `room`
/// items is reserved up front (fewer when the rest of the line is too short to hold them,
/// each taking at least `min_bytes` with its comma), so a long list grows no copies.
pub(super) fn parse_list<'a, T>(
    c: &mut Cursor<'a>,
    what: &str,
    room: usize,
    min_bytes: usize,
    mut item: impl FnMut(&mut Cursor<'a>) -> Result<T, ParseError>,
) -> Result<(Vec<T>, usize), ParseError> {
    let mut items = Vec::with_capacity(room.min(c.bytes_left() / min_bytes.max(1) + 1));
    let (_, open) = parse_each(c, what, |c, _| {
        items.push(item(c)?);
        Ok(())
    })?;
    Ok((items, open))
}

/// [`parse_list`] of at most [`MAX_RANK`] items (an op's dims, axes of a mesh): the next
/// one is an error at its column, "{what} has more than 64 entries ({why})".
fn parse_short_list<'a, T>(
    c: &mut Cursor<'a>,
    what: &str,
    why: &str,
    mut item: impl FnMut(&mut Cursor<'a>) -> Result<T, ParseError>,
) -> Result<Vec<T>, ParseError> {
    let mut items = Vec::new();
    parse_each(c, what, |c, k| {
        if k == MAX_RANK {
            return Err(c.err(
                c.peek().col,
                format!("{what} has more than {MAX_RANK} entries ({why})"),
            ));
        }
        items.push(item(c)?);
        Ok(())
    })?;
    Ok(items)
}

/// Push one more sharding entry (a dim, an axis) at the current token, unless `entries`
/// already has [`MAX_RANK`]: then the error "{too_many}".
fn push_bounded<T>(
    c: &Cursor,
    entries: &mut Vec<T>,
    entry: T,
    col: usize,
    too_many: &str,
) -> Result<(), ParseError> {
    if entries.len() == MAX_RANK {
        return Err(c.err(col, too_many));
    }
    entries.push(entry);
    Ok(())
}

/// A mesh axis name: letters, digits and `_` (a word that starts with a digit lexes as a
/// number), but not `_` alone, which means "not split" in shardings.
pub(super) fn parse_axis(c: &mut Cursor) -> Result<(String, usize), ParseError> {
    let t = c.peek();
    match t.tok {
        Tok::Ident("_") => Err(c.err(
            t.col,
            "`_` cannot name a mesh axis (in a sharding it means an unsplit dim)",
        )),
        Tok::Ident(s) | Tok::Num(s) if s.chars().all(is_word_char) => {
            c.bump();
            Ok((s.to_string(), t.col))
        }
        _ => Err(c.unexpected("a mesh axis name")),
    }
}

/// One of the keywords in `options`.
fn parse_keyword<T: Copy>(
    c: &mut Cursor,
    what: &str,
    options: &[(&str, T)],
) -> Result<T, ParseError> {
    let names: Vec<String> = options.iter().map(|(n, _)| format!("`{n}`")).collect();
    let expected = format!("{what}: one of {}", names.join(", "));
    let t = c.peek();
    if let Tok::Ident(s) = t.tok {
        if let Some((_, v)) = options.iter().find(|(n, _)| *n == s) {
            c.bump();
            return Ok(*v);
        }
    }
    Err(c.unexpected(&expected))
}

/// `dtype[d0,d1,...]`, at most 2^40 elements.
pub(super) fn parse_type(c: &mut Cursor) -> Result<Type, ParseError> {
    let (name, col) = c.ident("a type such as `f32[4,8]`")?;
    let dtype = DType::from_name(name).ok_or_else(|| {
        c.err(
            col,
            format!("unknown dtype `{name}`: expected one of f32, f64, bf16, i32, bool"),
        )
    })?;
    c.expect_punct('[', "`[` after the dtype (a scalar is `f32[]`)")?;
    let mut shape = Vec::new();
    if c.eat_punct(']').is_none() {
        loop {
            let (d, d_col) = parse_u64(c, "a dimension size")?;
            if shape.len() == MAX_RANK {
                return Err(c.err(d_col, "type has too many dims (at most 64)"));
            }
            shape.push(usize::try_from(d).unwrap_or(usize::MAX));
            if c.eat_punct(']').is_some() {
                break;
            }
            c.expect_punct(',', "`,` or `]` in the shape")?;
        }
    }
    let mut elements: u64 = 1;
    for &d in &shape {
        elements = (d as u64)
            .max(1)
            .checked_mul(elements)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| c.err(col, "type is too large: at most 2^40 elements"))?;
    }
    Ok(Type::new(dtype, shape))
}

/// `{dims | partial axes}` (the `@` already consumed). Every list in it has at most
/// [`MAX_RANK`] entries (no type has more dims, no mesh more axes): the next one is an error.
pub(super) fn parse_sharding(c: &mut Cursor) -> Result<Sharding, ParseError> {
    c.expect_punct('{', "`{` starting a sharding, e.g. `@{data, _}`")?;
    let mut s = Sharding::default();
    if !c.is_punct('}') && !c.is_punct('|') {
        loop {
            let col = c.peek().col;
            let dim = parse_sharding_dim(c)?;
            push_bounded(
                c,
                &mut s.dims,
                dim,
                col,
                "the sharding has more than 64 dims (a type has at most 64; give one entry per dim)",
            )?;
            if c.eat_punct(',').is_none() {
                break;
            }
        }
    }
    if c.eat_punct('|').is_some() {
        let t = c.peek();
        if t.tok != Tok::Ident("partial") {
            return Err(c.unexpected("`partial` after `|`"));
        }
        c.bump();
        loop {
            let (axis, col) = parse_axis(c)?;
            push_bounded(
                c,
                &mut s.partial,
                axis,
                col,
                "the sharding has more than 64 partial axes (a mesh has at most 64 axes)",
            )?;
            if c.eat_punct(',').is_none() {
                break;
            }
        }
        c.expect_punct('}', "`,` or `}`")?;
    } else {
        c.expect_punct('}', "`,`, `| partial ...` or `}`")?;
    }
    Ok(s)
}

/// One dim of a sharding: `_`, an axis, or `(axis,axis,...)`.
fn parse_sharding_dim(c: &mut Cursor) -> Result<Vec<String>, ParseError> {
    if c.peek().tok == Tok::Ident("_") {
        c.bump();
        return Ok(vec![]);
    }
    if c.eat_punct('(').is_none() {
        return Ok(vec![
            parse_axis(c)
                .map_err(|_| c.unexpected("`_`, a mesh axis name or `(axis,axis)`"))?
                .0,
        ]);
    }
    let mut axes = Vec::new();
    loop {
        let (axis, col) = parse_axis(c)?;
        push_bounded(
            c,
            &mut axes,
            axis,
            col,
            "a sharding dim has more than 64 axes (a mesh has at most 64 axes)",
        )?;
        if c.eat_punct(')').is_some() {
            return Ok(axes);
        }
        c.expect_punct(',', "`,` or `)`")?;
    }
}

/// `(a,b)` in a `pairs` list.
fn parse_pair(c: &mut Cursor) -> Result<(usize, usize), ParseError> {
    c.expect_punct('(', "`(` starting a pair, e.g. `(0,1)`")?;
    let (a, _) = parse_index(c, "a source rank")?;
    c.expect_punct(',', "`,` between the ranks of a pair")?;
    let (b, _) = parse_index(c, "a target rank")?;
    c.expect_punct(')', "`)` closing the pair")?;
    Ok((a, b))
}

/// The value of attribute `key` into its slot.
fn parse_attr_value(c: &mut Cursor, key: &str, slot: &mut Slot) -> Result<(), ParseError> {
    let what = format!("the value of `{key}`");
    let list = format!("the `{key}` list");
    match slot {
        Slot::Usize(x) => **x = parse_index(c, &what)?.0,
        Slot::U64(x) => **x = parse_u64(c, &what)?.0,
        Slot::Bool(x) => **x = parse_keyword(c, &what, &[("true", true), ("false", false)])?,
        Slot::List(x) => {
            **x = parse_short_list(c, &list, "a type has at most 64 dims", |c| {
                Ok(parse_index(c, "a non-negative integer")?.0)
            })?
        }
        Slot::Axes(x) => {
            **x = parse_short_list(c, &list, "a mesh has at most 64 axes", |c| {
                Ok(parse_axis(c)?.0)
            })?;
        }
        // `(0,1)` and a comma: 6 bytes at least.
        Slot::Pairs(x) => **x = parse_list(c, &list, usize::MAX, 6, parse_pair)?.0,
        Slot::Reduce(x) => {
            let options = ReduceOp::ALL.map(|r| (r.name(), r));
            **x = parse_keyword(c, &what, &options)?;
        }
        Slot::Dist(x) => {
            let options = [RngDist::Uniform, RngDist::Normal].map(|d| (d.name(), d));
            **x = parse_keyword(c, &what, &options)?;
        }
    }
    Ok(())
}

/// `key=value ...` after the arguments, into the op's slots; checks that required ones are
/// present.
pub(super) fn parse_attributes(
    c: &mut Cursor,
    op: &mut Op,
    op_col: usize,
) -> Result<(), ParseError> {
    let op_name = op.name();
    let mut slots = slots(op);
    let mut given = vec![false; slots.len()];
    while let Tok::Ident(key) = c.peek().tok {
        let key_col = c.peek().col;
        let Some(k) = slots.iter().position(|s| s.name == key) else {
            let msg = if slots.is_empty() {
                format!("unknown attribute `{key}`: {op_name} takes no attributes")
            } else {
                let names: Vec<&str> = slots.iter().map(|s| s.name).collect();
                format!(
                    "unknown attribute `{key}` for {op_name}: expected one of {}",
                    names.join(", ")
                )
            };
            return Err(c.err(key_col, msg));
        };
        if std::mem::replace(&mut given[k], true) {
            return Err(c.err(key_col, format!("attribute `{key}` is given twice")));
        }
        c.bump();
        c.expect_punct('=', &format!("`=` after `{key}`"))?;
        parse_attr_value(c, key, &mut slots[k].slot)?;
    }
    for (s, given) in slots.iter().zip(&given) {
        if s.required && !given {
            return Err(c.err(
                op_col,
                format!(
                    "{op_name} needs attribute `{}` (e.g. `{}={}`)",
                    s.name,
                    s.name,
                    s.slot.example()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats() {
        assert_eq!(float_from_str("1"), Ok(1.0));
        assert_eq!(float_from_str("-2.5e-3"), Ok(-2.5e-3));
        assert_eq!(float_from_str("1."), Ok(1.0));
        assert_eq!(float_from_str("1E+2"), Ok(100.0));
        assert_eq!(float_from_str("-inf"), Ok(f64::NEG_INFINITY));
        assert!(float_from_str("NaN").is_ok_and(f64::is_nan));
        for bad in [
            "", "-", "1e", "1.2.3", "0x10", "infinity", "1_0", "+1", "1e999",
        ] {
            assert!(float_from_str(bad).is_err(), "{bad}");
        }
    }
}
