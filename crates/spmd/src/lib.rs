//! The SPMD partitioner (GShard section 3.3; GSPMD, Xu et al. 2021, arXiv 2105.04663): from a
//! program whose every value has a sharding, ONE program that every device runs on its shard.
//! Local shapes replace global ones, collectives are ordinary IR ops naming mesh axes, and a
//! device's offsets are computed at run time from `partition_id` and the mesh strides, so the
//! emitted program, and the time to emit it, do not grow with the device count.
//!
//! Structure (after XLA's partitioner): a [`PartitionedValue`] per global value, the one
//! [`reshard::reshard`] between any two shardings, per-op-family handlers, and a cost model
//! for dot-general layouts. Nothing here executes a tensor.

mod ctx;
pub mod error;
mod handlers;
pub mod layout;
pub mod pv;
pub mod report;
pub mod reshard;
pub mod why;

pub use error::SpmdError;
pub use layout::{shard_ranges, DimRange};
pub use pv::PartitionedValue;

use ir::{Program, Sharding, Type};
use sharding::Provenance;
pub use why::CollectiveCause;

/// A named program input or output: its global type and how it is laid out.
#[derive(Clone, Debug, PartialEq)]
pub struct IoLayout {
    pub name: String,
    pub global: Type,
    pub sharding: Sharding,
}

/// The per-device program with the layouts of its parameters and outputs, and why each of
/// its collectives is there (in program order).
#[derive(Clone, Debug)]
pub struct Partitioned {
    pub program: Program,
    pub params: Vec<IoLayout>,
    pub outputs: Vec<IoLayout>,
    pub causes: Vec<CollectiveCause>,
}

/// Partition a program whose every instruction has a sharding (see `sharding::propagate`);
/// every sharding counts as annotated.
pub fn partition(p: &Program) -> Result<Partitioned, SpmdError> {
    partition_explained(p, &vec![Provenance::Annotated; p.len()])
}

/// [`partition`] a propagated program, with how each of its shardings was decided
/// (`sharding::propagate_explained`), which the collectives' causes cite.
pub fn partition_explained(p: &Program, prov: &[Provenance]) -> Result<Partitioned, SpmdError> {
    let mesh = p.mesh.clone().ok_or(SpmdError::NoMesh)?;
    for (i, ins) in p.instrs.iter().enumerate() {
        if ins.op.is_device_dependent() {
            return Err(SpmdError::AlreadyPartitioned {
                index: i,
                op: ins.op.name().into(),
            });
        }
        if ins.sharding.is_none() {
            return Err(SpmdError::Unsharded {
                index: i,
                op: ins.op.name().into(),
            });
        }
    }
    let mut ctx = ctx::Ctx::new(mesh, p.scopes.clone());
    let mut vals: Vec<PartitionedValue> = Vec::with_capacity(p.len());
    let mut params = Vec::new();
    for (i, ins) in p.instrs.iter().enumerate() {
        ctx.at = i;
        // What the partitioner emits for an instruction has the instruction's scope.
        ctx.b.set_scope(ins.scope);
        ctx.operands.clear();
        ctx.operands
            .extend(ins.operands.iter().map(|o| (*o, vals[o.index()].local.id)));
        ctx.handler_result = None;
        let target = ins.sharding.clone().unwrap();
        let pv = handlers::partition_instr(&mut ctx, p, i, &vals)?;
        if !pv.sharding.partial.is_empty() && pv.sharding.dims == target.dims {
            ctx.partial_sums.insert(i, pv.clone());
        }
        ctx.handler_result = Some(pv.local.id);
        let pv = reshard::reshard(&mut ctx, &pv, &target)?;
        if let ir::Op::Parameter { name } = &ins.op {
            params.push(IoLayout {
                name: name.clone(),
                global: ins.ty.clone(),
                sharding: target,
            });
        }
        vals.push(pv);
    }
    let mut outputs = Vec::new();
    for (name, v) in &p.outputs {
        let pv = &vals[v.index()];
        ctx.b.output(name, &pv.local);
        outputs.push(IoLayout {
            name: name.clone(),
            global: pv.global.clone(),
            sharding: pv.sharding.clone(),
        });
    }
    let mut program = ctx.b.program();
    let map = program.prune();
    let causes = why::complete(p, prov, ctx.emitted.take(), &map);
    debug_assert!(
        ir::verify(&program).is_ok(),
        "{}",
        ir::verify(&program).unwrap_err()
    );
    Ok(Partitioned {
        program,
        params,
        outputs,
        causes,
    })
}

/// Propagate shardings from the annotations, then partition.
pub fn compile(p: &Program) -> Result<Partitioned, SpmdError> {
    let (q, prov) = sharding::propagate_explained(p)?;
    partition_explained(&q, &prov)
}
