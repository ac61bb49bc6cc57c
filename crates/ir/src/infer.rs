//! Result-type inference and checking for every op, with errors that name the op, the
//! shapes involved and the fix.

use crate::dtype::{DType, Type};
use crate::error::ShapeError;
use crate::mesh::Mesh;
use crate::op::{BinaryOp, Collective, CollectiveKind, Literal, Op, UnaryOp};

fn fmt_types(ts: &[&Type]) -> String {
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_perm(p: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    p.len() == n
        && p.iter()
            .all(|&d| d < n && !std::mem::replace(&mut seen[d], true))
}

fn distinct_in_range(ds: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    ds.iter()
        .all(|&d| d < n && !std::mem::replace(&mut seen[d], true))
}

/// The result type of `op` applied to operands of types `operands`.
///
/// Ops whose result is not determined by their operands (parameter, constant, iota, convert,
/// broadcast, reshape, rng) take it from `declared`; for the others a `declared` type, when
/// given, must equal the inferred one. Collectives need the `mesh` for their group size.
pub fn infer_type(
    op: &Op,
    operands: &[&Type],
    declared: Option<&Type>,
    mesh: Option<&Mesh>,
) -> Result<Type, ShapeError> {
    let name = op.name();
    let err = |msg: String| ShapeError::new(name, msg);
    if let Some(n) = op.arity() {
        if operands.len() != n {
            return Err(err(format!(
                "takes {n} operand(s), got {} ({})",
                operands.len(),
                fmt_types(operands)
            )));
        }
    }
    let need_declared = || {
        declared
            .cloned()
            .ok_or_else(|| err("needs an explicit result type".to_string()))
    };
    let same_types = |what: &str| -> Result<(), ShapeError> {
        if operands.windows(2).any(|w| w[0] != w[1]) {
            return Err(err(format!(
                "operands must have one type, got {}; {what}",
                fmt_types(operands)
            )));
        }
        Ok(())
    };
    let group_size = |axes: &[String]| -> Result<usize, ShapeError> {
        let mesh = mesh.ok_or_else(|| {
            err("a collective needs a mesh: declare one with `mesh [...]`".to_string())
        })?;
        let mut seen: Vec<&String> = Vec::new();
        for a in axes {
            if mesh.axis_index(a).is_none() {
                return Err(err(format!("axis `{a}` is not in mesh {mesh}")));
            }
            if seen.contains(&a) {
                return Err(err(format!("axis `{a}` listed twice")));
            }
            seen.push(a);
        }
        Ok(mesh.size_of(axes))
    };
    let inferred = match op {
        Op::Parameter { .. } => need_declared()?,
        Op::Constant { value } => {
            let t = need_declared()?;
            let vals: &[f64] = match value {
                Literal::Splat(v) => std::slice::from_ref(v),
                Literal::Dense(vs) => {
                    if vs.len() != t.num_elements() {
                        return Err(err(format!(
                            "{} values given for type {t} with {} elements",
                            vs.len(),
                            t.num_elements()
                        )));
                    }
                    vs
                }
            };
            for &v in vals {
                let ok = match t.dtype {
                    DType::F32 | DType::F64 | DType::BF16 => true,
                    DType::I32 => v.fract() == 0.0 && v >= i32::MIN as f64 && v <= i32::MAX as f64,
                    DType::Bool => v == 0.0 || v == 1.0,
                };
                if !ok {
                    return Err(err(format!("value {v} is not a valid {}", t.dtype)));
                }
            }
            t
        }
        Op::Iota { dim } => {
            let t = need_declared()?;
            if *dim >= t.rank() {
                return Err(err(format!("dim {dim} out of range for {t}")));
            }
            if t.dtype == DType::Bool {
                return Err(err("iota needs a numeric dtype, got bool".into()));
            }
            t
        }
        Op::Unary(u) => {
            let x = operands[0];
            let ok = match u {
                UnaryOp::Not => matches!(x.dtype, DType::Bool | DType::I32),
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => x.dtype != DType::Bool,
                _ => x.dtype.is_float(),
            };
            if !ok {
                return Err(err(format!(
                    "not defined for {x}; convert the operand first"
                )));
            }
            x.clone()
        }
        Op::Binary(b) => {
            same_types("convert or broadcast one side first")?;
            let x = operands[0];
            let ok = match b {
                BinaryOp::And | BinaryOp::Or => matches!(x.dtype, DType::Bool | DType::I32),
                BinaryOp::Pow => x.dtype.is_float(),
                _ => x.dtype != DType::Bool,
            };
            if !ok {
                return Err(err(format!("not defined for {x}")));
            }
            x.clone()
        }
        Op::Compare(_) => {
            same_types("convert or broadcast one side first")?;
            operands[0].with_dtype(DType::Bool)
        }
        Op::Select => {
            let (p, t, f) = (operands[0], operands[1], operands[2]);
            if p.dtype != DType::Bool || p.shape != t.shape || t != f {
                return Err(err(format!(
                    "needs (bool[S], T[S], T[S]), got ({p}, {t}, {f})"
                )));
            }
            t.clone()
        }
        Op::Convert => {
            let t = need_declared()?;
            if t.shape != operands[0].shape {
                return Err(err(format!("cannot change shape {} -> {t}", operands[0])));
            }
            t
        }
        Op::StopGradient | Op::Copy => operands[0].clone(),
        Op::Broadcast { dims } => {
            let t = need_declared()?;
            let x = operands[0];
            let ok = x.dtype == t.dtype
                && dims.len() == x.rank()
                && dims.windows(2).all(|w| w[0] < w[1])
                && dims
                    .iter()
                    .enumerate()
                    .all(|(i, &d)| d < t.rank() && t.shape[d] == x.shape[i]);
            if !ok {
                return Err(err(format!(
                    "cannot broadcast {x} to {t} with dims={dims:?}: dims must be increasing, one per operand dim, mapping to equal sizes"
                )));
            }
            t
        }
        Op::Reshape => {
            let t = need_declared()?;
            let x = operands[0];
            if x.dtype != t.dtype || x.num_elements() != t.num_elements() {
                return Err(err(format!(
                    "cannot reshape {x} to {t}: element counts differ"
                )));
            }
            t
        }
        Op::Transpose { perm } => {
            let x = operands[0];
            if !is_perm(perm, x.rank()) {
                return Err(err(format!(
                    "perm {perm:?} is not a permutation of the dims of {x}"
                )));
            }
            x.with_shape(perm.iter().map(|&p| x.shape[p]).collect::<Vec<_>>())
        }
        Op::Slice { start, limit } => {
            let x = operands[0];
            if start.len() != x.rank()
                || limit.len() != x.rank()
                || (0..x.rank()).any(|i| start[i] > limit[i] || limit[i] > x.shape[i])
            {
                return Err(err(format!(
                    "slice start={start:?} limit={limit:?} does not fit {x}; need start <= limit <= size per dim"
                )));
            }
            x.with_shape(
                (0..x.rank())
                    .map(|i| limit[i] - start[i])
                    .collect::<Vec<_>>(),
            )
        }
        Op::DynamicSlice { sizes } => {
            let x = operands
                .first()
                .ok_or_else(|| err("needs an operand".into()))?;
            check_indices(name, &operands[1..], x.rank())?;
            if sizes.len() != x.rank() || sizes.iter().zip(&x.shape).any(|(s, n)| s > n) {
                return Err(err(format!("sizes {sizes:?} do not fit {x}")));
            }
            x.with_shape(sizes.clone())
        }
        Op::DynamicUpdateSlice => {
            if operands.len() < 2 {
                return Err(err("needs (array, update, starts...)".into()));
            }
            let (x, u) = (operands[0], operands[1]);
            check_indices(name, &operands[2..], x.rank())?;
            if u.dtype != x.dtype
                || u.rank() != x.rank()
                || u.shape.iter().zip(&x.shape).any(|(a, b)| a > b)
            {
                return Err(err(format!("update {u} does not fit into {x}")));
            }
            x.clone()
        }
        Op::Pad { low, high } => {
            let (x, v) = (operands[0], operands[1]);
            if v.rank() != 0 || v.dtype != x.dtype {
                return Err(err(format!(
                    "padding value must be a {} scalar, got {v}",
                    x.dtype
                )));
            }
            if low.len() != x.rank() || high.len() != x.rank() {
                return Err(err(format!("low/high need one entry per dim of {x}")));
            }
            let mut out = Vec::with_capacity(x.rank());
            for i in 0..x.rank() {
                let n = low[i]
                    .checked_add(x.shape[i])
                    .and_then(|n| n.checked_add(high[i]));
                out.push(n.ok_or_else(|| err(format!("padded size of dim {i} overflows")))?);
            }
            x.with_shape(out)
        }
        Op::Concatenate { dim } => {
            let x = operands
                .first()
                .ok_or_else(|| err("needs at least one operand".into()))?;
            if *dim >= x.rank() {
                return Err(err(format!("dim {dim} out of range for {x}")));
            }
            let mut out = x.shape.clone();
            out[*dim] = 0;
            for o in operands {
                let ok = o.dtype == x.dtype
                    && o.rank() == x.rank()
                    && (0..x.rank()).all(|i| i == *dim || o.shape[i] == x.shape[i]);
                if !ok {
                    return Err(err(format!(
                        "operands {} differ outside dim {dim}",
                        fmt_types(operands)
                    )));
                }
                out[*dim] += o.shape[*dim];
            }
            x.with_shape(out)
        }
        Op::Reduce { dims, .. } => {
            let x = operands[0];
            if !distinct_in_range(dims, x.rank()) || x.dtype == DType::Bool {
                return Err(err(format!("cannot reduce {x} over dims {dims:?}")));
            }
            x.with_shape(
                (0..x.rank())
                    .filter(|d| !dims.contains(d))
                    .map(|d| x.shape[d])
                    .collect::<Vec<_>>(),
            )
        }
        Op::DotGeneral(dd) => {
            let (l, r) = (operands[0], operands[1]);
            let bad = |why: &str| {
                err(format!(
                    "{l} x {r} with lhs_batch={:?} rhs_batch={:?} lhs_contract={:?} rhs_contract={:?}: {why}",
                    dd.lhs_batch, dd.rhs_batch, dd.lhs_contract, dd.rhs_contract
                ))
            };
            if l.dtype != r.dtype || l.dtype == DType::Bool {
                return Err(bad("operands need one numeric dtype"));
            }
            if dd.lhs_batch.len() != dd.rhs_batch.len()
                || dd.lhs_contract.len() != dd.rhs_contract.len()
            {
                return Err(bad("batch and contracting lists must pair up"));
            }
            let ld: Vec<usize> = dd
                .lhs_batch
                .iter()
                .chain(&dd.lhs_contract)
                .copied()
                .collect();
            let rd: Vec<usize> = dd
                .rhs_batch
                .iter()
                .chain(&dd.rhs_contract)
                .copied()
                .collect();
            if !distinct_in_range(&ld, l.rank()) || !distinct_in_range(&rd, r.rank()) {
                return Err(bad("dims out of range or repeated"));
            }
            if ld.iter().zip(&rd).any(|(&a, &b)| l.shape[a] != r.shape[b]) {
                return Err(bad("paired dims differ in size"));
            }
            let mut shape: Vec<usize> = dd.lhs_batch.iter().map(|&d| l.shape[d]).collect();
            shape.extend(dd.lhs_free(l.rank()).iter().map(|&d| l.shape[d]));
            shape.extend(dd.rhs_free(r.rank()).iter().map(|&d| r.shape[d]));
            l.with_shape(shape)
        }
        Op::Conv { pad_lo, pad_hi } => conv_type(name, operands[0], operands[1], pad_lo, pad_hi)?,
        Op::Reverse { dims } => {
            let x = operands[0];
            if !distinct_in_range(dims, x.rank()) {
                return Err(err(format!("dims {dims:?} must be distinct dims of {x}")));
            }
            x.clone()
        }
        Op::Cumsum { dim, .. } => {
            let x = operands[0];
            if *dim >= x.rank() || x.dtype == DType::Bool {
                return Err(err(format!("dim {dim} invalid for {x}")));
            }
            x.clone()
        }
        Op::Argmax { dim } => {
            let x = operands[0];
            if *dim >= x.rank() || x.dtype == DType::Bool {
                return Err(err(format!("dim {dim} invalid for {x}")));
            }
            let mut s = x.shape.clone();
            s.remove(*dim);
            Type::new(DType::I32, s)
        }
        Op::Gather { axis, batch_dims } => {
            gather_type(name, operands[0], operands[1], *axis, *batch_dims)?
        }
        Op::ScatterAdd { axis, batch_dims } => {
            let (base, idx, upd) = (operands[0], operands[1], operands[2]);
            if base.dtype == DType::Bool {
                return Err(err(format!(
                    "cannot add into {base}; convert to a number first"
                )));
            }
            let want = gather_type(name, base, idx, *axis, *batch_dims)?;
            if *upd != want {
                return Err(err(format!(
                    "updates must have type {want} (the gather of {base} by {idx}), got {upd}"
                )));
            }
            base.clone()
        }
        Op::Rng { global_shape, .. } => {
            let t = need_declared()?;
            if !t.dtype.is_float() {
                return Err(err(format!("rng produces floats, not {}", t.dtype)));
            }
            if operands.is_empty() || *operands[0] != Type::scalar(DType::I32) {
                return Err(err("first operand must be an i32[] seed".into()));
            }
            let offs = &operands[1..];
            if !offs.is_empty() {
                check_indices(name, offs, global_shape.len())?;
                if t.rank() != global_shape.len() {
                    return Err(err(format!(
                        "shape {t} does not match global shape {global_shape:?}"
                    )));
                }
            } else if t.shape != *global_shape {
                return Err(err(format!(
                    "without offsets the result {t} must have the global shape {global_shape:?}"
                )));
            }
            t
        }
        Op::PartitionId => Type::scalar(DType::I32),
        Op::Collective(Collective { kind, axes }) => {
            let k = group_size(axes)?;
            let x = operands[0];
            match kind {
                CollectiveKind::AllReduce { .. } => {
                    if x.dtype == DType::Bool {
                        return Err(err(format!("cannot reduce {x}; convert to a number first")));
                    }
                    x.clone()
                }
                CollectiveKind::AllGather { dim } => {
                    if *dim >= x.rank() {
                        return Err(err(format!("dim {dim} out of range for {x}")));
                    }
                    let mut s = x.shape.clone();
                    s[*dim] *= k;
                    x.with_shape(s)
                }
                CollectiveKind::ReduceScatter { dim, .. } => {
                    if x.dtype == DType::Bool {
                        return Err(err(format!("cannot reduce {x}; convert to a number first")));
                    }
                    if *dim >= x.rank() || !x.shape[*dim].is_multiple_of(k) {
                        return Err(err(format!(
                            "dim {dim} of {x} must exist and divide by the group size {k}"
                        )));
                    }
                    let mut s = x.shape.clone();
                    s[*dim] /= k;
                    x.with_shape(s)
                }
                CollectiveKind::AllToAll {
                    split_dim,
                    concat_dim,
                } => {
                    if *split_dim >= x.rank()
                        || *concat_dim >= x.rank()
                        || !x.shape[*split_dim].is_multiple_of(k)
                    {
                        return Err(err(format!(
                            "split dim {split_dim} of {x} must exist and divide by the group size {k}"
                        )));
                    }
                    let mut s = x.shape.clone();
                    s[*split_dim] /= k;
                    s[*concat_dim] *= k;
                    x.with_shape(s)
                }
                CollectiveKind::Permute { pairs } => {
                    let mut src = vec![false; k];
                    let mut dst = vec![false; k];
                    for &(a, b) in pairs {
                        if a >= k
                            || b >= k
                            || std::mem::replace(&mut src[a], true)
                            || std::mem::replace(&mut dst[b], true)
                        {
                            return Err(err(format!(
                                "pairs {pairs:?} must be ranks < {k} with no repeated source or target"
                            )));
                        }
                    }
                    x.clone()
                }
            }
        }
    };
    if let Some(d) = declared {
        if *d != inferred {
            return Err(err(format!(
                "declared result {d} but operands ({}) give {inferred}",
                fmt_types(operands)
            )));
        }
    }
    Ok(inferred)
}

fn check_indices(op: &str, idx: &[&Type], rank: usize) -> Result<(), ShapeError> {
    if idx.len() != rank || idx.iter().any(|t| **t != Type::scalar(DType::I32)) {
        return Err(ShapeError::new(
            op,
            format!(
                "needs one i32[] start per dim ({rank}), got ({})",
                fmt_types(idx)
            ),
        ));
    }
    Ok(())
}

fn gather_type(op: &str, x: &Type, idx: &Type, axis: usize, b: usize) -> Result<Type, ShapeError> {
    if idx.dtype != DType::I32 {
        return Err(ShapeError::new(
            op,
            format!("indices must be i32, got {idx}"),
        ));
    }
    if b > axis || axis >= x.rank() || b > idx.rank() || x.shape[..b] != idx.shape[..b] {
        return Err(ShapeError::new(
            op,
            format!(
                "{x} by indices {idx} with axis={axis} batch_dims={b}: need batch_dims <= axis < rank and equal leading batch dims"
            ),
        ));
    }
    let mut s = x.shape[..axis].to_vec();
    s.extend_from_slice(&idx.shape[b..]);
    s.extend_from_slice(&x.shape[axis + 1..]);
    Ok(x.with_shape(s))
}

/// The result type of a convolution (see [`Op::Conv`]): lhs `[N, S.., Cin]`, kernel
/// `[K.., Cin, Cout]`, result `[N, O.., Cout]` with `O = pad_lo + S + pad_hi - K + 1`.
fn conv_type(
    op: &str,
    l: &Type,
    r: &Type,
    pad_lo: &[usize],
    pad_hi: &[usize],
) -> Result<Type, ShapeError> {
    let k = pad_lo.len();
    let bad = |why: String| {
        ShapeError::new(
            op,
            format!("{l} with kernel {r}, pad_lo={pad_lo:?} pad_hi={pad_hi:?}: {why}"),
        )
    };
    if l.dtype != r.dtype || l.dtype == DType::Bool {
        return Err(bad("operands need one numeric dtype".into()));
    }
    if k == 0 || pad_hi.len() != k {
        return Err(bad(
            "give pad_lo and pad_hi one entry per spatial dim (at least one)".into(),
        ));
    }
    if l.rank() != k + 2 || r.rank() != k + 2 {
        return Err(bad(format!(
            "with {k} spatial dim(s) the lhs must be [N, S.., Cin] and the kernel [K.., Cin, Cout], both of rank {}",
            k + 2
        )));
    }
    if l.shape[k + 1] != r.shape[k] {
        return Err(bad(format!(
            "lhs input features {} differ from the kernel's {}",
            l.shape[k + 1],
            r.shape[k]
        )));
    }
    let mut shape = Vec::with_capacity(k + 2);
    shape.push(l.shape[0]);
    for i in 0..k {
        let kk = r.shape[i];
        let padded = pad_lo[i]
            .checked_add(l.shape[1 + i])
            .and_then(|n| n.checked_add(pad_hi[i]))
            .and_then(|n| n.checked_add(1))
            .ok_or_else(|| bad(format!("padded size of spatial dim {i} overflows")))?;
        if kk == 0 || padded < kk {
            return Err(bad(format!(
                "kernel spatial dim {i} ({kk}) must be between 1 and pad_lo + size + pad_hi + 1 ({padded})"
            )));
        }
        shape.push(padded - kk);
    }
    shape.push(r.shape[k + 1]);
    Ok(l.with_shape(shape))
}
