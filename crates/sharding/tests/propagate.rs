//! Propagation and annotation tests: programs in, shardings out.

use ir::{Builder, DType, Mesh, Sharding, Type};
use sharding::algebra::{merge, reshape, reshape_groups};
use sharding::{mesh_split, propagate, replicate, shard, split, ShardingError};

fn f32t(shape: &[usize]) -> Type {
    Type::new(DType::F32, shape.to_vec())
}

fn sh(dims: &[&[&str]]) -> Sharding {
    Sharding::from_dims(dims)
}

#[test]
fn merge_rules() {
    assert_eq!(
        merge(&sh(&[&["a"], &[]]), &sh(&[&[], &["b"]])),
        Some(sh(&[&["a"], &["b"]]))
    );
    assert_eq!(merge(&sh(&[&["a"], &[]]), &sh(&[&["b"], &[]])), None);
    assert_eq!(
        merge(&sh(&[&["a"], &[]]), &sh(&[&[], &["a"]])),
        None,
        "axis used twice"
    );
}

#[test]
fn reshape_groups_and_sharding() {
    assert_eq!(
        reshape_groups(&[4, 6, 8], &[8, 3, 8]).unwrap(),
        vec![(vec![0, 1], vec![0, 1]), (vec![2], vec![2])]
    );
    assert_eq!(
        reshape_groups(&[1, 4], &[4, 1]).unwrap(),
        vec![(vec![0], vec![]), (vec![1], vec![0]), (vec![], vec![1])]
    );
    let m = Mesh::new(&[("d", 4)]).unwrap();
    // [B,L,M] -> [G,S,M] keeps a B split when both B and G divide by 4.
    let s = reshape(&sh(&[&["d"], &[], &[]]), &[8, 16, 32], &[16, 8, 32], &m);
    assert_eq!(s, sh(&[&["d"], &[], &[]]));
    // G = 2 does not divide by 4: the split is dropped.
    let s = reshape(&sh(&[&["d"], &[], &[]]), &[8, 16, 32], &[2, 64, 32], &m);
    assert_eq!(s, sh(&[&[], &[], &[]]));
    // A split on a minor dim of a merged group cannot move.
    let s = reshape(&sh(&[&[], &["d"]]), &[4, 8], &[32], &m);
    assert_eq!(s, sh(&[&[]]));
    // Merge of a major split: [8,4] split on 0 -> [32] split.
    let s = reshape(&sh(&[&["d"], &[]]), &[8, 4], &[32], &m);
    assert_eq!(s, sh(&[&["d"]]));
}

#[test]
fn data_parallel_mlp_forward_and_backward() {
    let mesh = Mesh::new(&[("data", 4)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = split(&b.param("x", f32t(&[8, 16])), 0, "data").unwrap();
    let w1 = replicate(&b.param("w1", f32t(&[16, 32]))).unwrap();
    let w2 = b.param("w2", f32t(&[32, 4]));
    let h = x.matmul(&w1).relu();
    let y = h.matmul(&w2);
    b.output("y", &y);
    let p = propagate(&b.finish()).unwrap();
    let s = |v: &ir::Value| p.instr(v.id).sharding.clone().unwrap();
    assert_eq!(s(&h), sh(&[&["data"], &[]]));
    assert_eq!(s(&y), sh(&[&["data"], &[]]));
    assert_eq!(s(&w1), sh(&[&[], &[]]), "user annotation kept");
    assert_eq!(s(&w2), sh(&[&[], &[]]), "unreached values end replicated");
    assert!(p.instrs.iter().all(|i| i.sharding.is_some()));
}

#[test]
fn annotation_on_output_propagates_backward() {
    let mesh = Mesh::new(&[("m", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = b.param("x", f32t(&[4, 6]));
    let y = split(&x.exp().transpose(&[1, 0]), 0, "m").unwrap();
    b.output("y", &y);
    let p = propagate(&b.finish()).unwrap();
    assert_eq!(p.instr(x.id).sharding, Some(sh(&[&[], &["m"]])));
}

#[test]
fn gshard_moe_pattern_spec_5_5() {
    let (g, s_, e, c, m, h) = (4, 8, 4, 2, 6, 10);
    let mesh = Mesh::new(&[("expert", 4)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = split(&b.param("x", f32t(&[g, s_, m])), 0, "expert").unwrap();
    let wg = replicate(&b.param("wg", f32t(&[m, e]))).unwrap();
    let wi = split(&b.param("wi", f32t(&[e, m, h])), 0, "expert").unwrap();
    let wo = split(&b.param("wo", f32t(&[e, h, m])), 0, "expert").unwrap();
    let logits = b.einsum("GSM,ME->GSE", &[&x, &wg]);
    let gates = logits.softmax(2);
    // Stand-in for the top-2 gating: combine from the gates and a slot mask; dispatch from combine.
    let mask = b.param("mask", f32t(&[g, s_, e, c]));
    let combine = mask.mul(&gates.reshape(&[g, s_, e, 1]));
    let dispatch = combine.ne(0.0).convert(DType::F32);
    let xin = split(&b.einsum("GSEC,GSM->EGCM", &[&dispatch, &x]), 0, "expert").unwrap();
    let hid = b.einsum("EGCM,EMH->EGCH", &[&xin, &wi]).relu();
    let yout = b.einsum("EGCH,EHM->EGCM", &[&hid, &wo]);
    let y = b.einsum("GSEC,EGCM->GSM", &[&combine, &yout]);
    b.output("y", &y);
    let p = propagate(&b.finish()).unwrap();
    let s = |v: &ir::Value| p.instr(v.id).sharding.clone().unwrap();
    assert_eq!(s(&logits), sh(&[&["expert"], &[], &[]]));
    assert_eq!(s(&gates), sh(&[&["expert"], &[], &[]]));
    assert_eq!(s(&dispatch), sh(&[&["expert"], &[], &[], &[]]));
    assert_eq!(s(&combine), sh(&[&["expert"], &[], &[], &[]]));
    assert_eq!(s(&xin), sh(&[&["expert"], &[], &[], &[]]));
    assert_eq!(s(&hid), sh(&[&["expert"], &[], &[], &[]]));
    assert_eq!(s(&yout), sh(&[&["expert"], &[], &[], &[]]));
    assert_eq!(s(&y), sh(&[&["expert"], &[], &[]]));
}

#[test]
fn two_annotations_in_a_row_insert_a_copy() {
    let mesh = Mesh::new(&[("a", 2), ("b", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = split(&b.param("x", f32t(&[4, 4])), 0, "a").unwrap();
    let y = split(&x, 1, "b").unwrap();
    assert_ne!(x.id, y.id);
    assert_eq!(b.program().instr(y.id).op.name(), "copy");
    let z = mesh_split(&y, &[&["a"], &["b"]]).unwrap();
    assert_ne!(z.id, y.id);
}

#[test]
fn bad_annotations_are_clear_errors() {
    let mesh = Mesh::new(&[("data", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = b.param("x", f32t(&[4, 4]));
    let e = split(&x, 0, "model").unwrap_err();
    assert!(e.to_string().contains("`model`"), "{e}");
    let e = mesh_split(&x, &[&["data"], &["data"]]).unwrap_err();
    assert!(e.to_string().contains("used twice"), "{e}");
    let e = mesh_split(&x, &[&["data"]]).unwrap_err();
    assert!(e.to_string().contains("rank 2"), "{e}");
    assert!(matches!(
        split(&x, 5, "data"),
        Err(ShardingError::DimOutOfRange { .. })
    ));
    let nomesh = Builder::new();
    let y = nomesh.param("y", f32t(&[2]));
    assert!(matches!(replicate(&y), Err(ShardingError::NoMesh { .. })));
}

#[test]
fn shard_with_device_assignment() {
    let mesh = Mesh::new(&[("x", 2), ("y", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let t = b.param("t", f32t(&[4, 8]));
    // Pieces [2,2] held by devices 0,1,2,3 = mesh_split(t, [x, y]).
    let a = shard(&t, &[2, 2], &[0, 1, 2, 3]).unwrap();
    assert_eq!(a.sharding(), Some(sh(&[&["x"], &["y"]])));
    // Devices 0,2,1,3: dim 0 over y, dim 1 over x.
    let t2 = b.param("t2", f32t(&[4, 8]));
    let a2 = shard(&t2, &[2, 2], &[0, 2, 1, 3]).unwrap();
    assert_eq!(a2.sharding(), Some(sh(&[&["y"], &["x"]])));
    // Split dim 1 four ways over (x,y).
    let t3 = b.param("t3", f32t(&[4, 8]));
    let a3 = shard(&t3, &[1, 4], &[0, 1, 2, 3]).unwrap();
    assert_eq!(a3.sharding(), Some(sh(&[&[], &["x", "y"]])));
    let t4 = b.param("t4", f32t(&[4, 8]));
    assert!(matches!(
        shard(&t4, &[2, 2], &[0, 3, 1, 2]),
        Err(ShardingError::AssignmentNotOnMesh { .. })
    ));
}

#[test]
fn conv_passes_batch_and_spatial_from_the_lhs_and_output_features_from_the_kernel() {
    let mesh = Mesh::new(&[("a", 2), ("b", 2), ("c", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = mesh_split(&b.param("x", f32t(&[4, 16, 3])), &[&["a"], &["b"], &[]]).unwrap();
    let w = mesh_split(&b.param("w", f32t(&[3, 3, 8])), &[&[], &[], &["c"]]).unwrap();
    let y = x.conv(&w, &[1], &[1]);
    // Backward: an annotated result gives the lhs its batch and spatial layout, and the
    // kernel its output features; input features and the window stay whole.
    let u = b.param("u", f32t(&[4, 16, 3]));
    let v = b.param("v", f32t(&[3, 3, 8]));
    let z = mesh_split(&u.conv(&v, &[1], &[1]), &[&["b"], &["a"], &["c"]]).unwrap();
    // A kernel split on the window (a kernel gradient): that output dim is summed, not kept.
    let k = mesh_split(&b.param("k", f32t(&[16, 4, 2])), &[&["b"], &[], &[]]).unwrap();
    let g = x.transpose(&[2, 1, 0]).conv(&k, &[1], &[1]);
    b.output("y", &y);
    b.output("z", &z);
    b.output("g", &g);
    let p = propagate(&b.finish()).unwrap();
    let s = |v: &ir::Value| p.instr(v.id).sharding.clone().unwrap();
    assert_eq!(s(&y), sh(&[&["a"], &["b"], &["c"]]));
    assert_eq!(s(&u), sh(&[&["b"], &["a"], &[]]));
    assert_eq!(s(&v), sh(&[&[], &[], &["c"]]));
    assert_eq!(s(&g), sh(&[&[], &[], &[]]));
}

#[test]
fn reverse_keeps_the_layout_both_ways() {
    let mesh = Mesh::new(&[("m", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = b.param("x", f32t(&[4, 6]));
    let y = split(&x.reverse(&[0]), 0, "m").unwrap();
    let z = y.reverse(&[1]);
    b.output("z", &z);
    let p = propagate(&b.finish()).unwrap();
    assert_eq!(p.instr(x.id).sharding, Some(sh(&[&["m"], &[]])));
    assert_eq!(p.instr(z.id).sharding, Some(sh(&[&["m"], &[]])));
}
