//! Text format of programs: an HLO-like printer and a parser that never panics.
//!
//! One declaration per line; `#` starts a comment that runs to the end of the line, and
//! blank lines are ignored:
//!
//! ```text
//! mesh [data=2, expert=4]                          # optional, before any instruction
//! %x = f32[4,8] parameter("x") @{data, _}
//! %w = f32[8,16] parameter("w")
//! %y = f32[4,16] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
//! %z = f32[4,16] constant(0.0)
//! %r = f32[4,16] max(%y, %z)
//! %s = f32[] reduce(%r) op=sum dims=[0, 1]
//! output "loss" = %s
//! ```
//!
//! * `mesh` is exactly [`Mesh`]'s `Display`, e.g. `mesh [a=2, b=2] devices=[3,1,0,2]`.
//! * An instruction is `%name = TYPE OP(ARGS) KEY=VALUE... @SHARDING`. The type is
//!   `dtype[dims]` (`f32[4,8]`, scalar `f32[]`); the op is [`Op::name`]; the arguments are
//!   values, except for `parameter("name")` and `constant(1.5)` / `constant([1.0, 2.0])`.
//!   Attributes follow as `key=value` (`dims=[0, 1]`, `op=sum`, `axes=[data, expert]`,
//!   `pairs=[(0,1), (1,0)]`, `exclusive=true`); dot-general omits its empty dim lists. The
//!   optional sharding is exactly [`Sharding`]'s `Display`.
//! * `output "name" = %value` names an output.
//! * Strings escape `\"`, `\\`, `\n`, `\r`, `\t` and other control characters as `\u{1b}`.
//! * Numbers are printed with `{:?}` (shortest round-trip: `1.0`, `1e-10`, `inf`, `NaN`);
//!   the parser reads integers, decimals, exponents, `inf`, `-inf`, `nan` and `NaN`.
//!
//! The printer names values `%0, %1, ...` by index. The parser accepts any names made of
//! letters, digits and `_` and numbers them in order of definition. It type-checks every
//! instruction with [`infer_type`] and every sharding against the mesh as it goes, so errors
//! point at the offending line and column (1-based, counted in characters), and it returns
//! only programs that pass [`verify`]. Sizes are bounded (2^40 elements per type, 2^40 per
//! index attribute, 64 dims per type, 64 mesh axes, 2^20 mesh devices) so that no later
//! shape arithmetic can overflow and no check can take quadratic time in a huge rank.

use std::collections::HashMap;
use std::fmt;

use crate::dtype::{DType, Type};
use crate::error::ParseError;
use crate::infer::infer_type;
use crate::mesh::{Mesh, Sharding};
use crate::op::{BinaryOp, CompareOp, DotDims, Literal, Op, ReduceOp, RngDist, UnaryOp};
use crate::program::{Instr, Program, ValueId};
use crate::verify::verify;

/// Most elements a type may have (counting a zero-sized dim as 1), and the largest value of
/// an index attribute: keeps every shape computation far from `u64` overflow.
const MAX_ELEMENTS: u64 = 1 << 40;
/// Most devices a mesh may have (a mesh stores one id per device).
const MAX_DEVICES: u64 = 1 << 20;
/// Most dims a type may have, and most axes a mesh may have (size-1 axes do not count
/// towards [`MAX_DEVICES`]): keeps the quadratic dim and axis checks downstream cheap.
const MAX_RANK: usize = 64;

// ---------------------------------------------------------------------------------------
// Attributes: one table per direction, both matching every `Op` variant.
// ---------------------------------------------------------------------------------------

/// An attribute value borrowed from an op, for printing.
enum AttrRef<'a> {
    Usize(usize),
    U64(u64),
    Bool(bool),
    List(&'a [usize]),
    Axes(&'a [String]),
    Pairs(&'a [(usize, usize)]),
    Reduce(ReduceOp),
    Dist(RngDist),
}

/// Where a parsed attribute value is stored, for parsing.
enum Slot<'a> {
    Usize(&'a mut usize),
    U64(&'a mut u64),
    Bool(&'a mut bool),
    List(&'a mut Vec<usize>),
    Axes(&'a mut Vec<String>),
    Pairs(&'a mut Vec<(usize, usize)>),
    Reduce(&'a mut ReduceOp),
    Dist(&'a mut RngDist),
}

impl Slot<'_> {
    /// An example value, for "missing attribute" messages.
    fn example(&self) -> &'static str {
        match self {
            Slot::Usize(_) | Slot::U64(_) => "0",
            Slot::Bool(_) => "false",
            Slot::List(_) => "[0, 1]",
            Slot::Axes(_) => "[data]",
            Slot::Pairs(_) => "[(0,1), (1,0)]",
            Slot::Reduce(_) => "sum",
            Slot::Dist(_) => "uniform",
        }
    }
}

/// One attribute of an op being parsed.
struct AttrSlot<'a> {
    name: &'static str,
    /// Absent optional attributes keep the template's (empty) value.
    required: bool,
    slot: Slot<'a>,
}

fn req<'a>(name: &'static str, slot: Slot<'a>) -> AttrSlot<'a> {
    AttrSlot {
        name,
        required: true,
        slot,
    }
}

fn opt<'a>(name: &'static str, slot: Slot<'a>) -> AttrSlot<'a> {
    AttrSlot {
        name,
        required: false,
        slot,
    }
}

/// The attributes of `op` in printing order (dot-general omits its empty dim lists).
fn attrs(op: &Op) -> Vec<(&'static str, AttrRef<'_>)> {
    use AttrRef as A;
    match op {
        Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::DynamicUpdateSlice
        | Op::PartitionId => vec![],
        Op::Iota { dim } | Op::Concatenate { dim } | Op::Argmax { dim } => {
            vec![("dim", A::Usize(*dim))]
        }
        Op::Broadcast { dims } => vec![("dims", A::List(dims))],
        Op::Transpose { perm } => vec![("perm", A::List(perm))],
        Op::Slice { start, limit } => vec![("start", A::List(start)), ("limit", A::List(limit))],
        Op::DynamicSlice { sizes } => vec![("sizes", A::List(sizes))],
        Op::Pad { low, high } => vec![("low", A::List(low)), ("high", A::List(high))],
        Op::Conv { pad_lo, pad_hi } => {
            vec![("pad_lo", A::List(pad_lo)), ("pad_hi", A::List(pad_hi))]
        }
        Op::Reverse { dims } => vec![("dims", A::List(dims))],
        Op::Reduce { op, dims } => vec![("op", A::Reduce(*op)), ("dims", A::List(dims))],
        Op::DotGeneral(d) => [
            ("lhs_batch", &d.lhs_batch),
            ("rhs_batch", &d.rhs_batch),
            ("lhs_contract", &d.lhs_contract),
            ("rhs_contract", &d.rhs_contract),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, A::List(v)))
        .collect(),
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => vec![
            ("dim", A::Usize(*dim)),
            ("exclusive", A::Bool(*exclusive)),
            ("reverse", A::Bool(*reverse)),
        ],
        Op::Gather { axis, batch_dims } | Op::ScatterAdd { axis, batch_dims } => vec![
            ("axis", A::Usize(*axis)),
            ("batch_dims", A::Usize(*batch_dims)),
        ],
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => vec![
            ("dist", A::Dist(*dist)),
            ("stream", A::U64(*stream)),
            ("global_shape", A::List(global_shape)),
        ],
        Op::AllReduce { op, axes } => vec![("op", A::Reduce(*op)), ("axes", A::Axes(axes))],
        Op::AllGather { dim, axes } => vec![("dim", A::Usize(*dim)), ("axes", A::Axes(axes))],
        Op::ReduceScatter { op, dim, axes } => vec![
            ("op", A::Reduce(*op)),
            ("dim", A::Usize(*dim)),
            ("axes", A::Axes(axes)),
        ],
        Op::AllToAll {
            split_dim,
            concat_dim,
            axes,
        } => vec![
            ("split_dim", A::Usize(*split_dim)),
            ("concat_dim", A::Usize(*concat_dim)),
            ("axes", A::Axes(axes)),
        ],
        Op::CollectivePermute { axes, pairs } => {
            vec![("axes", A::Axes(axes)), ("pairs", A::Pairs(pairs))]
        }
    }
}

/// The attribute slots of `op` (a template from [`op_template`]), for the parser to fill.
fn slots(op: &mut Op) -> Vec<AttrSlot<'_>> {
    use Slot as S;
    match op {
        Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::DynamicUpdateSlice
        | Op::PartitionId => vec![],
        Op::Iota { dim } | Op::Concatenate { dim } | Op::Argmax { dim } => {
            vec![req("dim", S::Usize(dim))]
        }
        Op::Broadcast { dims } => vec![req("dims", S::List(dims))],
        Op::Transpose { perm } => vec![req("perm", S::List(perm))],
        Op::Slice { start, limit } => {
            vec![req("start", S::List(start)), req("limit", S::List(limit))]
        }
        Op::DynamicSlice { sizes } => vec![req("sizes", S::List(sizes))],
        Op::Pad { low, high } => vec![req("low", S::List(low)), req("high", S::List(high))],
        Op::Conv { pad_lo, pad_hi } => vec![
            req("pad_lo", S::List(pad_lo)),
            req("pad_hi", S::List(pad_hi)),
        ],
        Op::Reverse { dims } => vec![req("dims", S::List(dims))],
        Op::Reduce { op, dims } => vec![req("op", S::Reduce(op)), req("dims", S::List(dims))],
        Op::DotGeneral(DotDims {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        }) => vec![
            opt("lhs_batch", S::List(lhs_batch)),
            opt("rhs_batch", S::List(rhs_batch)),
            opt("lhs_contract", S::List(lhs_contract)),
            opt("rhs_contract", S::List(rhs_contract)),
        ],
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => vec![
            req("dim", S::Usize(dim)),
            req("exclusive", S::Bool(exclusive)),
            req("reverse", S::Bool(reverse)),
        ],
        Op::Gather { axis, batch_dims } | Op::ScatterAdd { axis, batch_dims } => vec![
            req("axis", S::Usize(axis)),
            req("batch_dims", S::Usize(batch_dims)),
        ],
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => vec![
            req("dist", S::Dist(dist)),
            req("stream", S::U64(stream)),
            req("global_shape", S::List(global_shape)),
        ],
        Op::AllReduce { op, axes } => vec![req("op", S::Reduce(op)), req("axes", S::Axes(axes))],
        Op::AllGather { dim, axes } => {
            vec![req("dim", S::Usize(dim)), req("axes", S::Axes(axes))]
        }
        Op::ReduceScatter { op, dim, axes } => vec![
            req("op", S::Reduce(op)),
            req("dim", S::Usize(dim)),
            req("axes", S::Axes(axes)),
        ],
        Op::AllToAll {
            split_dim,
            concat_dim,
            axes,
        } => vec![
            req("split_dim", S::Usize(split_dim)),
            req("concat_dim", S::Usize(concat_dim)),
            req("axes", S::Axes(axes)),
        ],
        Op::CollectivePermute { axes, pairs } => {
            vec![req("axes", S::Axes(axes)), req("pairs", S::Pairs(pairs))]
        }
    }
}

/// The op called `name`, with empty attributes for the parser to fill in.
fn op_template(name: &str) -> Option<Op> {
    let op = match name {
        "parameter" => Op::Parameter {
            name: String::new(),
        },
        "constant" => Op::Constant {
            value: Literal::Splat(0.0),
        },
        "iota" => Op::Iota { dim: 0 },
        "select" => Op::Select,
        "convert" => Op::Convert,
        "stop_gradient" => Op::StopGradient,
        "copy" => Op::Copy,
        "broadcast" => Op::Broadcast { dims: vec![] },
        "reshape" => Op::Reshape,
        "transpose" => Op::Transpose { perm: vec![] },
        "slice" => Op::Slice {
            start: vec![],
            limit: vec![],
        },
        "dynamic_slice" => Op::DynamicSlice { sizes: vec![] },
        "dynamic_update_slice" => Op::DynamicUpdateSlice,
        "pad" => Op::Pad {
            low: vec![],
            high: vec![],
        },
        "concatenate" => Op::Concatenate { dim: 0 },
        "reduce" => Op::Reduce {
            op: ReduceOp::Sum,
            dims: vec![],
        },
        "dot_general" => Op::DotGeneral(DotDims::default()),
        "conv" => Op::Conv {
            pad_lo: vec![],
            pad_hi: vec![],
        },
        "reverse" => Op::Reverse { dims: vec![] },
        "cumsum" => Op::Cumsum {
            dim: 0,
            exclusive: false,
            reverse: false,
        },
        "argmax" => Op::Argmax { dim: 0 },
        "gather" => Op::Gather {
            axis: 0,
            batch_dims: 0,
        },
        "scatter_add" => Op::ScatterAdd {
            axis: 0,
            batch_dims: 0,
        },
        "rng" => Op::Rng {
            dist: RngDist::Uniform,
            stream: 0,
            global_shape: vec![],
        },
        "partition_id" => Op::PartitionId,
        "all_reduce" => Op::AllReduce {
            op: ReduceOp::Sum,
            axes: vec![],
        },
        "all_gather" => Op::AllGather {
            dim: 0,
            axes: vec![],
        },
        "reduce_scatter" => Op::ReduceScatter {
            op: ReduceOp::Sum,
            dim: 0,
            axes: vec![],
        },
        "all_to_all" => Op::AllToAll {
            split_dim: 0,
            concat_dim: 0,
            axes: vec![],
        },
        "collective_permute" => Op::CollectivePermute {
            axes: vec![],
            pairs: vec![],
        },
        other => {
            let unary = UnaryOp::ALL.into_iter().find(|u| u.name() == other);
            let binary = BinaryOp::ALL.into_iter().find(|b| b.name() == other);
            let compare = CompareOp::ALL.into_iter().find(|c| c.name() == other);
            return unary
                .map(Op::Unary)
                .or(binary.map(Op::Binary))
                .or(compare.map(Op::Compare));
        }
    };
    Some(op)
}

// ---------------------------------------------------------------------------------------
// Printer
// ---------------------------------------------------------------------------------------

/// Print a whole program: the mesh, one line per instruction, then the outputs.
pub fn print(p: &Program) -> String {
    p.to_string()
}

/// Print instruction `i` as one line (no newline).
pub fn print_instr(p: &Program, i: usize) -> String {
    InstrLine { p, i }.to_string()
}

/// Print instructions `center-radius ..= center+radius` (those that exist), one per line,
/// the center marked with `>>`, for error messages that show a program around a fault.
pub fn print_context(p: &Program, center: usize, radius: usize) -> String {
    let lo = center.saturating_sub(radius);
    let hi = center.saturating_add(radius).saturating_add(1);
    let hi = hi.min(p.instrs.len());
    let mut out = String::new();
    for i in lo..hi {
        let mark = if i == center { ">> " } else { "   " };
        out.push_str(mark);
        out.push_str(&print_instr(p, i));
        out.push('\n');
    }
    out
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(mesh) = &self.mesh {
            writeln!(f, "mesh {mesh}")?;
        }
        for i in 0..self.instrs.len() {
            writeln!(f, "{}", InstrLine { p: self, i })?;
        }
        for (name, v) in &self.outputs {
            writeln!(f, "output {} = {v}", Quoted(name))?;
        }
        Ok(())
    }
}

/// One printed instruction.
struct InstrLine<'a> {
    p: &'a Program,
    i: usize,
}

impl fmt::Display for InstrLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.i;
        let Some(ins) = self.p.instrs.get(i) else {
            return write!(f, "%{i} = <no such instruction>");
        };
        write!(f, "%{i} = {} {}(", ins.ty, ins.op.name())?;
        // Parameter and constant carry their argument in the op; operands (present only in
        // an invalid program) follow, so that verify errors still show them.
        let mut sep = "";
        if let Op::Parameter { name } = &ins.op {
            write!(f, "{}", Quoted(name))?;
            sep = ", ";
        } else if let Op::Constant { value } = &ins.op {
            write_literal(f, value, !ins.ty.dtype.is_float())?;
            sep = ", ";
        }
        for o in &ins.operands {
            write!(f, "{sep}{o}")?;
            sep = ", ";
        }
        f.write_str(")")?;
        for (name, value) in attrs(&ins.op) {
            write!(f, " {name}=")?;
            write_attr(f, &value)?;
        }
        if let Some(s) = &ins.sharding {
            write!(f, " @{s}")?;
        }
        Ok(())
    }
}

/// A number as text: values of integer and bool constants without a fraction (`2`), floats
/// in the shortest form that parses back to the same f64 (`2.0`, `1e-10`).
fn write_num(f: &mut fmt::Formatter<'_>, v: f64, integer: bool) -> fmt::Result {
    if integer && v.fract() == 0.0 && v.abs() < 1e15 {
        write!(f, "{}", v as i64)
    } else {
        write!(f, "{v:?}")
    }
}

fn write_literal(f: &mut fmt::Formatter<'_>, value: &Literal, integer: bool) -> fmt::Result {
    match value {
        Literal::Splat(v) => write_num(f, *v, integer),
        Literal::Dense(vs) => {
            f.write_str("[")?;
            for (k, v) in vs.iter().enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                write_num(f, *v, integer)?;
            }
            f.write_str("]")
        }
    }
}

fn write_attr(f: &mut fmt::Formatter<'_>, value: &AttrRef<'_>) -> fmt::Result {
    match value {
        AttrRef::Usize(n) => write!(f, "{n}"),
        AttrRef::U64(n) => write!(f, "{n}"),
        AttrRef::Bool(b) => write!(f, "{b}"),
        AttrRef::List(xs) => write_list(f, xs.iter().map(|x| x.to_string())),
        AttrRef::Axes(xs) => write_list(f, xs.iter().cloned()),
        AttrRef::Pairs(ps) => write_list(f, ps.iter().map(|(a, b)| format!("({a},{b})"))),
        AttrRef::Reduce(r) => f.write_str(r.name()),
        AttrRef::Dist(d) => f.write_str(d.name()),
    }
}

fn write_list(f: &mut fmt::Formatter<'_>, items: impl Iterator<Item = String>) -> fmt::Result {
    f.write_str("[")?;
    for (k, item) in items.enumerate() {
        if k > 0 {
            f.write_str(", ")?;
        }
        f.write_str(&item)?;
    }
    f.write_str("]")
}

/// A string literal with escapes.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() => write!(f, "\\u{{{:x}}}", u32::from(c))?,
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

// ---------------------------------------------------------------------------------------
// Lexer
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Tok {
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
    fn describe(&self) -> String {
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
struct Token {
    tok: Tok,
    /// 1-based column in characters.
    col: usize,
}

const PUNCT: [char; 10] = ['=', '[', ']', '(', ')', ',', '{', '}', '@', '|'];

fn is_word_char(c: char) -> bool {
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
fn lex_line(text: &str, line: usize) -> Result<Vec<Token>, ParseError> {
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
struct Cursor<'t> {
    toks: &'t [Token],
    pos: usize,
    line: usize,
}

impl<'t> Cursor<'t> {
    fn peek(&self) -> &'t Token {
        self.toks.get(self.pos).unwrap_or(&END)
    }

    /// The current token; moves past it unless it is the end of the line.
    fn bump(&mut self) -> &'t Token {
        let t = self.peek();
        if t.tok != Tok::End {
            self.pos += 1;
        }
        t
    }

    fn err(&self, col: usize, msg: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            col,
            msg: msg.into(),
        }
    }

    /// "expected {expected}, found {the current token}".
    fn unexpected(&self, expected: &str) -> ParseError {
        let t = self.peek();
        self.err(
            t.col,
            format!("expected {expected}, found {}", t.tok.describe()),
        )
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    /// Consume `c` if it is next; returns its column.
    fn eat_punct(&mut self, c: char) -> Option<usize> {
        self.is_punct(c).then(|| self.bump().col)
    }

    fn expect_punct(&mut self, c: char, expected: &str) -> Result<usize, ParseError> {
        self.eat_punct(c).ok_or_else(|| self.unexpected(expected))
    }

    fn ident(&mut self, expected: &str) -> Result<(&'t str, usize), ParseError> {
        match &self.peek().tok {
            Tok::Ident(s) => Ok((s.as_str(), self.bump().col)),
            _ => Err(self.unexpected(expected)),
        }
    }

    fn string(&mut self, expected: &str) -> Result<(&'t str, usize), ParseError> {
        match &self.peek().tok {
            Tok::Str(s) => Ok((s.as_str(), self.bump().col)),
            _ => Err(self.unexpected(expected)),
        }
    }

    fn expect_end(&self, expected: &str) -> Result<(), ParseError> {
        match self.peek().tok {
            Tok::End => Ok(()),
            _ => Err(self.unexpected(expected)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Token-level parsers
// ---------------------------------------------------------------------------------------

/// A non-negative integer that fits `u64`.
fn parse_u64(c: &mut Cursor, what: &str) -> Result<(u64, usize), ParseError> {
    let t = c.peek();
    let Tok::Num(s) = &t.tok else {
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

fn parse_float(c: &mut Cursor) -> Result<f64, ParseError> {
    let t = c.peek();
    let text = match &t.tok {
        Tok::Num(s) | Tok::Ident(s) => s,
        _ => return Err(c.unexpected("a number")),
    };
    let v =
        float_from_str(text).map_err(|why| c.err(t.col, format!("bad number `{text}`: {why}")))?;
    c.bump();
    Ok(v)
}

/// `[item, item, ...]`; returns the items and the column of `[`.
fn parse_list<T>(
    c: &mut Cursor,
    what: &str,
    mut item: impl FnMut(&mut Cursor) -> Result<T, ParseError>,
) -> Result<(Vec<T>, usize), ParseError> {
    let open = c.expect_punct('[', &format!("`[` starting {what}"))?;
    let mut items = Vec::new();
    if c.eat_punct(']').is_some() {
        return Ok((items, open));
    }
    loop {
        items.push(item(c)?);
        if c.eat_punct(']').is_some() {
            return Ok((items, open));
        }
        c.expect_punct(',', "`,` or `]`")?;
    }
}

/// A mesh axis name: letters, digits and `_` (a word that starts with a digit lexes as a
/// number), but not `_` alone, which means "not split" in shardings.
fn parse_axis(c: &mut Cursor) -> Result<(String, usize), ParseError> {
    let t = c.peek();
    match &t.tok {
        Tok::Ident(s) if s == "_" => Err(c.err(
            t.col,
            "`_` cannot name a mesh axis (in a sharding it means an unsplit dim)",
        )),
        Tok::Ident(s) | Tok::Num(s) if s.chars().all(is_word_char) => {
            c.bump();
            Ok((s.clone(), t.col))
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
    if let Tok::Ident(s) = &t.tok {
        if let Some((_, v)) = options.iter().find(|(n, _)| n == s) {
            c.bump();
            return Ok(*v);
        }
    }
    Err(c.unexpected(&expected))
}

/// `dtype[d0,d1,...]`, at most 2^40 elements.
fn parse_type(c: &mut Cursor) -> Result<Type, ParseError> {
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

/// `{dims | partial axes}` (the `@` already consumed).
fn parse_sharding(c: &mut Cursor) -> Result<Sharding, ParseError> {
    c.expect_punct('{', "`{` starting a sharding, e.g. `@{data, _}`")?;
    let mut s = Sharding::default();
    if !c.is_punct('}') && !c.is_punct('|') {
        loop {
            s.dims.push(parse_sharding_dim(c)?);
            if c.eat_punct(',').is_none() {
                break;
            }
        }
    }
    if c.eat_punct('|').is_some() {
        let t = c.peek();
        if t.tok != Tok::Ident("partial".into()) {
            return Err(c.unexpected("`partial` after `|`"));
        }
        c.bump();
        loop {
            s.partial.push(parse_axis(c)?.0);
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
    if c.peek().tok == Tok::Ident("_".into()) {
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
        axes.push(parse_axis(c)?.0);
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
            **x = parse_list(
                c,
                &list,
                |c| Ok(parse_index(c, "a non-negative integer")?.0),
            )?
            .0
        }
        Slot::Axes(x) => {
            **x = parse_list(c, &list, |c| Ok(parse_axis(c)?.0))?.0;
        }
        Slot::Pairs(x) => **x = parse_list(c, &list, parse_pair)?.0,
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
fn parse_attributes(c: &mut Cursor, op: &mut Op, op_col: usize) -> Result<(), ParseError> {
    let op_name = op.name();
    let mut slots = slots(op);
    let mut given = vec![false; slots.len()];
    while let Tok::Ident(key) = &c.peek().tok {
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

// ---------------------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------------------

/// Parse a program in the text format. Never panics; on error, says where and what was
/// expected. Returns only programs that pass [`verify`].
pub fn parse(src: &str) -> Result<Program, ParseError> {
    let mut p = Parser::default();
    for (i, text) in src.split('\n').enumerate() {
        let line = i + 1;
        let toks = lex_line(text, line)?;
        let mut c = Cursor {
            toks: &toks,
            pos: 0,
            line,
        };
        p.line(&mut c)?;
    }
    p.finish()
}

#[derive(Default)]
struct Parser {
    prog: Program,
    /// Value name (without `%`) -> its id and line of definition.
    values: HashMap<String, (ValueId, usize)>,
    /// The line of every instruction, for verify errors.
    instr_lines: Vec<usize>,
    mesh_line: Option<usize>,
    /// Parameter and output names -> line of declaration.
    params: HashMap<String, usize>,
    outputs: HashMap<String, usize>,
}

impl Parser {
    fn line(&mut self, c: &mut Cursor) -> Result<(), ParseError> {
        match &c.peek().tok {
            Tok::End => Ok(()),
            Tok::Value(_) => self.instruction(c),
            Tok::Ident(k) if k == "mesh" => self.mesh(c),
            Tok::Ident(k) if k == "output" => self.output(c),
            _ => Err(c.unexpected(
                "an instruction `%name = ...`, `output \"name\" = %value`, `mesh [...]` or end of line",
            )),
        }
    }

    /// `mesh [name=size, ...] devices=[...]`.
    fn mesh(&mut self, c: &mut Cursor) -> Result<(), ParseError> {
        let kw_col = c.bump().col;
        if let Some(l) = self.mesh_line {
            return Err(c.err(
                kw_col,
                format!("the mesh is already declared on line {l}; a program has one mesh"),
            ));
        }
        if !self.prog.instrs.is_empty() || !self.prog.outputs.is_empty() {
            return Err(c.err(kw_col, "the mesh must be declared before any instruction"));
        }
        let (axes, _) = parse_list(c, "the mesh axes, e.g. `[data=2, expert=4]`", |c| {
            let (name, name_col) = parse_axis(c)?;
            c.expect_punct('=', "`=` and the axis size")?;
            let (size, size_col) = parse_u64(c, "the axis size")?;
            Ok((name, name_col, size, size_col))
        })?;
        let mut devices: u64 = 1;
        for (k, (name, name_col, size, size_col)) in axes.iter().enumerate() {
            if k == MAX_RANK {
                return Err(c.err(*name_col, "the mesh has too many axes (at most 64)"));
            }
            if axes[..k].iter().any(|a| a.0 == *name) {
                return Err(c.err(
                    *name_col,
                    format!("mesh axis `{name}` appears twice; give every axis a distinct name"),
                ));
            }
            if *size == 0 {
                return Err(c.err(
                    *size_col,
                    format!("mesh axis `{name}` has size 0; every axis needs size >= 1"),
                ));
            }
            devices = devices
                .checked_mul(*size)
                .filter(|&n| n <= MAX_DEVICES)
                .ok_or_else(|| c.err(*size_col, "the mesh has too many devices (at most 2^20)"))?;
        }
        let ids = if c.peek().tok == Tok::Ident("devices".into()) {
            c.bump();
            c.expect_punct('=', "`=` after `devices`")?;
            let (ids, col) = parse_list(c, "the device ids", |c| {
                let (id, col) = parse_u64(c, "a device id")?;
                u32::try_from(id).map_err(|_| c.err(col, format!("device id {id} is too large")))
            })?;
            if ids.len() as u64 != devices {
                return Err(c.err(
                    col,
                    format!(
                        "mesh needs {devices} device ids (the product of its axis sizes), got {}",
                        ids.len()
                    ),
                ));
            }
            Some((ids, col))
        } else {
            None
        };
        c.expect_end("`devices=[...]` or end of line")?;
        let refs: Vec<(&str, usize)> = axes
            .iter()
            .map(|(name, _, size, _)| (name.as_str(), *size as usize))
            .collect();
        let mesh = match ids {
            Some((ids, col)) => {
                Mesh::with_devices(&refs, ids).map_err(|e| c.err(col, e.to_string()))?
            }
            None => Mesh::new(&refs).map_err(|e| c.err(kw_col, e.to_string()))?,
        };
        self.prog.mesh = Some(mesh);
        self.mesh_line = Some(c.line);
        Ok(())
    }

    /// `output "name" = %value`.
    fn output(&mut self, c: &mut Cursor) -> Result<(), ParseError> {
        c.bump();
        let (name, col) = c.string("the output name as a string, e.g. `output \"y\" = %5`")?;
        if let Some(l) = self.outputs.get(name) {
            return Err(c.err(
                col,
                format!("output \"{name}\" is already declared on line {l}"),
            ));
        }
        c.expect_punct('=', "`=` after the output name")?;
        let v = self.operand(c)?;
        c.expect_end("end of line after the output")?;
        self.outputs.insert(name.to_string(), c.line);
        self.prog.outputs.push((name.to_string(), v));
        Ok(())
    }

    /// A use of a defined value.
    fn operand(&self, c: &mut Cursor) -> Result<ValueId, ParseError> {
        let t = c.peek();
        let Tok::Value(name) = &t.tok else {
            return Err(c.unexpected("a value such as `%0`"));
        };
        let (id, _) = self.values.get(name).ok_or_else(|| {
            c.err(
                t.col,
                format!("%{name} is not defined: values must be defined before they are used"),
            )
        })?;
        c.bump();
        Ok(*id)
    }

    /// `%name = TYPE OP(ARGS) ATTRS @SHARDING`.
    fn instruction(&mut self, c: &mut Cursor) -> Result<(), ParseError> {
        let t = c.bump();
        let Tok::Value(name) = &t.tok else {
            return Err(c.err(t.col, "expected `%name`"));
        };
        if let Some((_, l)) = self.values.get(name) {
            return Err(c.err(
                t.col,
                format!("%{name} is already defined on line {l}; give every value a distinct name"),
            ));
        }
        c.expect_punct('=', "`=` after the value name")?;
        let ty = parse_type(c)?;
        let (op_name, op_col) = c.ident("an op name such as `add` or `dot_general`")?;
        let mut op =
            op_template(op_name).ok_or_else(|| c.err(op_col, format!("unknown op `{op_name}`")))?;
        let open_col = c.expect_punct('(', "`(` after the op name")?;
        let operands = self.arguments(c, &mut op, &ty)?;
        parse_attributes(c, &mut op, op_col)?;
        let sharding = match c.eat_punct('@') {
            Some(at_col) => Some((parse_sharding(c)?, at_col)),
            None => None,
        };
        if sharding.is_some() {
            c.expect_end("end of line after the sharding")?;
        } else {
            c.expect_end("an attribute `name=value`, a sharding `@{...}` or end of line")?;
        }

        if let Some(n) = op.arity() {
            if operands.len() != n {
                let s = if n == 1 { "" } else { "s" };
                return Err(c.err(
                    open_col,
                    format!("{} takes {n} operand{s}, got {}", op.name(), operands.len()),
                ));
            }
        }
        let types: Vec<&Type> = operands
            .iter()
            .filter_map(|o| self.prog.instrs.get(o.index()).map(|i| &i.ty))
            .collect();
        infer_type(&op, &types, Some(&ty), self.prog.mesh.as_ref())
            .map_err(|e| c.err(op_col, e.to_string()))?;
        if let Some((s, at_col)) = &sharding {
            let mesh = self.prog.mesh.as_ref().ok_or_else(|| {
                c.err(
                    *at_col,
                    "a sharding needs a mesh: declare one with `mesh [...]` before the first instruction",
                )
            })?;
            s.validate(mesh, &ty.shape)
                .map_err(|e| c.err(*at_col, e.to_string()))?;
        }
        let index = u32::try_from(self.prog.instrs.len())
            .map_err(|_| c.err(t.col, "too many instructions"))?;
        self.prog.push(Instr {
            op,
            operands,
            ty,
            sharding: sharding.map(|(s, _)| s),
        });
        self.values.insert(name.clone(), (ValueId(index), c.line));
        self.instr_lines.push(c.line);
        Ok(())
    }

    /// The arguments in parentheses (the `(` already consumed) through `)`: the name of a
    /// parameter, the literal of a constant, or operand values.
    fn arguments(
        &mut self,
        c: &mut Cursor,
        op: &mut Op,
        ty: &Type,
    ) -> Result<Vec<ValueId>, ParseError> {
        if let Op::Parameter { name } = op {
            let (s, col) = c.string("the parameter name as a string, e.g. `parameter(\"x\")`")?;
            if let Some(l) = self.params.get(s) {
                return Err(c.err(
                    col,
                    format!("parameter \"{s}\" is already declared on line {l}"),
                ));
            }
            self.params.insert(s.to_string(), c.line);
            *name = s.to_string();
            c.expect_punct(')', "`)` after the parameter name")?;
            return Ok(vec![]);
        }
        if let Op::Constant { value } = op {
            *value = parse_literal(c, ty)?;
            c.expect_punct(')', "`)` after the constant")?;
            return Ok(vec![]);
        }
        let mut operands = Vec::new();
        if c.eat_punct(')').is_some() {
            return Ok(operands);
        }
        loop {
            operands.push(self.operand(c)?);
            if c.eat_punct(')').is_some() {
                return Ok(operands);
            }
            c.expect_punct(',', "`,` or `)`")?;
        }
    }

    fn finish(self) -> Result<Program, ParseError> {
        verify(&self.prog).map_err(|e| ParseError {
            line: self.instr_lines.get(e.index).copied().unwrap_or(1),
            col: 1,
            msg: format!("{}: {}", e.op, e.msg),
        })?;
        Ok(self.prog)
    }
}

/// A constant's literal: one number (splat) or `[n, n, ...]` with one per element.
fn parse_literal(c: &mut Cursor, ty: &Type) -> Result<Literal, ParseError> {
    if !c.is_punct('[') {
        return Ok(Literal::Splat(parse_float(c)?));
    }
    let (values, open) = parse_list(c, "the constant's values", parse_float)?;
    // The type is bounded by parse_type, so this product cannot overflow.
    let n = ty.num_elements();
    if values.len() != n {
        return Err(c.err(
            open,
            format!(
                "dense constant has {} values but {ty} has {n} elements",
                values.len()
            ),
        ));
    }
    Ok(Literal::Dense(values))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_name_has_a_template() {
        let mut names: Vec<&str> = vec![
            "parameter",
            "constant",
            "iota",
            "select",
            "convert",
            "stop_gradient",
            "copy",
            "broadcast",
            "reshape",
            "transpose",
            "slice",
            "dynamic_slice",
            "dynamic_update_slice",
            "pad",
            "concatenate",
            "reduce",
            "dot_general",
            "conv",
            "reverse",
            "cumsum",
            "argmax",
            "gather",
            "scatter_add",
            "rng",
            "partition_id",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "collective_permute",
        ];
        names.extend(UnaryOp::ALL.map(UnaryOp::name));
        names.extend(BinaryOp::ALL.map(BinaryOp::name));
        names.extend(CompareOp::ALL.map(CompareOp::name));
        for n in names {
            let op = op_template(n).unwrap_or_else(|| panic!("no template for {n}"));
            assert_eq!(op.name(), n);
        }
        assert_eq!(op_template("frobnicate"), None);
    }

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

    #[test]
    fn strings_round_trip() {
        let s = "a\"b\\c\nd\te\r\u{1b}é€🙂";
        let printed = Quoted(s).to_string();
        let toks = lex_line(&printed, 1).unwrap();
        assert_eq!(toks[0].tok, Tok::Str(s.to_string()));
        assert_eq!(toks[1].tok, Tok::End);
    }
}
