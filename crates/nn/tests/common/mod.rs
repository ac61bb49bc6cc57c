//! Shared by the Transformer tests: a tiny encoder-decoder MoE config, random inputs by
//! their init specs, and the training-step program (loss and gradients) on a mesh.

#![allow(dead_code)]

use ir::{Builder, DType, Mesh};
use nn::moe::{Activation, SecondPolicy};
use nn::params::Init;
use nn::transformer::{
    build, Balance, BatchShape, Layout, MoeConfig, MoeGating, Packing, Precision, TransformerConfig,
};
use runtime::HostTensor;
use std::collections::HashMap;

pub fn config(enc_layers: usize) -> TransformerConfig {
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
            overlap_chunks: 1,
        }),
        activation: Activation::Relu,
        dropout: 0.0,
        label_smoothing: 0.1,
        dtype: DType::F64,
        precision: Precision::Full,
        checkpoint: Default::default(),
    }
}

pub fn lcg(seed: u64) -> impl FnMut() -> f64 {
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
pub fn inputs(
    p: &ir::Program,
    specs: &[nn::params::ParamSpec],
    vocab: usize,
    src_vocab: usize,
) -> HashMap<String, HostTensor> {
    inputs_seeded(p, specs, vocab, src_vocab, 7)
}

/// [`inputs`] drawn from the generator seeded with `seed`.
pub fn inputs_seeded(
    p: &ir::Program,
    specs: &[nn::params::ParamSpec],
    vocab: usize,
    src_vocab: usize,
    seed: u64,
) -> HashMap<String, HostTensor> {
    let mut r = lcg(seed);
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
            // Packed rows: segments of 3 tokens numbered from 1, the row's last token padding.
            "src_seg" | "tgt_seg" => {
                let len = *ty.shape.last().unwrap();
                (0..n)
                    .map(|i| match i % len {
                        j if j + 1 == len => 0.0,
                        j => (1 + j / 3) as f64,
                    })
                    .collect()
            }
            "src_pos" | "tgt_pos" => {
                let len = *ty.shape.last().unwrap();
                (0..n).map(|i| ((i % len) % 3) as f64).collect()
            }
            "seed" => vec![3.0],
            other => panic!("unexpected parameter {other}"),
        };
        m.insert(name.to_string(), HostTensor::from_f64_values(ty, &vals));
    }
    m
}

pub fn training_step(
    mesh: Mesh,
    layout: Layout,
    cfg: &TransformerConfig,
    packing: Packing,
) -> (ir::Program, Vec<nn::params::ParamSpec>) {
    // The batch and the MoE groups (B*T/S) divide the device count.
    let batch = mesh.num_devices();
    training_step_of(mesh, layout, cfg, packing, batch)
}

/// [`training_step`] on a batch of `batch` rows.
pub fn training_step_of(
    mesh: Mesh,
    layout: Layout,
    cfg: &TransformerConfig,
    packing: Packing,
    batch: usize,
) -> (ir::Program, Vec<nn::params::ParamSpec>) {
    let b = Builder::with_mesh(mesh);
    let shape = BatchShape {
        batch,
        src_len: 8,
        tgt_len: 4,
        packing,
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

pub fn axes(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}
