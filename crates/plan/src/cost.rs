//! What one device's step does, counted on the partitioned program's local shapes: FLOPs
//! and memory traffic per instruction (grouped by op family), and bytes per collective kind
//! and mesh axes.
//!
//! Memory traffic assumes elementwise chains fused, as the executor and XLA fuse them: an
//! elementwise or broadcast instruction whose readers are all elementwise or broadcasts is
//! never written; every other value is written once and read once by each reader.

use ir::{DType, Op, OpClass, Program};
use serde::Serialize;
use std::collections::BTreeMap;

/// An op family of the time and FLOP breakdowns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Dot products and convolutions.
    Matmul,
    Elementwise,
    Reduction,
    /// Transposes, slices, concatenations, pads, materialised broadcasts.
    Layout,
    /// Gathers and scatters.
    Indexing,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Matmul => "matmul",
            Family::Elementwise => "elementwise",
            Family::Reduction => "reduction",
            Family::Layout => "layout",
            Family::Indexing => "indexing",
        }
    }
}

/// One instruction's work on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpCost {
    pub family: Family,
    pub flops: u64,
    /// Bytes read and written from memory.
    pub bytes: u64,
    /// The dtype whose peak rate its FLOPs run at (its first operand's, else its own).
    pub dtype: DType,
    /// A dot's `[batch, m, n, k]`: `batch` products of `m x k` by `k x n`.
    pub gemm: Option<[u64; 4]>,
    /// Whether it is an MoE layer's expert work (a scope segment `experts`, forward or
    /// backward): what chunked all-to-alls overlap with.
    pub expert: bool,
}

/// One collective of the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveCost {
    pub kind: &'static str,
    pub axes: Vec<String>,
    /// Devices in each group.
    pub group: usize,
    /// Bytes one device sends.
    pub bytes: u64,
    /// The group's stride over the mesh's device order (the product of the sizes of the
    /// axes after its last one): 1 for the minor axis.
    pub stride: usize,
    /// The payload's element type (compression applies to f32 payloads).
    #[serde(skip)]
    pub dtype: DType,
}

/// The work of one device's step.
#[derive(Clone, Debug, Default)]
pub struct StepCost {
    pub ops: Vec<OpCost>,
    pub collectives: Vec<CollectiveCost>,
    /// Steps of the executor's plan that do work (neither a parameter nor a collective):
    /// each pays the device's fixed step time. Set by the caller that prepared the plan;
    /// 0 leaves the fixed times out.
    pub work_steps: usize,
}

/// Bytes sent per collective kind and mesh axes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveTotal {
    pub kind: &'static str,
    pub axes: String,
    pub count: usize,
    pub bytes: u64,
}

impl StepCost {
    /// The cost of per-device program `p`.
    pub fn of(p: &Program) -> StepCost {
        let n = p.instrs.len();
        let fusable =
            |op: &Op| op.class() == OpClass::Elementwise || matches!(op, Op::Broadcast { .. });
        let mut readers_fuse = vec![true; n];
        let mut has_reader = vec![false; n];
        for ins in &p.instrs {
            for o in &ins.operands {
                has_reader[o.index()] = true;
                if !fusable(&ins.op) {
                    readers_fuse[o.index()] = false;
                }
            }
        }
        for (_, v) in &p.outputs {
            readers_fuse[v.index()] = false;
        }
        // Whether each value is written to memory.
        let written: Vec<bool> = p
            .instrs
            .iter()
            .enumerate()
            .map(|(i, ins)| match ins.op.class() {
                OpClass::Source => matches!(ins.op, Op::Parameter { .. }),
                OpClass::Collective => true,
                _ if fusable(&ins.op) => !(has_reader[i] && readers_fuse[i]),
                _ => true,
            })
            .collect();
        let mesh = p.mesh.as_ref();
        let mut cost = StepCost::default();
        for (i, ins) in p.instrs.iter().enumerate() {
            let family = match ins.op.class() {
                OpClass::Source => continue,
                OpClass::Collective => {
                    let axes = ins.op.collective_axes().unwrap_or(&[]).to_vec();
                    let group = mesh.map_or(1, |m| m.size_of(&axes));
                    let stride = mesh.map_or(1, |m| stride_of(m, &axes));
                    let operand = p.ty(ins.operands[0]).size_bytes();
                    cost.collectives.push(CollectiveCost {
                        kind: ins.op.name(),
                        axes,
                        group,
                        bytes: ins.op.wire_bytes(operand, group) as u64,
                        stride,
                        dtype: p.ty(ins.operands[0]).dtype,
                    });
                    continue;
                }
                OpClass::Contraction => Family::Matmul,
                OpClass::Elementwise => Family::Elementwise,
                OpClass::Reduction => Family::Reduction,
                OpClass::Layout => Family::Layout,
                OpClass::Indexing => Family::Indexing,
            };
            let read: usize = ins
                .operands
                .iter()
                .filter(|o| written[o.index()])
                .map(|o| p.ty(*o).size_bytes())
                .sum();
            let write = if written[i] { ins.ty.size_bytes() } else { 0 };
            let dtype = ins
                .operands
                .first()
                .map_or(ins.ty.dtype, |o| p.ty(*o).dtype);
            cost.ops.push(OpCost {
                family,
                flops: spmd::report::summary::flops(p, i),
                bytes: (read + write) as u64,
                dtype,
                gemm: gemm_dims(p, ins),
                expert: p
                    .scope(ir::ValueId(i as u32))
                    .segments()
                    .any(|seg| seg == "experts"),
            });
        }
        cost
    }

    /// FLOPs per device.
    pub fn flops(&self) -> u64 {
        self.ops.iter().map(|o| o.flops).sum()
    }

    /// FLOPs per device by family (families with none left out).
    pub fn flops_by_family(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for o in &self.ops {
            if o.flops > 0 {
                *m.entry(o.family.name()).or_insert(0) += o.flops;
            }
        }
        m
    }

    /// Bytes one device sends per collective kind and axes, largest first.
    pub fn collective_totals(&self) -> Vec<CollectiveTotal> {
        let mut m: BTreeMap<(&'static str, String), (usize, u64)> = BTreeMap::new();
        for c in &self.collectives {
            let e = m.entry((c.kind, c.axes.join(","))).or_insert((0, 0));
            e.0 += 1;
            e.1 += c.bytes;
        }
        let mut v: Vec<CollectiveTotal> = m
            .into_iter()
            .map(|((kind, axes), (count, bytes))| CollectiveTotal {
                kind,
                axes,
                count,
                bytes,
            })
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.bytes));
        v
    }
}

/// A dot's `[batch, m, n, k]` from its operands' shapes (`None` for other instructions).
fn gemm_dims(p: &Program, ins: &ir::Instr) -> Option<[u64; 4]> {
    let Op::DotGeneral(d) = &ins.op else {
        return None;
    };
    let (l, r) = (&p.ty(ins.operands[0]).shape, &p.ty(ins.operands[1]).shape);
    let prod = |s: &[usize], dims: &[usize]| dims.iter().map(|&i| s[i] as u64).product::<u64>();
    let free = |s: &[usize], a: &[usize], b: &[usize]| {
        (0..s.len())
            .filter(|i| !a.contains(i) && !b.contains(i))
            .map(|i| s[i] as u64)
            .product::<u64>()
    };
    Some([
        prod(l, &d.lhs_batch),
        free(l, &d.lhs_batch, &d.lhs_contract),
        free(r, &d.rhs_batch, &d.rhs_contract),
        prod(l, &d.lhs_contract),
    ])
}

/// The product of the sizes of the mesh axes after the last of `axes` (row-major device
/// order: the last axis is the minor one).
fn stride_of(mesh: &ir::Mesh, axes: &[String]) -> usize {
    let names: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
    let last = axes
        .iter()
        .filter_map(|a| names.iter().position(|n| n == a))
        .max();
    match last {
        Some(k) => mesh.axes[k + 1..].iter().map(|a| a.size).product(),
        None => 1,
    }
}
