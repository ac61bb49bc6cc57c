//! The small encoder-decoder MoE Transformer: its training-step program (loss and
//! gradients) partitions on meshes (expert=4) and (data=2, expert=4) and equals the
//! single-device run; the decoder-only LM builds and differentiates too.

mod common;

use common::{axes, config, inputs, training_step};
use ir::{Builder, DType, Mesh, Type};
use nn::moe::SecondPolicy;
use nn::transformer::{build, BatchShape, Layout, Packing, TransformerConfig};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::spmd::assert_spmd_matches;
use testkit::Tol;

#[test]
fn encoder_decoder_moe_training_step_partitions_exactly() {
    let cfg = config(2);
    for (mesh, layout) in [
        (
            Mesh::new(&[("expert", 4)]).unwrap(),
            Layout {
                batch_axes: axes(&["expert"]),
                expert_axes: axes(&["expert"]),
                model_axes: Vec::new(),
                weight_axes: Vec::new(),
            },
        ),
        (
            Mesh::new(&[("data", 2), ("expert", 4)]).unwrap(),
            Layout {
                batch_axes: axes(&["data", "expert"]),
                expert_axes: axes(&["expert"]),
                model_axes: Vec::new(),
                weight_axes: Vec::new(),
            },
        ),
    ] {
        let (p, specs) = training_step(mesh.clone(), layout, &cfg, Packing::Padded);
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
            packing: Packing::Padded,
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

#[test]
fn packed_training_step_partitions_exactly() {
    let cfg = config(2);
    let mesh = Mesh::new(&[("data", 2), ("expert", 4)]).unwrap();
    let layout = Layout {
        batch_axes: axes(&["data", "expert"]),
        expert_axes: axes(&["expert"]),
        model_axes: Vec::new(),
        weight_axes: Vec::new(),
    };
    let (p, specs) = training_step(mesh.clone(), layout, &cfg, Packing::Packed);
    assert!(p.param("src_seg").is_some() && p.param("src_pad").is_none());
    let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
    let part = assert_spmd_matches(&p, &ins, Tol::new(1e-9, 1e-11));
    let kinds: Vec<&str> = spmd::report::collectives(&part.program)
        .iter()
        .map(|c| c.kind)
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "all_to_all").count(), 8);
    assert!(!kinds.contains(&"all_gather"), "{kinds:?}");
}

/// One pair: source and target token ids (target ends with its `</s>`).
struct Pair {
    src: Vec<usize>,
    tgt: Vec<usize>,
}

const BOS: usize = 1;

/// The evaluation logits `[B,T,V]` of `rows` (each a list of pairs placed one after the
/// other), with `src_len`/`tgt_len` slots per row, packed or padded (one pair per row).
fn logits_of(
    cfg: &TransformerConfig,
    rows: &[Vec<&Pair>],
    len: (usize, usize),
    packing: Packing,
) -> Vec<f64> {
    let b = Builder::new();
    let shape = BatchShape {
        batch: rows.len(),
        src_len: len.0,
        tgt_len: len.1,
        packing,
    };
    let built = build(&b, cfg, &shape, &Layout::default(), false).unwrap();
    b.output("logits", &built.logits);
    let p = b.finish();
    let mut ins = inputs(&p, &built.params, cfg.vocab, cfg.src_vocab.unwrap());
    let (bsz, (s, t)) = (rows.len(), len);
    let mut v: HashMap<&str, Vec<f64>> = HashMap::new();
    for (name, n) in [("src", s), ("src_pad", s), ("src_seg", s), ("src_pos", s)] {
        v.insert(
            name,
            vec![if name == "src_pad" { 1.0 } else { 0.0 }; bsz * n],
        );
    }
    for name in ["tgt_in", "tgt_out", "tgt_weight", "tgt_seg", "tgt_pos"] {
        v.insert(name, vec![0.0; bsz * t]);
    }
    for (r, row) in rows.iter().enumerate() {
        let (mut so, mut to) = (r * s, r * t);
        for (k, pair) in row.iter().enumerate() {
            for (j, &id) in pair.src.iter().enumerate() {
                v.get_mut("src").unwrap()[so] = id as f64;
                v.get_mut("src_pad").unwrap()[so] = 0.0;
                v.get_mut("src_seg").unwrap()[so] = (k + 1) as f64;
                v.get_mut("src_pos").unwrap()[so] = j as f64;
                so += 1;
            }
            for (j, &id) in pair.tgt.iter().enumerate() {
                v.get_mut("tgt_in").unwrap()[to] =
                    if j == 0 { BOS } else { pair.tgt[j - 1] } as f64;
                v.get_mut("tgt_out").unwrap()[to] = id as f64;
                v.get_mut("tgt_weight").unwrap()[to] = 1.0;
                v.get_mut("tgt_seg").unwrap()[to] = (k + 1) as f64;
                v.get_mut("tgt_pos").unwrap()[to] = j as f64;
                to += 1;
            }
        }
    }
    for (name, vals) in v {
        if let Some(id) = p.param(name) {
            ins.insert(
                name.to_string(),
                HostTensor::from_f64_values(p.ty(id).clone(), &vals),
            );
        }
    }
    runtime::reference::run(&p, &ins).unwrap()["logits"].to_f64_vec()
}

#[test]
fn a_packed_row_computes_what_its_pairs_compute_alone() {
    // Dense (MoE routing groups differ between the layouts): every token's logits depend
    // only on its own pair, wherever the pair sits in a row.
    let mut cfg = config(2);
    cfg.moe = None;
    cfg.moe_every = 0;
    let pairs = [
        Pair {
            src: vec![4, 7, 2],
            tgt: vec![5, 2],
        },
        Pair {
            src: vec![9, 2],
            tgt: vec![3, 8, 2],
        },
        Pair {
            src: vec![6, 5, 11, 2],
            tgt: vec![7, 2],
        },
    ];
    let len = (6, 5);
    let packed = logits_of(
        &cfg,
        &[vec![&pairs[0], &pairs[1]], vec![&pairs[2]]],
        len,
        Packing::Packed,
    );
    let padded = logits_of(
        &cfg,
        &[vec![&pairs[0]], vec![&pairs[1]], vec![&pairs[2]]],
        len,
        Packing::Padded,
    );
    let v = cfg.vocab;
    let at = |x: &[f64], row: usize, pos: usize| x[(row * len.1 + pos) * v..][..v].to_vec();
    // (packed row, offset) of each pair's first target token.
    for (i, (row, off)) in [(0, 0), (0, 2), (1, 0)].into_iter().enumerate() {
        for j in 0..pairs[i].tgt.len() {
            let (a, b) = (at(&packed, row, off + j), at(&padded, i, j));
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 1e-10, "pair {i} token {j}: {a:?} vs {b:?}");
            }
        }
    }
}
