//! Tensor parallelism by annotation: the Transformer's `model` axis (heads, hidden dims and
//! vocabulary split) alone and combined with `data` and `expert`. Oracles: the partitioned
//! training step (loss and every gradient) equals the single-device run; the forward pass
//! of each block all-reduces once after attention and once after the feed-forward layer
//! and never gathers a weight; 2-D experts keep the all-to-alls of the expert axis.

mod common;

use common::{axes, config, inputs, training_step, training_step_of};
use ir::{Builder, Mesh, Program};
use nn::transformer::{build, BatchShape, Layout, Packing};
use spmd::report::{collectives, CollectiveInfo};
use testkit::spmd::assert_spmd_matches;
use testkit::Tol;

/// The tiny test model with vocabularies large enough that looking up a vocabulary-split
/// table and summing (one all-reduce of the embeddings) moves fewer bytes than gathering
/// the table, as in any real model; both split unevenly over 2 and 4.
fn tp_config(enc_layers: usize) -> nn::transformer::TransformerConfig {
    let mut cfg = config(enc_layers);
    cfg.vocab = 61;
    cfg.src_vocab = Some(67);
    cfg
}

/// The trainer's mesh (`data x expert`, then `model`) and layout.
fn mesh(data: usize, expert: usize, model: usize) -> (Mesh, Layout) {
    let mesh = Mesh::new(&[("data", data), ("expert", expert), ("model", model)]).unwrap();
    let layout = Layout {
        batch_axes: axes(&["data", "expert"]),
        expert_axes: axes(&["expert"]),
        model_axes: axes(&["model"]),
        weight_axes: Vec::new(),
    };
    (mesh, layout)
}

fn kinds(p: &Program) -> Vec<&'static str> {
    collectives(p).iter().map(|c| c.kind).collect()
}

#[test]
fn every_combination_of_data_model_and_expert_partitions_the_training_step_exactly() {
    // vocab 11 and source vocab 13 split unevenly over model=2: the partitioner pads them.
    let cfg = tp_config(2);
    for (d, e, m) in [(1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 2)] {
        let (mesh, layout) = mesh(d, e, m);
        // The batch divides over data x expert; the model axis does not split it.
        let (p, specs) = training_step(mesh.clone(), layout, &cfg, Packing::Packed);
        let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
        let part = assert_spmd_matches(&p, &ins, Tol::new(1e-9, 1e-11));
        let k = kinds(&part.program);
        assert!(!k.contains(&"all_gather"), "mesh {mesh}: {k:?}");
        let a2a = k.iter().filter(|k| **k == "all_to_all").count();
        // 2 MoE layers, dispatch and combine, forward and backward.
        assert_eq!(a2a, if e > 1 { 8 } else { 0 }, "mesh {mesh}: {k:?}");
    }
}

/// The forward pass alone, partitioned.
fn forward(mesh: Mesh, layout: &Layout, dense: bool) -> Program {
    let mut cfg = tp_config(2);
    if dense {
        cfg.moe = None;
        cfg.moe_every = 0;
    }
    let batch = mesh.size_of(&axes(&["data", "expert"]));
    let b = Builder::with_mesh(mesh);
    let shape = BatchShape {
        batch,
        src_len: 8,
        tgt_len: 4,
        packing: Packing::Padded,
    };
    let built = build(&b, &cfg, &shape, layout, false).unwrap();
    b.output("loss", &built.loss);
    spmd::compile(&b.finish()).unwrap().program
}

/// The collectives of `p` whose instruction's scope starts with `prefix`.
fn under<'a>(p: &Program, all: &'a [CollectiveInfo], prefix: &str) -> Vec<&'a CollectiveInfo> {
    all.iter()
        .filter(|c| {
            let s = p.scope(ir::ValueId(c.index as u32));
            !s.grad && s.path.starts_with(prefix)
        })
        .collect()
}

#[test]
fn each_block_all_reduces_once_after_attention_and_once_after_the_ffn() {
    for (d, m) in [(1, 2), (2, 2)] {
        let (mesh, layout) = mesh(d, 1, m);
        let p = forward(mesh.clone(), &layout, true);
        let all = collectives(&p);
        assert!(
            all.iter().all(|c| c.kind != "all_gather"),
            "mesh {mesh}: a weight or activation is gathered: {:?}",
            kinds(&p)
        );
        let mut sublayers = Vec::new();
        for l in 0..2 {
            sublayers.push(format!("encoder/layer{l}/attn"));
            sublayers.push(format!("encoder/layer{l}/ffn"));
            sublayers.push(format!("decoder/layer{l}/attn"));
            sublayers.push(format!("decoder/layer{l}/cross"));
            sublayers.push(format!("decoder/layer{l}/ffn"));
        }
        for s in &sublayers {
            let here = under(&p, &all, s);
            let reduces: Vec<_> = here.iter().filter(|c| c.kind == "all_reduce").collect();
            assert_eq!(
                reduces.len(),
                1,
                "mesh {mesh}, {s}: {:?}",
                here.iter().map(|c| (c.kind, &c.axes)).collect::<Vec<_>>()
            );
            assert_eq!(reduces[0].axes, ["model"], "mesh {mesh}, {s}");
            assert_eq!(here.len(), 1, "mesh {mesh}, {s}: only the all-reduce");
        }
        // The norms between the sub-layers communicate nothing.
        for l in 0..2 {
            for side in ["encoder", "decoder"] {
                let norms: Vec<_> = under(&p, &all, &format!("{side}/layer{l}"))
                    .into_iter()
                    .filter(|c| {
                        !sublayers.iter().any(|s| {
                            p.scope(ir::ValueId(c.index as u32))
                                .path
                                .starts_with(s.as_str())
                        })
                    })
                    .collect();
                assert!(norms.is_empty(), "mesh {mesh}: {norms:?}");
            }
        }
    }
}

#[test]
fn two_d_experts_keep_the_all_to_alls_of_the_expert_axis() {
    let a2a = |mesh: Mesh, layout: Layout| {
        let cfg = tp_config(2);
        let (p, _) = training_step_of(mesh, layout, &cfg, Packing::Padded, 4);
        let part = spmd::compile(&p).unwrap().program;
        collectives(&part)
            .into_iter()
            .filter(|c| c.kind == "all_to_all")
            .map(|c| (c.axes, c.shape, c.bytes))
            .collect::<Vec<_>>()
    };
    let (m1, l1) = mesh(1, 2, 1);
    let (m2, l2) = mesh(1, 2, 2);
    let one = a2a(m1, l1);
    assert_eq!(one.len(), 8);
    // The model axis splits each expert's hidden dim, not its tokens: the same exchanges.
    assert_eq!(a2a(m2, l2), one);
}

#[test]
fn sharded_weights_are_gathered_before_use_and_their_gradients_reduce_scattered() {
    let mut cfg = tp_config(1);
    cfg.moe = None;
    cfg.moe_every = 0;
    for (d, m) in [(2, 1), (2, 2)] {
        let (mesh, mut layout) = mesh(d, 1, m);
        layout.weight_axes = axes(&["data"]);
        let (p, specs) = training_step(mesh.clone(), layout, &cfg, Packing::Padded);
        // Stored split over data: the FFN's weights (dim 0 of wi [M,F], of wo [F,M]).
        let wi = p.param("decoder/layer0/ffn/wi").unwrap();
        let stored = p.instr(wi).sharding.as_ref().unwrap().to_string();
        assert!(
            stored.starts_with("{data"),
            "mesh {mesh}: wi stored {stored}"
        );
        let ins = inputs(&p, &specs, cfg.vocab, cfg.src_vocab.unwrap());
        let part = assert_spmd_matches(&p, &ins, Tol::new(1e-9, 1e-11));
        let q = &part.program;
        let all = collectives(q);
        for layer in ["decoder/layer0/ffn", "encoder/layer0/ffn"] {
            let here = under(q, &all, layer);
            let gathers = here.iter().filter(|c| c.kind == "all_gather").count();
            // wi, wo and the norm's scale, each gathered once over data.
            assert_eq!(gathers, 3, "mesh {mesh}, {layer}: {here:?}");
            assert!(here
                .iter()
                .all(|c| c.axes.contains(&"data".to_string()) || c.axes == ["model"]));
            // The backward pass reduce-scatters the two matrices' gradients (the norm
            // scale's is summed from activations moved by an all-to-all) and all-reduces
            // none over data.
            let grads: Vec<_> = all
                .iter()
                .filter(|c| {
                    let s = q.scope(ir::ValueId(c.index as u32));
                    s.grad && s.path.starts_with(layer) && c.axes.contains(&"data".to_string())
                })
                .collect();
            let rs = grads.iter().filter(|c| c.kind == "reduce_scatter").count();
            assert_eq!(rs, 2, "mesh {mesh}, {layer}: {grads:?}");
            assert!(
                grads.iter().all(|c| c.kind != "all_reduce"),
                "mesh {mesh}, {layer}: {grads:?}"
            );
        }
    }
}
