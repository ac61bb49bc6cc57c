//! The closed set of operations, with their properties declared once, here.
//!
//! Passes match on [`Op`] exhaustively with no wildcard arm, so adding a variant makes the
//! compiler list every pass that has to learn it (autodiff, propagation, partitioning,
//! interpreter, printer, parser).

/// Elementwise unary functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sign,
    Exp,
    Log,
    Log1p,
    Sqrt,
    Rsqrt,
    Tanh,
    Logistic,
    Erf,
    Sin,
    Cos,
    Floor,
    /// Logical not (bool) or bitwise not (i32).
    Not,
}

/// Elementwise binary functions (operands of equal type; result of the same type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division, or integer division truncating toward zero.
    Div,
    /// Remainder with the sign of the dividend (C / Rust `%`).
    Rem,
    Pow,
    Max,
    Min,
    /// Logical and (bool) or bitwise and (i32).
    And,
    /// Logical or (bool) or bitwise or (i32).
    Or,
}

/// Elementwise comparisons; the result is `bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions used by `reduce` and the reducing collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Distribution of the counter-based RNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RngDist {
    /// Uniform on `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
}

/// Data of a constant: one value broadcast to the whole shape, or every element row-major.
/// Values are stored as `f64` (exact for every f32, bf16, i32 and bool value).
#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Splat(f64),
    Dense(Vec<f64>),
}

/// Dimension numbers of a dot-general. The result dims are: batch dims (in `lhs_batch`
/// order), then lhs free dims, then rhs free dims, each in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contract: Vec<usize>,
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// Dimension numbers from each side's batch dims and contracting dims.
    pub fn new(
        lhs_batch: Vec<usize>,
        rhs_batch: Vec<usize>,
        lhs_contract: Vec<usize>,
        rhs_contract: Vec<usize>,
    ) -> DotDims {
        DotDims {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        }
    }

    /// Free (non-batch, non-contracting) dims of the lhs for a rank-`rank` operand.
    pub fn lhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank)
            .filter(|d| !self.lhs_batch.contains(d) && !self.lhs_contract.contains(d))
            .collect()
    }

    /// Free dims of the rhs.
    pub fn rhs_free(&self, rank: usize) -> Vec<usize> {
        (0..rank)
            .filter(|d| !self.rhs_batch.contains(d) && !self.rhs_contract.contains(d))
            .collect()
    }
}

/// A collective: what it does ([`CollectiveKind`]) and the mesh axes whose groups it runs
/// over. The replica groups are `Mesh::groups(axes)`, so the program text does not grow
/// with the device count.
#[derive(Clone, Debug, PartialEq)]
pub struct Collective {
    pub kind: CollectiveKind,
    pub axes: Vec<String>,
}

/// The collectives. Adding one means: its name and wire bytes here, its type in `infer`,
/// its attributes in `text::attrs`, its transpose in autodiff, and its execution in the
/// runtime (reference interpreter, communicator) and the MPI backend.
#[derive(Clone, Debug, PartialEq)]
pub enum CollectiveKind {
    /// Every member gets the reduction of the group's values.
    AllReduce { op: ReduceOp },
    /// Concatenate the group's values along `dim` in rank order.
    AllGather { dim: usize },
    /// Reduce over the group, then rank `r` keeps block `r` along `dim`.
    ReduceScatter { op: ReduceOp, dim: usize },
    /// Split along `split_dim` into k blocks, block j goes to rank j; received blocks are
    /// concatenated along `concat_dim` in rank order.
    AllToAll { split_dim: usize, concat_dim: usize },
    /// Rank `src` sends to rank `dst` for each pair; a rank that receives nothing gets
    /// zeros.
    Permute { pairs: Vec<(usize, usize)> },
}

impl CollectiveKind {
    /// The text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            CollectiveKind::AllReduce { .. } => "all_reduce",
            CollectiveKind::AllGather { .. } => "all_gather",
            CollectiveKind::ReduceScatter { .. } => "reduce_scatter",
            CollectiveKind::AllToAll { .. } => "all_to_all",
            CollectiveKind::Permute { .. } => "collective_permute",
        }
    }

    /// Bytes one member sends for an operand of `b` bytes in a group of `k` (ring
    /// all-reduce: `2 (k-1)/k` of the buffer; all-gather: its block to `k-1` peers;
    /// reduce-scatter and all-to-all: `(k-1)/k`; permute: the whole buffer).
    pub fn wire_bytes(&self, b: usize, k: usize) -> usize {
        let k = k.max(1);
        match self {
            CollectiveKind::AllReduce { .. } => 2 * b * (k - 1) / k,
            CollectiveKind::AllGather { .. } => b * (k - 1),
            CollectiveKind::ReduceScatter { .. } | CollectiveKind::AllToAll { .. } => {
                b * (k - 1) / k
            }
            CollectiveKind::Permute { .. } => b,
        }
    }
}

/// What kind of computation an op is. The properties passes ask about
/// ([`Op::is_elementwise`], [`Op::is_collective`]) derive from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Produces a value from attributes alone: parameter, constant, iota, rng, partition id.
    Source,
    /// Element `i` of the result depends only on element `i` of each operand.
    Elementwise,
    /// Moves or replicates elements without arithmetic: broadcast, reshape, transpose,
    /// slices, pad, concatenate, reverse, dynamic update.
    Layout,
    /// Reductions and scans along dims: reduce, cumsum, argmax.
    Reduction,
    /// Contractions: dot products and convolution.
    Contraction,
    /// Data-dependent indexing: gather, scatter-add.
    Indexing,
    /// Communication between devices.
    Collective,
}

/// An operation. Result types live on the instruction, not here; attributes that the result
/// type already determines (the target shape of `reshape`, the dtype of `convert`) are not
/// repeated.
///
/// Collectives name the mesh axes they communicate over (`axes`); the replica groups are
/// `Mesh::groups(axes)`, so the program text does not grow with the device count.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A named input of the program.
    Parameter {
        name: String,
    },
    Constant {
        value: Literal,
    },
    /// `out[i] = i_dim` (index along `dim`), any numeric dtype.
    Iota {
        dim: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `(pred, on_true, on_false)`, all of one shape.
    Select,
    /// Elementwise dtype conversion (float -> int truncates toward zero; -> bool is `!= 0`).
    Convert,
    /// Identity whose value carries no gradient.
    StopGradient,
    /// Identity; the carrier of a user sharding annotation that differs from its operand's.
    Copy,
    /// Operand dim `i` becomes result dim `dims[i]` (strictly increasing); the other result
    /// dims are new. Operand dims must equal their result dims.
    Broadcast {
        dims: Vec<usize>,
    },
    /// Row-major reshape to the result shape.
    Reshape,
    /// `out.shape[i] = in.shape[perm[i]]`.
    Transpose {
        perm: Vec<usize>,
    },
    /// Static slice `[start, limit)` per dim with unit stride.
    Slice {
        start: Vec<usize>,
        limit: Vec<usize>,
    },
    /// Operands: the array, then one i32 scalar start per dim (clamped into range).
    DynamicSlice {
        sizes: Vec<usize>,
    },
    /// Operands: the array, the update, then one i32 scalar start per dim (clamped).
    DynamicUpdateSlice,
    /// Operands: the array and a scalar padding value.
    Pad {
        low: Vec<usize>,
        high: Vec<usize>,
    },
    Concatenate {
        dim: usize,
    },
    /// Reduce over `dims` (removed from the result).
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
    },
    DotGeneral(DotDims),
    /// Convolution with window stride 1 and no dilation (cross-correlation, as in XLA):
    /// lhs `[N, S_1..S_k, Cin]`, kernel `[K_1..K_k, Cin, Cout]`, result `[N, O_1..O_k, Cout]`
    /// with `O_i = pad_lo[i] + S_i + pad_hi[i] - K_i + 1` and
    /// `out[n, o, co] = sum_{j, ci} lhs[n, o + j - pad_lo, ci] * kernel[j, ci, co]`, reading
    /// zeros outside the lhs. `k = pad_lo.len() >= 1` spatial dims; SAME and VALID padding
    /// are special cases.
    Conv {
        pad_lo: Vec<usize>,
        pad_hi: Vec<usize>,
    },
    /// Flip along `dims`: `out[.., i_d, ..] = in[.., n_d - 1 - i_d, ..]` for `d` in `dims`.
    Reverse {
        dims: Vec<usize>,
    },
    /// Prefix sum along `dim`; `exclusive` starts at 0, `reverse` runs from the end.
    Cumsum {
        dim: usize,
        exclusive: bool,
        reverse: bool,
    },
    /// i32 index of the largest element along `dim` (removed); ties go to the lowest index.
    Argmax {
        dim: usize,
    },
    /// `tf.gather(x, idx, axis, batch_dims)`: result shape is
    /// `x[..axis] ++ idx[batch_dims..] ++ x[axis+1..]`, where the first `batch_dims` dims of
    /// `x` and `idx` are shared. An out-of-range index yields zeros.
    Gather {
        axis: usize,
        batch_dims: usize,
    },
    /// Operands `(base, idx, updates)`: the transpose of `Gather`, added onto `base`.
    /// Out-of-range indices are dropped.
    ScatterAdd {
        axis: usize,
        batch_dims: usize,
    },
    /// Counter-based RNG. Operands: an i32 scalar seed, then optionally one i32 scalar
    /// offset per dim (added by the partitioner). Element `i` of the result is a pure
    /// function of `(seed, stream, row-major index of i + offsets in global_shape)`.
    Rng {
        dist: RngDist,
        stream: u64,
        global_shape: Vec<usize>,
    },
    /// The mesh position of the executing device, as an i32 scalar.
    PartitionId,
    /// Communication between the devices of each group along `axes` (only present after
    /// partitioning).
    Collective(Collective),
}

impl Op {
    /// The text-format name of the op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Parameter { .. } => "parameter",
            Op::Constant { .. } => "constant",
            Op::Iota { .. } => "iota",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(c) => c.name(),
            Op::Select => "select",
            Op::Convert => "convert",
            Op::StopGradient => "stop_gradient",
            Op::Copy => "copy",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::Pad { .. } => "pad",
            Op::Concatenate { .. } => "concatenate",
            Op::Reduce { .. } => "reduce",
            Op::DotGeneral(_) => "dot_general",
            Op::Conv { .. } => "conv",
            Op::Reverse { .. } => "reverse",
            Op::Cumsum { .. } => "cumsum",
            Op::Argmax { .. } => "argmax",
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Rng { .. } => "rng",
            Op::PartitionId => "partition_id",
            Op::Collective(c) => c.kind.name(),
        }
    }

    /// The op's class, from which [`Op::is_elementwise`] and [`Op::is_collective`] derive.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Parameter { .. }
            | Op::Constant { .. }
            | Op::Iota { .. }
            | Op::Rng { .. }
            | Op::PartitionId => OpClass::Source,
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Convert
            | Op::StopGradient
            | Op::Copy => OpClass::Elementwise,
            Op::Broadcast { .. }
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Pad { .. }
            | Op::Concatenate { .. }
            | Op::Reverse { .. } => OpClass::Layout,
            Op::Reduce { .. } | Op::Cumsum { .. } | Op::Argmax { .. } => OpClass::Reduction,
            Op::DotGeneral(_) | Op::Conv { .. } => OpClass::Contraction,
            Op::Gather { .. } | Op::ScatterAdd { .. } => OpClass::Indexing,
            Op::Collective(_) => OpClass::Collective,
        }
    }

    /// Same-shape, position-wise ops (operands and result share one shape).
    pub fn is_elementwise(&self) -> bool {
        self.class() == OpClass::Elementwise
    }

    /// Ops that communicate between devices (only present after partitioning).
    pub fn is_collective(&self) -> bool {
        self.class() == OpClass::Collective
    }

    /// The collective, if this op is one.
    pub fn as_collective(&self) -> Option<&Collective> {
        if let Op::Collective(c) = self {
            Some(c)
        } else {
            None
        }
    }

    /// The collective's kind, if this op is one.
    pub fn collective_kind(&self) -> Option<&CollectiveKind> {
        self.as_collective().map(|c| &c.kind)
    }

    /// `all_reduce` over `axes`.
    pub fn all_reduce(op: ReduceOp, axes: Vec<String>) -> Op {
        Op::collective(CollectiveKind::AllReduce { op }, axes)
    }

    /// `all_gather` along `dim` over `axes`.
    pub fn all_gather(dim: usize, axes: Vec<String>) -> Op {
        Op::collective(CollectiveKind::AllGather { dim }, axes)
    }

    /// `reduce_scatter` along `dim` over `axes`.
    pub fn reduce_scatter(op: ReduceOp, dim: usize, axes: Vec<String>) -> Op {
        Op::collective(CollectiveKind::ReduceScatter { op, dim }, axes)
    }

    /// `all_to_all` from `split_dim` to `concat_dim` over `axes`.
    pub fn all_to_all(split_dim: usize, concat_dim: usize, axes: Vec<String>) -> Op {
        let kind = CollectiveKind::AllToAll {
            split_dim,
            concat_dim,
        };
        Op::collective(kind, axes)
    }

    /// `collective_permute` of `pairs` (source rank, target rank) over `axes`.
    pub fn collective_permute(axes: Vec<String>, pairs: Vec<(usize, usize)>) -> Op {
        Op::collective(CollectiveKind::Permute { pairs }, axes)
    }

    /// A collective of `kind` over `axes`.
    pub fn collective(kind: CollectiveKind, axes: Vec<String>) -> Op {
        Op::Collective(Collective { kind, axes })
    }

    /// Bytes one device sends to the other members of its group for this collective on an
    /// operand of `operand_bytes` with `k` group members (ring all-reduce: `2 (k-1)/k` of the
    /// buffer; all-gather: its block to `k-1` peers; reduce-scatter and all-to-all:
    /// `(k-1)/k`; collective-permute: the whole buffer). 0 for every other op. The one
    /// formula behind `gshard inspect`'s analytic counts and the executor's measured ones.
    pub fn wire_bytes(&self, operand_bytes: usize, k: usize) -> usize {
        self.as_collective()
            .map_or(0, |c| c.kind.wire_bytes(operand_bytes, k))
    }

    /// The mesh axes a collective communicates over.
    pub fn collective_axes(&self) -> Option<&[String]> {
        self.as_collective().map(|c| c.axes.as_slice())
    }

    /// Ops whose result depends on which device runs them (illegal before partitioning
    /// unless the program has no mesh, where the single device is position 0).
    pub fn is_device_dependent(&self) -> bool {
        self.is_collective() || *self == Op::PartitionId
    }

    /// Exact operand count, or `None` when it varies (concatenate, dynamic slicing, rng).
    pub fn arity(&self) -> Option<usize> {
        match self {
            Op::Parameter { .. } | Op::Constant { .. } | Op::Iota { .. } | Op::PartitionId => {
                Some(0)
            }
            Op::Unary(_)
            | Op::Convert
            | Op::StopGradient
            | Op::Copy
            | Op::Broadcast { .. }
            | Op::Reshape
            | Op::Transpose { .. }
            | Op::Reverse { .. }
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::Cumsum { .. }
            | Op::Argmax { .. }
            | Op::Collective(_) => Some(1),
            Op::Binary(_)
            | Op::Compare(_)
            | Op::Pad { .. }
            | Op::DotGeneral(_)
            | Op::Conv { .. }
            | Op::Gather { .. } => Some(2),
            Op::Select | Op::ScatterAdd { .. } => Some(3),
            Op::DynamicSlice { .. }
            | Op::DynamicUpdateSlice
            | Op::Concatenate { .. }
            | Op::Rng { .. } => None,
        }
    }
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 15] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Not,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Not => "not",
        }
    }

    /// Float-only functions (everything except neg, abs, sign, not).
    pub fn needs_float(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Not
        )
    }
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 10] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::And,
        BinaryOp::Or,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
        }
    }
}

impl CompareOp {
    pub const ALL: [CompareOp; 6] = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// The identity element (used to mask padding before reducing).
    pub fn identity(self) -> f64 {
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
        }
    }
}

impl RngDist {
    pub fn name(self) -> &'static str {
        match self {
            RngDist::Uniform => "uniform",
            RngDist::Normal => "normal",
        }
    }
}
