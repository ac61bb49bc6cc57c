//! The printer: one line per instruction, `%i` names by index, numbers that parse back
//! to the same bits, strings with escapes, scopes with their `grad` marker and checkpoint
//! mark.

use std::fmt;

use super::attrs::{attrs, AttrRef};
use crate::op::{Literal, Op};
use crate::program::Program;

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
pub(super) struct InstrLine<'a> {
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
        let scope = self.p.scopes.get(ins.scope);
        if !scope.path.is_empty() || scope.grad || scope.checkpoint.is_some() {
            write!(f, " {}", Quoted(&scope.path))?;
            if scope.grad {
                f.write_str(" grad")?;
            }
            match &scope.checkpoint {
                None => {}
                Some(r) if *r == scope.path => f.write_str(" checkpoint")?,
                Some(r) => write!(f, " checkpoint={}", Quoted(r))?,
            }
        }
        Ok(())
    }
}

/// A number as text: values of integer and bool constants without a fraction (`2`), floats
/// in the shortest form that parses back to the same f64 (`2.0`, `1e-10`).
pub(super) fn write_num(f: &mut fmt::Formatter<'_>, v: f64, integer: bool) -> fmt::Result {
    if integer && v.fract() == 0.0 && v.abs() < 1e15 {
        write!(f, "{}", v as i64)
    } else {
        write!(f, "{v:?}")
    }
}

pub(super) fn write_literal(
    f: &mut fmt::Formatter<'_>,
    value: &Literal,
    integer: bool,
) -> fmt::Result {
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

pub(super) fn write_attr(f: &mut fmt::Formatter<'_>, value: &AttrRef<'_>) -> fmt::Result {
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

pub(super) fn write_list(
    f: &mut fmt::Formatter<'_>,
    items: impl Iterator<Item = String>,
) -> fmt::Result {
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
pub(super) struct Quoted<'a>(pub(super) &'a str);

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
