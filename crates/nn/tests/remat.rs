//! Rematerialisation on the MoE Transformer's training step: every policy gives the
//! gradients of the step without it, bit for bit (dropout and random routing included, so
//! recomputed random numbers are the same), and a finite-difference check agrees; the
//! recomputed step partitioned over 8 devices equals one device; recomputing each layer
//! lowers the executor's measured peak memory on a deeper model; and the sublayers the model
//! marks as checkpoint regions (`TransformerConfig::checkpoint`) are the regions of the
//! `marked` policy, recomputed as `scopes:` recomputes their paths, with the gradients of
//! the step that keeps everything.

mod common;

use autodiff::remat::{marked_regions, remat, Policy};
use common::{axes, config, inputs, training_step, training_step_of};
use ir::{Mesh, Program};
use nn::moe::SecondPolicy;
use nn::transformer::{Checkpoint, Layout, Packing, TransformerConfig};
use runtime::{HostTensor, InProcess};
use std::collections::HashMap;
use testkit::spmd::{assert_spmd_matches, run_partitioned};
use testkit::Tol;

/// The tiny encoder-decoder MoE with dropout and GShard's random second expert, so that
/// the step reads random numbers in every layer.
fn random_config() -> TransformerConfig {
    let mut cfg = config(2);
    cfg.dropout = 0.1;
    cfg.moe.as_mut().unwrap().policy = SecondPolicy::Random { threshold: 0.5 };
    cfg
}

fn policies() -> [Policy; 4] {
    [
        Policy::Layer,
        Policy::Dots,
        Policy::Scopes(vec!["decoder/layer1/moe".into(), "encoder/layer0".into()]),
        Policy::Scopes(vec!["encoder".into(), "decoder".into()]),
    ]
}

fn one_device() -> (Mesh, Layout) {
    (Mesh::new(&[("data", 1)]).unwrap(), Layout::default())
}

fn eight_devices() -> (Mesh, Layout) {
    (
        Mesh::new(&[("data", 2), ("expert", 4)]).unwrap(),
        Layout {
            batch_axes: axes(&["data", "expert"]),
            expert_axes: axes(&["expert"]),
            model_axes: Vec::new(),
            weight_axes: Vec::new(),
        },
    )
}

fn bits(t: &HostTensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

fn grad_names(p: &Program) -> Vec<String> {
    p.outputs
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| n.starts_with("grad_"))
        .collect()
}

#[test]
fn every_policy_gives_the_training_steps_gradients_bit_for_bit() {
    let cfg = random_config();
    let (mesh, layout) = one_device();
    let (p, specs) = training_step(mesh, layout, &cfg, Packing::Packed);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    assert!(
        p.param("seed").is_some(),
        "the step reads no random numbers"
    );
    let want = runtime::reference::run(&p, &ins).unwrap();
    let want_exec = runtime::run_devices(&p, &InProcess::new(1), std::slice::from_ref(&ins))
        .unwrap()
        .outputs
        .remove(0);
    for policy in policies() {
        let r = remat(&p, &policy).unwrap();
        assert!(!r.recomputed.is_empty(), "{policy}: nothing recomputed");
        // Reference interpreter and executor (native kernels) alike.
        let got = runtime::reference::run(&r.program, &ins).unwrap();
        let got_exec =
            runtime::run_devices(&r.program, &InProcess::new(1), std::slice::from_ref(&ins))
                .unwrap()
                .outputs
                .remove(0);
        assert_eq!(want.len(), got.len());
        for (name, w) in &want {
            assert_eq!(bits(&got[name]), bits(w), "{policy}: `{name}` (reference)");
            let we = &want_exec[name];
            assert_eq!(
                bits(&got_exec[name]),
                bits(we),
                "{policy}: `{name}` (executor)"
            );
        }
    }
}

#[test]
fn recomputed_gradients_match_a_finite_difference() {
    // Deterministic routing (random routing makes the loss jump where a threshold flips).
    let cfg = config(2);
    let (mesh, layout) = one_device();
    let (p, specs) = training_step(mesh, layout, &cfg, Packing::Padded);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    let q = remat(&p, &Policy::Layer).unwrap().program;
    let out = runtime::reference::run(&q, &ins).unwrap();
    // Along one direction through every weight: (L(w + e d) - L(w - e d)) / 2e = <grad, d>.
    let dir = |name: &str, n: usize| -> Vec<f64> {
        let h = name
            .bytes()
            .fold(7u64, |a, c| a.wrapping_mul(31).wrapping_add(c as u64));
        (0..n)
            .map(|i| (((h + i as u64 * 2654435761) % 1000) as f64 / 500.0) - 1.0)
            .collect()
    };
    let mut directional = 0.0;
    for g in grad_names(&q) {
        let w = g.strip_prefix("grad_").unwrap();
        let gv = out[&g].to_f64_vec();
        let d = dir(w, gv.len());
        directional += gv.iter().zip(&d).map(|(a, b)| a * b).sum::<f64>();
    }
    let eps = 1e-6;
    let loss_at = |sign: f64| {
        let mut moved: HashMap<String, HostTensor> = ins.clone();
        for g in grad_names(&q) {
            let w = g.strip_prefix("grad_").unwrap();
            let t = &ins[w];
            let v = t.to_f64_vec();
            let d = dir(w, v.len());
            let nv: Vec<f64> = v
                .iter()
                .zip(&d)
                .map(|(x, dx)| x + sign * eps * dx)
                .collect();
            moved.insert(
                w.to_string(),
                HostTensor::from_f64_values(t.ty.clone(), &nv),
            );
        }
        runtime::reference::run(&q, &moved).unwrap()["loss"].to_f64_vec()[0]
    };
    let fd = (loss_at(1.0) - loss_at(-1.0)) / (2.0 * eps);
    let err = (fd - directional).abs() / directional.abs().max(1e-3);
    assert!(
        err < 1e-8,
        "finite difference {fd} vs gradient {directional}"
    );
}

#[test]
fn recomputed_step_on_eight_devices_equals_one_device() {
    let cfg = random_config();
    let (mesh, layout) = eight_devices();
    let (p, specs) = training_step(mesh, layout, &cfg, Packing::Packed);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    let (plain, _) = run_partitioned(&p, &ins).unwrap();
    for policy in [Policy::Layer, Policy::Dots] {
        let q = remat(&p, &policy).unwrap().program;
        let part = assert_spmd_matches(&q, &ins, Tol::new(1e-9, 1e-11));
        // Recomputing the MoE layers' forward passes brings their all-to-alls back: more
        // than the 2 forward + 2 backward of each of the 2 MoE layers.
        let a2a = spmd::report::collectives(&part.program)
            .iter()
            .filter(|c| c.kind == "all_to_all")
            .count();
        if policy == Policy::Layer {
            assert!(a2a > 8, "{policy}: {a2a} all-to-alls, none recomputed");
        }
        // And the partitioned gradients are those of the partitioned step without remat.
        let (got, _) = run_partitioned(&q, &ins).unwrap();
        for (name, w) in &plain {
            testkit::assert_close(
                &format!("{policy}: {name}"),
                &got[name],
                w,
                Tol::new(1e-12, 1e-14),
            );
        }
    }
}

/// A 6+6-layer model on a batch large enough that activations outweigh the weights.
fn deep_step() -> (Program, HashMap<String, HostTensor>) {
    let mut cfg = config(6);
    cfg.dec_layers = 6;
    let (mesh, layout) = one_device();
    let (p, specs) = training_step_of(mesh, layout, &cfg, Packing::Padded, 32);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    (p, ins)
}

#[test]
fn recomputing_layers_lowers_the_measured_peak_memory() {
    let (p, ins) = deep_step();
    let peak = |q: &Program| {
        runtime::run_devices(q, &InProcess::new(1), std::slice::from_ref(&ins))
            .unwrap()
            .peak_bytes_per_device
    };
    let none = peak(&p);
    let layer = peak(&remat(&p, &Policy::Layer).unwrap().program);
    let dots = peak(&remat(&p, &Policy::Dots).unwrap().program);
    assert!(
        (layer as f64) < 0.7 * none as f64,
        "peak with layer remat {layer} B, without {none} B"
    );
    assert!(
        dots < none,
        "peak with dots remat {dots} B, without {none} B"
    );
}

/// [`random_config`] with `checkpoint` marked.
fn marking(checkpoint: Checkpoint) -> TransformerConfig {
    TransformerConfig {
        checkpoint,
        ..random_config()
    }
}

const BOTH: Checkpoint = Checkpoint {
    attention: true,
    ffn: true,
};

#[test]
fn the_model_marks_the_sublayers_its_config_names() {
    let (mesh, layout) = one_device();
    let regions = |checkpoint: Checkpoint| {
        let (p, _) = training_step(
            mesh.clone(),
            layout.clone(),
            &marking(checkpoint),
            Packing::Packed,
        );
        marked_regions(&p)
    };
    assert!(regions(Checkpoint::default()).is_empty());
    let ffn = Checkpoint {
        ffn: true,
        ..Checkpoint::default()
    };
    assert_eq!(
        regions(ffn),
        [
            "decoder/layer0/ffn",
            "decoder/layer1/moe",
            "encoder/layer0/ffn",
            "encoder/layer1/moe"
        ]
    );
    let attention = Checkpoint {
        attention: true,
        ..Checkpoint::default()
    };
    assert_eq!(
        regions(attention),
        [
            "decoder/layer0/attn",
            "decoder/layer0/cross",
            "decoder/layer1/attn",
            "decoder/layer1/cross",
            "encoder/layer0/attn",
            "encoder/layer1/attn"
        ]
    );
    assert_eq!(regions(BOTH).len(), 10);
    // Without `marked`, the marks are metadata: the step is the unmarked one but for them.
    let (plain, _) = training_step(
        mesh.clone(),
        layout.clone(),
        &random_config(),
        Packing::Packed,
    );
    let (marked, _) = training_step(mesh, layout, &marking(BOTH), Packing::Packed);
    assert_eq!(plain.len(), marked.len());
    assert!(plain
        .instrs
        .iter()
        .zip(&marked.instrs)
        .all(|(a, b)| a.op == b.op && a.operands == b.operands && a.ty == b.ty));
    assert_ne!(plain, marked, "the marks are part of the program");
}

#[test]
fn marked_policy_is_scopes_with_the_marked_paths() {
    let (mesh, layout) = one_device();
    let (p, _) = training_step(mesh, layout, &marking(BOTH), Packing::Packed);
    let by_marks = remat(&p, &Policy::Marked).unwrap();
    let by_paths = remat(&p, &Policy::Scopes(marked_regions(&p))).unwrap();
    assert_eq!(by_marks.program, by_paths.program);
    assert_eq!(by_marks.recomputed, by_paths.recomputed);
    assert!(!by_marks.recomputed.is_empty());
    // Every clone lies in a marked region's backward pass.
    for v in &by_marks.recomputed {
        let s = by_marks.program.scope(*v);
        assert!(s.grad && s.checkpoint_region().is_some(), "{s}");
    }
    // An unmarked model under `marked` is a one-line error naming the fix.
    let (unmarked, _) = training_step(
        one_device().0,
        one_device().1,
        &random_config(),
        Packing::Packed,
    );
    let e = remat(&unmarked, &Policy::Marked).unwrap_err().to_string();
    assert!(e.contains("checkpoint") && !e.contains('\n'), "{e}");
}

#[test]
fn marked_sublayers_give_every_gradient_of_the_step_that_keeps_everything() {
    // The step without marks and without remat is the oracle: marking and recomputing must
    // change no output, bit for bit, in the reference interpreter and the executor.
    let (mesh, layout) = one_device();
    let cfg = random_config();
    let (p, specs) = training_step(mesh.clone(), layout.clone(), &cfg, Packing::Packed);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    let want = runtime::reference::run(&p, &ins).unwrap();
    let want_exec = runtime::run_devices(&p, &InProcess::new(1), std::slice::from_ref(&ins))
        .unwrap()
        .outputs
        .remove(0);
    let n_grads = grad_names(&p).len();
    assert_eq!(n_grads, specs.len(), "a gradient per parameter");
    for checkpoint in [
        BOTH,
        Checkpoint {
            ffn: true,
            ..Checkpoint::default()
        },
    ] {
        let (m, _) = training_step(
            mesh.clone(),
            layout.clone(),
            &marking(checkpoint),
            Packing::Packed,
        );
        let r = remat(&m, &Policy::Marked).unwrap();
        assert!(
            !r.recomputed.is_empty(),
            "{checkpoint:?}: nothing recomputed"
        );
        let got = runtime::reference::run(&r.program, &ins).unwrap();
        let got_exec =
            runtime::run_devices(&r.program, &InProcess::new(1), std::slice::from_ref(&ins))
                .unwrap()
                .outputs
                .remove(0);
        assert_eq!(want.len(), got.len());
        assert_eq!(grad_names(&r.program).len(), n_grads);
        for (name, w) in &want {
            assert_eq!(
                bits(&got[name]),
                bits(w),
                "{checkpoint:?}: `{name}` (reference)"
            );
            assert_eq!(
                bits(&got_exec[name]),
                bits(&want_exec[name]),
                "{checkpoint:?}: `{name}` (executor)"
            );
        }
    }
}

#[test]
fn marks_survive_partitioning_and_the_text_format() {
    let cfg = marking(Checkpoint {
        ffn: true,
        ..Checkpoint::default()
    });
    let (mesh, layout) = eight_devices();
    let (p, specs) = training_step(mesh, layout, &cfg, Packing::Packed);
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    let q = remat(&p, &Policy::Marked).unwrap().program;
    let part = assert_spmd_matches(&q, &ins, Tol::new(1e-9, 1e-11));
    // The per-device program keeps every mark, forward and backward.
    assert_eq!(marked_regions(&part.program), marked_regions(&p));
    let marked_backward = part
        .program
        .instrs
        .iter()
        .filter(|i| {
            part.program.scopes.is_grad(i.scope)
                && part.program.scopes.checkpoint_region(i.scope).is_some()
        })
        .count();
    assert!(marked_backward > 0, "no marked backward instruction");
    // And prints and parses back with them.
    let text = ir::text::print(&part.program);
    assert!(text.contains(" checkpoint=\"encoder/layer1/moe\""));
    assert_eq!(ir::text::parse(&text).unwrap(), part.program);
}
