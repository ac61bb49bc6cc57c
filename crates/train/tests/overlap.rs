//! `model.overlap = k`: the MoE layers' expert buffers cut into `k` chunks along capacity,
//! each with its own all-to-alls (so an executor that overlaps collectives with compute
//! runs one chunk's all-to-all during another's experts). Training with k = 2 and 4 at 8
//! in-process devices (mesh data=2 x expert=4) gives the losses, gradient norms and every
//! updated weight of k = 1 bit for bit; so does one MoE layer's loss and four gradients,
//! with the executor's start/wait all-to-alls (`ExecOptions::overlap`) on and off; the
//! per-device step program holds k all-to-alls per direction per MoE layer; a k that does
//! not divide the capacity is a one-line error.

mod common;

use common::{scratch, trajectory};

use train::config::TrainConfig;
use train::data::Corpus;
use train::trainer::{run, RunOptions};

fn tiny(overlap: usize) -> TrainConfig {
    let mut c = common::tiny_moe(2, 4, 16, 2);
    c.model.overlap = overlap;
    c
}

#[test]
fn chunked_moe_layers_train_bit_for_bit_like_unchunked_ones() {
    let c: Corpus = common::corpus(400, &["de"]);
    let base = scratch("overlap", "1");
    run(&tiny(1), &c, &RunOptions::new(base.clone()), &mut |_| {}).unwrap();
    let want = trajectory(&base);
    assert_eq!(want.0.len(), 2);
    assert!(want.1.iter().any(|(n, _)| n.ends_with("moe/wi")));
    for k in [2, 4] {
        let dir = scratch("overlap", &k.to_string());
        run(&tiny(k), &c, &RunOptions::new(dir.clone()), &mut |_| {}).unwrap();
        let got = trajectory(&dir);
        assert_eq!(
            got.0, want.0,
            "overlap {k}: losses or gradient norms differ"
        );
        assert_eq!(got.1.len(), want.1.len(), "overlap {k}: tensors");
        for ((n, g), (m, w)) in got.1.iter().zip(&want.1) {
            assert_eq!(n, m);
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "overlap {k}: `{n}` differs from overlap 1");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&base).ok();
}

/// All-to-alls of the per-device step program: (forward, backward).
fn all_to_alls(cfg: &TrainConfig) -> (usize, usize) {
    let step = train::trainer::step_program(cfg, 300).unwrap();
    let part = spmd::compile(&step.program).unwrap();
    let p = &part.program;
    let mut n = (0, 0);
    for ins in &p.instrs {
        if ins.op.name() == "all_to_all" {
            if p.scopes.is_grad(ins.scope) {
                n.1 += 1;
            } else {
                n.0 += 1;
            }
        }
    }
    n
}

#[test]
fn each_chunk_has_its_own_all_to_alls() {
    // Two MoE layers (one in the encoder, one in the decoder), each with a dispatch and a
    // combine all-to-all per chunk in each direction.
    for (k, want) in [(1, (4, 4)), (2, (8, 8)), (4, (16, 16))] {
        assert_eq!(all_to_alls(&tiny(k)), want, "overlap {k}");
    }
}

#[test]
fn an_overlap_that_does_not_divide_the_capacity_is_a_one_line_error() {
    // The default model: groups of 256 tokens, 8 experts, capacity factor 2: C = 128.
    for (text, needle) in [
        (
            "[model]\noverlap = 3\n",
            "does not divide the expert capacity 128: use one of its divisors (1, 2, 4, 8, 16, 32, 64, 128)",
        ),
        ("[model]\noverlap = 0\n", "model.overlap = 0"),
    ] {
        let e = TrainConfig::from_toml(text, "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.overlap") && e.contains(needle) && !e.contains('\n'),
            "{e}"
        );
    }
    TrainConfig::from_toml("[model]\noverlap = 4\n", "c.toml").unwrap();
}

/// One MoE layer (top-2, groups over data x expert, experts over expert) with its loss and
/// four gradients at 8 devices, cut into `k` chunks; outputs by name.
fn moe_layer_grads(
    k: usize,
    overlap: bool,
) -> std::collections::HashMap<String, runtime::HostTensor> {
    use ir::{Builder, DType, Mesh, Type};
    use nn::moe::{moe_layer_with, Gate, MoeLayerOptions, MoeSharding, MoeWeights, Route, Top2};
    let (g, s, e, m, h, c) = (8, 16, 4, 16, 32, 16);
    let b = Builder::with_mesh(Mesh::new(&[("data", 2), ("expert", 4)]).unwrap());
    let t = |shape: &[usize]| Type::new(DType::F32, shape.to_vec());
    let x = b.param("x", t(&[g, s, m]));
    let wg = b.param("wg", t(&[m, e]));
    let wi = b.param("wi", t(&[e, m, h]));
    let wo = b.param("wo", t(&[e, h, m]));
    let lw = b.param("lw", t(&[g, s, m]));
    let layout = MoeSharding {
        group_axes: vec!["data".into(), "expert".into()],
        expert_axes: vec!["expert".into()],
        model_axes: vec![],
    };
    let noise = b.param("noise", t(&[g, s]));
    let gate = Gate::Top2(Top2 {
        policy: nn::moe::SecondPolicy::Random { threshold: 0.5 },
        ..Top2::new(c)
    });
    let opts = MoeLayerOptions {
        sharding: Some(&layout),
        overlap_chunks: k,
    };
    let w = MoeWeights {
        wg: &wg,
        wi: &wi,
        wo: &wo,
    };
    let route = Route::new(&gate).noise(Some(&noise));
    let out = moe_layer_with(&x, w, route, nn::moe::Activation::Relu, opts).unwrap();
    let aux = out.gating.as_top2().unwrap().aux_loss.mul(0.01);
    b.output("loss", &out.y.mul(&lw).sum_all().add(&aux));
    let p = autodiff::grad(&b.finish(), "loss", &["x", "wg", "wi", "wo"]).unwrap();
    let part = spmd::compile(&p).unwrap();
    let mut inputs = std::collections::HashMap::new();
    for (i, (name, v)) in p.params().into_iter().enumerate() {
        let ty = p.ty(v).clone();
        let vals: Vec<f64> = (0..ty.num_elements())
            .map(|j| {
                let u = ((j * 7919 + i * 104729) % 1000) as f64 / 1000.0;
                if name == "noise" {
                    u
                } else {
                    (2.0 * u - 1.0) * 0.7
                }
            })
            .collect();
        inputs.insert(
            name.to_string(),
            runtime::HostTensor::from_f64_values(ty, &vals),
        );
    }
    let per_dev: Vec<std::collections::HashMap<String, std::sync::Arc<runtime::HostTensor>>> =
        driver::shard_inputs(&part, &inputs)
            .unwrap()
            .into_iter()
            .map(|m| {
                m.into_iter()
                    .map(|(k, v)| (k, std::sync::Arc::new(v)))
                    .collect()
            })
            .collect();
    let opts = runtime::ExecOptions::native().with_overlap(overlap);
    let exe = runtime::Executable::with_options(&part.program, opts).unwrap();
    let comm = runtime::InProcess::new(8).with_comm_thread(overlap);
    let r = exe.run_shared(&comm, &per_dev, None).unwrap();
    driver::assemble_outputs(&part, &r.outputs)
}

#[test]
fn a_chunked_moe_layer_gives_the_unchunked_gradients_bit_for_bit() {
    let want = moe_layer_grads(1, false);
    for (k, overlap) in [(1, true), (2, false), (2, true), (4, true)] {
        let got = moe_layer_grads(k, overlap);
        let mut names: Vec<&String> = want.keys().collect();
        names.sort();
        for name in names {
            let (a, b) = (got[name].to_f64_vec(), want[name].to_f64_vec());
            let bad = a
                .iter()
                .zip(&b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(
                bad,
                0,
                "k {k}, overlap {overlap}: {name}: {bad} of {} differ",
                b.len()
            );
        }
    }
}
