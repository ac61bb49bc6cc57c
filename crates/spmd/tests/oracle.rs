//! The partitioned program on N devices equals the single-device run (hand-picked cases).

use ir::{Builder, DType, Mesh, Type};
use runtime::HostTensor;
use sharding::{mesh_split, replicate, split};
use std::collections::HashMap;
use testkit::spmd::assert_spmd_matches;
use testkit::Tol;

fn f64t(shape: &[usize]) -> Type {
    Type::new(DType::F64, shape.to_vec())
}

fn rand_tensor(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    HostTensor::from_f64(shape.to_vec(), v)
}

fn collective_kinds(part: &spmd::Partitioned) -> Vec<&'static str> {
    spmd::report::collectives(&part.program)
        .iter()
        .map(|c| c.kind)
        .collect()
}

#[test]
fn data_parallel_mlp() {
    let b = Builder::with_mesh(Mesh::new(&[("data", 4)]).unwrap());
    let x = split(&b.param("x", f64t(&[8, 6])), 0, "data").unwrap();
    let w1 = replicate(&b.param("w1", f64t(&[6, 5]))).unwrap();
    let w2 = b.param("w2", f64t(&[5, 3]));
    let y = x.matmul(&w1).relu().matmul(&w2);
    b.output("y", &y);
    b.output("loss", &y.mul(&y).sum_all());
    let p = b.finish();
    let inputs = HashMap::from([
        ("x".to_string(), rand_tensor(&[8, 6], 1)),
        ("w1".to_string(), rand_tensor(&[6, 5], 2)),
        ("w2".to_string(), rand_tensor(&[5, 3], 3)),
    ]);
    let part = assert_spmd_matches(&p, &inputs, Tol::F64);
    assert_eq!(
        collective_kinds(&part),
        vec!["all_reduce"],
        "only the loss sum is reduced"
    );
}

#[test]
fn uneven_split_is_padded_and_masked() {
    let b = Builder::with_mesh(Mesh::new(&[("d", 4)]).unwrap());
    let x = split(&b.param("x", f64t(&[5, 3])), 0, "d").unwrap();
    let w = b.param("w", f64t(&[5, 2]));
    let s = x.exp().sum(&[0]);
    let m = x.reduce_max(&[0]);
    let c = b.einsum("ab,ac->bc", &[&x, &w]);
    b.output("s", &s);
    b.output("m", &m);
    b.output("c", &c);
    b.output("x2", &x.mul(2.0));
    let p = b.finish();
    let inputs = HashMap::from([
        ("x".to_string(), rand_tensor(&[5, 3], 4)),
        ("w".to_string(), rand_tensor(&[5, 2], 5)),
    ]);
    assert_spmd_matches(&p, &inputs, Tol::F64);
}

#[test]
fn resharding_between_dims_uses_all_to_all() {
    let b = Builder::with_mesh(Mesh::new(&[("a", 2), ("b", 2)]).unwrap());
    let x = mesh_split(&b.param("x", f64t(&[4, 8])), &[&["a"], &["b"]]).unwrap();
    let y = mesh_split(&x, &[&["b"], &["a"]]).unwrap();
    let z = mesh_split(&y, &[&[], &["a", "b"]]).unwrap();
    let r = replicate(&z).unwrap();
    b.output("y", &y.mul(1.0));
    b.output("z", &z.mul(1.0));
    b.output("r", &r.mul(1.0));
    let p = b.finish();
    let inputs = HashMap::from([("x".to_string(), rand_tensor(&[4, 8], 6))]);
    let part = assert_spmd_matches(&p, &inputs, Tol::EXACT);
    assert!(
        collective_kinds(&part).contains(&"all_to_all"),
        "{:?}",
        collective_kinds(&part)
    );
}

#[test]
fn iota_and_rng_are_shard_invariant() {
    let b = Builder::with_mesh(Mesh::new(&[("d", 2), ("e", 3)]).unwrap());
    let seed = b.param("seed", Type::scalar(DType::I32));
    let u = b.rng(ir::RngDist::Uniform, &seed, f64t(&[4, 9]));
    let u = mesh_split(&u, &[&["d"], &["e"]]).unwrap();
    let i = b.iota(f64t(&[4, 9]), 1);
    let i = mesh_split(&i, &[&[], &["e", "d"]]).unwrap();
    b.output("u", &u.add(&i));
    let p = b.finish();
    let inputs = HashMap::from([("seed".to_string(), HostTensor::scalar_i32(7))]);
    assert_spmd_matches(&p, &inputs, Tol::EXACT);
}

// ---- minimal cases found by the property suite (prop_oracle.rs) ----

/// A gather whose operand stays split on the gathered axis sums the members' results, which
/// bools cannot do (it emitted an `all_reduce` of bools).
#[test]
fn gather_of_bools_from_a_split_axis() {
    let b = Builder::with_mesh(Mesh::new(&[("x", 4)]).unwrap());
    let x = split(&b.param("x", Type::new(DType::Bool, [1])), 0, "x").unwrap();
    let i = b.param("i", Type::scalar(DType::I32));
    b.output("y", &x.gather(&i, 0, 0));
    let p = b.finish();
    let inputs = HashMap::from([
        ("x".to_string(), HostTensor::from_bool([1], vec![true])),
        ("i".to_string(), HostTensor::scalar_i32(0)),
    ]);
    assert_spmd_matches(&p, &inputs, Tol::EXACT);
}

/// Masking the padding of an i32 max-reduce used the float identity -inf, which is not an
/// i32 constant; integers use i32::MIN / i32::MAX.
#[test]
fn integer_max_over_an_uneven_split_dim() {
    let b = Builder::with_mesh(Mesh::new(&[("x", 2)]).unwrap());
    let x = split(&b.param("x", Type::new(DType::I32, [1])), 0, "x").unwrap();
    b.output("max", &x.reduce_max(&[0]));
    b.output("min", &x.reduce_min(&[0]));
    let p = b.finish();
    let inputs = HashMap::from([("x".to_string(), HostTensor::from_i32([1], vec![-3]))]);
    assert_spmd_matches(&p, &inputs, Tol::EXACT);
}

/// Scatter-add with updates split (unevenly) on their index dim: every device scatters its
/// part, so the padded updates must add nothing even where the padded indices are in range.
#[test]
fn scatter_add_ignores_padded_updates() {
    let b = Builder::with_mesh(Mesh::new(&[("x", 2)]).unwrap());
    let base = b.param("base", f64t(&[3]));
    let i = split(&b.param("i", Type::new(DType::I32, [1])), 0, "x").unwrap();
    // `i * 0` is 0 in the padding too: an in-range index for the padded update.
    let i = i.mul(0.0);
    let u = split(&b.param("u", f64t(&[1])), 0, "x").unwrap();
    b.output("y", &replicate(&base.scatter_add(&i, &u, 0, 0)).unwrap());
    let p = b.finish();
    let inputs = HashMap::from([
        ("base".to_string(), rand_tensor(&[3], 7)),
        ("i".to_string(), HostTensor::from_i32([1], vec![2])),
        ("u".to_string(), rand_tensor(&[1], 8)),
    ]);
    assert_spmd_matches(&p, &inputs, Tol::F64);
}

// ---- convolution: halo exchange (GShard App. A.4) ----

/// `y = conv(x, w)` with the given annotations (`None`: left to propagation), `loss =
/// sum(y * c)` for a fixed `c`, differentiated with respect to `x` and `w`; checked against
/// the single-device run. Returns the partitioned program's collective kinds.
fn conv_case(
    mesh: &Mesh,
    shapes: (&[usize], &[usize]),
    pads: (&[usize], &[usize]),
    xs: Layout,
    ws: Layout,
    ys: Layout,
) -> Vec<&'static str> {
    conv_program(mesh, shapes, pads, (xs, ws, ys), true)
}

/// A `mesh_split` annotation (axes per dim), or `None` for none.
type Layout<'a> = Option<&'a [&'a [&'a str]]>;

/// [`conv_case`], the backward pass only if `backward`.
fn conv_program(
    mesh: &Mesh,
    (xshape, wshape): (&[usize], &[usize]),
    (lo, hi): (&[usize], &[usize]),
    (xs, ws, ys): (Layout, Layout, Layout),
    backward: bool,
) -> Vec<&'static str> {
    let b = Builder::with_mesh(mesh.clone());
    let annotate = |v: ir::Value, s: Option<&[&[&str]]>| match s {
        Some(s) => mesh_split(&v, s).unwrap(),
        None => v,
    };
    let x = annotate(b.param("x", f64t(xshape)), xs);
    let w = annotate(b.param("w", f64t(wshape)), ws);
    let y = annotate(x.conv(&w, lo, hi), ys);
    let c = b.constant(testkit::fixed_values(y.ty().num_elements(), 9), y.ty());
    b.output("y", &y);
    b.output("loss", &y.mul(&c).sum_all());
    let p = b.finish();
    let p = if backward {
        autodiff::grad(&p, "loss", &["x", "w"]).unwrap()
    } else {
        p
    };
    let inputs = HashMap::from([
        ("x".to_string(), rand_tensor(xshape, 11)),
        ("w".to_string(), rand_tensor(wshape, 12)),
    ]);
    collective_kinds(&assert_spmd_matches(&p, &inputs, Tol::F64))
}

/// Forward and backward of a conv split on its spatial dim over every test mesh's first
/// axis, for SAME, VALID (output tiles shorter than input tiles: per-device windows) and
/// one-sided padding: halos travel by collective-permute, nothing is gathered (all-reduces
/// sum the loss and the kernel gradient). The kernel gradient sums per-device parts only
/// when the output splits evenly (a padded kernel element would meet real values); for
/// VALID over 4 or 8 devices (14 outputs) it gathers, the forward pass still does not.
#[test]
fn conv_split_on_spatial_dim_exchanges_halos_forward_and_backward() {
    testkit::spmd::for_each_mesh(|mesh| {
        let a = mesh.axes[0].name.as_str();
        let d = mesh.axes[0].size;
        let s: &[&[&str]] = &[&[], &[a], &[]];
        let whole: &[&[&str]] = &[&[], &[], &[]];
        let ann = (Some(s), Some(whole), Some(s));
        for (k, lo, hi) in [(3, 1, 1), (3, 0, 0), (3, 2, 0), (2, 0, 1), (1, 0, 0)] {
            let case = |backward| {
                conv_program(
                    mesh,
                    (&[2, 16, 3], &[k, 3, 4]),
                    (&[lo], &[hi]),
                    ann,
                    backward,
                )
            };
            let fwd = case(false);
            let permutes =
                |kinds: &[&str]| kinds.iter().filter(|&&c| c == "collective_permute").count();
            assert!(
                !fwd.contains(&"all_gather"),
                "k={k} pad=({lo},{hi}): {fwd:?}"
            );
            let kinds = case(true);
            if (lo + 16 + hi + 1 - k) % d == 0 {
                assert!(
                    !kinds.contains(&"all_gather"),
                    "k={k} pad=({lo},{hi}): {kinds:?}"
                );
            }
            if d > 1 {
                // At most one halo per side for y, for dx and for dw (SAME: exactly that).
                assert!(permutes(&fwd) <= 2 && permutes(&kinds) <= 6, "{kinds:?}");
                if (k, lo, hi) == (3, 1, 1) {
                    assert_eq!(permutes(&kinds), 6, "{kinds:?}");
                }
            }
        }
    });
}

/// Uneven tiles (13 over 2, 4 or 8): the padding is zeroed before the halos move, so it reads
/// as the conv's zero padding; propagation alone places the output. Forward and the input
/// gradient exchange halos; the kernel gradient (13 outputs, not a whole number of tiles)
/// gathers.
#[test]
fn conv_with_uneven_spatial_tiles() {
    testkit::spmd::for_each_mesh(|mesh| {
        let a = mesh.axes[0].name.as_str();
        let s: &[&[&str]] = &[&[], &[a], &[]];
        let case = |backward| {
            conv_program(
                mesh,
                (&[1, 13, 2], &[3, 2, 3]),
                (&[1], &[1]),
                (Some(s), None, None),
                backward,
            )
        };
        let fwd = case(false);
        assert!(!fwd.contains(&"all_gather"), "{fwd:?}");
        let kinds = case(true);
        let permutes = kinds.iter().filter(|&&c| c == "collective_permute").count();
        if mesh.axes[0].size > 1 {
            assert!(permutes >= 4, "{kinds:?}");
        }
    });
}

/// Both spatial dims split (H over `a`, W over `b`): halos along W carry the H halos too, so
/// the corners arrive with no extra exchange.
#[test]
fn conv_2d_split_on_both_spatial_dims() {
    for mesh in [
        Mesh::new(&[("a", 2), ("b", 2)]).unwrap(),
        Mesh::new(&[("a", 2), ("b", 4)]).unwrap(),
    ] {
        let s: &[&[&str]] = &[&[], &["a"], &["b"], &[]];
        let kinds = conv_case(
            &mesh,
            (&[2, 8, 8, 2], &[3, 3, 2, 3]),
            (&[1, 1], &[1, 1]),
            Some(s),
            Some(&[&[], &[], &[], &[]]),
            Some(s),
        );
        assert!(!kinds.contains(&"all_gather"), "{mesh}: {kinds:?}");
        let permutes = kinds.iter().filter(|&&c| c == "collective_permute").count();
        assert_eq!(permutes, 12, "{mesh}: {kinds:?}");
    }
}

/// Batch and output-feature splits need no communication in the forward pass; a split
/// input-feature dim is a partial sum, all-reduced like a dot's contracting dim.
#[test]
fn conv_batch_feature_and_input_feature_splits() {
    let mesh = Mesh::new(&[("a", 2), ("b", 2)]).unwrap();
    let kinds = conv_case(
        &mesh,
        (&[4, 6, 3], &[3, 3, 4]),
        (&[1], &[1]),
        Some(&[&["a"], &[], &[]]),
        Some(&[&[], &[], &["b"]]),
        Some(&[&["a"], &[], &["b"]]),
    );
    assert!(!kinds.contains(&"all_gather"), "{kinds:?}");
    let mesh = Mesh::new(&[("x", 4)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = mesh_split(&b.param("x", f64t(&[2, 6, 8])), &[&[], &[], &["x"]]).unwrap();
    let w = mesh_split(&b.param("w", f64t(&[3, 8, 2])), &[&[], &["x"], &[]]).unwrap();
    b.output("y", &replicate(&x.conv(&w, &[1], &[1])).unwrap());
    let inputs = HashMap::from([
        ("x".to_string(), rand_tensor(&[2, 6, 8], 13)),
        ("w".to_string(), rand_tensor(&[3, 8, 2], 14)),
    ]);
    let part = assert_spmd_matches(&b.finish(), &inputs, Tol::F64);
    assert_eq!(collective_kinds(&part), ["all_reduce"]);
}

/// A halo longer than a tile (a 5-wide SAME kernel over tiles of 1 or 2, padding 3 over
/// tiles of 1) falls back to gathering the spatial dim: still correct.
#[test]
fn conv_halo_larger_than_a_tile_falls_back_to_gathering() {
    testkit::spmd::for_each_mesh(|mesh| {
        let a = mesh.axes[0].name.as_str();
        let s: &[&[&str]] = &[&[], &[a], &[]];
        conv_case(
            mesh,
            (&[1, 8, 2], &[5, 2, 2]),
            (&[2], &[2]),
            Some(s),
            None,
            Some(s),
        );
        conv_case(
            mesh,
            (&[1, 8, 2], &[2, 2, 2]),
            (&[3], &[1]),
            Some(s),
            None,
            Some(s),
        );
        // Padding beyond the kernel's reach: dx slices the output gradient first.
        conv_case(
            mesh,
            (&[2, 16, 3], &[3, 3, 4]),
            (&[3], &[3]),
            Some(s),
            None,
            None,
        );
    });
}

/// Reverse of an evenly split dim: every device flips its tile and one collective-permute
/// mirrors the tiles; an uneven split is gathered first.
#[test]
fn reverse_moves_mirrored_tiles_with_one_permute() {
    testkit::spmd::for_each_mesh(|mesh| {
        let axes: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
        let b = Builder::with_mesh(mesh.clone());
        let x = mesh_split(&b.param("x", f64t(&[8, 8])), &[&[axes[0]], &axes[1..]]).unwrap();
        let y = mesh_split(&x.reverse(&[0, 1]), &[&[axes[0]], &axes[1..]]).unwrap();
        let u = split(&b.param("u", f64t(&[5])), 0, axes[0]).unwrap();
        b.output("y", &y);
        b.output("u", &u.reverse(&[0]));
        let inputs = HashMap::from([
            ("x".to_string(), rand_tensor(&[8, 8], 15)),
            ("u".to_string(), rand_tensor(&[5], 16)),
        ]);
        let part = assert_spmd_matches(&b.finish(), &inputs, Tol::EXACT);
        if mesh.num_devices() > 1 {
            let kinds = collective_kinds(&part);
            assert_eq!(kinds[0], "collective_permute", "{kinds:?}");
        }
    });
}

// ---- reshards that only move whole tiles ----

/// Between any two layouts that cut every dim into the same number of tiles, the reshard is
/// one collective-permute (none where every device already holds its tile), on meshes with
/// three axes and with replicated axes on either side; uneven dims (5, 7) move whole too.
#[test]
fn reshard_between_equal_tile_counts_is_one_permute() {
    let mesh = Mesh::new(&[("a", 2), ("b", 2), ("c", 2)]).unwrap();
    let classes: [&[&[&[&str]]]; 3] = [
        &[&[&["a"], &[]], &[&["b"], &[]], &[&["c"], &[]]],
        &[
            &[&["a", "b"], &[]],
            &[&["b", "a"], &[]],
            &[&["c", "a"], &[]],
        ],
        &[
            &[&["a"], &["b"]],
            &[&["b"], &["a"]],
            &[&["c"], &["a"]],
            &[&["a"], &["c"]],
        ],
    ];
    for class in classes {
        for from in class {
            for to in class {
                for shape in [[8, 4], [5, 7]] {
                    let b = Builder::with_mesh(mesh.clone());
                    let x = mesh_split(&b.param("x", f64t(&shape)), from).unwrap();
                    let y = mesh_split(&x.copy(), to).unwrap();
                    b.output("y", &y.mul(1.0));
                    let inputs = HashMap::from([("x".to_string(), rand_tensor(&shape, 17))]);
                    let part = assert_spmd_matches(&b.finish(), &inputs, Tol::EXACT);
                    let kinds = collective_kinds(&part);
                    let want: &[&str] = if from == to {
                        &[]
                    } else {
                        &["collective_permute"]
                    };
                    assert_eq!(kinds, want, "{from:?} -> {to:?}");
                }
            }
        }
    }
}
