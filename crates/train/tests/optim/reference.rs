//! Naive f64 references of every optimizer's update (Adafactor, Adam, SGD) and the learning
//! rate schedules, in plain loops, and the check of an IR update against them.

use super::*;

// ---------------------------------------------------------------- naive references

/// Independent schedule: `base * min(t/w, 1) * rsqrt(max(t, w))` (linear warm-up) or
/// `base * rsqrt(max(t, w))`, times the cool-down's share of the rate left at step `t` of
/// a `run`-step run.
pub fn sched(s: &LrSchedule, t: f64, run: u64) -> f64 {
    match *s {
        LrSchedule::Constant { value } => value,
        LrSchedule::Rsqrt {
            base,
            warmup_steps,
            linear_warmup,
            cooldown,
        } => {
            let w = warmup_steps as f64;
            let warm = if linear_warmup && w > 0.0 {
                (t / w).min(1.0)
            } else {
                1.0
            };
            // The last n steps of the run: n, n-1, ..., 1 n-ths of the rate.
            let n = (cooldown * run as f64).round().max(1.0);
            let first_cool = run as f64 - n + 1.0;
            let cool = if cooldown == 0.0 || t < first_cool {
                1.0
            } else if t > run as f64 {
                0.0
            } else {
                (n - (t - first_cool)) / n
            };
            base * warm / t.max(w).sqrt() * cool
        }
    }
}

/// State of one parameter in the naive reference, by slot name.
pub type RefState = HashMap<String, Vec<f64>>;

/// Adafactor on flat row-major data of `shape`, at 1-based step `t`; returns the new param.
pub fn adafactor_ref(
    c: &AdafactorConfig,
    shape: &[usize],
    p: &[f64],
    g: &[f64],
    st: &mut RefState,
    t: f64,
) -> Vec<f64> {
    let n_el = p.len();
    let mut beta2 = 1.0 - t.powf(-c.decay_rate);
    if let Some(cap) = c.beta2_cap {
        beta2 = beta2.min(cap);
    }
    let lr = sched(&c.lr, t, RUN_STEPS);
    let g2: Vec<f64> = g.iter().map(|x| x * x + c.eps1).collect();
    let r = shape.len();
    let mut u = vec![0.0; n_el];
    if c.factored && r >= 2 {
        let (n, m) = (shape[r - 2], shape[r - 1]);
        let batch = n_el / (n * m);
        let vr = st.get_mut("v_row").unwrap();
        for bi in 0..batch {
            for i in 0..n {
                let mean: f64 = (0..m).map(|j| g2[(bi * n + i) * m + j]).sum::<f64>() / m as f64;
                vr[bi * n + i] = beta2 * vr[bi * n + i] + (1.0 - beta2) * mean;
            }
        }
        let vr = vr.clone();
        let vc = st.get_mut("v_col").unwrap();
        for bi in 0..batch {
            for j in 0..m {
                let mean: f64 = (0..n).map(|i| g2[(bi * n + i) * m + j]).sum::<f64>() / n as f64;
                vc[bi * m + j] = beta2 * vc[bi * m + j] + (1.0 - beta2) * mean;
            }
        }
        for bi in 0..batch {
            let rmean: f64 = (0..n).map(|i| vr[bi * n + i]).sum::<f64>() / n as f64;
            for i in 0..n {
                for j in 0..m {
                    // V^ = R C / mean(R)
                    let vhat = vr[bi * n + i] * vc[bi * m + j] / rmean;
                    let k = (bi * n + i) * m + j;
                    u[k] = g[k] / vhat.sqrt();
                }
            }
        }
    } else {
        let v = st.get_mut("v").unwrap();
        for k in 0..n_el {
            v[k] = beta2 * v[k] + (1.0 - beta2) * g2[k];
            u[k] = g[k] / v[k].sqrt();
        }
    }
    if let Some(d) = c.clipping_threshold {
        let f = (rms(&u) / d).max(1.0);
        u.iter_mut().for_each(|x| *x /= f);
    }
    let alpha = if c.multiply_by_parameter_scale {
        lr * rms(p).max(c.eps2)
    } else {
        lr
    };
    let mut delta: Vec<f64> = u.iter().map(|x| alpha * x).collect();
    if c.beta1 > 0.0 {
        let m = st.get_mut("m").unwrap();
        for k in 0..n_el {
            m[k] = c.beta1 * m[k] + (1.0 - c.beta1) * delta[k];
        }
        delta = m.clone();
    }
    (0..n_el)
        .map(|k| p[k] - delta[k] - c.weight_decay * lr * p[k])
        .collect()
}

pub fn adam_ref(c: &AdamConfig, p: &[f64], g: &[f64], st: &mut RefState, t: f64) -> Vec<f64> {
    let lr = sched(&c.lr, t, RUN_STEPS);
    let (bc1, bc2) = if c.bias_correction {
        (1.0 - c.beta1.powf(t), 1.0 - c.beta2.powf(t))
    } else {
        (1.0, 1.0)
    };
    let mut out = vec![0.0; p.len()];
    for k in 0..p.len() {
        let m = &mut st.get_mut("m").unwrap()[k];
        *m = c.beta1 * *m + (1.0 - c.beta1) * g[k];
        let mhat = *m / bc1;
        let v = &mut st.get_mut("v").unwrap()[k];
        *v = c.beta2 * *v + (1.0 - c.beta2) * g[k] * g[k];
        let vhat = *v / bc2;
        let u = mhat / (vhat.sqrt() + c.eps) + c.weight_decay * p[k];
        out[k] = p[k] - lr * u;
    }
    out
}

pub fn sgd_ref(c: &SgdConfig, p: &[f64], g: &[f64], st: &mut RefState, t: f64) -> Vec<f64> {
    let lr = sched(&c.lr, t, RUN_STEPS);
    let mut out = vec![0.0; p.len()];
    for k in 0..p.len() {
        let mut d = g[k];
        if c.momentum > 0.0 {
            let m = &mut st.get_mut("m").unwrap()[k];
            *m = c.momentum * *m + g[k];
            d = if c.nesterov {
                g[k] + c.momentum * *m
            } else {
                *m
            };
        }
        out[k] = p[k] - lr * (d + c.weight_decay * p[k]);
    }
    out
}

pub fn reference_step(
    opt: &Optimizer,
    s: &ParamSpec,
    p: &[f64],
    g: &[f64],
    st: &mut RefState,
    t: f64,
) -> Vec<f64> {
    match opt {
        Optimizer::Adafactor(c) => adafactor_ref(c, &s.ty.shape, p, g, st, t),
        Optimizer::Adam(c) => adam_ref(c, p, g, st, t),
        Optimizer::Sgd(c) => sgd_ref(c, p, g, st, t),
    }
}

/// Run `opt` for 5 steps on random params and gradients through the IR and through the
/// naive reference; every new parameter, state tensor and the lr agree within f64 rounding.
pub fn check_against_reference(opt: &Optimizer, seed: u64) {
    let params = specs();
    let prog = update_program(opt, &params);
    let states = opt.state_specs(&params);
    let mut r = lcg(seed);
    // IR-side values of every carried input.
    let mut carried: HashMap<String, HostTensor> = HashMap::new();
    // Reference-side values.
    let mut ref_p: HashMap<String, Vec<f64>> = HashMap::new();
    let mut ref_st: HashMap<String, RefState> = HashMap::new();
    for s in &params {
        let v: Vec<f64> = (0..s.ty.num_elements()).map(|_| 2.0 * r() - 1.0).collect();
        carried.insert(s.name.clone(), tensor(&s.ty, &v));
        ref_p.insert(s.name.clone(), v);
        ref_st.insert(s.name.clone(), RefState::new());
    }
    for st in &states {
        carried.insert(st.name.clone(), HostTensor::zeros(st.ty.clone()));
        if let Some(rest) = st.name.strip_prefix("opt/") {
            if let Some((param, slot)) = rest.rsplit_once('/') {
                ref_st
                    .get_mut(param)
                    .unwrap()
                    .insert(slot.to_string(), vec![0.0; st.ty.num_elements()]);
            }
        }
    }
    for step in 1..=5 {
        let t = step as f64;
        let mut inputs = carried.clone();
        for s in &params {
            // Gradients of varying scale, so clipping and the moments have work to do.
            let scale = [1.0, 10.0, 0.1, 3.0, 0.5][step - 1];
            let g: Vec<f64> = (0..s.ty.num_elements())
                .map(|_| scale * (2.0 * r() - 1.0))
                .collect();
            let want = reference_step(
                opt,
                s,
                &ref_p[&s.name],
                &g,
                ref_st.get_mut(&s.name).unwrap(),
                t,
            );
            ref_p.insert(s.name.clone(), want);
            inputs.insert(format!("in_grad/{}", s.name), tensor(&s.ty, &g));
        }
        let out = runtime::reference::run(&prog, &inputs).unwrap();
        let lr = out[LR_OUTPUT].to_f64_vec()[0];
        assert!(
            Tol::F64.accepts(lr, sched(opt.lr(), t, RUN_STEPS)),
            "step {step}: lr {lr} vs {}",
            sched(opt.lr(), t, RUN_STEPS)
        );
        assert_eq!(
            out[&new_name(STEP)].to_f64_vec(),
            vec![t],
            "step counter after step {step}"
        );
        for s in &params {
            let got = &out[&new_name(&s.name)];
            testkit::assert_close(
                &format!("{opt:?} step {step} new/{}", s.name),
                got,
                &tensor(&s.ty, &ref_p[&s.name]),
                Tol::F64,
            );
        }
        for st in &states {
            let got = &out[&new_name(&st.name)];
            if let Some((param, slot)) = st
                .name
                .strip_prefix("opt/")
                .and_then(|x| x.rsplit_once('/'))
            {
                testkit::assert_close(
                    &format!("{opt:?} step {step} new/{}", st.name),
                    got,
                    &tensor(&st.ty, &ref_st[param][slot]),
                    Tol::F64,
                );
            }
        }
        for name in carried.clone().keys() {
            carried.insert(name.clone(), out[&new_name(name)].clone());
        }
    }
}
