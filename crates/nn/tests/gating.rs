//! The routers of `nn::gating` (Switch top-1, Shazeer noisy top-k, expert choice) and the
//! dropless capacity, checked against hand-computed cases and against naive token-by-token
//! implementations written here in plain f64 Rust loops (independent of the IR code);
//! gradients against finite differences; every router (Shazeer's hierarchical one too, whose
//! own checks are in `hierarchical.rs`) inside `moe_layer` with GShard's 1-D
//! annotations partitions on meshes `[expert=2]` and `[expert=4]` and equals the
//! single-device run.

use ir::{Builder, DType, Mesh, Program, Type, Value};
use nn::capacity::dropless_capacity;
use nn::gating::{
    cv_squared, expert_choice_gating, noisy_top_k_gating, switch_gating, switch_router_logits,
    ExpertChoice, NoisyTopK, Switch,
};
use nn::hierarchical::Hierarchical;
use nn::moe::{
    moe_layer, top2_gating, Activation, Gate, HierarchicalNoiseWeights, MoeSharding, MoeWeights,
    Route, Top2,
};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::spmd::assert_spmd_matches;
use testkit::{check_grads, Tol};

#[path = "gating/naive.rs"]
mod naive;
use naive::*;

// ---- Switch top-1 ----

/// A program of `switch_gating` on logits parameter `[G,S,E]` (and optional paddings).
fn switch_program(gse: [usize; 3], c: usize, pads: bool) -> Program {
    let b = Builder::new();
    let logits = b.param("logits", f64t(&gse));
    let p = pads.then(|| b.param("pads", f64t(&gse[..2])));
    let r = switch_gating(&logits, &Switch::new(c), p.as_ref());
    for (n, v) in [
        ("combine", &r.combine),
        ("dispatch", &r.dispatch),
        ("aux", &r.aux_loss),
        ("z", &r.z_loss),
        ("index", &r.index),
        ("gate", &r.gate),
        ("pos", &r.pos),
        ("kept", &r.kept),
        ("over", &r.over_capacity),
        ("density", &r.density),
    ] {
        b.output(n, v);
    }
    b.finish()
}

#[test]
fn switch_routes_by_argmax_with_raw_probability_gates() {
    let logits = [2.0, 1.0, 0.0, 0.0, 3.0, 1.0, 1.0, 0.0, 2.0, 0.5, 0.2, 0.1];
    let out = run(
        &switch_program([1, 4, 3], 2, false),
        &[("logits", host(&[1, 4, 3], &logits))],
    );
    assert_eq!(vals(&out, "index"), [0.0, 1.0, 2.0, 0.0]);
    assert_eq!(vals(&out, "kept"), [1.0; 4]);
    assert_eq!(vals(&out, "pos"), [0.0, 0.0, 0.0, 1.0]);
    // Raw probabilities, not renormalised: e^2 / (e^2 + e + 1) for the first row.
    let e = std::f64::consts::E;
    let g0 = e * e / (e * e + e + 1.0);
    let g1 = e.powi(3) / (1.0 + e.powi(3) + e);
    let g2 = e * e / (e + 1.0 + e * e);
    let g3 = 1.0 / (1.0 + (-0.3f64).exp() + (-0.4f64).exp());
    close("gate", &vals(&out, "gate"), &[g0, g1, g2, g3], 1e-14);
    let mut want = vec![0.0; 4 * 3 * 2];
    want[0] = g0; // t0 e0 c0
    want[(3 + 1) * 2] = g1; // t1 e1 c0
    want[(6 + 2) * 2] = g2; // t2 e2 c0
    want[9 * 2 + 1] = g3; // t3 e0 c1
    close("combine", &vals(&out, "combine"), &want, 1e-14);
    assert_eq!(vals(&out, "dispatch"), nonzero(&want));
    assert_eq!(scalar(&out, "over"), 0.0);
}

#[test]
fn switch_capacity_drops_later_tokens_in_token_order() {
    // Expert 0 is the argmax of tokens 0, 1, 3, 4 and has 2 slots: tokens 3 and 4 are
    // dropped although token 4 is the most confident (priority is token order).
    let logits = [3.0, 0.0, 2.0, 0.0, 0.0, 1.0, 1.0, 0.0, 4.0, 0.0];
    let p = switch_program([1, 5, 2], 2, true);
    let out = run(
        &p,
        &[
            ("logits", host(&[1, 5, 2], &logits)),
            ("pads", host(&[1, 5], &[0.0; 5])),
        ],
    );
    assert_eq!(vals(&out, "kept"), [1.0, 1.0, 1.0, 0.0, 0.0]);
    assert_eq!(vals(&out, "pos"), [0.0, 1.0, 0.0, 0.0, 0.0]);
    assert_eq!(vals(&out, "gate")[3..], [0.0, 0.0]);
    close("over", &[scalar(&out, "over")], &[2.0 / 5.0], 1e-15);
    // A padding token routes nowhere and frees its slot: with token 1 a pad, token 3 gets
    // slot 1 and only token 4 is dropped.
    let out = run(
        &p,
        &[
            ("logits", host(&[1, 5, 2], &logits)),
            ("pads", host(&[1, 5], &[0.0, 1.0, 0.0, 0.0, 0.0])),
        ],
    );
    assert_eq!(vals(&out, "kept"), [1.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(vals(&out, "pos"), [0.0, 0.0, 0.0, 1.0, 0.0]);
    close("over", &[scalar(&out, "over")], &[1.0 / 4.0], 1e-15);
    let combine = vals(&out, "combine");
    assert!(
        combine[4..8].iter().all(|&v| v == 0.0),
        "pad row {combine:?}"
    );
}

#[test]
fn switch_losses_match_hand_values_and_naive_loops() {
    // Uniform logits: every token ties and goes to expert 0 (lowest index): density
    // [1,0,0,0], proxy 1/4 each, so aux = 16 * mean([1/4,0,0,0]) = 1; z = (ln 4)^2.
    let out = run(
        &switch_program([1, 4, 4], 4, false),
        &[("logits", host(&[1, 4, 4], &[0.0; 16]))],
    );
    close("aux", &[scalar(&out, "aux")], &[1.0], 1e-14);
    close("z", &[scalar(&out, "z")], &[4f64.ln().powi(2)], 1e-14);
    assert_eq!(vals(&out, "density"), [1.0, 0.0, 0.0, 0.0]);

    let (g, s, e, c) = (3, 6, 4, 2);
    // Expert 0 is favoured so that some groups overflow it.
    let logits: Vec<f64> = rand_vec(1, g * s * e, 3.0)
        .iter()
        .enumerate()
        .map(|(i, v)| if i % e == 0 { v + 2.0 } else { *v })
        .collect();
    let mut pads = vec![0.0; g * s];
    for t in [2, 14, 15, 16, 17] {
        pads[t] = 1.0;
    }
    let want = naive_switch(&logits, (g, s, e, c), Some(&pads));
    let out = run(
        &switch_program([g, s, e], c, true),
        &[
            ("logits", host(&[g, s, e], &logits)),
            ("pads", host(&[g, s], &pads)),
        ],
    );
    close("combine", &vals(&out, "combine"), &want.combine, 1e-13);
    assert_eq!(vals(&out, "dispatch"), nonzero(&want.combine));
    assert_eq!(vals(&out, "index"), want.index);
    assert_eq!(vals(&out, "kept"), want.kept);
    close("aux", &[scalar(&out, "aux")], &[want.aux], 1e-13);
    close("z", &[scalar(&out, "z")], &[want.z], 1e-13);
    assert!(
        want.kept.iter().sum::<f64>() < 13.0,
        "the case must drop tokens"
    );
}

#[test]
fn switch_jitter_changes_routing_only_through_the_router_inputs() {
    // Router = identity: logits = x'. Token 0 nearly ties (1.0 vs 1.005): no jitter -> e1;
    // jitter multipliers (1.01, 0.99) -> x' = (1.01, 0.99495) -> e0.
    let (g, s, m) = (1, 2, 2);
    let x = [1.0, 1.005, 2.0, 1.0];
    let b = Builder::new();
    let xv = b.param("x", f64t(&[g, s, m]));
    let wg = b.param("wg", f64t(&[m, 2]));
    let u = b.param("u", f64t(&[g, s, m]));
    let cfg = Switch::new(2);
    let plain = switch_gating(
        &switch_router_logits(&xv, &wg, cfg.jitter_eps, None),
        &cfg,
        None,
    );
    let jit = switch_gating(
        &switch_router_logits(&xv, &wg, cfg.jitter_eps, Some(&u)),
        &cfg,
        None,
    );
    b.output("plain_index", &plain.index);
    b.output("plain_combine", &plain.combine);
    b.output("jit_index", &jit.index);
    b.output("jit_combine", &jit.combine);
    b.output("jit_aux", &jit.aux_loss);
    let p = b.finish();
    let eye = host(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    // u = 1/2 is the multiplier 1: identical to no jitter.
    let out = run(
        &p,
        &[
            ("x", host(&[g, s, m], &x)),
            ("wg", eye.clone()),
            ("u", host(&[g, s, m], &[0.5; 4])),
        ],
    );
    assert_eq!(vals(&out, "jit_index"), vals(&out, "plain_index"));
    close(
        "combine",
        &vals(&out, "jit_combine"),
        &vals(&out, "plain_combine"),
        1e-15,
    );
    // u = (1, 0) on token 0: the multiplier (1.01, 0.99) flips its expert; the result is
    // exactly routing of the jittered inputs x * U computed outside.
    let uv = [1.0, 0.0, 0.5, 0.5];
    let out = run(
        &p,
        &[
            ("x", host(&[g, s, m], &x)),
            ("wg", eye.clone()),
            ("u", host(&[g, s, m], &uv)),
        ],
    );
    assert_eq!(vals(&out, "plain_index"), [1.0, 0.0]);
    assert_eq!(vals(&out, "jit_index"), [0.0, 0.0]);
    let xj: Vec<f64> = x
        .iter()
        .zip(uv)
        .map(|(x, u)| x * (1.0 - 0.01 + 0.02 * u))
        .collect();
    let want = naive_switch(&xj, (g, s, 2, 2), None);
    close("combine", &vals(&out, "jit_combine"), &want.combine, 1e-14);
    close("aux", &[scalar(&out, "jit_aux")], &[want.aux], 1e-14);

    // Inside the layer, the experts receive the un-jittered x.
    let b = Builder::new();
    let xv = b.param("x", f64t(&[g, s, m]));
    let wg = b.param("wg", f64t(&[m, 2]));
    let wi = b.param("wi", f64t(&[2, m, 3]));
    let wo = b.param("wo", f64t(&[2, 3, m]));
    let u = b.param("u", f64t(&[g, s, m]));
    let gate = Gate::Switch(cfg);
    let out = moe_layer(
        &xv,
        MoeWeights {
            wg: &wg,
            wi: &wi,
            wo: &wo,
        },
        Route::new(&gate).noise(Some(&u)),
        Activation::Relu,
        None,
    )
    .unwrap();
    b.output("xin", &out.expert_inputs);
    let p = b.finish();
    let out = run(
        &p,
        &[
            ("x", host(&[g, s, m], &x)),
            ("wg", eye),
            ("wi", host(&[2, m, 3], &[0.0; 12])),
            ("wo", host(&[2, 3, m], &[0.0; 12])),
            ("u", host(&[g, s, m], &uv)),
        ],
    );
    // xin [E,G,C,M]: expert 0 holds token 0 at slot 0 and token 1 at slot 1.
    assert_eq!(
        vals(&out, "xin"),
        [1.0, 1.005, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    );
}

// ---- noisy top-k ----

struct NoisyCase {
    g: usize,
    s: usize,
    e: usize,
    k: usize,
    c: usize,
    noise: bool,
    pads: bool,
}

fn noisy_program(nc: &NoisyCase) -> Program {
    let b = Builder::new();
    let gse = [nc.g, nc.s, nc.e];
    let clean = b.param("clean", f64t(&gse));
    let raw = nc.noise.then(|| b.param("raw", f64t(&gse)));
    let n = nc.noise.then(|| b.param("n", f64t(&gse)));
    let p = nc.pads.then(|| b.param("pads", f64t(&gse[..2])));
    let r = noisy_top_k_gating(
        &clean,
        raw.as_ref().zip(n.as_ref()),
        &NoisyTopK::new(nc.k, nc.c),
        p.as_ref(),
    );
    for (name, v) in [
        ("noisy", &r.noisy_logits),
        ("gates", &r.gates),
        ("combine", &r.combine),
        ("dispatch", &r.dispatch),
        ("importance", &r.importance),
        ("load", &r.load),
        ("importance_loss", &r.importance_loss),
        ("load_loss", &r.load_loss),
        ("top_index", &r.top_index),
        ("top_gates", &r.top_gates),
        ("pos", &r.pos),
        ("kept", &r.kept),
        ("over", &r.over_capacity),
    ] {
        b.output(name, v);
    }
    b.finish()
}

/// Run the IR router and the naive loops on one random case and compare everything.
fn check_noisy_against_naive(nc: &NoisyCase, seed: u64) -> NaiveNoisy {
    let (g, s, e) = (nc.g, nc.s, nc.e);
    let n_el = g * s * e;
    let clean = rand_vec(seed, n_el, 2.0);
    let raw = rand_vec(seed + 1, n_el, 1.5);
    let n = normal_vec(seed + 2, n_el);
    let pads: Vec<f64> = (0..g * s)
        .map(|t| if nc.pads && t % 4 == 3 { 1.0 } else { 0.0 })
        .collect();
    let want = naive_noisy(
        &clean,
        nc.noise.then_some((raw.as_slice(), n.as_slice())),
        (g, s, e, nc.k, nc.c),
        nc.pads.then_some(pads.as_slice()),
    );
    let mut ins = vec![("clean", host(&[g, s, e], &clean))];
    if nc.noise {
        ins.push(("raw", host(&[g, s, e], &raw)));
        ins.push(("n", host(&[g, s, e], &n)));
    }
    if nc.pads {
        ins.push(("pads", host(&[g, s], &pads)));
    }
    let out = run(&noisy_program(nc), &ins);
    let what = format!("k={} noise={} pads={}", nc.k, nc.noise, nc.pads);
    close(
        &format!("noisy ({what})"),
        &vals(&out, "noisy"),
        &want.noisy,
        1e-14,
    );
    close(
        &format!("gates ({what})"),
        &vals(&out, "gates"),
        &want.gates,
        1e-13,
    );
    close(
        &format!("combine ({what})"),
        &vals(&out, "combine"),
        &want.combine,
        1e-13,
    );
    assert_eq!(
        vals(&out, "dispatch"),
        nonzero(&want.combine),
        "dispatch ({what})"
    );
    assert_eq!(vals(&out, "kept"), want.kept, "kept ({what})");
    close(
        &format!("importance ({what})"),
        &vals(&out, "importance"),
        &want.importance,
        1e-13,
    );
    close(
        &format!("load ({what})"),
        &vals(&out, "load"),
        &want.load,
        1e-12,
    );
    close(
        &format!("losses ({what})"),
        &[scalar(&out, "importance_loss"), scalar(&out, "load_loss")],
        &[cv2(&want.importance), cv2(&want.load)],
        1e-12,
    );
    want
}

#[test]
fn noisy_top_k_without_noise_is_a_softmax_over_the_top_k_logits() {
    for k in 1..=4 {
        let nc = NoisyCase {
            g: 2,
            s: 5,
            e: 4,
            k,
            c: 3,
            noise: false,
            pads: false,
        };
        let want = check_noisy_against_naive(&nc, 10 + k as u64);
        // Without noise the load is the count of non-zero gates: k per token.
        assert_eq!(want.load.iter().sum::<f64>(), (10 * k) as f64);
    }
    // A hand case: logits (1, 3, 2, 0), k = 2 -> softmax over (3, 2) on experts 1 and 2.
    let nc = NoisyCase {
        g: 1,
        s: 1,
        e: 4,
        k: 2,
        c: 1,
        noise: false,
        pads: false,
    };
    let out = run(
        &noisy_program(&nc),
        &[("clean", host(&[1, 1, 4], &[1.0, 3.0, 2.0, 0.0]))],
    );
    let w = 1.0 / (1.0 + (-1f64).exp());
    close(
        "gates",
        &vals(&out, "gates"),
        &[0.0, w, 1.0 - w, 0.0],
        1e-15,
    );
    assert_eq!(vals(&out, "top_index"), [1.0, 2.0]);
}

#[test]
fn noisy_top_k_estimators_match_the_naive_formulas_with_noise() {
    for (k, pads) in [(1, false), (2, false), (2, true), (3, true)] {
        let nc = NoisyCase {
            g: 2,
            s: 8,
            e: 5,
            k,
            c: 3,
            noise: true,
            pads,
        };
        let want = check_noisy_against_naive(&nc, 100 + k as u64);
        // The smooth load is a probability per (token, expert), summed: within [0, tokens].
        assert!(want.load.iter().all(|&l| (0.0..=16.0).contains(&l)));
    }
    // k = E: there is no (k+1)-th logit; the load falls back to counting (T2T).
    let nc = NoisyCase {
        g: 1,
        s: 4,
        e: 3,
        k: 3,
        c: 4,
        noise: true,
        pads: false,
    };
    let want = check_noisy_against_naive(&nc, 7);
    assert_eq!(want.load, [4.0; 3]);
}

#[test]
fn noisy_top_k_fills_capacity_rank_by_rank() {
    // k=2, C=2. Rank-1 picks: t0 e0, t1 e0, t2 e1; rank-2: t0 e1, t1 e2, t2 e0.
    // Rank 1 fills e0 slots 0,1 and e1 slot 0; rank 2 then starts after those counts:
    // t0 -> e1 slot 1, t1 -> e2 slot 0, t2 -> e0 at position 2: dropped.
    let nc = NoisyCase {
        g: 1,
        s: 3,
        e: 3,
        k: 2,
        c: 2,
        noise: false,
        pads: false,
    };
    let logits = [3.0, 2.0, 0.0, 3.0, 0.0, 2.0, 2.0, 3.0, 0.0];
    let out = run(&noisy_program(&nc), &[("clean", host(&[1, 3, 3], &logits))]);
    assert_eq!(vals(&out, "top_index"), [0.0, 1.0, 0.0, 2.0, 1.0, 0.0]);
    assert_eq!(vals(&out, "kept"), [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(vals(&out, "pos"), [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
    close("over", &[scalar(&out, "over")], &[1.0 / 6.0], 1e-15);
    let w = 1.0 / (1.0 + (-1f64).exp());
    let mut want = vec![0.0; 3 * 3 * 2];
    let at = |t: usize, e: usize, c: usize| (t * 3 + e) * 2 + c;
    want[at(0, 0, 0)] = w;
    want[at(0, 1, 1)] = 1.0 - w;
    want[at(1, 0, 1)] = w;
    want[at(1, 2, 0)] = 1.0 - w;
    want[at(2, 1, 0)] = w;
    close("combine", &vals(&out, "combine"), &want, 1e-15);
    check_noisy_against_naive(&nc, 3);
}

#[test]
fn cv_squared_is_t2t_and_safe_at_the_edges() {
    let b = Builder::new();
    let zeros = b.param("zeros", f64t(&[4]));
    let one = b.param("one", f64t(&[1]));
    let x = b.param("x", f64t(&[4]));
    b.output("zeros", &cv_squared(&zeros));
    b.output("one", &cv_squared(&one));
    b.output("x", &cv_squared(&x));
    let out = run(
        &b.finish(),
        &[
            ("zeros", host(&[4], &[0.0; 4])),
            ("one", host(&[1], &[3.7])),
            ("x", host(&[4], &[1.0, 2.0, 3.0, 4.0])),
        ],
    );
    // All zeros: 0 / (0 + 1e-10) = 0, not NaN. One example: variance ~0.
    assert_eq!(scalar(&out, "zeros"), 0.0);
    let one = scalar(&out, "one");
    assert!(
        one.is_finite() && one.abs() < 1e-15,
        "cv^2 of one value: {one}"
    );
    close("one", &[one], &[cv2(&[3.7])], 1e-12);
    // Population variance 1.25 over mean^2 6.25 = 0.2 (up to the epsilons).
    close("x", &[scalar(&out, "x")], &[0.2], 1e-9);
    close(
        "x",
        &[scalar(&out, "x")],
        &[cv2(&[1.0, 2.0, 3.0, 4.0])],
        1e-14,
    );
}

// ---- expert choice ----

fn expert_choice_program(gse: [usize; 3], c: usize, pads: bool) -> Program {
    let b = Builder::new();
    let logits = b.param("logits", f64t(&gse));
    let p = pads.then(|| b.param("pads", f64t(&gse[..2])));
    let r = expert_choice_gating(&logits, &ExpertChoice { capacity: c }, p.as_ref());
    for (n, v) in [
        ("combine", &r.combine),
        ("dispatch", &r.dispatch),
        ("selected", &r.selected),
        ("top_index", &r.top_index),
        ("experts_per_token", &r.experts_per_token),
        ("unrouted", &r.unrouted),
        ("raw", &r.raw_gates),
    ] {
        b.output(n, v);
    }
    b.finish()
}

#[test]
fn expert_choice_gives_each_expert_its_c_best_tokens() {
    let (g, s, e, c) = (2, 6, 3, 2);
    let logits = rand_vec(5, g * s * e, 2.0);
    let out = run(
        &expert_choice_program([g, s, e], c, false),
        &[("logits", host(&[g, s, e], &logits))],
    );
    let want = naive_expert_choice(&logits, (g, s, e, c), None);
    close("combine", &vals(&out, "combine"), &want.combine, 1e-14);
    assert_eq!(vals(&out, "dispatch"), nonzero(&want.combine));
    assert_eq!(vals(&out, "selected"), want.selected);
    let sel = vals(&out, "selected");
    for gi in 0..g {
        for ei in 0..e {
            let n: f64 = (0..s).map(|si| sel[(gi * s + si) * e + ei]).sum();
            assert_eq!(n, c as f64, "group {gi} expert {ei}");
        }
    }
    // Combine weights are the router probabilities of the chosen (token, expert) pairs.
    let raw = vals(&out, "raw");
    let comb = vals(&out, "combine");
    for (i, &sv) in sel.iter().enumerate() {
        let w: f64 = comb[i * c..(i + 1) * c].iter().sum();
        assert_eq!(w, sv * raw[i]);
    }
    let ept = vals(&out, "experts_per_token");
    let none = ept.iter().filter(|&&n| n == 0.0).count() as f64;
    close(
        "unrouted",
        &[scalar(&out, "unrouted")],
        &[none / 12.0],
        1e-15,
    );

    // A hand case: S=3, E=2, C=1. P[:,0] = (0.73, 0.5, 0.12): expert 0 takes token 0;
    // P[:,1] = (0.27, 0.5, 0.88): expert 1 takes token 2; token 1 gets no expert.
    let out = run(
        &expert_choice_program([1, 3, 2], 1, false),
        &[("logits", host(&[1, 3, 2], &[1.0, 0.0, 0.0, 0.0, 0.0, 2.0]))],
    );
    assert_eq!(vals(&out, "top_index"), [0.0, 2.0]);
    assert_eq!(vals(&out, "experts_per_token"), [1.0, 0.0, 1.0]);
    let p0 = 1.0 / (1.0 + (-1f64).exp());
    let p2 = 1.0 / (1.0 + (-2f64).exp());
    close(
        "combine",
        &vals(&out, "combine"),
        &[p0, 0.0, 0.0, 0.0, 0.0, p2],
        1e-15,
    );
}

#[test]
fn expert_choice_takes_fewer_tokens_when_a_group_is_mostly_padding() {
    let (g, s, e, c) = (2, 6, 3, 2);
    let logits = rand_vec(6, g * s * e, 2.0);
    // Group 0: one pad; group 1: only token 7 is real.
    let mut pads = vec![0.0; 12];
    pads[1] = 1.0;
    for t in [6, 8, 9, 10, 11] {
        pads[t] = 1.0;
    }
    let out = run(
        &expert_choice_program([g, s, e], c, true),
        &[
            ("logits", host(&[g, s, e], &logits)),
            ("pads", host(&[g, s], &pads)),
        ],
    );
    let want = naive_expert_choice(&logits, (g, s, e, c), Some(&pads));
    close("combine", &vals(&out, "combine"), &want.combine, 1e-14);
    assert_eq!(vals(&out, "selected"), want.selected);
    let sel = vals(&out, "selected");
    for ei in 0..e {
        let n0: f64 = (0..s).map(|si| sel[si * e + ei]).sum();
        let n1: f64 = (0..s).map(|si| sel[(s + si) * e + ei]).sum();
        assert_eq!((n0, n1), (2.0, 1.0), "expert {ei}");
        assert_eq!(sel[e + ei], 0.0, "a pad is never chosen");
    }
    assert_eq!(vals(&out, "experts_per_token")[7], 3.0);
}

// ---- gradients ----

/// `x [G,S,M]`, `wg [M,E]` (and `wn [M,E]`), a fixed weight `w` on the combine; the loss is
/// `sum(combine * w)` plus the router's unweighted losses.
fn grad_inputs(
    g: usize,
    s: usize,
    m: usize,
    e: usize,
    c: usize,
) -> Vec<(&'static str, HostTensor)> {
    vec![
        ("x", host(&[g, s, m], &rand_vec(21, g * s * m, 1.0))),
        ("wg", host(&[m, e], &rand_vec(22, m * e, 1.5))),
        ("wn", host(&[m, e], &rand_vec(23, m * e, 1.0))),
        ("n", host(&[g, s, e], &normal_vec(24, g * s * e))),
        (
            "u",
            host(
                &[g, s, m],
                &rand_vec(25, g * s * m, 0.5)
                    .iter()
                    .map(|v| v + 0.5)
                    .collect::<Vec<_>>(),
            ),
        ),
        ("w", host(&[g, s, e, c], &rand_vec(26, g * s * e * c, 1.0))),
    ]
}

fn grad_case(
    gsmec: [usize; 5],
    wrt: &[&str],
    build: impl Fn(&Builder, &Value, &Value) -> (Value, Vec<Value>),
) {
    let [g, s, m, e, c] = gsmec;
    let b = Builder::new();
    let x = b.param("x", f64t(&[g, s, m]));
    let wg = b.param("wg", f64t(&[m, e]));
    let w = b.param("w", f64t(&[g, s, e, c]));
    let (combine, losses) = build(&b, &x, &wg);
    let mut loss = combine.mul(&w).sum_all();
    for l in &losses {
        loss = loss.add(l);
    }
    b.output("loss", &loss);
    let p = b.finish();
    let names: Vec<String> = p.params().iter().map(|(n, _)| n.to_string()).collect();
    let ins: HashMap<String, HostTensor> = grad_inputs(g, s, m, e, c)
        .into_iter()
        .filter(|(n, _)| names.iter().any(|k| k == n))
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    check_grads(&p, "loss", wrt, &ins, Tol::FD);
}

#[test]
fn switch_gradients_match_finite_differences() {
    grad_case([2, 4, 3, 3, 2], &["x", "wg"], |b, x, wg| {
        let u = b.param("u", f64t(&x.shape()));
        let logits = switch_router_logits(x, wg, 1e-2, Some(&u));
        let r = switch_gating(&logits, &Switch::new(2), None);
        (r.combine, vec![r.aux_loss, r.z_loss])
    });
}

#[test]
fn noisy_top_k_gradients_match_finite_differences() {
    grad_case([2, 4, 3, 4, 2], &["x", "wg", "wn"], |b, x, wg| {
        let (e, sh) = (wg.shape()[1], x.shape());
        let wn = b.param("wn", f64t(&[sh[2], e]));
        let n = b.param("n", f64t(&[sh[0], sh[1], e]));
        let clean = b.einsum("GSM,ME->GSE", &[x, wg]);
        let raw = b.einsum("GSM,ME->GSE", &[x, &wn]);
        let r = noisy_top_k_gating(&clean, Some((&raw, &n)), &NoisyTopK::new(2, 2), None);
        (r.combine, vec![r.importance_loss, r.load_loss])
    });
}

#[test]
fn expert_choice_gradients_match_finite_differences() {
    grad_case([2, 4, 3, 3, 2], &["x", "wg"], |b, x, wg| {
        let logits = b.einsum("GSM,ME->GSE", &[x, wg]);
        let r = expert_choice_gating(&logits, &ExpertChoice { capacity: 2 }, None);
        (r.combine, vec![])
    });
}

// ---- dropless ----

#[test]
fn dropless_capacity_drops_nothing_even_when_routing_collapses() {
    // Every token prefers expert 0, then expert 1, then 2: with C = S nothing is dropped;
    // with the usual small capacity most tokens would be.
    let (g, s, e) = (2, 8, 4);
    let mut r = lcg(9);
    let logits: Vec<f64> = (0..g * s)
        .flat_map(|_| [6.0 + r(), 4.0 + r(), 2.0 + r(), r()])
        .collect();
    for (c, dropless) in [(2, false), (dropless_capacity(s), true)] {
        let b = Builder::new();
        let l = b.param("logits", f64t(&[g, s, e]));
        let t2 = top2_gating(&l, &Top2::new(c), None, None);
        let sw = switch_gating(&l, &Switch::new(c), None);
        let nk = noisy_top_k_gating(&l, None, &NoisyTopK::new(3, c), None);
        for (n, v) in [
            ("t2_kept_1", &t2.kept_1),
            ("t2_kept_2", &t2.kept_2),
            ("t2_over", &t2.over_capacity_1.add(&t2.over_capacity_2)),
            ("sw_kept", &sw.kept),
            ("sw_over", &sw.over_capacity),
            ("nk_kept", &nk.kept),
            ("nk_over", &nk.over_capacity),
        ] {
            b.output(n, v);
        }
        let out = run(&b.finish(), &[("logits", host(&[g, s, e], &logits))]);
        let all_kept = ["t2_kept_1", "t2_kept_2", "sw_kept", "nk_kept"]
            .iter()
            .all(|n| vals(&out, n).iter().all(|&k| k == 1.0));
        let over: f64 = ["t2_over", "sw_over", "nk_over"]
            .iter()
            .map(|n| scalar(&out, n))
            .sum();
        assert_eq!(all_kept, dropless, "C={c}");
        assert_eq!(over == 0.0, dropless, "C={c}: over-capacity {over}");
    }
}

// ---- SPMD ----

/// Builds a gate (declaring its extra parameters) and the layer's noise input.
type MakeGate = Box<dyn Fn(&Builder) -> (Gate, Option<Value>)>;

#[test]
fn every_gate_in_the_moe_layer_partitions_on_expert_meshes() {
    let (g, s, e, m, h) = (4, 4, 4, 3, 5);
    let c = 2;
    let gates: Vec<(&str, MakeGate)> = vec![
        ("top2", Box::new(move |_| (Gate::Top2(Top2::new(c)), None))),
        (
            "switch",
            Box::new(move |b| {
                let u = b.param("u", f64t(&[g, s, m]));
                (Gate::Switch(Switch::new(c)), Some(u))
            }),
        ),
        (
            "noisy_top_k",
            Box::new(move |b| {
                let wn = b.param("wn", f64t(&[m, e]));
                let n = b.param("n", f64t(&[g, s, e]));
                (
                    Gate::NoisyTopK {
                        cfg: NoisyTopK::new(2, c),
                        w_noise: Some(wn),
                    },
                    Some(n),
                )
            }),
        ),
        (
            "expert_choice",
            Box::new(move |_| (Gate::ExpertChoice(ExpertChoice { capacity: c }), None)),
        ),
        (
            "hierarchical",
            Box::new(move |b| {
                let w_primary = b.param("wp", f64t(&[m, 2]));
                let primary = b.param("wnp", f64t(&[m, 2]));
                let secondary = b.param("wn", f64t(&[m, e]));
                let n = b.param("nh", f64t(&[g, s, 2 + e]));
                let w_noise = Some(HierarchicalNoiseWeights { primary, secondary });
                let cfg = Hierarchical::new(2, 2, 1, c);
                let gate = Gate::Hierarchical {
                    cfg,
                    w_primary,
                    w_noise,
                };
                (gate, Some(n))
            }),
        ),
    ];
    let mut rng = lcg(31);
    let mut rv = |n: usize, scale: f64| -> Vec<f64> {
        (0..n).map(|_| scale * (2.0 * rng() - 1.0)).collect()
    };
    let all_inputs = [
        ("x", host(&[g, s, m], &rv(g * s * m, 1.0))),
        ("wg", host(&[m, e], &rv(m * e, 1.5))),
        ("wi", host(&[e, m, h], &rv(e * m * h, 0.8))),
        ("wo", host(&[e, h, m], &rv(e * h * m, 0.8))),
        ("wn", host(&[m, e], &rv(m * e, 1.0))),
        ("n", host(&[g, s, e], &normal_vec(32, g * s * e))),
        ("wp", host(&[m, 2], &rv(m * 2, 1.5))),
        ("wnp", host(&[m, 2], &rv(m * 2, 1.0))),
        ("nh", host(&[g, s, 2 + e], &normal_vec(33, g * s * (2 + e)))),
        (
            "u",
            host(
                &[g, s, m],
                &rv(g * s * m, 0.5)
                    .iter()
                    .map(|v| v + 0.5)
                    .collect::<Vec<_>>(),
            ),
        ),
        ("loss_weight", host(&[g, s, m], &rv(g * s * m, 1.0))),
    ];
    for d in [2, 4] {
        for (name, make) in &gates {
            let b = Builder::with_mesh(Mesh::new(&[("expert", d)]).unwrap());
            let x = b.param("x", f64t(&[g, s, m]));
            let wg = b.param("wg", f64t(&[m, e]));
            let wi = b.param("wi", f64t(&[e, m, h]));
            let wo = b.param("wo", f64t(&[e, h, m]));
            let lw = b.param("loss_weight", f64t(&[g, s, m]));
            let (gate, noise) = make(&b);
            let out = moe_layer(
                &x,
                MoeWeights {
                    wg: &wg,
                    wi: &wi,
                    wo: &wo,
                },
                Route::new(&gate).noise(noise.as_ref()),
                Activation::Relu,
                Some(&MoeSharding::one_axis("expert")),
            )
            .unwrap();
            let mut loss = out.y.mul(&lw).sum_all();
            for (ln, l) in out.gating.losses() {
                b.output(ln, l);
                loss = loss.add(&l.mul(0.01));
            }
            b.output("loss", &loss);
            b.output("y", &out.y);
            b.output("combine", out.gating.combine());
            b.output("dispatch", out.gating.dispatch());
            let fwd = b.finish();
            let mut wrt = vec!["x", "wg", "wi", "wo"];
            for extra in ["wn", "wp", "wnp"] {
                if fwd.param(extra).is_some() {
                    wrt.push(extra);
                }
            }
            let p = autodiff::grad(&fwd, "loss", &wrt).unwrap();
            let names: Vec<String> = p.params().iter().map(|(n, _)| n.to_string()).collect();
            let ins: HashMap<String, HostTensor> = all_inputs
                .iter()
                .filter(|(n, _)| names.iter().any(|k| k == n))
                .map(|(n, t)| (n.to_string(), t.clone()))
                .collect();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                assert_spmd_matches(&p, &ins, Tol::new(1e-9, 1e-11))
            }));
            let part = match r {
                Ok(part) => part,
                Err(err) => {
                    let msg = err
                        .downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| "non-string panic".into());
                    panic!("{name} on expert={d}: {msg}");
                }
            };
            let kinds: Vec<&str> = spmd::report::collectives(&part.program)
                .iter()
                .map(|c| c.kind)
                .collect();
            // GShard's two all-to-alls forward and two backward; nothing gathered whole.
            let a2a = kinds.iter().filter(|k| **k == "all_to_all").count();
            assert_eq!(a2a, 4, "{name} on expert={d}: {kinds:?}");
            assert!(
                !kinds.contains(&"all_gather"),
                "{name} on expert={d}: {kinds:?}"
            );
            // Sanity: the single-device run routes something.
            let single = runtime::run(&testkit::spmd::unpartitioned(&p), &ins).unwrap();
            let dispatched: f64 = single["dispatch"].to_f64_vec().iter().sum();
            assert!(dispatched > 0.0, "{name}: nothing dispatched");
        }
    }
}

#[test]
fn padding_tokens_get_no_expert_under_every_gate() {
    let (g, s, e, m, h) = (2, 4, 4, 3, 5);
    let pads = [0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0];
    for gate in [
        Gate::Top2(Top2::new(2)),
        Gate::Switch(Switch::new(2)),
        Gate::NoisyTopK {
            cfg: NoisyTopK::new(2, 2),
            w_noise: None,
        },
        Gate::ExpertChoice(ExpertChoice { capacity: 2 }),
    ] {
        let b = Builder::new();
        let x = b.param("x", f64t(&[g, s, m]));
        let wg = b.param("wg", f64t(&[m, e]));
        let wi = b.param("wi", f64t(&[e, m, h]));
        let wo = b.param("wo", f64t(&[e, h, m]));
        let pv = b.param("pads", f64t(&[g, s]));
        let out = moe_layer(
            &x,
            MoeWeights {
                wg: &wg,
                wi: &wi,
                wo: &wo,
            },
            Route::new(&gate).paddings(Some(&pv)),
            Activation::Relu,
            None,
        )
        .unwrap();
        b.output("y", &out.y);
        b.output("dispatch", out.gating.dispatch());
        let res = run(
            &b.finish(),
            &[
                ("x", host(&[g, s, m], &rand_vec(41, g * s * m, 1.0))),
                ("wg", host(&[m, e], &rand_vec(42, m * e, 1.0))),
                ("wi", host(&[e, m, h], &rand_vec(43, e * m * h, 1.0))),
                ("wo", host(&[e, h, m], &rand_vec(44, e * h * m, 1.0))),
                ("pads", host(&[g, s], &pads)),
            ],
        );
        let (y, disp) = (vals(&res, "y"), vals(&res, "dispatch"));
        for (t, &pad) in pads.iter().enumerate() {
            let routed: f64 = disp[t * e * 2..(t + 1) * e * 2].iter().sum();
            if pad == 1.0 {
                assert_eq!(routed, 0.0, "{gate:?}: pad {t} dispatched");
                assert!(y[t * m..(t + 1) * m].iter().all(|&v| v == 0.0), "{gate:?}");
            } else if !matches!(gate, Gate::ExpertChoice(_)) {
                // (Under expert choice a real token may legitimately get no expert.)
                assert!(routed > 0.0, "{gate:?}: real token {t} not dispatched");
            }
        }
    }
}
