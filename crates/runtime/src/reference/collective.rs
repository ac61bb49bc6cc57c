//! Collectives over all device buffers at once (XLA's collective semantics). `groups` are
//! replica groups from `Mesh::groups(axes)`: every device is in exactly one, and a device's
//! rank is its position in its group. `args[d][0]` is device `d`'s operand.
//!
//! - all_reduce: the elementwise reduction over the group (rank order, f64 accumulation).
//! - all_gather: the group's values concatenated along `dim` in rank order.
//! - reduce_scatter: all_reduce, then rank `r` keeps block `r` of `k` along `dim`.
//! - all_to_all: every rank splits its value into `k` blocks along `split_dim`; block `j`
//!   goes to rank `j`, which concatenates what it receives along `concat_dim` in source-rank
//!   order.
//! - collective_permute: group-relative `(src, dst)` rank pairs, applied in every group; a
//!   rank that receives nothing gets zeros.

use super::scalar;
use super::val::{concat, Val};
use ir::{CollectiveKind, ReduceOp};

/// Run `f` on each group's operands (in rank order); `f` returns one value per rank, which
/// goes to that rank's device.
fn per_group(
    groups: &[Vec<usize>],
    args: &[Vec<&Val>],
    f: impl Fn(&[&Val]) -> Vec<Val>,
) -> Vec<Val> {
    let mut out: Vec<Option<Val>> = vec![None; args.len()];
    for g in groups {
        let xs: Vec<&Val> = g.iter().map(|&d| args[d][0]).collect();
        for (&d, v) in g.iter().zip(f(&xs)) {
            out[d] = Some(v);
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(d, v)| v.unwrap_or_else(|| panic!("device {d} is in no replica group")))
        .collect()
}

/// Elementwise reduction of equal-typed values.
fn reduce_all(xs: &[&Val], op: ReduceOp) -> Val {
    let v = (0..xs[0].v.len())
        .map(|e| scalar::reduce(op, xs[0].dtype(), xs.iter().map(|x| x.v[e])))
        .collect();
    Val::new(&xs[0].ty, v)
}

/// The collective `kind` over `groups`.
pub fn run(groups: &[Vec<usize>], args: &[Vec<&Val>], kind: &CollectiveKind) -> Vec<Val> {
    match kind {
        CollectiveKind::AllReduce { op } => all_reduce(groups, args, *op),
        CollectiveKind::AllGather { dim } => all_gather(groups, args, *dim),
        CollectiveKind::ReduceScatter { op, dim } => reduce_scatter(groups, args, *op, *dim),
        CollectiveKind::AllToAll {
            split_dim,
            concat_dim,
        } => all_to_all(groups, args, *split_dim, *concat_dim),
        CollectiveKind::Permute { pairs } => collective_permute(groups, args, pairs),
    }
}

pub fn all_reduce(groups: &[Vec<usize>], args: &[Vec<&Val>], op: ReduceOp) -> Vec<Val> {
    per_group(groups, args, |xs| vec![reduce_all(xs, op); xs.len()])
}

pub fn all_gather(groups: &[Vec<usize>], args: &[Vec<&Val>], dim: usize) -> Vec<Val> {
    per_group(groups, args, |xs| vec![concat(xs, dim); xs.len()])
}

pub fn reduce_scatter(
    groups: &[Vec<usize>],
    args: &[Vec<&Val>],
    op: ReduceOp,
    dim: usize,
) -> Vec<Val> {
    per_group(groups, args, |xs| {
        let k = xs.len();
        let full = reduce_all(xs, op);
        let m = full.shape()[dim] / k;
        (0..k).map(|r| full.slice_dim(dim, r * m, m)).collect()
    })
}

pub fn all_to_all(
    groups: &[Vec<usize>],
    args: &[Vec<&Val>],
    split_dim: usize,
    concat_dim: usize,
) -> Vec<Val> {
    per_group(groups, args, |xs| {
        let k = xs.len();
        let m = xs[0].shape()[split_dim] / k;
        (0..k)
            .map(|r| {
                let received: Vec<Val> = xs
                    .iter()
                    .map(|x| x.slice_dim(split_dim, r * m, m))
                    .collect();
                concat(&received.iter().collect::<Vec<_>>(), concat_dim)
            })
            .collect()
    })
}

pub fn collective_permute(
    groups: &[Vec<usize>],
    args: &[Vec<&Val>],
    pairs: &[(usize, usize)],
) -> Vec<Val> {
    per_group(groups, args, |xs| {
        (0..xs.len())
            .map(|r| match pairs.iter().find(|&&(_, dst)| dst == r) {
                Some(&(src, _)) => xs[src].clone(),
                None => Val::new(&xs[0].ty, vec![0.0; xs[0].v.len()]),
            })
            .collect()
    })
}
