//! The partitioner's emission context: the output builder, the mesh, the cached
//! `partition_id` arithmetic (device coordinates and ranks computed at run time from the
//! mesh strides, so nothing is unrolled per device), and the reshard cache.

use crate::error::SpmdError;
use crate::pv::PartitionedValue;
use crate::why::{Emitted, Moved, Reshard};
use ir::{
    BinaryOp, Builder, CompareOp, DType, Literal, Mesh, Op, Program, Scopes, Sharding, Type, Value,
    ValueId,
};
use std::cell::RefCell;
use std::collections::HashMap;

pub struct Ctx {
    pub b: Builder,
    pub mesh: Mesh,
    /// The global instruction being partitioned (for error messages and causes).
    pub at: usize,
    pid: Option<Value>,
    ranks: HashMap<Vec<String>, Value>,
    pub(crate) reshard_cache: HashMap<(ValueId, Sharding), PartitionedValue>,
    /// Global instruction -> its value as a pending partial sum, before the driver reduced
    /// it: an add or subtract of such values sums the local parts and reduces once (the
    /// reductions it leaves unused are pruned).
    pub(crate) partial_sums: HashMap<usize, PartitionedValue>,
    /// The current instruction's operands: global ids and the local values they are.
    pub(crate) operands: Vec<(ValueId, ValueId)>,
    /// The local result of the current instruction's handler, before the final reshard.
    pub(crate) handler_result: Option<ValueId>,
    /// The reshard in progress, if any: what the collectives emitted now are for.
    pub(crate) resharding: Option<Reshard>,
    /// Every collective emitted, with why (filled by `emit`, which takes `&self`).
    pub(crate) emitted: RefCell<Vec<Emitted>>,
}

impl Ctx {
    /// A context whose program shares `scopes` (so a global instruction's scope id is valid
    /// in the per-device program).
    pub fn new(mesh: Mesh, scopes: Scopes) -> Ctx {
        let prog = Program {
            mesh: Some(mesh.clone()),
            scopes,
            ..Program::default()
        };
        Ctx {
            b: Builder::from_program(prog),
            mesh,
            at: 0,
            pid: None,
            ranks: HashMap::new(),
            reshard_cache: HashMap::new(),
            partial_sums: HashMap::new(),
            operands: Vec::new(),
            handler_result: None,
            resharding: None,
            emitted: RefCell::new(Vec::new()),
        }
    }

    /// What a reshard of the local value `v` moves for the current instruction.
    pub(crate) fn moved_here(&self, v: ValueId) -> Moved {
        if self.handler_result == Some(v) {
            return Moved::Result;
        }
        match self.operands.iter().position(|&(_, local)| local == v) {
            Some(position) => Moved::Operand {
                position,
                value: self.operands[position].0,
            },
            None => Moved::Internal,
        }
    }

    /// Emit one op; a shape error here is a partitioner bug, reported with the instruction.
    pub fn emit(
        &self,
        op: Op,
        operands: &[&Value],
        declared: Option<Type>,
    ) -> Result<Value, SpmdError> {
        let collective = op.is_collective();
        let v = self
            .b
            .try_emit(op, operands, declared)
            .map_err(|e| SpmdError::Internal {
                index: self.at,
                msg: e.to_string(),
            })?;
        if collective {
            self.emitted.borrow_mut().push(Emitted {
                local: v.id,
                serves: ValueId(self.at as u32),
                reshard: self.resharding.clone(),
            });
        }
        Ok(v)
    }

    pub fn i32(&self, v: i64) -> Value {
        self.b.scalar(v as f64, DType::I32)
    }

    pub fn bin(&self, op: BinaryOp, a: &Value, b: &Value) -> Result<Value, SpmdError> {
        self.emit(Op::Binary(op), &[a, b], None)
    }

    fn partition_id(&mut self) -> Value {
        if self.pid.is_none() {
            self.pid = Some(self.b.partition_id());
        }
        self.pid.clone().unwrap()
    }

    /// This device's rank within its group along `axes` (listed order = major to minor), as
    /// an i32 scalar computed from `partition_id` and the mesh strides.
    pub fn rank(&mut self, axes: &[String]) -> Result<Value, SpmdError> {
        if let Some(v) = self.ranks.get(axes) {
            return Ok(v.clone());
        }
        let v = if axes.is_empty() {
            self.i32(0)
        } else {
            let pid = self.partition_id();
            let mut acc: Option<Value> = None;
            for a in axes {
                let stride = self
                    .mesh
                    .axis_stride(a)
                    .ok_or_else(|| SpmdError::Internal {
                        index: self.at,
                        msg: format!("axis {a} not in mesh"),
                    })?;
                let size = self.mesh.axis_size(a).unwrap_or(1);
                let c = self.bin(BinaryOp::Div, &pid, &self.i32(stride as i64))?;
                let c = self.bin(BinaryOp::Rem, &c, &self.i32(size as i64))?;
                acc = Some(match acc {
                    None => c,
                    Some(r) => {
                        let r = self.bin(BinaryOp::Mul, &r, &self.i32(size as i64))?;
                        self.bin(BinaryOp::Add, &r, &c)?
                    }
                });
            }
            acc.unwrap()
        };
        self.ranks.insert(axes.to_vec(), v.clone());
        Ok(v)
    }

    /// Offset (in elements) of this device's shard along a dim split over `axes` with local
    /// size `local`: `rank(axes) * local`.
    pub fn offset(&mut self, axes: &[String], local: usize) -> Result<Value, SpmdError> {
        let r = self.rank(axes)?;
        if axes.is_empty() || local == 1 {
            return Ok(r);
        }
        self.bin(BinaryOp::Mul, &r, &self.i32(local as i64))
    }

    /// A bool mask of `local_shape` that is true where the global index along `dim`
    /// (`offset + local index`) is below `global` — false on padding.
    pub fn valid_mask(
        &mut self,
        local_shape: &[usize],
        dim: usize,
        axes: &[String],
        global: usize,
    ) -> Result<Value, SpmdError> {
        let ity = Type::new(DType::I32, local_shape.to_vec());
        let iota = self.emit(Op::Iota { dim }, &[], Some(ity.clone()))?;
        let off = self.offset(axes, local_shape[dim])?;
        let off = self.emit(Op::Broadcast { dims: vec![] }, &[&off], Some(ity.clone()))?;
        let gidx = self.bin(BinaryOp::Add, &iota, &off)?;
        let lim = self.emit(
            Op::Constant {
                value: Literal::Splat(global as f64),
            },
            &[],
            Some(ity),
        )?;
        self.emit(Op::Compare(CompareOp::Lt), &[&gidx, &lim], None)
    }

    /// Replace the padding of `x` along `dim` by `fill`.
    pub fn mask_padding(
        &mut self,
        x: &Value,
        dim: usize,
        axes: &[String],
        global: usize,
        fill: f64,
    ) -> Result<Value, SpmdError> {
        let ty = x.ty();
        if ty.shape[dim] * self.mesh.size_of(axes) == global {
            return Ok(x.clone());
        }
        let m = self.valid_mask(&ty.shape, dim, axes, global)?;
        // An infinite identity (max/min) is the dtype's extreme value for integers.
        let fill = match ty.dtype {
            DType::I32 => fill.clamp(i32::MIN as f64, i32::MAX as f64),
            DType::Bool => (fill != 0.0) as u8 as f64,
            DType::F32 | DType::F64 | DType::BF16 => fill,
        };
        let f = self.emit(
            Op::Constant {
                value: Literal::Splat(fill),
            },
            &[],
            Some(ty),
        )?;
        self.emit(Op::Select, &[&m, x, &f], None)
    }
}
