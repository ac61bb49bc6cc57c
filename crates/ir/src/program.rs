//! `Program`: a flat SSA list of typed instructions with named parameters and outputs.

use crate::dtype::Type;
use crate::mesh::{Mesh, Sharding};
use crate::op::{Literal, Op};
use crate::scope::{Scope, ScopeId, Scopes};
use std::fmt;

/// Index of an instruction (and of the value it defines) in its program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One instruction: an op, its operands (earlier values), its result type, an optional
/// sharding (a user annotation before propagation; every value's layout after it) and its
/// scope in the program's [`Scopes`] table (metadata: where the model code made it).
#[derive(Clone, Debug, PartialEq)]
pub struct Instr {
    pub op: Op,
    pub operands: Vec<ValueId>,
    pub ty: Type,
    pub sharding: Option<Sharding>,
    pub scope: ScopeId,
}

/// A whole computation: instructions in SSA order (operands always precede their users),
/// named outputs, the mesh that shardings and collectives refer to, and the table of the
/// instructions' scopes.
///
/// Equality compares scopes by path, marker and checkpoint mark, not by id: a program
/// equals its printed and re-parsed self even when the table lists its scopes in another
/// order.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub instrs: Vec<Instr>,
    pub outputs: Vec<(String, ValueId)>,
    pub mesh: Option<Mesh>,
    pub scopes: Scopes,
}

impl PartialEq for Program {
    fn eq(&self, other: &Program) -> bool {
        let same_instr = |a: &Instr, b: &Instr| {
            let Instr {
                op,
                operands,
                ty,
                sharding,
                scope,
            } = a;
            *op == b.op
                && *operands == b.operands
                && *ty == b.ty
                && *sharding == b.sharding
                && self.scopes.get(*scope) == other.scopes.get(b.scope)
        };
        self.mesh == other.mesh
            && self.outputs == other.outputs
            && self.instrs.len() == other.instrs.len()
            && self
                .instrs
                .iter()
                .zip(&other.instrs)
                .all(|(a, b)| same_instr(a, b))
    }
}

impl Program {
    pub fn new() -> Program {
        Program::default()
    }

    /// Append an instruction without checking it; returns its id.
    pub fn push(&mut self, instr: Instr) -> ValueId {
        self.instrs.push(instr);
        ValueId((self.instrs.len() - 1) as u32)
    }

    pub fn instr(&self, v: ValueId) -> &Instr {
        &self.instrs[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &Type {
        &self.instrs[v.index()].ty
    }

    /// The scope of value `v`.
    pub fn scope(&self, v: ValueId) -> &Scope {
        self.scopes.get(self.instrs[v.index()].scope)
    }

    pub fn len(&self) -> usize {
        self.instrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }

    /// Parameters as `(name, id)` in program order.
    pub fn params(&self) -> Vec<(&str, ValueId)> {
        self.instrs
            .iter()
            .enumerate()
            .filter_map(|(i, ins)| {
                if let Op::Parameter { name } = &ins.op {
                    Some((name.as_str(), ValueId(i as u32)))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The parameter named `name`.
    pub fn param(&self, name: &str) -> Option<ValueId> {
        self.params()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// The value of every element of `v`, if it is a splat constant (possibly broadcast,
    /// reshaped or copied): lets passes treat `x * 1`, `max(x, 0)` specially.
    /// Follows the chain in a loop (it may be as long as the program), only towards
    /// earlier instructions (so an unverified program cannot make it cycle).
    pub fn splat_value(&self, v: ValueId) -> Option<f64> {
        let mut v = v;
        loop {
            let ins = self.instrs.get(v.index())?;
            match &ins.op {
                Op::Constant {
                    value: Literal::Splat(x),
                } => return Some(*x),
                Op::Broadcast { .. } | Op::Reshape | Op::Copy => {
                    let next = *ins.operands.first()?;
                    if next.index() >= v.index() {
                        return None;
                    }
                    v = next;
                }
                _ => return None,
            }
        }
    }

    /// The output named `name`.
    pub fn output(&self, name: &str) -> Option<ValueId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// Users of every value (operand positions listed once per use).
    pub fn users(&self) -> Vec<Vec<ValueId>> {
        let mut users = vec![Vec::new(); self.instrs.len()];
        for (i, ins) in self.instrs.iter().enumerate() {
            for &o in &ins.operands {
                users[o.index()].push(ValueId(i as u32));
            }
        }
        users
    }

    /// Keep only instructions that some output (transitively) uses, plus every parameter;
    /// renumbers ids. Returns the old->new map (`None` for removed values).
    pub fn prune(&mut self) -> Vec<Option<ValueId>> {
        let n = self.instrs.len();
        let mut live = vec![false; n];
        for (_, v) in &self.outputs {
            live[v.index()] = true;
        }
        for i in (0..n).rev() {
            if matches!(self.instrs[i].op, Op::Parameter { .. }) {
                live[i] = true;
            }
            if live[i] {
                for o in self.instrs[i].operands.clone() {
                    live[o.index()] = true;
                }
            }
        }
        let mut map = vec![None; n];
        let mut instrs = Vec::new();
        for (i, ins) in std::mem::take(&mut self.instrs).into_iter().enumerate() {
            if live[i] {
                let mut ins = ins;
                for o in &mut ins.operands {
                    *o = map[o.index()].expect("operand precedes user");
                }
                map[i] = Some(ValueId(instrs.len() as u32));
                instrs.push(ins);
            }
        }
        self.instrs = instrs;
        for (_, v) in &mut self.outputs {
            *v = map[v.index()].expect("outputs are live");
        }
        map
    }
}
