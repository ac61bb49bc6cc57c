//! `runtime::run` errors: missing and mistyped inputs, malformed tensors, programs that do
//! not verify. Each message must name the parameter or instruction and what was expected.

mod common;

use common::inputs;
use ir::{Builder, DType, Instr, Op, Program, Type, UnaryOp};
use runtime::{run, Data, HostTensor, RuntimeError};
use std::collections::HashMap;

fn add_one() -> Program {
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F32, vec![2, 3]));
    b.output("y", &x.add(1.0));
    b.finish()
}

#[test]
fn missing_input_names_parameter_and_type() {
    let e = run(&add_one(), &HashMap::new()).unwrap_err();
    assert!(
        matches!(&e, RuntimeError::MissingInput { name, device: None, .. } if name == "x"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("`x`") && msg.contains("f32[2,3]"), "{msg}");
}

#[test]
fn type_mismatch_names_expected_and_given() {
    let ins = inputs(vec![("x", HostTensor::from_f32(vec![3, 2], vec![0.0; 6]))]);
    let e = run(&add_one(), &ins).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, RuntimeError::InputTypeMismatch { .. }));
    assert!(
        msg.contains("`x`") && msg.contains("f32[2,3]") && msg.contains("f32[3,2]"),
        "{msg}"
    );
    let ins = inputs(vec![("x", HostTensor::from_i32(vec![2, 3], vec![0; 6]))]);
    let msg = run(&add_one(), &ins).unwrap_err().to_string();
    assert!(msg.contains("i32[2,3]"), "{msg}");
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let bad = HostTensor {
        ty: Type::new(DType::F32, vec![2, 3]),
        data: Data::F32(vec![1.0; 5]),
    };
    let e = run(&add_one(), &inputs(vec![("x", bad)])).unwrap_err();
    assert!(matches!(e, RuntimeError::MalformedInput { .. }), "{e}");
    assert!(e.to_string().contains("6 elements"), "{e}");
}

#[test]
fn extra_inputs_are_ignored() {
    let ins = inputs(vec![
        ("x", HostTensor::from_f32(vec![2, 3], vec![1.0; 6])),
        ("unused", HostTensor::scalar_i32(3)),
    ]);
    let r = run(&add_one(), &ins).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r["y"].to_f64_vec(), vec![2.0; 6]);
}

#[test]
fn every_named_output_is_returned() {
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F32, vec![1]));
    b.output("a", &x);
    b.output("b", &x.neg());
    b.output("c", &x);
    let p = b.finish();
    let r = run(
        &p,
        &inputs(vec![("x", HostTensor::from_f32(vec![1], vec![2.0]))]),
    )
    .unwrap();
    let mut names: Vec<_> = r.keys().cloned().collect();
    names.sort();
    assert_eq!(names, vec!["a", "b", "c"]);
    assert_eq!(r["b"].to_f64_vec(), vec![-2.0]);
}

#[test]
fn verify_failure_is_wrapped() {
    let mut p = Program::new();
    let x = p.push(Instr {
        op: Op::Parameter { name: "x".into() },
        operands: vec![],
        ty: Type::new(DType::I32, vec![2]),
        sharding: None,
        scope: ir::ScopeId::ROOT,
    });
    // exp is float-only.
    let y = p.push(Instr {
        op: Op::Unary(UnaryOp::Exp),
        operands: vec![x],
        ty: Type::new(DType::I32, vec![2]),
        sharding: None,
        scope: ir::ScopeId::ROOT,
    });
    p.outputs.push(("y".into(), y));
    let e = run(
        &p,
        &inputs(vec![("x", HostTensor::from_i32(vec![2], vec![1, 2]))]),
    )
    .unwrap_err();
    assert!(matches!(e, RuntimeError::Verify(_)), "{e}");
    assert!(e.to_string().contains("exp"), "{e}");
}

#[test]
fn dead_values_do_not_disturb_results() {
    // Values are freed after their last use; a value used late must survive.
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F32, vec![2]));
    let a = x.exp();
    let mut c = x.clone();
    for _ in 0..5 {
        c = c.add(1.0);
    }
    let _unused = x.mul(3.0);
    b.output("y", &a.add(&c));
    let p = b.finish();
    let r = run(
        &p,
        &inputs(vec![("x", HostTensor::from_f32(vec![2], vec![0.0, 1.0]))]),
    )
    .unwrap();
    let want = [1.0f32 + 5.0, std::f32::consts::E + 6.0];
    assert_eq!(r["y"].as_f32().unwrap(), &want);
}
