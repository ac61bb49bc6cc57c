//! The reference interpreter: naive, single-threaded and obviously correct. It is the
//! oracle for the fast executor, for autodiff (finite differences) and for every partitioned
//! program (`run_spmd(partition(p)) == run(p)`).
//!
//! - [`run`] executes a program on one device (mesh position 0). A collective is legal only if
//!   every mesh axis it names has size 1 (then it is the identity / a reduction over one
//!   member).
//! - [`run_spmd`] executes it on every mesh position, bulk-synchronously: each instruction is
//!   evaluated on all devices, and each collective across all device buffers at once with
//!   replica groups from [`ir::Mesh::groups`]. `partition_id` is the mesh position.
//!
//! Values are held as `f64` and every op's result is rounded to its dtype (see `val.rs`,
//! `scalar.rs` and `eval.rs` for the exact rules, `crate::tensor` for conversions and
//! `crate::rng` for the RNG). Both entry points run [`ir::verify`] first. A value is dropped
//! after its last use.

mod collective;
mod eval;
mod scalar;
mod val;

use crate::alloc::check_room;
pub use crate::error::RuntimeError;
use crate::tensor::HostTensor;
use ir::{Instr, Mesh, Op, Program, Type};
use std::collections::HashMap;
use val::Val;

/// Run `p` on one device (partition id 0). Parameters are looked up by name (extra inputs
/// are ignored); returns every named output.
pub fn run(
    p: &Program,
    inputs: &HashMap<String, HostTensor>,
) -> Result<HashMap<String, HostTensor>, RuntimeError> {
    let mut outs = execute(p, &[inputs], false)?;
    Ok(outs.pop().unwrap_or_default())
}

/// Run `p` on all `p.mesh.num_devices()` mesh positions (one device if there is no mesh);
/// `inputs[pos]` feeds mesh position `pos`. Returns every named output per position.
pub fn run_spmd(
    p: &Program,
    inputs: &[HashMap<String, HostTensor>],
) -> Result<Vec<HashMap<String, HostTensor>>, RuntimeError> {
    let n = p.mesh.as_ref().map_or(1, Mesh::num_devices);
    if inputs.len() != n {
        return Err(RuntimeError::DeviceCount {
            expected: n,
            got: inputs.len(),
        });
    }
    let refs: Vec<&HashMap<String, HostTensor>> = inputs.iter().collect();
    execute(p, &refs, true)
}

/// What the op rules may ask of the run: inputs, partition ids, replica groups.
pub(crate) struct Ctx<'a> {
    inputs: &'a [&'a HashMap<String, HostTensor>],
    spmd: bool,
    mesh: Option<&'a Mesh>,
}

impl Ctx<'_> {
    /// Parameter `name` of device `d`, checked against its declared type.
    fn param(&self, d: usize, name: &str, ty: &Type) -> Result<Val, RuntimeError> {
        let device = self.spmd.then_some(d);
        let t = self.inputs[d]
            .get(name)
            .ok_or_else(|| RuntimeError::MissingInput {
                name: name.to_string(),
                expected: ty.clone(),
                device,
            })?;
        if t.ty != *ty {
            return Err(RuntimeError::InputTypeMismatch {
                name: name.to_string(),
                expected: ty.clone(),
                got: t.ty.clone(),
                device,
            });
        }
        HostTensor::new(t.ty.clone(), t.data.clone()).map_err(|source| {
            RuntimeError::MalformedInput {
                name: name.to_string(),
                device,
                source,
            }
        })?;
        Ok(Val::from_host(t))
    }

    /// Replica groups of a collective of instruction `index` over `axes`.
    fn groups(
        &self,
        index: usize,
        op: &Op,
        axes: &[String],
    ) -> Result<Vec<Vec<usize>>, RuntimeError> {
        let mesh = self.mesh.ok_or_else(|| RuntimeError::NoMesh {
            index,
            op: op.name().to_string(),
        })?;
        let size = mesh.size_of(axes);
        if self.spmd {
            Ok(mesh.groups(axes))
        } else if size == 1 {
            Ok(vec![vec![0]])
        } else {
            Err(RuntimeError::CollectiveOnOneDevice {
                index,
                op: op.name().to_string(),
                axes: axes.join(","),
                size,
            })
        }
    }
}

/// Results of at least this many bytes are checked for room before they are computed.
const ROOM_CHECKED: usize = 1 << 20;

/// Index of the last instruction that reads each value (`usize::MAX` for outputs; the value
/// itself if nothing reads it).
fn last_uses(p: &Program) -> Vec<usize> {
    let mut last: Vec<usize> = (0..p.instrs.len()).collect();
    for (i, ins) in p.instrs.iter().enumerate() {
        for o in &ins.operands {
            last[o.index()] = i;
        }
    }
    for (_, v) in &p.outputs {
        last[v.index()] = usize::MAX;
    }
    last
}

fn execute(
    p: &Program,
    inputs: &[&HashMap<String, HostTensor>],
    spmd: bool,
) -> Result<Vec<HashMap<String, HostTensor>>, RuntimeError> {
    if p.mesh.is_none() {
        if let Some((index, ins)) = p
            .instrs
            .iter()
            .enumerate()
            .find(|(_, i)| i.op.is_collective())
        {
            return Err(RuntimeError::NoMesh {
                index,
                op: ins.op.name().to_string(),
            });
        }
    }
    ir::verify(p)?;
    let cx = Ctx {
        inputs,
        spmd,
        mesh: p.mesh.as_ref(),
    };
    let last = last_uses(p);
    let mut vals: Vec<Option<Vec<Val>>> = vec![None; p.instrs.len()];
    for (i, ins) in p.instrs.iter().enumerate() {
        let args: Vec<Vec<&Val>> = (0..inputs.len())
            .map(|d| {
                ins.operands
                    .iter()
                    .map(|o| &vals[o.index()].as_ref().expect("operands are live")[d])
                    .collect()
            })
            .collect();
        // The result is one f64 per element on every device: check that it fits before
        // the op's rule builds it (an allocation it could not make would abort).
        let bytes = ins.ty.num_elements().saturating_mul(8);
        if bytes >= ROOM_CHECKED {
            check_room(bytes)
                .map_err(|e| RuntimeError::out_of_memory(e, i, &ins.ty, spmd.then_some(0)))?;
        }
        let out = eval::eval(i, ins, &args, &cx)?;
        vals[i] = Some(out);
        for o in ins.operands.iter().map(|o| o.index()).chain([i]) {
            if last[o] == i {
                vals[o] = None;
            }
        }
    }
    Ok((0..inputs.len())
        .map(|d| {
            p.outputs
                .iter()
                .map(|(name, v)| {
                    let val = &vals[v.index()].as_ref().expect("outputs are kept")[d];
                    (name.clone(), val.to_host())
                })
                .collect()
        })
        .collect())
}

/// Evaluate one instruction that needs no inputs map, mesh position or peers (everything but
/// parameter, partition_id and collectives) on one device's operands. The executor's kernels.
pub(crate) fn eval_local(
    index: usize,
    ins: &Instr,
    args: &[&HostTensor],
) -> Result<HostTensor, RuntimeError> {
    let bytes = ins.ty.num_elements().saturating_mul(8);
    if bytes >= ROOM_CHECKED {
        check_room(bytes).map_err(|e| RuntimeError::out_of_memory(e, index, &ins.ty, None))?;
    }
    let vals: Vec<Val> = args.iter().map(|t| Val::from_host(t)).collect();
    let refs: Vec<&Val> = vals.iter().collect();
    let cx = Ctx {
        inputs: &[],
        spmd: false,
        mesh: None,
    };
    let mut out = eval::eval(index, ins, &[refs], &cx)?;
    Ok(out.pop().expect("one device in, one value out").to_host())
}

/// A collective over every mesh position's buffer (`local[pos]`), as the in-process
/// communicator needs it; `None` if `op` is not a collective.
pub(crate) fn collective_on_hosts(
    op: &Op,
    mesh: &Mesh,
    local: &[HostTensor],
) -> Option<Vec<HostTensor>> {
    let vals: Vec<Val> = local.iter().map(Val::from_host).collect();
    let args: Vec<Vec<&Val>> = vals.iter().map(|v| vec![v]).collect();
    let c = op.as_collective()?;
    let out = collective::run(&mesh.groups(&c.axes), &args, &c.kind);
    Some(out.iter().map(Val::to_host).collect())
}
