//! Attributes of the text format: one table per direction (printing reads an op's
//! attributes, parsing fills an op template's slots), both matching every `Op` variant.

use crate::op::{
    BinaryOp, Collective, CollectiveKind, CompareOp, DotDims, Literal, Op, ReduceOp, RngDist,
    UnaryOp,
};

/// An attribute value borrowed from an op, for printing.
pub(super) enum AttrRef<'a> {
    Usize(usize),
    U64(u64),
    Bool(bool),
    List(&'a [usize]),
    Axes(&'a [String]),
    Pairs(&'a [(usize, usize)]),
    Reduce(ReduceOp),
    Dist(RngDist),
}

/// Where a parsed attribute value is stored, for parsing.
pub(super) enum Slot<'a> {
    Usize(&'a mut usize),
    U64(&'a mut u64),
    Bool(&'a mut bool),
    List(&'a mut Vec<usize>),
    Axes(&'a mut Vec<String>),
    Pairs(&'a mut Vec<(usize, usize)>),
    Reduce(&'a mut ReduceOp),
    Dist(&'a mut RngDist),
}

impl Slot<'_> {
    /// An example value, for "missing attribute" messages.
    pub(super) fn example(&self) -> &'static str {
        match self {
            Slot::Usize(_) | Slot::U64(_) => "0",
            Slot::Bool(_) => "false",
            Slot::List(_) => "[0, 1]",
            Slot::Axes(_) => "[data]",
            Slot::Pairs(_) => "[(0,1), (1,0)]",
            Slot::Reduce(_) => "sum",
            Slot::Dist(_) => "uniform",
        }
    }
}

/// One attribute of an op being parsed.
pub(super) struct AttrSlot<'a> {
    pub(super) name: &'static str,
    /// Absent optional attributes keep the template's (empty) value.
    pub(super) required: bool,
    pub(super) slot: Slot<'a>,
}

fn req<'a>(name: &'static str, slot: Slot<'a>) -> AttrSlot<'a> {
    AttrSlot {
        name,
        required: true,
        slot,
    }
}

fn opt<'a>(name: &'static str, slot: Slot<'a>) -> AttrSlot<'a> {
    AttrSlot {
        name,
        required: false,
        slot,
    }
}

/// The attributes of `op` in printing order (dot-general omits its empty dim lists).
pub(super) fn attrs(op: &Op) -> Vec<(&'static str, AttrRef<'_>)> {
    use AttrRef as A;
    match op {
        Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::DynamicUpdateSlice
        | Op::PartitionId => vec![],
        Op::Iota { dim } | Op::Concatenate { dim } | Op::Argmax { dim } => {
            vec![("dim", A::Usize(*dim))]
        }
        Op::Broadcast { dims } => vec![("dims", A::List(dims))],
        Op::Transpose { perm } => vec![("perm", A::List(perm))],
        Op::Slice { start, limit } => vec![("start", A::List(start)), ("limit", A::List(limit))],
        Op::DynamicSlice { sizes } => vec![("sizes", A::List(sizes))],
        Op::Pad { low, high } => vec![("low", A::List(low)), ("high", A::List(high))],
        Op::Conv { pad_lo, pad_hi } => {
            vec![("pad_lo", A::List(pad_lo)), ("pad_hi", A::List(pad_hi))]
        }
        Op::Reverse { dims } => vec![("dims", A::List(dims))],
        Op::Reduce { op, dims } => vec![("op", A::Reduce(*op)), ("dims", A::List(dims))],
        Op::DotGeneral(d) => [
            ("lhs_batch", &d.lhs_batch),
            ("rhs_batch", &d.rhs_batch),
            ("lhs_contract", &d.lhs_contract),
            ("rhs_contract", &d.rhs_contract),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, A::List(v)))
        .collect(),
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => vec![
            ("dim", A::Usize(*dim)),
            ("exclusive", A::Bool(*exclusive)),
            ("reverse", A::Bool(*reverse)),
        ],
        Op::Gather { axis, batch_dims } | Op::ScatterAdd { axis, batch_dims } => vec![
            ("axis", A::Usize(*axis)),
            ("batch_dims", A::Usize(*batch_dims)),
        ],
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => vec![
            ("dist", A::Dist(*dist)),
            ("stream", A::U64(*stream)),
            ("global_shape", A::List(global_shape)),
        ],
        Op::Collective(Collective { kind, axes }) => {
            let axes = ("axes", A::Axes(axes));
            match kind {
                CollectiveKind::AllReduce { op } => vec![("op", A::Reduce(*op)), axes],
                CollectiveKind::AllGather { dim } => vec![("dim", A::Usize(*dim)), axes],
                CollectiveKind::ReduceScatter { op, dim } => {
                    vec![("op", A::Reduce(*op)), ("dim", A::Usize(*dim)), axes]
                }
                CollectiveKind::AllToAll {
                    split_dim,
                    concat_dim,
                } => vec![
                    ("split_dim", A::Usize(*split_dim)),
                    ("concat_dim", A::Usize(*concat_dim)),
                    axes,
                ],
                CollectiveKind::Permute { pairs } => vec![axes, ("pairs", A::Pairs(pairs))],
            }
        }
    }
}

/// The attribute slots of `op` (a template from [`op_template`]), for the parser to fill.
pub(super) fn slots(op: &mut Op) -> Vec<AttrSlot<'_>> {
    use Slot as S;
    match op {
        Op::Parameter { .. }
        | Op::Constant { .. }
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Convert
        | Op::StopGradient
        | Op::Copy
        | Op::Reshape
        | Op::DynamicUpdateSlice
        | Op::PartitionId => vec![],
        Op::Iota { dim } | Op::Concatenate { dim } | Op::Argmax { dim } => {
            vec![req("dim", S::Usize(dim))]
        }
        Op::Broadcast { dims } => vec![req("dims", S::List(dims))],
        Op::Transpose { perm } => vec![req("perm", S::List(perm))],
        Op::Slice { start, limit } => {
            vec![req("start", S::List(start)), req("limit", S::List(limit))]
        }
        Op::DynamicSlice { sizes } => vec![req("sizes", S::List(sizes))],
        Op::Pad { low, high } => vec![req("low", S::List(low)), req("high", S::List(high))],
        Op::Conv { pad_lo, pad_hi } => vec![
            req("pad_lo", S::List(pad_lo)),
            req("pad_hi", S::List(pad_hi)),
        ],
        Op::Reverse { dims } => vec![req("dims", S::List(dims))],
        Op::Reduce { op, dims } => vec![req("op", S::Reduce(op)), req("dims", S::List(dims))],
        Op::DotGeneral(DotDims {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        }) => vec![
            opt("lhs_batch", S::List(lhs_batch)),
            opt("rhs_batch", S::List(rhs_batch)),
            opt("lhs_contract", S::List(lhs_contract)),
            opt("rhs_contract", S::List(rhs_contract)),
        ],
        Op::Cumsum {
            dim,
            exclusive,
            reverse,
        } => vec![
            req("dim", S::Usize(dim)),
            req("exclusive", S::Bool(exclusive)),
            req("reverse", S::Bool(reverse)),
        ],
        Op::Gather { axis, batch_dims } | Op::ScatterAdd { axis, batch_dims } => vec![
            req("axis", S::Usize(axis)),
            req("batch_dims", S::Usize(batch_dims)),
        ],
        Op::Rng {
            dist,
            stream,
            global_shape,
        } => vec![
            req("dist", S::Dist(dist)),
            req("stream", S::U64(stream)),
            req("global_shape", S::List(global_shape)),
        ],
        Op::Collective(Collective { kind, axes }) => {
            let axes = req("axes", S::Axes(axes));
            match kind {
                CollectiveKind::AllReduce { op } => vec![req("op", S::Reduce(op)), axes],
                CollectiveKind::AllGather { dim } => vec![req("dim", S::Usize(dim)), axes],
                CollectiveKind::ReduceScatter { op, dim } => {
                    vec![req("op", S::Reduce(op)), req("dim", S::Usize(dim)), axes]
                }
                CollectiveKind::AllToAll {
                    split_dim,
                    concat_dim,
                } => vec![
                    req("split_dim", S::Usize(split_dim)),
                    req("concat_dim", S::Usize(concat_dim)),
                    axes,
                ],
                CollectiveKind::Permute { pairs } => vec![axes, req("pairs", S::Pairs(pairs))],
            }
        }
    }
}

/// The op called `name`, with empty attributes for the parser to fill in.
pub(super) fn op_template(name: &str) -> Option<Op> {
    let op = match name {
        "parameter" => Op::Parameter {
            name: String::new(),
        },
        "constant" => Op::Constant {
            value: Literal::Splat(0.0),
        },
        "iota" => Op::Iota { dim: 0 },
        "select" => Op::Select,
        "convert" => Op::Convert,
        "stop_gradient" => Op::StopGradient,
        "copy" => Op::Copy,
        "broadcast" => Op::Broadcast { dims: vec![] },
        "reshape" => Op::Reshape,
        "transpose" => Op::Transpose { perm: vec![] },
        "slice" => Op::Slice {
            start: vec![],
            limit: vec![],
        },
        "dynamic_slice" => Op::DynamicSlice { sizes: vec![] },
        "dynamic_update_slice" => Op::DynamicUpdateSlice,
        "pad" => Op::Pad {
            low: vec![],
            high: vec![],
        },
        "concatenate" => Op::Concatenate { dim: 0 },
        "reduce" => Op::Reduce {
            op: ReduceOp::Sum,
            dims: vec![],
        },
        "dot_general" => Op::DotGeneral(DotDims::default()),
        "conv" => Op::Conv {
            pad_lo: vec![],
            pad_hi: vec![],
        },
        "reverse" => Op::Reverse { dims: vec![] },
        "cumsum" => Op::Cumsum {
            dim: 0,
            exclusive: false,
            reverse: false,
        },
        "argmax" => Op::Argmax { dim: 0 },
        "gather" => Op::Gather {
            axis: 0,
            batch_dims: 0,
        },
        "scatter_add" => Op::ScatterAdd {
            axis: 0,
            batch_dims: 0,
        },
        "rng" => Op::Rng {
            dist: RngDist::Uniform,
            stream: 0,
            global_shape: vec![],
        },
        "partition_id" => Op::PartitionId,
        "all_reduce" => Op::all_reduce(ReduceOp::Sum, vec![]),
        "all_gather" => Op::all_gather(0, vec![]),
        "reduce_scatter" => Op::reduce_scatter(ReduceOp::Sum, 0, vec![]),
        "all_to_all" => Op::all_to_all(0, 0, vec![]),
        "collective_permute" => Op::collective_permute(vec![], vec![]),
        other => {
            let unary = UnaryOp::ALL.into_iter().find(|u| u.name() == other);
            let binary = BinaryOp::ALL.into_iter().find(|b| b.name() == other);
            let compare = CompareOp::ALL.into_iter().find(|c| c.name() == other);
            return unary
                .map(Op::Unary)
                .or(binary.map(Op::Binary))
                .or(compare.map(Op::Compare));
        }
    };
    Some(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_name_has_a_template() {
        let mut names: Vec<&str> = vec![
            "parameter",
            "constant",
            "iota",
            "select",
            "convert",
            "stop_gradient",
            "copy",
            "broadcast",
            "reshape",
            "transpose",
            "slice",
            "dynamic_slice",
            "dynamic_update_slice",
            "pad",
            "concatenate",
            "reduce",
            "dot_general",
            "conv",
            "reverse",
            "cumsum",
            "argmax",
            "gather",
            "scatter_add",
            "rng",
            "partition_id",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "collective_permute",
        ];
        names.extend(UnaryOp::ALL.map(UnaryOp::name));
        names.extend(BinaryOp::ALL.map(BinaryOp::name));
        names.extend(CompareOp::ALL.map(CompareOp::name));
        for n in names {
            let op = op_template(n).unwrap_or_else(|| panic!("no template for {n}"));
            assert_eq!(op.name(), n);
        }
        assert_eq!(op_template("frobnicate"), None);
    }
}
