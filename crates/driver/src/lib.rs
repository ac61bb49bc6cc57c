//! The driver layer between the compiler and the executor: running a partitioned program on
//! the devices of this process. It cuts global host tensors into each device's shard, runs
//! every device with the executor, and assembles global outputs from the shards (each tile
//! taken once, from its first holder). `gshard run`, `gshard bench` and training use it.

use ir::Mesh;
use runtime::{BlockDim, HostTensor};
use spmd::{layout, IoLayout, Partitioned};
use std::collections::HashMap;
use thiserror::Error;

/// Why a partitioned run could not start or finish.
#[derive(Debug, Error)]
pub enum DeviceError {
    #[error("parameter `{name}` ({expected}) is missing from the inputs")]
    Missing { name: String, expected: ir::Type },
    #[error("parameter `{name}` expects {expected} but the input is {got}")]
    Mistyped {
        name: String,
        expected: ir::Type,
        got: ir::Type,
    },
    #[error("the partitioned program has no mesh")]
    NoMesh,
    #[error(transparent)]
    Exec(#[from] runtime::ExecError),
}

/// Device `pos`'s block of a value laid out as `l`.
pub fn block(l: &IoLayout, mesh: &Mesh, pos: usize) -> Vec<BlockDim> {
    layout::shard_ranges(&l.global.shape, &l.sharding, mesh, pos)
        .into_iter()
        .map(|r| BlockDim {
            offset: r.offset,
            len: r.len,
            padded: r.padded,
        })
        .collect()
}

/// Every device's inputs (its shard of each parameter).
pub fn shard_inputs(
    part: &Partitioned,
    inputs: &HashMap<String, HostTensor>,
) -> Result<Vec<HashMap<String, HostTensor>>, DeviceError> {
    let mesh = part.program.mesh.as_ref().ok_or(DeviceError::NoMesh)?;
    let all: Vec<usize> = (0..mesh.num_devices()).collect();
    shard_inputs_for(part, inputs, &all)
}

/// The inputs of the devices at `positions` only (e.g. the one an MPI rank runs).
pub fn shard_inputs_for(
    part: &Partitioned,
    inputs: &HashMap<String, HostTensor>,
    positions: &[usize],
) -> Result<Vec<HashMap<String, HostTensor>>, DeviceError> {
    let mesh = part.program.mesh.as_ref().ok_or(DeviceError::NoMesh)?;
    let mut per_dev = vec![HashMap::new(); positions.len()];
    for l in &part.params {
        let t = inputs.get(&l.name).ok_or_else(|| DeviceError::Missing {
            name: l.name.clone(),
            expected: l.global.clone(),
        })?;
        if t.ty != l.global {
            return Err(DeviceError::Mistyped {
                name: l.name.clone(),
                expected: l.global.clone(),
                got: t.ty.clone(),
            });
        }
        for (&pos, m) in positions.iter().zip(per_dev.iter_mut()) {
            m.insert(l.name.clone(), t.block(&block(l, mesh, pos)));
        }
    }
    Ok(per_dev)
}

/// One global output from the devices' shards.
pub fn assemble(l: &IoLayout, mesh: &Mesh, shards: &[&HostTensor]) -> HostTensor {
    let mut g = HostTensor::zeros(l.global.clone());
    for (pos, s) in shards.iter().enumerate() {
        if layout::is_canonical_holder(&l.sharding, mesh, pos) {
            g.set_block(&block(l, mesh, pos), s);
        }
    }
    g
}

/// The global outputs, each tile taken from its first holder.
pub fn assemble_outputs(
    part: &Partitioned,
    outs: &[HashMap<String, HostTensor>],
) -> HashMap<String, HostTensor> {
    let mesh = part
        .program
        .mesh
        .as_ref()
        .expect("partitioned program has a mesh");
    part.outputs
        .iter()
        .map(|l| {
            let shards: Vec<&HostTensor> = outs.iter().map(|o| &o[&l.name]).collect();
            (l.name.clone(), assemble(l, mesh, &shards))
        })
        .collect()
}

/// Partition-and-run result.
pub struct SpmdRun {
    pub outputs: HashMap<String, HostTensor>,
    pub peak_bytes_per_device: usize,
}

/// Run a partitioned program on all its devices in this process.
pub fn run(
    part: &Partitioned,
    inputs: &HashMap<String, HostTensor>,
) -> Result<SpmdRun, DeviceError> {
    let mesh = part.program.mesh.as_ref().ok_or(DeviceError::NoMesh)?;
    let per_dev = shard_inputs(part, inputs)?;
    let comm = runtime::InProcess::new(mesh.num_devices());
    let r = runtime::run_devices(&part.program, &comm, &per_dev)?;
    Ok(SpmdRun {
        outputs: assemble_outputs(part, &r.outputs),
        peak_bytes_per_device: r.peak_bytes_per_device,
    })
}
