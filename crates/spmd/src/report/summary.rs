//! The summary by scope for `gshard inspect`: per scope prefix of a per-device program, the
//! FLOPs, the bytes sent per collective kind and the memory of the saved activations (forward
//! values that the backward pass reads), so a model's communication bottleneck is one table
//! away.

use super::human_bytes;
use ir::scope::{layer_of, prefix};
use ir::{Op, OpClass, Program};
use std::fmt::Write;

/// How scopes are grouped into rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// By layer (`decoder/layer1`, see [`ir::scope::layer_of`]).
    Layer,
    /// By the first `n` path segments.
    Depth(usize),
}

/// One row of the summary (per device).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScopeRow {
    /// The scope prefix (empty: the top level).
    pub scope: String,
    pub instructions: usize,
    /// Floating-point operations (a multiply-add counts 2; elementwise ops 1 per element).
    pub flops: u64,
    /// Bytes sent per collective kind (the kinds' text-format names), in first-seen order.
    pub collective_bytes: Vec<(&'static str, usize)>,
    /// Bytes of this scope's forward values that the backward pass reads.
    pub saved_bytes: usize,
}

/// The FLOPs of one instruction of `p` on its (local) shapes.
pub fn flops(p: &Program, i: usize) -> u64 {
    let ins = &p.instrs[i];
    let out = ins.ty.num_elements() as u64;
    let operand = |k: usize| p.ty(ins.operands[k]);
    match &ins.op {
        Op::DotGeneral(dd) => {
            let lhs = operand(0);
            let k: u64 = dd
                .lhs_contract
                .iter()
                .map(|&d| lhs.shape[d] as u64)
                .product();
            2 * out * k
        }
        Op::Conv { .. } => {
            let kernel = operand(1);
            let window: u64 = kernel.shape[..kernel.rank().saturating_sub(1)]
                .iter()
                .map(|&d| d as u64)
                .product();
            2 * out * window
        }
        op => match op.class() {
            OpClass::Elementwise => out,
            OpClass::Reduction => operand(0).num_elements() as u64,
            OpClass::Source
            | OpClass::Layout
            | OpClass::Contraction
            | OpClass::Indexing
            | OpClass::Collective => 0,
        },
    }
}

/// The rows of `p`'s summary, in order of first appearance.
pub fn by_scope(p: &Program, grouping: Grouping) -> Vec<ScopeRow> {
    let key = |path: &str| -> String {
        match grouping {
            Grouping::Layer => layer_of(path).to_string(),
            Grouping::Depth(n) => prefix(path, n).to_string(),
        }
    };
    // One key per scope of the table, computed once.
    let keys: Vec<String> = p.scopes.iter().map(|(_, s)| key(&s.path)).collect();
    let mut rows: Vec<ScopeRow> = Vec::new();
    let mut row_of_key: std::collections::HashMap<&str, usize> = Default::default();
    let mut row_of_instr = Vec::with_capacity(p.len());
    for ins in &p.instrs {
        let k = keys[ins.scope.index()].as_str();
        let r = *row_of_key.entry(k).or_insert_with(|| {
            rows.push(ScopeRow {
                scope: k.to_string(),
                ..ScopeRow::default()
            });
            rows.len() - 1
        });
        row_of_instr.push(r);
    }
    let mut saved = vec![false; p.len()];
    for (i, ins) in p.instrs.iter().enumerate() {
        let row = &mut rows[row_of_instr[i]];
        row.instructions += 1;
        row.flops += flops(p, i);
        if let Some(axes) = ins.op.collective_axes() {
            let k = p.mesh.as_ref().map(|m| m.size_of(axes)).unwrap_or(1);
            let bytes = ins.op.wire_bytes(p.ty(ins.operands[0]).size_bytes(), k);
            let name = ins.op.name();
            match row.collective_bytes.iter_mut().find(|(n, _)| *n == name) {
                Some((_, b)) => *b += bytes,
                None => row.collective_bytes.push((name, bytes)),
            }
        }
        if p.scopes.is_grad(ins.scope) {
            for o in &ins.operands {
                let def = p.instr(*o);
                let activation = !p.scopes.is_grad(def.scope)
                    && !matches!(def.op.class(), OpClass::Source | OpClass::Collective);
                if activation && !std::mem::replace(&mut saved[o.index()], true) {
                    rows[row_of_instr[o.index()]].saved_bytes += def.ty.size_bytes();
                }
            }
        }
    }
    rows
}

/// Large numbers of FLOPs as `1.23 G`.
pub fn human_flops(f: u64) -> String {
    let units = ["", " k", " M", " G", " T", " P"];
    let mut v = f as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < units.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{f}")
    } else {
        format!("{v:.2}{}", units[u])
    }
}

/// The summary as a table: one row per scope prefix, one column per collective kind.
pub fn text(rows: &[ScopeRow]) -> String {
    let mut kinds: Vec<&str> = Vec::new();
    for r in rows {
        for (k, _) in &r.collective_bytes {
            if !kinds.contains(k) {
                kinds.push(k);
            }
        }
    }
    let width = rows
        .iter()
        .map(|r| r.scope.len())
        .max()
        .unwrap_or(0)
        .max(11);
    let mut out = String::new();
    let _ = write!(out, "  {:<width$} {:>7} {:>11}", "scope", "instrs", "FLOPs");
    for k in &kinds {
        let _ = write!(out, " {k:>14}");
    }
    let _ = writeln!(out, " {:>14}", "saved activ.");
    for r in rows {
        let name = if r.scope.is_empty() {
            "(top level)"
        } else {
            &r.scope
        };
        let _ = write!(
            out,
            "  {name:<width$} {:>7} {:>11}",
            r.instructions,
            human_flops(r.flops)
        );
        for k in &kinds {
            let b = r
                .collective_bytes
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, b)| human_bytes(*b))
                .unwrap_or_else(|| "-".to_string());
            let _ = write!(out, " {b:>14}");
        }
        let _ = writeln!(out, " {:>14}", human_bytes(r.saved_bytes));
    }
    out
}
