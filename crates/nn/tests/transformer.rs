//! The small encoder-decoder MoE Transformer: its training-step program (loss and
//! gradients) partitions on meshes (expert=4) and (data=2, expert=4) and equals the
//! single-device run; the decoder-only LM builds and differentiates too.

use ir::{Builder, DType, Mesh, Type};
use nn::moe::{Activation, SecondPolicy};
use nn::params::Init;
use nn::transformer::{
    build, Balance, BatchShape, Layout, MoeConfig, MoeGating, TransformerConfig,
};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::spmd::assert_spmd_matches;
use testkit::Tol;

fn config(enc_layers: usize) -> TransformerConfig {
    TransformerConfig {
        vocab: 11,
        src_vocab: Some(13),
        model_dim: 8,
        heads: 2,
        head_dim: 4,
        ffn_dim: 12,
        enc_layers,
        dec_layers: 2,
        moe_every: 2,
        moe: Some(MoeConfig {
            experts: 4,
            expert_dim: 12,
            group_size: 4,
            capacity: 2,
            policy: SecondPolicy::All,
            aux_loss_coef: 0.01,
            gating: MoeGating::Top2,
            balance: Balance::AuxLoss,
        }),
        activation: Activation::Relu,
        dropout: 0.0,
        label_smoothing: 0.1,
        dtype: DType::F64,
    }
}

fn lcg(seed: u64) -> impl FnMut() -> f64 {
    let mut x = seed
        .wrapping_mul(2862933555777941757)
        .wrapping_add(3037000493);
    move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random weights by their init spec, random tokens, a few padding positions.
fn inputs(
    p: &ir::Program,
    specs: &[nn::params::ParamSpec],
    vocab: usize,
    src_vocab: usize,
) -> HashMap<String, HostTensor> {
    let mut r = lcg(7);
    let mut m = HashMap::new();
    for s in specs {
        let n = s.ty.num_elements();
        let v: Vec<f64> = (0..n)
            .map(|_| match s.init {
                Init::Normal(std) | Init::Uniform(std) => std * (2.0 * r() - 1.0) * 1.7,
                Init::Zeros => 0.1 * (r() - 0.5),
                Init::Ones => 1.0 + 0.1 * (r() - 0.5),
            })
            .collect();
        m.insert(
            s.name.clone(),
            HostTensor::from_f64_values(s.ty.clone(), &v),
        );
    }
    for (name, v) in p.params() {
        if m.contains_key(name) {
            continue;
        }
        let ty = p.ty(v).clone();
        let n = ty.num_elements();
        let vals: Vec<f64> = match name {
            "src" => (0..n).map(|_| (r() * src_vocab as f64).floor()).collect(),
            "tgt_in" | "tgt_out" => (0..n).map(|_| (r() * vocab as f64).floor()).collect(),
            "src_pad" => (0..n).map(|i| if i % 7 == 6 { 1.0 } else { 0.0 }).collect(),
            "tgt_weight" => (0..n).map(|i| if i % 5 == 4 { 0.0 } else { 1.0 }).collect(),
            "seed" => vec![3.0],
            other => panic!("unexpected parameter {other}"),
        };
        m.insert(name.to_string(), HostTensor::from_f64_values(ty, &vals));
    }
    m
}

fn training_step(
    mesh: Mesh,
    layout: Layout,
    cfg: &TransformerConfig,
) -> (ir::Program, Vec<nn::params::ParamSpec>) {
    // The batch and the MoE groups (B*T/S) divide the device count.
    let batch = mesh.num_devices();
    let b = Builder::with_mesh(mesh);
    let shape = BatchShape {
        batch,
        src_len: 8,
        tgt_len: 4,
    };
    let built = build(&b, cfg, &shape, &layout, true).unwrap();
    b.output("loss", &built.loss);
    b.output("ce", &built.ce);
    for (i, (_, st)) in built.moe.iter().enumerate() {
        b.output(&format!("load{i}"), &st.load);
    }
    let fwd = b.finish();
    ir::verify(&fwd).unwrap();
    let names: Vec<String> = built.params.iter().map(|s| s.name.clone()).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let p = autodiff::grad(&fwd, "loss", &wrt).unwrap();
    (p, built.params)
}

fn axes(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn encoder_decoder_moe_training_step_partitions_exactly() {
    let cfg = config(2);
    for (mesh, layout) in [
        (
            Mesh::new(&[("expert", 4)]).unwrap(),
            Layout {
                batch_axes: axes(&["expert"]),
                expert_axes: axes(&["expert"]),
            },
        ),
        (
            Mesh::new(&[("data", 2), ("expert", 4)]).unwrap(),
            Layout {
                batch_axes: axes(&["data", "expert"]),
                expert_axes: axes(&["expert"]),
            },
        ),
    ] {
        let (p, specs) = training_step(mesh.clone(), layout, &cfg);
        let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
        let part = assert_spmd_matches(&p, &ins, Tol::new(1e-9, 1e-11));
        let kinds: Vec<&str> = spmd::report::collectives(&part.program)
            .iter()
            .map(|c| c.kind)
            .collect();
        let a2a = kinds.iter().filter(|k| **k == "all_to_all").count();
        // 2 MoE layers (one in the encoder, one in the decoder): 2 forward + 2 backward each.
        assert_eq!(a2a, 8, "mesh {mesh}: {kinds:?}");
        // Data parallel elsewhere: no activation is ever gathered whole.
        assert!(!kinds.contains(&"all_gather"), "mesh {mesh}: {kinds:?}");
    }
}

#[test]
fn decoder_only_lm_builds_and_differentiates() {
    let mut cfg = config(0);
    cfg.src_vocab = None;
    cfg.dropout = 0.1;
    cfg.moe.as_mut().unwrap().policy = SecondPolicy::Random { threshold: 0.5 };
    let b = Builder::new();
    let built = build(
        &b,
        &cfg,
        &BatchShape {
            batch: 2,
            src_len: 0,
            tgt_len: 8,
        },
        &Layout::default(),
        true,
    )
    .unwrap();
    b.output("loss", &built.loss);
    let fwd = b.finish();
    assert!(fwd.param("seed").is_some());
    let names: Vec<String> = built.params.iter().map(|s| s.name.clone()).collect();
    let wrt: Vec<&str> = names.iter().map(String::as_str).collect();
    let p = autodiff::grad(&fwd, "loss", &wrt).unwrap();
    let ins = inputs(&p, &built.params, cfg.vocab, cfg.vocab);
    let out = runtime::reference::run(&p, &ins).unwrap();
    let loss = out["loss"].to_f64_vec()[0];
    // Cross-entropy of a near-uniform model is about ln(V).
    assert!(
        loss.is_finite() && loss > 0.5 * (11f64).ln() && loss < 3.0 * (11f64).ln(),
        "loss {loss}"
    );
    assert!(out
        .keys()
        .any(|k| k.starts_with("grad_decoder/layer1/moe/wi")));
    let _ = Type::scalar(DType::I32);
}
