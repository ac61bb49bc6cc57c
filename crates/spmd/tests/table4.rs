//! GShard Table 4 (Lepikhin et al. 2020, arXiv 2006.16668) as golden IR text: which
//! collectives each sharded op needs. Regenerate the snapshots with
//! `UPDATE_EXPECT=1 cargo test -p spmd --test table4`.

use expect_test::{expect, Expect};
use ir::{Builder, DType, Mesh, Type};
use sharding::{replicate, split};

fn f32t(shape: &[usize]) -> Type {
    Type::new(DType::F32, shape.to_vec())
}

fn check(b: Builder, want: Expect) -> spmd::Partitioned {
    let part = spmd::compile(&b.finish()).unwrap();
    want.assert_eq(&ir::text::print(&part.program));
    part
}

fn kinds(part: &spmd::Partitioned) -> Vec<&'static str> {
    spmd::report::collectives(&part.program)
        .iter()
        .map(|c| c.kind)
        .collect()
}

fn mesh() -> Builder {
    Builder::with_mesh(Mesh::new(&[("d", 4)]).unwrap())
}

#[test]
fn add_split_on_a_needs_no_collective() {
    let b = mesh();
    let x = split(&b.param("x", f32t(&[8])), 0, "d").unwrap();
    let y = split(&b.param("y", f32t(&[8])), 0, "d").unwrap();
    b.output("z", &x.add(&y));
    let part = check(
        b,
        expect![[r#"
            mesh [d=4]
            %0 = f32[2] parameter("x")
            %1 = f32[2] parameter("y")
            %2 = f32[2] add(%0, %1)
            output "z" = %2
        "#]],
    );
    assert!(kinds(&part).is_empty());
}

#[test]
fn matmul_split_on_contracting_dim_is_one_all_reduce() {
    let b = mesh();
    let x = split(&b.param("x", f32t(&[2, 8])), 1, "d").unwrap();
    let w = split(&b.param("w", f32t(&[8, 3])), 0, "d").unwrap();
    let y = replicate(&x.matmul(&w)).unwrap();
    b.output("y", &y);
    let part = check(
        b,
        expect![[r#"
            mesh [d=4]
            %0 = f32[2,2] parameter("x")
            %1 = f32[2,3] parameter("w")
            %2 = f32[2,3] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]
            %3 = f32[2,3] all_reduce(%2) op=sum axes=[d]
            output "y" = %3
        "#]],
    );
    assert_eq!(kinds(&part), ["all_reduce"]);
}

#[test]
fn matmul_split_on_a_needs_no_collective() {
    let b = mesh();
    let x = split(&b.param("x", f32t(&[8, 5])), 0, "d").unwrap();
    let w = replicate(&b.param("w", f32t(&[5, 3]))).unwrap();
    b.output("y", &x.matmul(&w));
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,5] parameter("x")
        %1 = f32[5,3] parameter("w")
        %2 = f32[2,3] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]
        output "y" = %2
    "#]],
    );
    assert!(kinds(&part).is_empty());
}

#[test]
fn matmul_with_mismatched_operands_gathers() {
    // AB split on A and BC split on C (the other operand's free dim): O(D) all-gather.
    let b = mesh();
    let x = split(&b.param("x", f32t(&[8, 5])), 0, "d").unwrap();
    let w = split(&b.param("w", f32t(&[5, 8])), 1, "d").unwrap();
    let y = split(&x.matmul(&w), 0, "d").unwrap();
    b.output("y", &y);
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,5] parameter("x")
        %1 = f32[5,2] parameter("w")
        %2 = f32[5,8] all_gather(%1) dim=1 axes=[d]
        %3 = f32[2,8] dot_general(%0, %2) lhs_contract=[1] rhs_contract=[0]
        output "y" = %3
    "#]],
    );
    assert_eq!(kinds(&part), ["all_gather"]);
}

#[test]
fn reduce_over_unsplit_dim_needs_no_collective() {
    let b = mesh();
    let x = split(&b.param("x", f32t(&[8, 5])), 0, "d").unwrap();
    b.output("y", &x.sum(&[1]));
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,5] parameter("x")
        %1 = f32[2] reduce(%0) op=sum dims=[1]
        output "y" = %1
    "#]],
    );
    assert!(kinds(&part).is_empty());
}

#[test]
fn reduce_over_split_dim_is_one_all_reduce() {
    let b = mesh();
    let x = split(&b.param("x", f32t(&[8, 5])), 0, "d").unwrap();
    b.output("y", &x.sum(&[0]));
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,5] parameter("x")
        %1 = f32[5] reduce(%0) op=sum dims=[0]
        %2 = f32[5] all_reduce(%1) op=sum axes=[d]
        output "y" = %2
    "#]],
    );
    assert_eq!(kinds(&part), ["all_reduce"]);
}

#[test]
fn moe_dispatch_einsum_g_split_to_e_split_is_one_all_to_all() {
    let (g, s, e, c, m) = (8, 4, 8, 2, 6);
    let b = mesh();
    let dispatch = split(&b.param("dispatch", f32t(&[g, s, e, c])), 0, "d").unwrap();
    let x = split(&b.param("x", f32t(&[g, s, m])), 0, "d").unwrap();
    let xin = split(&b.einsum("GSEC,GSM->EGCM", &[&dispatch, &x]), 0, "d").unwrap();
    b.output("xin", &xin);
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,4,8,2] parameter("dispatch")
        %1 = f32[2,4,6] parameter("x")
        %2 = f32[2,8,2,6] dot_general(%0, %1) lhs_batch=[0] rhs_batch=[0] lhs_contract=[1] rhs_contract=[1]
        %3 = f32[8,2,2,6] all_to_all(%2) split_dim=1 concat_dim=0 axes=[d]
        %4 = f32[2,8,2,6] transpose(%3) perm=[1, 0, 2, 3]
        output "xin" = %4
    "#]],
    );
    assert_eq!(kinds(&part), ["all_to_all"]);
    let c0 = &spmd::report::collectives(&part.program)[0];
    // Per device: the local [E, G/D, C, M] expert buffer, (D-1)/D of it sent.
    assert_eq!(c0.bytes, e * (g / 4) * c * m * 4 * 3 / 4);
}

#[test]
fn convolution_split_on_spatial_x_is_two_collective_permutes() {
    // [N, X, Cin] split on X, a 3-wide kernel with SAME padding: every device needs one
    // element from each neighbour (O(1) halo), not the whole X.
    let b = mesh();
    let x = split(&b.param("x", f32t(&[2, 16, 3])), 1, "d").unwrap();
    let w = replicate(&b.param("w", f32t(&[3, 3, 5]))).unwrap();
    let y = split(&x.conv(&w, &[1], &[1]), 1, "d").unwrap();
    b.output("y", &y);
    let part = check(
        b,
        expect![[r#"
        mesh [d=4]
        %0 = f32[2,4,3] parameter("x")
        %1 = f32[3,3,5] parameter("w")
        %2 = f32[2,1,3] slice(%0) start=[0, 3, 0] limit=[2, 4, 3]
        %3 = f32[2,1,3] collective_permute(%2) axes=[d] pairs=[(0,1), (1,2), (2,3)]
        %4 = f32[2,1,3] slice(%0) start=[0, 0, 0] limit=[2, 1, 3]
        %5 = f32[2,1,3] collective_permute(%4) axes=[d] pairs=[(1,0), (2,1), (3,2)]
        %6 = f32[2,6,3] concatenate(%3, %0, %5) dim=1
        %7 = f32[2,4,5] conv(%6, %1) pad_lo=[0] pad_hi=[0]
        output "y" = %7
    "#]],
    );
    assert_eq!(kinds(&part), ["collective_permute", "collective_permute"]);
    let cps = spmd::report::collectives(&part.program);
    // Per device: one [2, 1, 3] f32 halo each way.
    assert!(cps.iter().all(|c| c.bytes == 2 * 3 * 4), "{cps:?}");
}

#[test]
fn reshard_that_moves_whole_tiles_is_one_collective_permute() {
    // Dim 0 split over `a`, then over `b` (|a| = |b|): every device already holds a whole
    // tile of the target, just not its own; one permute, not all-gather + slice.
    let b = Builder::with_mesh(Mesh::new(&[("a", 2), ("b", 2)]).unwrap());
    let x = sharding::mesh_split(&b.param("x", f32t(&[8, 3])), &[&["a"], &[]]).unwrap();
    let y = sharding::mesh_split(&x.mul(2.0), &[&["b"], &[]]).unwrap();
    b.output("y", &y.exp());
    let part = check(
        b,
        expect![[r#"
        mesh [a=2, b=2]
        %0 = f32[4,3] parameter("x")
        %1 = f32[4,3] constant(2.0)
        %2 = f32[4,3] collective_permute(%0) axes=[a, b] pairs=[(0,0), (2,1), (1,2), (3,3)]
        %3 = f32[4,3] mul(%2, %1)
        %4 = f32[4,3] exp(%3)
        output "y" = %4
    "#]],
    );
    assert_eq!(kinds(&part), ["collective_permute"]);
}
