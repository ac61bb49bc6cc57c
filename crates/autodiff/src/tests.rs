//! Unit tests that inspect the emitted IR (structure, errors, dead-code freedom). Numerical
//! checks against finite differences live in `tests/grads/`.

use super::*;
use ir::{DType, Literal, Mesh, ReduceOp};

fn f64s(shape: &[usize]) -> Type {
    Type::new(DType::F64, shape)
}

/// The op names of the appended backward instructions.
fn tail_ops(before: &Program, after: &Program) -> Vec<&'static str> {
    after.instrs[before.len()..]
        .iter()
        .map(|i| i.op.name())
        .collect()
}

fn checked_grad(p: &Program, loss: &str, wrt: &[&str]) -> Program {
    let g = grad(p, loss, wrt).unwrap();
    if let Err(e) = ir::verify(&g) {
        panic!("gradient program does not verify: {e}");
    }
    g
}

#[test]
fn forward_is_kept_and_grad_outputs_are_appended() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[3]));
    let w = b.param("w", f64s(&[3]));
    let y = x.mul(&w);
    b.output("y", &y);
    b.output("loss", &y.sum_all());
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["x", "w"]);
    assert_eq!(g.instrs[..p.len()], p.instrs[..]);
    let names: Vec<&str> = g.outputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["y", "loss", "grad_x", "grad_w"]);
    assert_eq!(g.ty(g.output("grad_w").unwrap()), &f64s(&[3]));
    assert!(g.instrs[p.len()..].iter().all(|i| i.sharding.is_none()));
}

#[test]
fn unused_parameter_gets_zeros() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[2, 2]));
    let w = b.param("w", f64s(&[4]));
    b.output("w_out", &w.exp());
    b.output("loss", &x.sum_all());
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["w"]);
    let gw = g.instr(g.output("grad_w").unwrap());
    assert_eq!(
        gw.op,
        Op::Constant {
            value: Literal::Splat(0.0)
        }
    );
    assert_eq!(gw.ty, f64s(&[4]));
    assert_eq!(tail_ops(&p, &g), ["constant"]);
}

#[test]
fn no_backward_code_for_values_off_the_wrt_path() {
    // loss = sum(x * c): only x's cotangent is needed, not c's.
    let b = Builder::new();
    let x = b.param("x", f64s(&[3]));
    let c = b.param("c", f64s(&[3]));
    b.output("loss", &x.mul(&c).sum_all());
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["x"]);
    assert_eq!(tail_ops(&p, &g), ["constant", "broadcast", "mul"]);
    let mul = g.instrs.last().unwrap();
    assert_eq!(mul.operands[1], c.id, "grad_x = g * c");
}

#[test]
fn stop_gradient_and_int_casts_block_gradients() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[3]));
    let mask = x.gt(0.0).convert(DType::F64);
    let loss = x.stop_gradient().add(&mask).sum_all();
    b.output("loss", &loss);
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["x"]);
    assert_eq!(tail_ops(&p, &g), ["constant"], "grad_x is just zeros");
}

#[test]
fn shared_uses_accumulate_in_a_fixed_order() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[2]));
    b.output("loss", &x.mul(&x).add(&x).sum_all());
    let p = b.finish();
    let g1 = checked_grad(&p, "loss", &["x"]);
    let g2 = checked_grad(&p, "loss", &["x"]);
    assert_eq!(g1, g2);
    // add's cotangent, then mul's two operand cotangents: two adds.
    let adds = tail_ops(&p, &g1).iter().filter(|&&o| o == "add").count();
    assert_eq!(adds, 2);
}

#[test]
fn loss_that_is_a_parameter_has_gradient_one() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[]));
    b.output("loss", &x);
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["x"]);
    let gx = g.instr(g.output("grad_x").unwrap());
    assert_eq!(
        gx.op,
        Op::Constant {
            value: Literal::Splat(1.0)
        }
    );
}

fn small_program() -> Program {
    let b = Builder::new();
    let x = b.param("x", f64s(&[3]));
    let _i = b.param("i", Type::new(DType::I32, [3]));
    b.output("y", &x.exp());
    b.output("loss", &x.sum_all());
    b.output("n", &b.scalar(1.0, DType::I32));
    b.finish()
}

#[test]
fn error_unknown_loss() {
    let err = grad(&small_program(), "nope", &["x"]).unwrap_err();
    assert!(matches!(err, GradError::UnknownLoss { .. }));
    assert_eq!(
        err.to_string(),
        "loss `nope` is not an output of the program (outputs: y, loss, n); pass the name of a scalar float output"
    );
}

#[test]
fn error_loss_not_scalar() {
    let err = grad(&small_program(), "y", &["x"]).unwrap_err();
    assert!(matches!(err, GradError::LossNotFloatScalar { .. }));
    assert!(err.to_string().contains("has type f64[3]"), "{err}");
}

#[test]
fn error_loss_not_float() {
    let err = grad(&small_program(), "n", &["x"]).unwrap_err();
    assert!(err.to_string().contains("has type i32[]"), "{err}");
}

#[test]
fn error_unknown_param() {
    let err = grad(&small_program(), "loss", &["w"]).unwrap_err();
    assert_eq!(
        err,
        GradError::UnknownParam {
            name: "w".into(),
            params: "x, i".into()
        }
    );
}

#[test]
fn error_param_not_float() {
    let err = grad(&small_program(), "loss", &["i"]).unwrap_err();
    assert!(matches!(err, GradError::ParamNotFloat { .. }));
    assert!(err.to_string().contains("i32[3]"), "{err}");
}

#[test]
fn error_duplicate_wrt_or_taken_output_name() {
    let err = grad(&small_program(), "loss", &["x", "x"]).unwrap_err();
    assert_eq!(
        err,
        GradError::OutputExists {
            name: "grad_x".into()
        }
    );
    let g = grad(&small_program(), "loss", &["x"]).unwrap();
    let err = grad(&g, "loss", &["x"]).unwrap_err();
    assert!(matches!(err, GradError::OutputExists { .. }));
}

/// Build `loss = sum(w * f(x))` over a 4-device mesh and return the backward collective
/// ops (name and op) emitted for `f`.
fn collective_tail(f: impl Fn(&Value) -> Value) -> Vec<Op> {
    let mesh = Mesh::new(&[("a", 2), ("b", 2)]).unwrap();
    let b = Builder::with_mesh(mesh);
    let x = b.param("x", f64s(&[4, 4]));
    let y = f(&x);
    let w = b.param("w", y.ty());
    b.output("loss", &y.mul(&w).sum_all());
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["x"]);
    g.instrs[p.len()..]
        .iter()
        .filter(|i| i.op.is_collective())
        .map(|i| i.op.clone())
        .collect()
}

fn emit(op: Op) -> impl Fn(&Value) -> Value {
    move |x: &Value| x.builder().emit(op.clone(), &[x], None)
}

fn axes(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn collective_transposes() {
    let ar = Op::all_reduce(ReduceOp::Sum, axes(&["a"]));
    assert_eq!(collective_tail(emit(ar.clone())), [ar]);

    let ag = Op::all_gather(1, axes(&["b", "a"]));
    let rs = Op::reduce_scatter(ReduceOp::Sum, 1, axes(&["b", "a"]));
    assert_eq!(collective_tail(emit(ag.clone())), std::slice::from_ref(&rs));
    assert_eq!(collective_tail(emit(rs)), [ag]);

    let a2a = |split_dim, concat_dim| Op::all_to_all(split_dim, concat_dim, axes(&["a", "b"]));
    assert_eq!(collective_tail(emit(a2a(0, 1))), [a2a(1, 0)]);

    let cp = |pairs: &[(usize, usize)]| Op::collective_permute(axes(&["b"]), pairs.to_vec());
    assert_eq!(collective_tail(emit(cp(&[(0, 1)]))), [cp(&[(1, 0)])]);
}

#[test]
fn max_collectives_use_the_chooser_rule() {
    let ar = Op::all_reduce(ReduceOp::Max, axes(&["a"]));
    let sum = Op::all_reduce(ReduceOp::Sum, axes(&["a"]));
    assert_eq!(collective_tail(emit(ar)), [sum.clone(), sum.clone()]);
    let rs = Op::reduce_scatter(ReduceOp::Min, 0, axes(&["a"]));
    let ag = Op::all_gather(0, axes(&["a"]));
    let mut got = collective_tail(emit(rs));
    got.sort_by_key(|o| o.name());
    assert_eq!(got, [ag.clone(), ag, sum]);
}

#[test]
fn backward_instructions_get_the_forward_scope_marked_grad() {
    let b = Builder::new();
    let x = b.param("x", f64s(&[3]));
    let w = b.param("w", f64s(&[3]));
    let y = {
        let _s = b.scope("layer0");
        x.mul(&w).exp()
    };
    let loss = {
        let _s = b.scope("loss");
        y.sum_all()
    };
    b.output("loss", &loss);
    let p = b.finish();
    let g = checked_grad(&p, "loss", &["w"]);
    // The forward keeps its scopes.
    for i in 0..p.len() {
        assert_eq!(g.scope(ValueId(i as u32)), p.scope(ValueId(i as u32)));
    }
    let tail: Vec<(String, bool)> = (p.len()..g.len())
        .map(|i| {
            let s = g.scope(ValueId(i as u32));
            (s.path.clone(), s.grad)
        })
        .collect();
    assert!(tail.iter().all(|(_, grad)| *grad), "{tail:?}");
    assert!(tail.iter().any(|(p, _)| p == "layer0"), "{tail:?}");
    assert!(tail.iter().any(|(p, _)| p == "loss"), "{tail:?}");
    // The gradient of `w` is computed by the backward pass of its user in `layer0`.
    let gw = g.scope(g.output("grad_w").unwrap());
    assert!(gw.grad);
    assert_eq!(gw.path, "layer0");
}
