//! The line parser: mesh, instructions and outputs, each type-checked as it is read (an
//! instruction's scope and checkpoint mark checked too).

use std::collections::HashMap;

use super::attrs::op_template;
use super::items::{
    parse_attributes, parse_axis, parse_each, parse_float, parse_sharding, parse_type, parse_u64,
};
use super::lex::{Cursor, Tok};
use super::{MAX_DEVICES, MAX_RANK};
use crate::dtype::Type;
use crate::error::ParseError;
use crate::infer::infer_type;
use crate::mesh::Mesh;
use crate::op::{Literal, Op};
use crate::program::{Instr, Program, ValueId};
use crate::scope::{Scope, ScopeId};
use crate::verify::verify;

/// Parse a program in the text format. Never panics; on error, says where and what was
/// expected. Returns only programs that pass [`verify`].
pub fn parse(src: &str) -> Result<Program, ParseError> {
    let mut p = Parser::default();
    for (i, text) in src.split('\n').enumerate() {
        let line = i + 1;
        let mut c = Cursor::new(text, line)?;
        p.line(&mut c)?;
    }
    p.finish()
}

#[derive(Default)]
pub(super) struct Parser {
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
        match c.peek().tok {
            Tok::End => Ok(()),
            Tok::Value(_) => self.instruction(c),
            Tok::Ident("mesh") => self.mesh(c),
            Tok::Ident("output") => self.output(c),
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
        // Every axis is read (a syntax error anywhere in the list comes first), but only the
        // first 65 are kept: the checks below stop at the 65th.
        let mut axes = Vec::new();
        parse_each(c, "the mesh axes, e.g. `[data=2, expert=4]`", |c, k| {
            let (name, name_col) = parse_axis(c)?;
            c.expect_punct('=', "`=` and the axis size")?;
            let (size, size_col) = parse_u64(c, "the axis size")?;
            if k <= MAX_RANK {
                axes.push((name, name_col, size, size_col));
            }
            Ok(())
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
        let ids = if c.peek().tok == Tok::Ident("devices") {
            c.bump();
            c.expect_punct('=', "`=` after `devices`")?;
            // Every id is read and checked, but only as many as the mesh has are kept.
            // (`devices` is at most 2^20; `0,` takes 2 bytes.)
            let want = devices as usize;
            let mut ids = Vec::with_capacity(want.min(c.bytes_left() / 2 + 1));
            let (got, col) = parse_each(c, "the device ids", |c, k| {
                let (id, col) = parse_u64(c, "a device id")?;
                let id = u32::try_from(id)
                    .map_err(|_| c.err(col, format!("device id {id} is too large")))?;
                if k < want {
                    ids.push(id);
                }
                Ok(())
            })?;
            if got != want {
                return Err(c.err(
                    col,
                    format!(
                        "mesh needs {devices} device ids (the product of its axis sizes), got {got}"
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
        if let Some(l) = self.outputs.get(name.as_ref()) {
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
        let Tok::Value(name) = t.tok else {
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
        let Tok::Value(name) = t.tok else {
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
        let scope = self.scope(c)?;
        if scope.is_some() {
            // `scope` read through the end of the line.
        } else if sharding.is_some() {
            c.expect_end("a scope `\"path\"` or end of line after the sharding")?;
        } else {
            c.expect_end(
                "an attribute `name=value`, a sharding `@{...}`, a scope `\"path\"` or end of line",
            )?;
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
            scope: scope.unwrap_or(ScopeId::ROOT),
        });
        self.values
            .insert(name.to_string(), (ValueId(index), c.line));
        self.instr_lines.push(c.line);
        Ok(())
    }

    /// The optional scope at the end of an instruction: `"path"`, then `grad` for the
    /// backward pass, then `checkpoint` (the path is a checkpoint region) or
    /// `checkpoint="region"` (it lies in that region), then the end of the line.
    fn scope(&mut self, c: &mut Cursor) -> Result<Option<ScopeId>, ParseError> {
        if !matches!(c.peek().tok, Tok::Str(_)) {
            return Ok(None);
        }
        let (path, _) = c.string("a scope path")?;
        let grad = c.peek().tok == Tok::Ident("grad");
        if grad {
            c.bump();
        }
        let mut scope = Scope {
            path: path.into_owned(),
            grad,
            checkpoint: None,
        };
        if c.peek().tok == Tok::Ident("checkpoint") {
            let col = c.bump().col;
            let region = match c.eat_punct('=') {
                Some(_) => c
                    .string("a checkpoint region `\"path\"` after `checkpoint=`")?
                    .0
                    .into_owned(),
                None => scope.path.clone(),
            };
            scope.checkpoint = Some(region);
            scope.check().map_err(|e| c.err(col, e))?;
            c.expect_end("end of line after the checkpoint mark")?;
        } else if grad {
            c.expect_end("`checkpoint` or end of line after `grad`")?;
        } else {
            c.expect_end("`grad`, `checkpoint` or end of line after the scope")?;
        }
        Ok(Some(self.prog.scopes.intern(scope)))
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
            if let Some(l) = self.params.get(s.as_ref()) {
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
pub(super) fn parse_literal(c: &mut Cursor, ty: &Type) -> Result<Literal, ParseError> {
    if !c.is_punct('[') {
        return Ok(Literal::Splat(parse_float(c)?));
    }
    // The type is bounded by parse_type, so this product cannot overflow. Every value is
    // read and checked, but at most `n` are kept, in room reserved once (a value and its
    // comma take 2 bytes at least).
    let n = ty.num_elements();
    let mut values = Vec::with_capacity(n.min(c.bytes_left() / 2 + 1));
    let (got, open) = parse_each(c, "the constant's values", |c, k| {
        let v = parse_float(c)?;
        if k < n {
            values.push(v);
        }
        Ok(())
    })?;
    if got != n {
        return Err(c.err(
            open,
            format!("dense constant has {got} values but {ty} has {n} elements"),
        ));
    }
    Ok(Literal::Dense(values))
}
