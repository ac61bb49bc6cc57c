//! Load balancing without an auxiliary loss (DeepSeek-V3, arXiv 2412.19437 section 2.1.2):
//! the choice bias of `top2_gating_biased` changes which experts a token takes but not the
//! gates, checked against naive f64 loops; and the update `nn::moe_ffn::bias_update`,
//! iterated on a skewed router, evens out the expert load (and without it the load stays
//! skewed).

use ir::{Builder, DType, Program, Type};
use nn::moe::{top2_gating_biased, Top2};
use nn::moe_ffn::bias_update;
use runtime::HostTensor;
use std::collections::HashMap;

#[path = "gating/naive.rs"]
#[allow(dead_code)]
mod naive;
use naive::*;

/// Top-2 on `logits [G,S,E]` with a choice `bias [E]`: the choices, the gates, the share
/// of assignments per expert and the next bias at `rate`.
fn program(g: usize, s: usize, e: usize, rate: f64) -> Program {
    let b = Builder::new();
    let logits = b.param("logits", f64t(&[g, s, e]));
    let bias = b.param("bias", f64t(&[e]));
    let r = top2_gating_biased(&logits, &Top2::new(s), None, None, Some(&bias));
    let load = r
        .index_1
        .one_hot(e, DType::F64)
        .add(&r.index_2.one_hot(e, DType::F64))
        .mean(&[0, 1]);
    b.output("index_1", &r.index_1);
    b.output("index_2", &r.index_2);
    b.output("gate_1", &r.gate_1);
    b.output("gate_2", &r.gate_2);
    b.output("load", &load);
    b.output("new_bias", &bias_update(&bias, &load, rate));
    b.finish()
}

#[test]
fn the_choice_bias_moves_the_choice_but_not_the_gates() {
    let (g, s, e) = (2, 5, 4);
    let logits = rand_vec(81, g * s * e, 2.0);
    for bias in [
        vec![0.0; e],
        vec![0.0, 0.0, 0.0, 10.0],
        vec![0.3, -0.2, 0.1, 0.0],
    ] {
        let out = run(
            &program(g, s, e, 0.0),
            &[
                ("logits", host(&[g, s, e], &logits)),
                ("bias", host(&[e], &bias)),
            ],
        );
        for t in 0..g * s {
            let p = softmax(&logits[t * e..(t + 1) * e]);
            let scored: Vec<f64> = p.iter().zip(&bias).map(|(a, b)| a + b).collect();
            let ord = order_desc(&scored);
            let (i1, i2) = (ord[0], ord[1]);
            assert_eq!(
                vals(&out, "index_1")[t],
                i1 as f64,
                "token {t}, bias {bias:?}"
            );
            assert_eq!(
                vals(&out, "index_2")[t],
                i2 as f64,
                "token {t}, bias {bias:?}"
            );
            // The gates are the unbiased probabilities (normalised over the two, legacy).
            let d = p[i1] + p[i2] + 1e-9;
            close(
                &format!("gates of token {t}, bias {bias:?}"),
                &[vals(&out, "gate_1")[t], vals(&out, "gate_2")[t]],
                &[p[i1] / d, p[i2] / d],
                1e-14,
            );
        }
        // A large enough bias on one expert makes it every token's first choice.
        if bias[3] == 10.0 {
            assert!(vals(&out, "index_1").iter().all(|&i| i == 3.0));
        }
    }
}

/// Coefficient of variation (population std / mean) of a load vector.
fn cv(load: &[f64]) -> f64 {
    let n = load.len() as f64;
    let mean = load.iter().sum::<f64>() / n;
    let var = load.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / n;
    var.sqrt() / mean
}

/// Run `steps` bias updates at `rate` on a router skewed towards experts 0 and 1 (the
/// logits fixed: only the bias moves); the CV of the load at each step.
fn cv_over_steps(rate: f64, steps: usize) -> Vec<f64> {
    let (g, s, e) = (4, 32, 8);
    let skew = [3.0, 2.0, 1.0, 0.5, 0.0, 0.0, -0.5, -1.0];
    let logits: Vec<f64> = rand_vec(91, g * s * e, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v + skew[i % e])
        .collect();
    let p = program(g, s, e, rate);
    let mut bias = vec![0.0; e];
    let mut cvs = Vec::new();
    for step in 0..steps {
        let out = run(
            &p,
            &[
                ("logits", host(&[g, s, e], &logits)),
                ("bias", host(&[e], &bias)),
            ],
        );
        let load = vals(&out, "load");
        // The update is bias + rate * sign(mean - load), expert by expert.
        let mean = load.iter().sum::<f64>() / e as f64;
        let want: Vec<f64> = bias
            .iter()
            .zip(&load)
            .map(|(b, l)| b + rate * (mean - l).signum() * f64::from((mean - l) != 0.0))
            .collect();
        close(
            &format!("new bias at step {step}"),
            &vals(&out, "new_bias"),
            &want,
            1e-15,
        );
        cvs.push(cv(&load));
        bias = vals(&out, "new_bias");
    }
    cvs
}

#[test]
fn the_bias_update_evens_out_a_skewed_router() {
    let steps = 120;
    let with = cv_over_steps(0.01, steps);
    let without = cv_over_steps(0.0, steps);
    let tail = |v: &[f64]| v[steps - 20..].iter().sum::<f64>() / 20.0;
    assert!(with[0] > 0.5, "the router is not skewed: CV {}", with[0]);
    assert_eq!(with[0], without[0]);
    assert!(
        tail(&with) < 0.25 * with[0],
        "CV of the load: {} at the start, {} over the last 20 steps",
        with[0],
        tail(&with)
    );
    // Without updates nothing changes.
    assert!(without.iter().all(|&c| c == without[0]));
}
