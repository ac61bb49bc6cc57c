//! The oracles of `gating.rs`: naive token-by-token routers in plain f64 loops (Switch,
//! noisy top-k, expert choice), written independently of the IR code, and small helpers
//! (seeded values, one-device runs, comparisons).

use super::*;

// ---- helpers ----

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

/// `n` values uniform on `[-scale, scale)`.
pub fn rand_vec(seed: u64, n: usize, scale: f64) -> Vec<f64> {
    let mut r = lcg(seed);
    (0..n).map(|_| scale * (2.0 * r() - 1.0)).collect()
}

/// Standard normal values (Box-Muller).
pub fn normal_vec(seed: u64, n: usize) -> Vec<f64> {
    let mut r = lcg(seed);
    (0..n)
        .map(|_| {
            let (u, v) = (1.0 - r(), r());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        })
        .collect()
}

pub fn f64t(shape: &[usize]) -> Type {
    Type::new(DType::F64, shape.to_vec())
}

pub fn host(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(shape.to_vec(), v.to_vec())
}

pub fn run(p: &Program, ins: &[(&str, HostTensor)]) -> HashMap<String, HostTensor> {
    runtime::run(p, &testkit::inputs(ins)).unwrap_or_else(|e| panic!("run failed: {e}"))
}

pub fn vals(out: &HashMap<String, HostTensor>, name: &str) -> Vec<f64> {
    out.get(name)
        .unwrap_or_else(|| panic!("no output {name}"))
        .to_f64_vec()
}

pub fn scalar(out: &HashMap<String, HostTensor>, name: &str) -> f64 {
    vals(out, name)[0]
}

#[track_caller]
pub fn close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{name}[{i}]: got {a}, want {b}\n  got:  {got:?}\n  want: {want:?}"
        );
    }
}

// ---- naive references (token by token, f64) ----

pub fn softmax(v: &[f64]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ex: Vec<f64> = v.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = ex.iter().sum();
    ex.iter().map(|x| x / z).collect()
}

pub fn logsumexp(v: &[f64]) -> f64 {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Indices by decreasing value, ties to the lowest index.
pub fn order_desc(v: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
    idx
}

pub fn is_pad(pads: Option<&[f64]>, t: usize) -> bool {
    pads.is_some_and(|p| p[t] == 1.0)
}

pub fn cv2(x: &[f64]) -> f64 {
    let n = x.len() as f64 + 1e-10;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    var / (mean * mean + 1e-10)
}

pub struct NaiveSwitch {
    pub combine: Vec<f64>,
    pub index: Vec<f64>,
    pub kept: Vec<f64>,
    pub aux: f64,
    pub z: f64,
}

pub fn naive_switch(
    logits: &[f64],
    (g, s, e, c): (usize, usize, usize, usize),
    pads: Option<&[f64]>,
) -> NaiveSwitch {
    let mut out = NaiveSwitch {
        combine: vec![0.0; g * s * e * c],
        index: vec![0.0; g * s],
        kept: vec![0.0; g * s],
        aux: 0.0,
        z: 0.0,
    };
    let (mut z_sum, mut real) = (0.0, 0.0);
    for gi in 0..g {
        let mut counter = vec![0usize; e];
        let mut density = vec![0.0; e];
        let mut proxy = vec![0.0; e];
        for si in 0..s {
            let t = gi * s + si;
            let row = &logits[t * e..(t + 1) * e];
            let p = softmax(row);
            let best = order_desc(&p)[0];
            out.index[t] = best as f64;
            if is_pad(pads, t) {
                continue;
            }
            density[best] += 1.0 / s as f64;
            for ei in 0..e {
                proxy[ei] += p[ei] / s as f64;
            }
            z_sum += logsumexp(row).powi(2);
            real += 1.0;
            if counter[best] < c {
                out.combine[((t * e) + best) * c + counter[best]] = p[best];
                out.kept[t] = 1.0;
            }
            counter[best] += 1;
        }
        for ei in 0..e {
            out.aux += density[ei] * proxy[ei];
        }
    }
    out.aux *= (e * e) as f64 / (g * e) as f64;
    out.z = z_sum / f64::max(real, 1.0);
    out
}

pub struct NaiveNoisy {
    pub noisy: Vec<f64>,
    pub gates: Vec<f64>,
    pub combine: Vec<f64>,
    pub kept: Vec<f64>,
    pub importance: Vec<f64>,
    pub load: Vec<f64>,
}

pub fn softplus_f(x: f64) -> f64 {
    (1.0 + x.exp()).ln()
}

/// T2T noisy top-k, token by token; `noise = (raw_noise, n)`.
pub fn naive_noisy(
    clean: &[f64],
    noise: Option<(&[f64], &[f64])>,
    (g, s, e, k, c): (usize, usize, usize, usize, usize),
    pads: Option<&[f64]>,
) -> NaiveNoisy {
    let eps = 1e-2;
    let mut out = NaiveNoisy {
        noisy: vec![0.0; g * s * e],
        gates: vec![0.0; g * s * e],
        combine: vec![0.0; g * s * e * c],
        kept: vec![0.0; g * s * k],
        importance: vec![0.0; e],
        load: vec![0.0; e],
    };
    let mut tops = vec![Vec::new(); g * s];
    let mut weights = vec![Vec::new(); g * s];
    for t in 0..g * s {
        let cl = &clean[t * e..(t + 1) * e];
        let std: Vec<f64> = match noise {
            Some((raw, _)) => (0..e).map(|i| softplus_f(raw[t * e + i]) + eps).collect(),
            None => vec![0.0; e],
        };
        let h: Vec<f64> = match noise {
            Some((_, n)) => (0..e).map(|i| cl[i] + n[t * e + i] * std[i]).collect(),
            None => cl.to_vec(),
        };
        out.noisy[t * e..(t + 1) * e].copy_from_slice(&h);
        let ord = order_desc(&h);
        let top: Vec<usize> = ord[..k].to_vec();
        let w = softmax(&top.iter().map(|&i| h[i]).collect::<Vec<_>>());
        tops[t] = top.clone();
        weights[t] = w.clone();
        if is_pad(pads, t) {
            continue;
        }
        for (r, &i) in top.iter().enumerate() {
            out.gates[t * e + i] = w[r];
            out.importance[i] += w[r];
        }
        if noise.is_some() && k < e {
            let thr_in = h[ord[k]];
            let thr_out = h[ord[k - 1]];
            for i in 0..e {
                let thr = if h[i] > thr_in { thr_in } else { thr_out };
                let z = (cl[i] - thr) / (std::f64::consts::SQRT_2 * std[i]);
                out.load[i] += 0.5 * (1.0 + libm::erf(z));
            }
        } else {
            for i in 0..e {
                if out.gates[t * e + i] > 0.0 {
                    out.load[i] += 1.0;
                }
            }
        }
    }
    // Slots: rank by rank, token order within a rank, after the kept counts of earlier ranks.
    for gi in 0..g {
        let mut kept_count = vec![0usize; e];
        for r in 0..k {
            let mut next = kept_count.clone();
            for si in 0..s {
                let t = gi * s + si;
                if is_pad(pads, t) {
                    continue;
                }
                let i = tops[t][r];
                if next[i] < c {
                    out.combine[(t * e + i) * c + next[i]] = weights[t][r];
                    out.kept[t * k + r] = 1.0;
                    kept_count[i] += 1;
                }
                next[i] += 1;
            }
        }
    }
    out
}

pub struct NaiveExpertChoice {
    pub combine: Vec<f64>,
    pub selected: Vec<f64>,
}

pub fn naive_expert_choice(
    logits: &[f64],
    (g, s, e, c): (usize, usize, usize, usize),
    pads: Option<&[f64]>,
) -> NaiveExpertChoice {
    let mut out = NaiveExpertChoice {
        combine: vec![0.0; g * s * e * c],
        selected: vec![0.0; g * s * e],
    };
    for gi in 0..g {
        let p: Vec<Vec<f64>> = (0..s)
            .map(|si| softmax(&logits[(gi * s + si) * e..(gi * s + si + 1) * e]))
            .collect();
        for ei in 0..e {
            let col: Vec<f64> = p.iter().map(|row| row[ei]).collect();
            let chosen: Vec<usize> = order_desc(&col)
                .into_iter()
                .filter(|&si| !is_pad(pads, gi * s + si))
                .take(c)
                .collect();
            let mut slot = 0;
            for (si, row) in p.iter().enumerate() {
                if chosen.contains(&si) {
                    let t = gi * s + si;
                    out.selected[t * e + ei] = 1.0;
                    out.combine[(t * e + ei) * c + slot] = row[ei];
                    slot += 1;
                }
            }
        }
    }
    out
}

/// `[G,S,E,C]` 0/1 from a combine (the routers here never produce a zero kept weight).
pub fn nonzero(v: &[f64]) -> Vec<f64> {
    v.iter()
        .map(|&x| if x != 0.0 { 1.0 } else { 0.0 })
        .collect()
}
