//! The collective transposes, checked under `runtime::run_spmd` on a 2x2 mesh: the gradient
//! program's `grad_x` on each device must match finite differences of the sum of all
//! devices' losses with respect to that device's `x` (`testkit::check_grads_spmd`).

use crate::Case;
use ir::{Mesh, Op, ReduceOp};
use proptest::prelude::*;
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::strategies::{distinct_f64_tensor, f64_tensor, shape_of_rank};
use testkit::{cases, check_grads_spmd, inputs, Tol};

const CASES: u32 = 16;

fn mesh() -> Mesh {
    Mesh::new(&[("a", 2), ("b", 2)]).unwrap()
}

/// Every way to name a group of the 2x2 mesh.
fn axes() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        Just(vec!["a"]),
        Just(vec!["b"]),
        Just(vec!["a", "b"]),
        Just(vec!["b", "a"]),
    ]
    .prop_map(|v| v.into_iter().map(String::from).collect())
}

fn group_size(axes: &[String]) -> usize {
    mesh().size_of(axes)
}

/// Per-device values of local shape `local`, stacked along a new leading device dim.
fn stacked(local: Vec<usize>, distinct: bool) -> BoxedStrategy<HostTensor> {
    let mut s = local;
    s.insert(0, mesh().num_devices());
    if distinct {
        distinct_f64_tensor(s, -2.0, 2.0).boxed()
    } else {
        f64_tensor(s, -2.0, 2.0).boxed()
    }
}

/// `z = op(tanh(x))`, `loss = sum(z * z * w)` on every device; check `grad_x` everywhere.
fn check_collective(op: Op, stacked: &HostTensor) {
    let m = mesh();
    let ndev = m.num_devices();
    let local = stacked.shape()[1..].to_vec();
    let mut c = Case::with_mesh(m);
    let x = c.diff(
        "x",
        &HostTensor::from_f64(local.clone(), vec![0.0; stacked.num_elements() / ndev]),
    );
    let z = c.b.emit(op, &[&x.tanh()], None);
    let (p, _, _) = c.finish(&z.mul(&z));
    let v = stacked.to_f64_vec();
    let n = v.len() / ndev;
    let per_device: Vec<HashMap<String, HostTensor>> = (0..ndev)
        .map(|d| {
            let t = HostTensor::from_f64(local.clone(), v[d * n..(d + 1) * n].to_vec());
            inputs(&[("x", t)])
        })
        .collect();
    check_grads_spmd(&p, "loss", &["x"], &per_device, Tol::FD);
}

/// A local shape of rank 1..=2 whose dim `dim` is a multiple of `k`.
fn divisible_shape(k: usize) -> impl Strategy<Value = (Vec<usize>, usize)> {
    (1usize..=2)
        .prop_flat_map(|r| (shape_of_rank(r, 3), 0..r, 1usize..=2))
        .prop_map(move |(mut s, d, m)| {
            s[d] = k * m;
            (s, d)
        })
}

proptest! {
    #![proptest_config(cases(CASES))]

    #[test]
    fn all_reduce_sum((axes, t) in axes().prop_flat_map(|a| (Just(a), (1usize..=2).prop_flat_map(|r| shape_of_rank(r, 3)).prop_flat_map(|s| stacked(s, false))))) {
        check_collective(Op::all_reduce(ReduceOp::Sum, axes), &t);
    }

    /// Distinct values across devices, so the chooser picks one device per element.
    #[test]
    fn all_reduce_max_min((axes, t, max) in (axes(), shape_of_rank(2, 2).prop_flat_map(|s| stacked(s, true)), any::<bool>())) {
        let op = if max { ReduceOp::Max } else { ReduceOp::Min };
        check_collective(Op::all_reduce(op, axes), &t);
    }

    #[test]
    fn all_gather((axes, (t, dim)) in (axes(), (1usize..=2).prop_flat_map(|r| (shape_of_rank(r, 3), 0..r)).prop_flat_map(|(s, d)| (stacked(s, false), Just(d))))) {
        check_collective(Op::all_gather(dim, axes), &t);
    }

    #[test]
    fn reduce_scatter(((axes, (t, dim)), op) in (
        axes().prop_flat_map(|a| {
            let k = group_size(&a);
            (Just(a), divisible_shape(k).prop_flat_map(|(s, d)| (stacked(s, true), Just(d))))
        }),
        prop_oneof![Just(ReduceOp::Sum), Just(ReduceOp::Max), Just(ReduceOp::Min)],
    )) {
        check_collective(Op::reduce_scatter(op, dim, axes), &t);
    }

    #[test]
    fn all_to_all((axes, (t, split_dim, concat_dim)) in axes().prop_flat_map(|a| {
        let k = group_size(&a);
        (Just(a), divisible_shape(k).prop_flat_map(|(s, d)| {
            let r = s.len();
            (stacked(s, false), Just(d), 0..r)
        }))
    })) {
        check_collective(Op::all_to_all(split_dim, concat_dim, axes), &t);
    }

    /// A random partial permutation of the group's ranks (some ranks receive zeros).
    #[test]
    fn collective_permute((axes, pairs, t) in axes().prop_flat_map(|a| {
        let k = group_size(&a);
        let perm = Just((0..k).collect::<Vec<usize>>()).prop_shuffle();
        let keep = proptest::collection::vec(any::<bool>(), k);
        (Just(a), (perm, keep).prop_map(|(p, keep)| {
            p.into_iter().enumerate().filter(|&(i, _)| keep[i]).collect::<Vec<(usize, usize)>>()
        }), shape_of_rank(2, 2).prop_flat_map(|s| stacked(s, false)))
    })) {
        check_collective(Op::collective_permute(axes, pairs), &t);
    }
}

/// Two-way ties across the devices of each group: the central difference sees half the
/// slope on each tied device, which is what the chooser rule gives.
#[test]
fn max_collectives_split_ties_evenly() {
    let same: Vec<f64> = (0..4).flat_map(|_| [0.5, -1.0, 1.5, 0.25]).collect();
    let t = HostTensor::from_f64([4, 4], same);
    let a = vec!["a".to_string()];
    check_collective(Op::all_reduce(ReduceOp::Max, a.clone()), &t);
    check_collective(Op::reduce_scatter(ReduceOp::Min, 0, a), &t);
}
