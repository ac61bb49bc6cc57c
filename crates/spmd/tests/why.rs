//! Why each collective: a deliberately bad annotation (a weight split on its contracting dim
//! over the axis the batch uses) makes the dot gather the weight whole; the report flags it,
//! names the annotation and the scope, and the annotation it suggests removes the gather.
//! Scopes reach the collectives the partitioner inserts.

use ir::{Builder, DType, Mesh, Program, Sharding, Type, ValueId};
use spmd::report::why::{self, WhyOptions};
use spmd::why::Moved;

fn f32s(shape: &[usize]) -> Type {
    Type::new(DType::F32, shape.to_vec())
}

/// `y = x @ w` with `x [1024, 64]` split on the batch over `data`, and `w [64, 64]`
/// annotated `w_sharding`, inside scope `mlp`.
fn mlp(w_sharding: Sharding) -> Program {
    let b = Builder::with_mesh(Mesh::new(&[("data", 4)]).unwrap());
    let _s = b.scope("mlp");
    let x = sharding::split(&b.param("x", f32s(&[1024, 64])), 0, "data").unwrap();
    let w = b.param("w", f32s(&[64, 64]));
    w.set_sharding(Some(w_sharding));
    let y = x.matmul(&w);
    b.output("y", &y);
    b.finish()
}

#[test]
fn a_weight_split_so_that_a_dot_gathers_it_is_flagged_with_its_annotation() {
    let p = mlp(Sharding::split(2, 0, "data"));
    let part = spmd::compile(&p).unwrap();
    let entries = why::entries(&part, WhyOptions::default());
    let flagged: Vec<_> = entries.iter().filter(|e| e.flagged).collect();
    assert_eq!(
        flagged.len(),
        1,
        "{}",
        why::text(&part, WhyOptions::default())
    );
    let e = flagged[0];
    assert_eq!(e.info.kind, "all_gather");
    assert_eq!(e.scope, "mlp");
    let cause = e.cause.unwrap();
    assert_eq!(cause.serves_op, "dot_general");
    let r = cause.reshard.as_ref().unwrap();
    assert_eq!(
        r.moved,
        Moved::Operand {
            position: 1,
            value: ValueId(1)
        }
    );
    assert_eq!(r.from, Sharding::split(2, 0, "data"));
    assert_eq!(r.to, Sharding::replicated(2));
    let avoid = cause.full_gather.as_ref().unwrap();
    assert_eq!(avoid.value, ValueId(1));
    assert_eq!(avoid.culprit.as_ref().unwrap().param.as_deref(), Some("w"));
    let line = why::describe_gather(&part.program, cause).unwrap();
    assert_eq!(
        line,
        "involuntary full gather of f32[64,64] (16.00 KiB): the annotation {data, _} of %1 \
         parameter \"w\" at mlp splits it; annotate %1 {_, _} (at mlp) to avoid it"
    );
    let text = why::text(&part, WhyOptions::default());
    assert!(text.contains(&format!("! {line}")), "{text}");
    assert!(text.contains("## mlp: 1 collectives"), "{text}");

    // Taking the advice removes the gather, and with it every collective.
    let fixed = mlp(avoid.sharding.clone());
    let part = spmd::compile(&fixed).unwrap();
    assert!(why::entries(&part, WhyOptions::default()).is_empty());

    // A gather below the threshold is not flagged.
    let part = spmd::compile(&p).unwrap();
    let big = WhyOptions {
        min_gather_bytes: 64 * 64 * 4 + 1,
    };
    assert!(why::entries(&part, big).iter().all(|e| !e.flagged));
}

#[test]
fn gradient_all_reduces_are_caused_by_the_backward_dot_in_its_scope() {
    let b = Builder::with_mesh(Mesh::new(&[("data", 2)]).unwrap());
    let x = sharding::split(&b.param("x", f32s(&[8, 4])), 0, "data").unwrap();
    let w = b.param("w", f32s(&[4, 3]));
    let y = {
        let _s = b.scope("layer0");
        x.matmul(&w)
    };
    let loss = {
        let _s = b.scope("loss");
        y.mul(&y).sum_all()
    };
    b.output("loss", &loss);
    let step = autodiff::grad(&b.finish(), "loss", &["w"]).unwrap();
    let part = spmd::compile(&step).unwrap();
    let entries = why::entries(&part, WhyOptions::default());
    assert!(!entries.is_empty());
    for e in &entries {
        let cause = e.cause.expect("every collective has a cause");
        assert_eq!(e.info.kind, "all_reduce");
        // The partial sums of a dot over the split batch, or of the loss's sum.
        let r = cause.reshard.as_ref().unwrap();
        assert_eq!(r.moved, Moved::Result, "{}", why::describe_moved(cause));
        assert!(!r.from.partial.is_empty());
        assert!(!e.flagged);
    }
    let scopes: Vec<(&str, bool)> = entries.iter().map(|e| (e.scope, e.grad)).collect();
    assert!(scopes.contains(&("layer0", true)), "{scopes:?}");
    assert!(scopes.contains(&("loss", false)), "{scopes:?}");
    // The inserted instructions carry the scope of the instruction they serve.
    let grad_w = part.program.output("grad_w").unwrap();
    assert_eq!(part.program.scope(grad_w).path, "layer0");
}

#[test]
fn propagated_shardings_cite_the_annotation_they_came_from() {
    let b = Builder::with_mesh(Mesh::new(&[("data", 2)]).unwrap());
    let x = {
        let _s = b.scope("input");
        sharding::split(&b.param("x", f32s(&[8, 4])), 0, "data").unwrap()
    };
    let h = x.exp().neg().abs();
    // The output wants the value whole: a gather that the output's own need causes.
    let out = h.sum(&[1]);
    let out = sharding::replicate(&out).unwrap();
    b.output("out", &out);
    let p = b.finish();
    let (q, prov) = sharding::propagate_explained(&p).unwrap();
    let chain = sharding::provenance_chain(&prov, ValueId(3));
    assert_eq!(chain.first(), Some(&ValueId(3)));
    assert_eq!(chain.last(), Some(&ValueId(0)), "{prov:?}");
    assert_eq!(
        q.instr(ValueId(3)).sharding,
        Some(Sharding::split(2, 0, "data"))
    );
    let part = spmd::partition_explained(&q, &prov).unwrap();
    let text = why::text(&part, WhyOptions::default());
    assert!(text.contains("annotated"), "{text}");
    assert!(text.contains("propagated forward from"), "{text}");
    assert!(text.contains("at input: annotated"), "{text}");
}
