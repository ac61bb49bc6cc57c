//! Unit tests of the remat pass on small programs: what each policy keeps and recomputes,
//! where the clones go, that they compute the same gradients (reference interpreter, bit
//! for bit), that the regions the model code marks are recomputed as `scopes:` recomputes
//! their paths, and that bad policies are one-line errors.

use super::*;
use crate::grad;
use ir::{Builder, DType, RngDist, Type};
use runtime::HostTensor;
use std::collections::HashMap;

fn f64s(shape: &[usize]) -> Type {
    Type::new(DType::F64, shape)
}

/// Two layers `x + f(x w_l) * noise` (`f(a) = tanh(a) sin(tanh(a))`, random noise), then a
/// loss outside the layers.
fn two_layers() -> Program {
    layers_marking(false)
}

/// [`two_layers`], its `ffn` scopes marked as checkpoint regions when `marked`.
fn layers_marking(marked: bool) -> Program {
    let b = Builder::new();
    let mut x = b.param("x", f64s(&[3, 4]));
    let seed = b.param("seed", Type::new(DType::I32, []));
    for l in 0..2 {
        let _s = b.scope(&format!("enc/layer{l}"));
        let w = b.param(&format!("w{l}"), f64s(&[4, 4]));
        let h = {
            let _f = if marked {
                b.checkpoint_scope("ffn")
            } else {
                b.scope("ffn")
            };
            let a = x.matmul(&w).tanh();
            a.mul(&a.sin())
        };
        let noise = b.rng(RngDist::Uniform, &seed, f64s(&[3, 4]));
        x = h.mul(&noise).add(&x);
    }
    let _s = b.scope("loss");
    b.output("loss", &x.mul(&x).sum_all());
    b.finish()
}

fn with_grads() -> Program {
    grad(&two_layers(), "loss", &["x", "w0", "w1"]).unwrap()
}

fn inputs() -> HashMap<String, HostTensor> {
    let vals = |n: usize, k: f64| (0..n).map(|i| ((i as f64 + k) * 0.37).sin()).collect();
    HashMap::from([
        (
            "x".to_string(),
            HostTensor::from_f64(vec![3, 4], vals(12, 1.0)),
        ),
        (
            "w0".to_string(),
            HostTensor::from_f64(vec![4, 4], vals(16, 2.0)),
        ),
        (
            "w1".to_string(),
            HostTensor::from_f64(vec![4, 4], vals(16, 3.0)),
        ),
        ("seed".to_string(), HostTensor::scalar_i32(5)),
    ])
}

fn bits(t: &HostTensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn every_policy_gives_the_same_gradients_bit_for_bit() {
    let p = with_grads();
    let want = runtime::run(&p, &inputs()).unwrap();
    for policy in [
        Policy::Layer,
        Policy::Dots,
        Policy::Scopes(vec!["enc/layer1/ffn".into()]),
    ] {
        let r = remat(&p, &policy).unwrap();
        ir::verify(&r.program).unwrap();
        assert!(!r.recomputed.is_empty(), "{policy}: nothing recomputed");
        let got = runtime::run(&r.program, &inputs()).unwrap();
        for name in ["loss", "grad_x", "grad_w0", "grad_w1"] {
            assert_eq!(bits(&got[name]), bits(&want[name]), "{policy}: {name}");
        }
    }
}

#[test]
fn layer_policy_recomputes_inside_layers_and_keeps_their_outputs() {
    let p = with_grads();
    let r = remat(&p, &Policy::Layer).unwrap();
    let q = &r.program;
    let boundary = q
        .instrs
        .iter()
        .position(|i| q.scopes.is_grad(i.scope))
        .unwrap();
    // The forward pass is untouched.
    assert_eq!(q.instrs[..boundary], p.instrs[..boundary]);
    // Each clone is a forward instruction of a layer, now in that layer's backward scope,
    // and placed after the start of the backward pass.
    let ops: Vec<&str> = r.recomputed.iter().map(|v| q.instr(*v).op.name()).collect();
    assert!(
        ops.contains(&"dot_general") && ops.contains(&"tanh") && ops.contains(&"rng"),
        "{ops:?}"
    );
    for v in &r.recomputed {
        assert!(v.index() >= boundary);
        let s = q.scope(*v);
        assert!(s.grad && s.path.starts_with("enc/layer"), "{s}");
    }
    // No backward instruction reads a forward value of a layer other than what the layer
    // passes on (its residual output) or a source.
    for ins in &q.instrs[boundary..] {
        for o in &ins.operands {
            let def = q.instr(*o);
            if o.index() < boundary && q.scopes.path(def.scope).contains("layer") {
                assert!(
                    matches!(def.op, Op::Parameter { .. } | Op::Binary(ir::BinaryOp::Add)),
                    "backward reads {} of {}",
                    def.op.name(),
                    q.scopes.path(def.scope)
                );
            }
        }
    }
}

#[test]
fn dots_policy_keeps_only_contractions_between_the_passes() {
    let p = with_grads();
    let r = remat(&p, &Policy::Dots).unwrap();
    let q = &r.program;
    let boundary = q
        .instrs
        .iter()
        .position(|i| q.scopes.is_grad(i.scope))
        .unwrap();
    for ins in &q.instrs[boundary..] {
        for o in &ins.operands {
            let def = q.instr(*o);
            if o.index() < boundary {
                let ok = matches!(def.op.class(), OpClass::Contraction | OpClass::Source)
                    && !matches!(def.op, Op::Rng { .. })
                    || q.outputs.iter().any(|(_, v)| v == o);
                assert!(ok, "backward reads forward {}", def.op.name());
            }
        }
    }
    assert!(r
        .recomputed
        .iter()
        .all(|v| q.instr(*v).op.class() != OpClass::Contraction));
}

#[test]
fn none_and_forward_only_programs_are_unchanged() {
    let p = with_grads();
    let r = remat(&p, &Policy::None).unwrap();
    assert_eq!(r.program, p);
    assert!(r.recomputed.is_empty());
    let f = two_layers();
    assert_eq!(remat(&f, &Policy::Layer).unwrap().program, f);
}

#[test]
fn remat_is_idempotent() {
    let p = with_grads();
    let once = remat(&p, &Policy::Layer).unwrap().program;
    let twice = remat(&once, &Policy::Layer).unwrap();
    assert!(twice.recomputed.is_empty());
    assert_eq!(twice.program, once);
}

#[test]
fn marked_regions_are_recomputed_as_scopes_recomputes_their_paths() {
    let p = grad(&layers_marking(true), "loss", &["x", "w0", "w1"]).unwrap();
    let regions = marked_regions(&p);
    assert_eq!(regions, ["enc/layer0/ffn", "enc/layer1/ffn"]);
    // The backward pass of a marked region keeps its mark.
    let boundary = p
        .instrs
        .iter()
        .position(|i| p.scopes.is_grad(i.scope))
        .unwrap();
    assert!(p.instrs[boundary..]
        .iter()
        .any(|i| p.scopes.checkpoint_region(i.scope) == Some("enc/layer1/ffn")));
    let marked = remat(&p, &Policy::Marked).unwrap();
    let scopes = remat(&p, &Policy::Scopes(regions)).unwrap();
    assert_eq!(marked.program, scopes.program);
    assert_eq!(marked.recomputed, scopes.recomputed);
    assert!(!marked.recomputed.is_empty());
    // Clones stay in their region, marked, in its backward scope.
    for v in &marked.recomputed {
        let s = marked.program.scope(*v);
        assert!(s.grad && s.checkpoint_region().is_some(), "{s}");
    }
    // The same values as keeping everything, and as the unmarked program.
    let want = runtime::run(&with_grads(), &inputs()).unwrap();
    let got = runtime::run(&marked.program, &inputs()).unwrap();
    for name in ["loss", "grad_x", "grad_w0", "grad_w1"] {
        assert_eq!(bits(&got[name]), bits(&want[name]), "{name}");
    }
    // Only the marked regions are recomputed: `marked` on the unmarked program's twin equals
    // `scopes:` with the ffn paths.
    let listed = Policy::Scopes(vec!["enc/layer0/ffn".into(), "enc/layer1/ffn".into()]);
    let unmarked = remat(&with_grads(), &listed).unwrap();
    assert_eq!(unmarked.recomputed, marked.recomputed);
}

#[test]
fn marked_without_a_marked_region_is_a_one_line_error() {
    let e = remat(&with_grads(), &Policy::Marked)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"marked\"") && e.contains("checkpoint_scope") && !e.contains('\n'),
        "{e}"
    );
    // A forward-only program with marks: refused like `scopes:` with its paths.
    let f = layers_marking(true);
    assert_eq!(
        remat(&f, &Policy::Marked).unwrap_err(),
        remat(&f, &Policy::Scopes(marked_regions(&f))).unwrap_err()
    );
}

#[test]
fn policies_parse_and_bad_ones_are_one_line_errors() {
    for s in ["none", "layer", "dots", "marked", "scopes:a/b,c"] {
        assert_eq!(Policy::parse(s).unwrap().to_string(), s);
    }
    for bad in ["layers", "", "scopes:", "scopes: , "] {
        let e = Policy::parse(bad).unwrap_err().to_string();
        assert!(
            !e.contains('\n')
                && e.contains("scopes:")
                && (bad.starts_with("scopes") || e.contains("\"marked\"")),
            "{e}"
        );
    }
    let e = remat(&with_grads(), &Policy::Scopes(vec!["enc/layer7".into()]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`enc/layer7`") && e.contains("gshard inspect"),
        "{e}"
    );
    // A prefix of a segment is not a scope: `enc/lay` names nothing.
    assert!(remat(&with_grads(), &Policy::Scopes(vec!["enc/lay".into()])).is_err());
}
