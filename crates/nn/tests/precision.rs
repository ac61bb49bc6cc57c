//! Mixed precision on the small encoder-decoder MoE Transformer (f32 master weights, bf16
//! activations and matmul operands): a training step's loss and gradients stay within
//! bf16's rounding of the f32 step's, the step partitioned over 8 devices equals one
//! device's, and its all-to-alls move bf16 values, half the f32 step's bytes.
//!
//! The bounds. bf16 keeps 8 significant bits, so one rounding moves a value by at most
//! `u = 2^-8` (0.39 %) of itself. A training step rounds every activation after each op
//! that makes it in bf16; an error that reaches a gradient passes through about 100 such
//! roundings (4 layers of norm, projections, attention, feed-forward or experts, and the
//! residual add, forward and backward), independent in sign, so it grows like
//! `sqrt(100) u = 10 u` (3.9 %): the bound on the step's whole gradient, norm-wise
//! (measured: median 6.9 u). One weight's gradient is a sum over the batch's tokens whose terms
//! partly cancel, which multiplies its relative error by `sum |term| / |sum term|`: allowed
//! a factor of 3, 32 u (measured: median 21 u). The loss, a mean in f32 of a softmax in f32 over bf16 logits, moves by a
//! few `u` at most (bound 4 u; measured at most 1.2 u). Routing is discrete: where a
//! token's two best experts (or its place in an expert's capacity) are within bf16's
//! rounding of each other, the bf16 step may route it elsewhere than the f32 step, a change
//! no rounding bound covers. Measured: one draw in six has gradients ~15 % off, and which
//! draw it is changes when only the combine's rounding changes, as such a discrete change
//! would make it. So the gradient bounds hold for the median of six input draws, and the
//! loss bound for every draw. Partitioned and single-device runs round
//! the same values in the same ops, except the partial sums of a split contraction (weight
//! gradients summed over the batch, which each device rounds to bf16 before the
//! all-reduce rounds their sum once more): 8 roundings of partials no larger than the
//! gradient's largest entry, independent in sign, `sqrt(8) u`, plus the two final ones:
//! the bound is 4 u of that entry (measured: 1.9 u; the loss is bit for bit the same).

mod common;

use common::{axes, config, inputs, inputs_seeded, training_step_of};
use ir::{DType, Mesh, Op};
use nn::transformer::{Layout, Packing, Precision, TransformerConfig};
use runtime::HostTensor;
use std::collections::HashMap;

/// bf16's unit roundoff.
const U: f64 = 1.0 / 256.0;

fn model(precision: Precision) -> TransformerConfig {
    let mut cfg = config(2);
    cfg.dtype = DType::F32;
    cfg.precision = precision;
    cfg
}

fn layout() -> Layout {
    Layout {
        batch_axes: axes(&["data", "expert"]),
        expert_axes: axes(&["expert"]),
        model_axes: Vec::new(),
        weight_axes: Vec::new(),
    }
}

fn mesh() -> Mesh {
    Mesh::new(&[("data", 2), ("expert", 4)]).unwrap()
}

/// `|a - b| / |b|` over the whole tensor (2-norms).
fn norm_error(a: &HostTensor, b: &HostTensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let diff: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// The largest `|a - b|` over the tensor, against its largest `|b|`.
fn max_error(a: &HostTensor, b: &HostTensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    worst / scale.max(f64::MIN_POSITIVE)
}

fn grads(out: &HashMap<String, HostTensor>) -> Vec<(&String, &HostTensor)> {
    let mut g: Vec<_> = out.iter().filter(|(k, _)| k.starts_with("grad_")).collect();
    g.sort_by_key(|(k, _)| k.as_str());
    g
}

#[test]
fn bf16_step_is_the_f32_step_within_bf16_rounding() {
    let shape_batch = 8;
    let (full, specs) = training_step_of(
        mesh(),
        layout(),
        &model(Precision::Full),
        Packing::Padded,
        shape_batch,
    );
    let (mixed, mixed_specs) = training_step_of(
        mesh(),
        layout(),
        &model(Precision::Mixed(DType::BF16)),
        Packing::Padded,
        shape_batch,
    );
    assert_eq!(
        specs, mixed_specs,
        "the master weights are the same f32 tensors"
    );
    // The mixed step really multiplies in bf16.
    let bf16_dots = mixed
        .instrs
        .iter()
        .filter(|i| matches!(i.op, Op::DotGeneral(_)) && i.ty.dtype == DType::BF16)
        .count();
    let dots = mixed
        .instrs
        .iter()
        .filter(|i| matches!(i.op, Op::DotGeneral(_)))
        .count();
    assert!(
        bf16_dots * 4 >= dots * 3,
        "{bf16_dots} of {dots} dots in bf16"
    );
    let one = testkit::spmd::unpartitioned;
    let (full, mixed) = (one(&full), one(&mixed));
    // (whole gradient's error, worst weight's error) of each input draw.
    let mut errors: Vec<(f64, f64)> = Vec::new();
    for seed in 7..13 {
        let ins = inputs_seeded(&full, &specs, 11, 13, seed);
        let want = runtime::reference::run(&full, &ins).unwrap();
        let got = runtime::reference::run(&mixed, &ins).unwrap();
        let (lw, lg) = (want["loss"].to_f64_vec()[0], got["loss"].to_f64_vec()[0]);
        let loss_err = (lg - lw).abs() / lw.abs();
        assert!(
            loss_err > 0.0,
            "the bf16 step rounds: its loss cannot be f32's exactly"
        );
        assert!(
            loss_err <= 4.0 * U,
            "draw {seed}: loss {lg} in bf16 against {lw} in f32: {loss_err:e} apart, over 4u"
        );
        let (gw, gg) = (grads(&want), grads(&got));
        assert_eq!(gw.len(), specs.len());
        let mut worst = (0.0, String::new());
        let (mut diff, mut norm) = (0.0, 0.0);
        for ((name, w), (_, g)) in gw.iter().zip(&gg) {
            let (wv, gv) = (w.to_f64_vec(), g.to_f64_vec());
            diff += wv
                .iter()
                .zip(&gv)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>();
            norm += wv.iter().map(|a| a * a).sum::<f64>();
            assert_eq!(g.ty.dtype, DType::F32, "{name} lands in f32");
            let e = norm_error(g, w);
            if e > worst.0 {
                worst = (e, name.to_string());
            }
        }
        let whole = (diff / norm).sqrt();
        eprintln!(
            "draw {seed}: loss {lw} (f32) {lg} (bf16): {loss_err:.1e}; all gradients {whole:.1e}, worst {} {:.1e}",
            worst.1, worst.0
        );
        errors.push((whole, worst.0));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let whole = median(errors.iter().map(|e| e.0).collect());
    let worst = median(errors.iter().map(|e| e.1).collect());
    assert!(
        whole <= 10.0 * U,
        "the step's gradient differs from f32's by {whole:e} norm-wise (median), over 10u"
    );
    assert!(
        worst <= 32.0 * U,
        "the worst weight's gradient differs from f32's by {worst:e} norm-wise (median), over 32u"
    );
}

#[test]
fn bf16_step_on_8_devices_is_the_one_device_step() {
    let cfg = model(Precision::Mixed(DType::BF16));
    let (p, specs) = training_step_of(mesh(), layout(), &cfg, Packing::Padded, 8);
    let ins = inputs(&p, &specs, 11, 13);
    let want = runtime::reference::run(&testkit::spmd::unpartitioned(&p), &ins).unwrap();
    let (got, part) = testkit::spmd::run_partitioned(&p, &ins).unwrap();
    let (lw, lg) = (want["loss"].to_f64_vec()[0], got["loss"].to_f64_vec()[0]);
    // Every forward value is rounded in the same op from the same terms; only the loss's
    // sum over devices is rounded to f32 once more (the same bits here).
    assert!(
        (lw - lg).abs() <= 1e-6 * lw.abs(),
        "loss {lg} on 8 devices against {lw} on one"
    );
    let mut worst = 0.0f64;
    for (name, w) in grads(&want) {
        let e = max_error(&got[name.as_str()], w);
        worst = worst.max(e);
        assert!(
            e <= 4.0 * U,
            "{name}: 8 devices differ by {e:e} of its largest entry"
        );
    }
    eprintln!("loss {lw} on one device, {lg} on 8; gradients differ by {worst:.1e} at most");
    // Every all-to-all moves bf16: half the bytes of the f32 step's.
    let a2a = |p: &ir::Program| -> Vec<(DType, usize)> {
        spmd::report::collectives(p)
            .iter()
            .filter(|c| c.kind == "all_to_all")
            .map(|c| (c.dtype, c.bytes))
            .collect()
    };
    let mixed = a2a(&part.program);
    let (full, _) = training_step_of(
        mesh(),
        layout(),
        &model(Precision::Full),
        Packing::Padded,
        8,
    );
    let full = a2a(&spmd::compile(&full).unwrap().program);
    assert_eq!(mixed.len(), 8, "2 MoE layers, 2 forward + 2 backward each");
    assert!(mixed.iter().all(|(dt, _)| *dt == DType::BF16), "{mixed:?}");
    let bytes = |v: &[(DType, usize)]| v.iter().map(|(_, b)| b).sum::<usize>();
    assert_eq!(
        2 * bytes(&mixed),
        bytes(&full),
        "{mixed:?} against {full:?}"
    );
}
