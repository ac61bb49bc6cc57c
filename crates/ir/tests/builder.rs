//! Builder, shape inference and einsum lowering: the IR that model code produces.

use ir::{verify, Builder, DType, DotDims, Op, Type};

fn f32t(shape: &[usize]) -> Type {
    Type::new(DType::F32, shape.to_vec())
}

#[test]
fn mlp_builds_and_verifies() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[4, 8]));
    let w1 = b.param("w1", f32t(&[8, 16]));
    let w2 = b.param("w2", f32t(&[16, 2]));
    let y = x.matmul(&w1).relu().matmul(&w2);
    assert_eq!(y.shape(), vec![4, 2]);
    let loss = (&y * &y).mean_all();
    b.output("loss", &loss);
    let p = b.finish();
    verify(&p).unwrap();
    assert_eq!(p.params().len(), 3);
}

#[test]
fn numpy_broadcasting_inserts_reshape_and_broadcast() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 3, 4]));
    let s = b.param("s", f32t(&[3, 1]));
    let y = &x * &s;
    assert_eq!(y.shape(), vec![2, 3, 4]);
    let p = b.finish();
    let ops: Vec<&str> = p.instrs.iter().map(|i| i.op.name()).collect();
    assert_eq!(
        ops,
        ["parameter", "parameter", "reshape", "broadcast", "mul"]
    );
    match &p.instrs[3].op {
        Op::Broadcast { dims } => assert_eq!(dims, &vec![1]),
        other => panic!("expected broadcast, got {other:?}"),
    }
}

#[test]
fn einsum_moe_dispatch_lowers_to_dot_general_and_transpose() {
    let b = Builder::new();
    let dispatch = b.param("dispatch", f32t(&[2, 8, 4, 3])); // GSEC
    let x = b.param("x", f32t(&[2, 8, 5])); // GSM
    let xin = b.einsum("GSEC,GSM->EGCM", &[&dispatch, &x]);
    assert_eq!(xin.shape(), vec![4, 2, 3, 5]);
    let p = b.finish();
    let dot = p.instrs.iter().find_map(|i| match &i.op {
        Op::DotGeneral(d) => Some((d.clone(), i.ty.clone())),
        _ => None,
    });
    let (dd, ty) = dot.expect("a dot_general");
    assert_eq!(
        dd,
        DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![1],
            rhs_contract: vec![1]
        }
    );
    // dot result: G, E, C (lhs free), M (rhs free) -> transpose to EGCM
    assert_eq!(ty.shape, vec![2, 4, 3, 5]);
    assert!(matches!(p.instrs.last().unwrap().op, Op::Transpose { .. }));
}

#[test]
fn einsum_sums_letters_only_in_one_operand() {
    let b = Builder::new();
    let a = b.param("a", f32t(&[3, 4]));
    let v = b.einsum("ij->j", &[&a]);
    assert_eq!(v.shape(), vec![4]);
    let c = b.param("c", f32t(&[4, 5]));
    let w = b.einsum("ij,kl->jl", &[&a, &c]);
    assert_eq!(w.shape(), vec![4, 5]);
}

#[test]
#[allow(clippy::redundant_clone)]
fn shape_errors_name_op_and_shapes() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[4, 8]));
    let w = b.param("w", f32t(&[7, 16]));
    let err = b
        .try_emit(
            Op::DotGeneral(DotDims {
                lhs_contract: vec![1],
                rhs_contract: vec![0],
                ..Default::default()
            }),
            &[&x, &w],
            None,
        )
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("dot_general"), "{msg}");
    assert!(
        msg.contains("f32[4,8]") && msg.contains("f32[7,16]"),
        "{msg}"
    );
    assert!(msg.contains("differ in size"), "{msg}");
}

#[test]
fn verify_rejects_use_before_def() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2]));
    let _ = x.exp();
    let mut p = b.finish();
    p.instrs[1].operands[0] = ir::ValueId(1);
    let e = verify(&p).unwrap_err();
    assert!(e.msg.contains("does not precede"), "{e}");
}

#[test]
fn verify_rejects_duplicate_parameter_names() {
    let b = Builder::new();
    b.param("x", f32t(&[2]));
    b.param("x", f32t(&[2]));
    let e = verify(&b.program()).unwrap_err();
    assert!(e.msg.contains("used twice"), "{e}");
}

#[test]
fn top_k_and_one_hot_types() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[3, 5]));
    let (v, i) = x.top_k(2);
    assert_eq!(v.ty(), f32t(&[3, 2]));
    assert_eq!(i.ty(), Type::new(DType::I32, vec![3, 2]));
    let oh = i.one_hot(5, DType::F32);
    assert_eq!(oh.shape(), vec![3, 2, 5]);
    verify(&b.finish()).unwrap();
}

#[test]
fn rng_streams_are_distinct() {
    let b = Builder::new();
    let seed = b.param("seed", Type::scalar(DType::I32));
    let a = b.rng(ir::RngDist::Uniform, &seed, f32t(&[2]));
    let c = b.rng(ir::RngDist::Normal, &seed, f32t(&[2]));
    let p = b.finish();
    let stream = |v: &ir::Value| match &p.instr(v.id).op {
        Op::Rng { stream, .. } => *stream,
        other => panic!("{other:?}"),
    };
    assert_ne!(stream(&a), stream(&c));
}

#[test]
fn conv_same_keeps_spatial_sizes_and_reverse_keeps_the_type() {
    let b = Builder::new();
    let x = b.param("x", f32t(&[2, 7, 5, 3]));
    let w = b.param("w", f32t(&[4, 1, 3, 6]));
    let y = x.conv_same(&w);
    assert_eq!(y.shape(), vec![2, 7, 5, 6]);
    assert_eq!(
        b.program().instr(y.id).op,
        Op::Conv {
            pad_lo: vec![1, 0],
            pad_hi: vec![2, 0]
        }
    );
    assert_eq!(w.reverse(&[0, 1]).ty(), w.ty());
    assert_eq!(w.reverse(&[]).id, w.id, "reversing no dims is the identity");
}
