//! What the partitioner did, for `gshard inspect`: every collective with its local shape and
//! bytes moved, and the bytes each device holds for parameters and outputs; why each
//! collective is there ([`why`]) and a summary by scope ([`summary`]).

pub mod summary;
pub mod why;

use crate::Partitioned;
use ir::Program;

/// A byte count as `512 B`, `1.50 KiB`, `2.00 MiB`.
pub fn human_bytes(b: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", units[u])
    }
}

/// One collective of the per-device program.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveInfo {
    pub index: usize,
    pub kind: &'static str,
    pub axes: Vec<String>,
    /// Local operand shape.
    pub shape: Vec<usize>,
    pub dtype: ir::DType,
    /// Bytes one device sends (and receives) for this collective.
    pub bytes: usize,
}

/// Every collective of a per-device program, in program order.
pub fn collectives(p: &Program) -> Vec<CollectiveInfo> {
    let mesh = p.mesh.as_ref();
    let mut out = Vec::new();
    for (i, ins) in p.instrs.iter().enumerate() {
        let Some(axes) = ins.op.collective_axes() else {
            continue;
        };
        let operand = p.ty(ins.operands[0]);
        let k = mesh.map(|m| m.size_of(axes)).unwrap_or(1);
        let bytes = ins.op.wire_bytes(operand.size_bytes(), k);
        out.push(CollectiveInfo {
            index: i,
            kind: ins.op.name(),
            axes: axes.to_vec(),
            shape: operand.shape.clone(),
            dtype: operand.dtype,
            bytes,
        });
    }
    out
}

/// Bytes per device for the parameters and for the outputs.
pub fn io_bytes_per_device(part: &Partitioned) -> (usize, usize) {
    let mesh = part
        .program
        .mesh
        .as_ref()
        .expect("partitioned programs have a mesh");
    let size = |l: &crate::IoLayout| {
        l.sharding
            .shard_shape(mesh, &l.global.shape)
            .iter()
            .product::<usize>()
            * l.global.dtype.size_bytes()
    };
    (
        part.params.iter().map(size).sum(),
        part.outputs.iter().map(size).sum(),
    )
}

/// Peak bytes of live values on one device when the program runs in order and every value
/// is freed after its last use (the executor's policy).
pub fn peak_bytes(p: &Program) -> usize {
    let n = p.instrs.len();
    let mut last: Vec<usize> = (0..n).collect();
    for (i, ins) in p.instrs.iter().enumerate() {
        for o in &ins.operands {
            last[o.index()] = i;
        }
    }
    for (_, v) in &p.outputs {
        last[v.index()] = usize::MAX;
    }
    let (mut live, mut peak) = (0usize, 0usize);
    let mut freed = vec![false; n];
    for (i, ins) in p.instrs.iter().enumerate() {
        live += ins.ty.size_bytes();
        peak = peak.max(live);
        for o in ins.operands.iter().map(|o| o.index()).chain([i]) {
            if last[o] == i && !freed[o] {
                freed[o] = true;
                live -= p.instrs[o].ty.size_bytes();
            }
        }
    }
    peak
}
