//! Shazeer's hierarchical MoE gating (`nn::hierarchical`) against a naive token-by-token
//! implementation of the paper's appendix B in plain f64 loops (written here, independent of
//! the IR code) and a hand case; gradients (through both gates, both noise projections and
//! all four balancing losses) against finite differences. Its partitioned run inside
//! `moe_layer` is checked with the other gates in `gating.rs`.
// The naive oracle indexes like the paper's formulas (token t, group i, expert j, rank r).
#![allow(clippy::needless_range_loop)]

use ir::{Builder, DType, Program, Type, Value};
use nn::hierarchical::{hierarchical_gating, Hierarchical, HierarchicalNoise};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::{check_grads, Tol};

#[path = "gating/naive.rs"]
#[allow(dead_code)]
mod naive;
use naive::*;

/// One random case: `A` groups of `B` experts, `k_p` groups and `k_s` experts per group.
#[derive(Clone, Copy, Debug)]
struct Case {
    g: usize,
    s: usize,
    a: usize,
    b: usize,
    kp: usize,
    ks: usize,
    c: usize,
    noise: bool,
    pads: bool,
}

impl Case {
    fn e(&self) -> usize {
        self.a * self.b
    }
}

/// One token's noisy top-k over `cl` (T2T): the noisy logits' top `k` (ties to the lowest
/// index), their softmax weights and the per-expert load term (the smooth estimator's
/// probability with noise and `k < n`, else 1 for the kept experts).
fn token_top_k(
    cl: &[f64],
    noise: Option<(&[f64], &[f64])>,
    k: usize,
) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
    let n = cl.len();
    let std: Vec<f64> = match noise {
        Some((raw, _)) => raw.iter().map(|&r| softplus_f(r) + 1e-2).collect(),
        None => vec![0.0; n],
    };
    let h: Vec<f64> = match noise {
        Some((_, z)) => (0..n).map(|i| cl[i] + z[i] * std[i]).collect(),
        None => cl.to_vec(),
    };
    let ord = order_desc(&h);
    let top = ord[..k].to_vec();
    let w = softmax(&top.iter().map(|&i| h[i]).collect::<Vec<_>>());
    let load = if noise.is_some() && k < n {
        let (thr_in, thr_out) = (h[ord[k]], h[ord[k - 1]]);
        (0..n)
            .map(|i| {
                let thr = if h[i] > thr_in { thr_in } else { thr_out };
                let z = (cl[i] - thr) / (std::f64::consts::SQRT_2 * std[i]);
                0.5 * (1.0 + libm::erf(z))
            })
            .collect()
    } else {
        (0..n)
            .map(|i| if top.contains(&i) { 1.0 } else { 0.0 })
            .collect()
    };
    (top, w, load)
}

struct NaiveHier {
    gates: Vec<f64>,
    combine: Vec<f64>,
    top_index: Vec<f64>,
    kept: Vec<f64>,
    importance: Vec<f64>,
    load: Vec<f64>,
    primary_importance: Vec<f64>,
    primary_load: Vec<f64>,
}

/// The inputs of a case: primary logits `[G,S,A]`, secondary `[G,S,E]`, their noise
/// projections and normals, paddings `[G,S]`.
struct Inputs {
    primary: Vec<f64>,
    secondary: Vec<f64>,
    p_raw: Vec<f64>,
    p_n: Vec<f64>,
    s_raw: Vec<f64>,
    s_n: Vec<f64>,
    pads: Vec<f64>,
}

fn inputs(cs: &Case, seed: u64) -> Inputs {
    let (t, a, e) = (cs.g * cs.s, cs.a, cs.e());
    Inputs {
        primary: rand_vec(seed, t * a, 2.0),
        secondary: rand_vec(seed + 1, t * e, 2.0),
        p_raw: rand_vec(seed + 2, t * a, 1.5),
        p_n: normal_vec(seed + 3, t * a),
        s_raw: rand_vec(seed + 4, t * e, 1.5),
        s_n: normal_vec(seed + 5, t * e),
        pads: (0..t)
            .map(|i| if cs.pads && i % 3 == 2 { 1.0 } else { 0.0 })
            .collect(),
    }
}

/// Appendix B token by token: gates `G_p(x)_i G_i(x)_j`, Importance_H, Load_H =
/// `Load_p(X)_i Load_i(X^(i))_j / |X^(i)|`, the primary gate's importance and load, and slots
/// rank by rank over the `k_p * k_s` assignments.
fn naive_hier(cs: &Case, inp: &Inputs) -> NaiveHier {
    let (g, s, a, bw, e, c) = (cs.g, cs.s, cs.a, cs.b, cs.e(), cs.c);
    let k = cs.kp * cs.ks;
    let mut out = NaiveHier {
        gates: vec![0.0; g * s * e],
        combine: vec![0.0; g * s * e * c],
        top_index: vec![0.0; g * s * k],
        kept: vec![0.0; g * s * k],
        importance: vec![0.0; e],
        load: vec![0.0; e],
        primary_importance: vec![0.0; a],
        primary_load: vec![0.0; a],
    };
    let mut sec_load = vec![vec![0.0; bw]; a];
    let mut members = vec![0.0f64; a];
    let mut assigned: Vec<Vec<(usize, f64)>> = vec![Vec::new(); g * s];
    for t in 0..g * s {
        let pn = cs
            .noise
            .then(|| (&inp.p_raw[t * a..(t + 1) * a], &inp.p_n[t * a..(t + 1) * a]));
        let (ptop, pw, pload) = token_top_k(&inp.primary[t * a..(t + 1) * a], pn, cs.kp);
        let pad = inp.pads[t] == 1.0;
        for (rp, &i) in ptop.iter().enumerate() {
            let lo = t * e + i * bw;
            let sn = cs
                .noise
                .then(|| (&inp.s_raw[lo..lo + bw], &inp.s_n[lo..lo + bw]));
            let (stop, sw, sload) = token_top_k(&inp.secondary[lo..lo + bw], sn, cs.ks);
            for (rs, &j) in stop.iter().enumerate() {
                let w = if pad { 0.0 } else { pw[rp] * sw[rs] };
                assigned[t].push((i * bw + j, w));
                out.top_index[t * k + rp * cs.ks + rs] = (i * bw + j) as f64;
                out.gates[t * e + i * bw + j] = w;
                out.importance[i * bw + j] += w;
            }
            if !pad {
                members[i] += 1.0;
                out.primary_importance[i] += pw[rp];
                for (j, l) in sload.iter().enumerate() {
                    sec_load[i][j] += l;
                }
            }
        }
        if !pad {
            for (i, l) in pload.iter().enumerate() {
                out.primary_load[i] += l;
            }
        }
    }
    for i in 0..a {
        for j in 0..bw {
            out.load[i * bw + j] = out.primary_load[i] * sec_load[i][j] / members[i].max(1.0);
        }
    }
    for gi in 0..g {
        let mut kept_count = vec![0usize; e];
        for r in 0..k {
            let mut next = kept_count.clone();
            for si in 0..s {
                let t = gi * s + si;
                if inp.pads[t] == 1.0 {
                    continue;
                }
                let (x, w) = assigned[t][r];
                if next[x] < c {
                    out.combine[(t * e + x) * c + next[x]] = w;
                    out.kept[t * k + r] = 1.0;
                    kept_count[x] += 1;
                }
                next[x] += 1;
            }
        }
    }
    out
}

fn program(cs: &Case) -> Program {
    let b = Builder::new();
    let (g, s, a, e) = (cs.g, cs.s, cs.a, cs.e());
    let primary = b.param("primary", f64t(&[g, s, a]));
    let secondary = b.param("secondary", f64t(&[g, s, e]));
    let noise = cs.noise.then(|| {
        (
            b.param("p_raw", f64t(&[g, s, a])),
            b.param("p_n", f64t(&[g, s, a])),
            b.param("s_raw", f64t(&[g, s, e])),
            b.param("s_n", f64t(&[g, s, e])),
        )
    });
    let pads = cs.pads.then(|| b.param("pads", f64t(&[g, s])));
    let r = hierarchical_gating(
        &primary,
        &secondary,
        noise.as_ref().map(|(pr, pn, sr, sn)| HierarchicalNoise {
            primary_raw: pr,
            primary_normal: pn,
            secondary_raw: sr,
            secondary_normal: sn,
        }),
        &Hierarchical::new(a, cs.kp, cs.ks, cs.c),
        pads.as_ref(),
    );
    for (n, v) in [
        ("gates", &r.gates),
        ("combine", &r.combine),
        ("dispatch", &r.dispatch),
        ("top_index", &r.top_index),
        ("kept", &r.kept),
        ("importance", &r.importance),
        ("load", &r.load),
        ("primary_importance", &r.primary_importance),
        ("primary_load", &r.primary_load),
        ("importance_loss", &r.importance_loss),
        ("load_loss", &r.load_loss),
        ("primary_importance_loss", &r.primary_importance_loss),
        ("primary_load_loss", &r.primary_load_loss),
        ("over", &r.over_capacity),
    ] {
        b.output(n, v);
    }
    b.finish()
}

fn check_against_naive(cs: &Case, seed: u64) -> NaiveHier {
    let inp = inputs(cs, seed);
    let want = naive_hier(cs, &inp);
    let (g, s, a, e) = (cs.g, cs.s, cs.a, cs.e());
    let mut ins = vec![
        ("primary", host(&[g, s, a], &inp.primary)),
        ("secondary", host(&[g, s, e], &inp.secondary)),
    ];
    if cs.noise {
        ins.push(("p_raw", host(&[g, s, a], &inp.p_raw)));
        ins.push(("p_n", host(&[g, s, a], &inp.p_n)));
        ins.push(("s_raw", host(&[g, s, e], &inp.s_raw)));
        ins.push(("s_n", host(&[g, s, e], &inp.s_n)));
    }
    if cs.pads {
        ins.push(("pads", host(&[g, s], &inp.pads)));
    }
    let out = run(&program(cs), &ins);
    let what = format!("{cs:?}");
    let k = cs.kp * cs.ks;
    // Pads keep their (unused) picks in top_index; compare real tokens only.
    let real_idx = |v: Vec<f64>| -> Vec<f64> {
        v.iter()
            .enumerate()
            .map(|(i, &x)| if inp.pads[i / k] == 1.0 { -1.0 } else { x })
            .collect()
    };
    assert_eq!(
        real_idx(vals(&out, "top_index")),
        real_idx(want.top_index.clone()),
        "top_index ({what})"
    );
    assert_eq!(vals(&out, "kept"), want.kept, "kept ({what})");
    for (name, w, tol) in [
        ("gates", &want.gates, 1e-13),
        ("combine", &want.combine, 1e-13),
        ("importance", &want.importance, 1e-13),
        ("load", &want.load, 1e-12),
        ("primary_importance", &want.primary_importance, 1e-13),
        ("primary_load", &want.primary_load, 1e-12),
    ] {
        close(&format!("{name} ({what})"), &vals(&out, name), w, tol);
    }
    assert_eq!(
        vals(&out, "dispatch"),
        nonzero(&want.combine),
        "dispatch ({what})"
    );
    close(
        &format!("losses ({what})"),
        &[
            scalar(&out, "importance_loss"),
            scalar(&out, "load_loss"),
            scalar(&out, "primary_importance_loss"),
            scalar(&out, "primary_load_loss"),
        ],
        &[
            cv2(&want.importance),
            cv2(&want.load),
            cv2(&want.primary_importance),
            cv2(&want.primary_load),
        ],
        1e-12,
    );
    let assignments = want.top_index.len() as f64 - inp.pads.iter().sum::<f64>() * k as f64;
    let dropped = assignments - want.kept.iter().sum::<f64>();
    close(
        &format!("over ({what})"),
        &[scalar(&out, "over")],
        &[dropped / assignments.max(1.0)],
        1e-14,
    );
    want
}

#[test]
fn hierarchical_gating_matches_the_naive_appendix_b_loops() {
    let base = Case {
        g: 2,
        s: 6,
        a: 2,
        b: 3,
        kp: 1,
        ks: 1,
        c: 2,
        noise: false,
        pads: false,
    };
    for (i, cs) in [
        base,
        Case {
            kp: 2,
            ks: 2,
            ..base
        },
        Case {
            a: 3,
            b: 2,
            kp: 2,
            ks: 1,
            noise: true,
            ..base
        },
        Case {
            a: 2,
            b: 4,
            kp: 2,
            ks: 2,
            c: 3,
            noise: true,
            pads: true,
            ..base
        },
        Case {
            a: 4,
            b: 2,
            kp: 2,
            ks: 2,
            pads: true,
            ..base
        },
        // k = width at both levels: the load falls back to counting (T2T).
        Case {
            a: 2,
            b: 2,
            kp: 2,
            ks: 2,
            c: 6,
            noise: true,
            ..base
        },
    ]
    .iter()
    .enumerate()
    {
        let want = check_against_naive(cs, 50 + 10 * i as u64);
        // Every real token's gates sum to 1 (before capacity).
        let e = cs.e();
        let real = (cs.g * cs.s) as f64 - if cs.pads { 4.0 } else { 0.0 };
        let total: f64 = want.gates.chunks(e).map(|t| t.iter().sum::<f64>()).sum();
        assert!((total - real).abs() < 1e-12, "{cs:?}: gates sum {total}");
    }
}

#[test]
fn hierarchical_hand_case_two_groups_one_expert_each() {
    // One token, A = 2 groups of B = 2: primary logits (1, 0) -> both groups (k_p = 2) with
    // weights (sigma(1), 1 - sigma(1)); group 0's secondary logits (3, 0) pick expert 0,
    // group 1's (0, 2) pick expert 3 (k_s = 1, weight 1).
    let cs = Case {
        g: 1,
        s: 1,
        a: 2,
        b: 2,
        kp: 2,
        ks: 1,
        c: 1,
        noise: false,
        pads: false,
    };
    let out = run(
        &program(&cs),
        &[
            ("primary", host(&[1, 1, 2], &[1.0, 0.0])),
            ("secondary", host(&[1, 1, 4], &[3.0, 0.0, 0.0, 2.0])),
        ],
    );
    let w = 1.0 / (1.0 + (-1f64).exp());
    assert_eq!(vals(&out, "top_index"), [0.0, 3.0]);
    close(
        "gates",
        &vals(&out, "gates"),
        &[w, 0.0, 0.0, 1.0 - w],
        1e-15,
    );
    close(
        "combine",
        &vals(&out, "combine"),
        &[w, 0.0, 0.0, 1.0 - w],
        1e-15,
    );
    // Without noise Load_H counts the kept experts: 1 for experts 0 and 3.
    assert_eq!(vals(&out, "load"), [1.0, 0.0, 0.0, 1.0]);
    assert_eq!(vals(&out, "primary_load"), [1.0, 1.0]);
}

/// `x [G,S,M]`, both gates' weights and noise projections, a fixed weight on the combine;
/// the loss is `sum(combine * w)` plus the four balancing losses.
#[test]
fn hierarchical_gradients_match_finite_differences() {
    let (g, s, m, a, bw, c) = (2, 4, 3, 2, 2, 2);
    let e = a * bw;
    let b = Builder::new();
    let x = b.param("x", f64t(&[g, s, m]));
    let wp = b.param("wp", f64t(&[m, a]));
    let wg = b.param("wg", f64t(&[m, e]));
    let wnp = b.param("wnp", f64t(&[m, a]));
    let wn = b.param("wn", f64t(&[m, e]));
    let n = b.param("n", f64t(&[g, s, a + e]));
    let w = b.param("w", f64t(&[g, s, e, c]));
    let mm = |wt: &Value| b.einsum("GSM,ME->GSE", &[&x, wt]);
    let (pr, sr) = (mm(&wnp), mm(&wn));
    let (pn, sn) = (n.slice_dim(2, 0, a), n.slice_dim(2, a, a + e));
    let r = hierarchical_gating(
        &mm(&wp),
        &mm(&wg),
        Some(HierarchicalNoise {
            primary_raw: &pr,
            primary_normal: &pn,
            secondary_raw: &sr,
            secondary_normal: &sn,
        }),
        &Hierarchical::new(a, 2, 1, c),
        None,
    );
    let loss = r
        .combine
        .mul(&w)
        .sum_all()
        .add(&r.importance_loss)
        .add(&r.load_loss)
        .add(&r.primary_importance_loss)
        .add(&r.primary_load_loss);
    b.output("loss", &loss);
    let p = b.finish();
    let ins: HashMap<String, HostTensor> = [
        ("x", host(&[g, s, m], &rand_vec(61, g * s * m, 1.0))),
        ("wp", host(&[m, a], &rand_vec(62, m * a, 1.5))),
        ("wg", host(&[m, e], &rand_vec(63, m * e, 1.5))),
        ("wnp", host(&[m, a], &rand_vec(64, m * a, 1.0))),
        ("wn", host(&[m, e], &rand_vec(65, m * e, 1.0))),
        ("n", host(&[g, s, a + e], &normal_vec(66, g * s * (a + e)))),
        ("w", host(&[g, s, e, c], &rand_vec(67, g * s * e * c, 1.0))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    check_grads(&p, "loss", &["x", "wp", "wg", "wnp", "wn"], &ins, Tol::FD);
}

#[test]
fn load_h_gives_the_primary_gate_a_gradient() {
    // The appendix's reason for Load_H = Load_p * Load_i / |X^(i)|: the load loss alone
    // reaches the primary gate's weights.
    let (g, s, m, a, bw) = (1, 6, 3, 3, 2);
    let e = a * bw;
    let b = Builder::new();
    let x = b.param("x", f64t(&[g, s, m]));
    let wp = b.param("wp", f64t(&[m, a]));
    let wg = b.param("wg", f64t(&[m, e]));
    let n = b.param("n", f64t(&[g, s, a + e]));
    let mm = |wt: &Value| b.einsum("GSM,ME->GSE", &[&x, wt]);
    let (pn, sn) = (n.slice_dim(2, 0, a), n.slice_dim(2, a, a + e));
    let (pr, sr) = (mm(&wp).mul(0.0), mm(&wg).mul(0.0));
    let r = hierarchical_gating(
        &mm(&wp),
        &mm(&wg),
        Some(HierarchicalNoise {
            primary_raw: &pr,
            primary_normal: &pn,
            secondary_raw: &sr,
            secondary_normal: &sn,
        }),
        &Hierarchical::new(a, 1, 1, 4),
        None,
    );
    b.output("load_loss", &r.load_loss);
    let fwd = b.finish();
    let p = autodiff::grad(&fwd, "load_loss", &["wp"]).unwrap();
    let ins = testkit::inputs(&[
        ("x", host(&[g, s, m], &rand_vec(71, g * s * m, 1.0))),
        ("wp", host(&[m, a], &rand_vec(72, m * a, 1.5))),
        ("wg", host(&[m, e], &rand_vec(73, m * e, 1.5))),
        ("n", host(&[g, s, a + e], &normal_vec(74, g * s * (a + e)))),
    ]);
    let out = runtime::run(&p, &ins).unwrap();
    let gn: f64 = out[&autodiff::grad_output_name("wp")]
        .to_f64_vec()
        .iter()
        .map(|v| v * v)
        .sum();
    assert!(gn > 1e-8, "no gradient of Load_H's loss reaches W_primary");
}
