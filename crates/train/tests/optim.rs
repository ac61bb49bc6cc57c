//! `train::optim`: every optimizer's IR update against a naive f64 reference written here in
//! plain loops (5 steps, shapes [3], [4,5], [2,3,4]); Adafactor's factored state shapes;
//! update clipping; the learning-rate schedules; minimising a quadratic end to end
//! (Builder + autodiff::grad + append_update); sharded state annotations that propagate and
//! a partitioned update equal to the single-device one; a cross-check of Adafactor against
//! optax; configuration serde and typed errors.

use ir::{Builder, CollectiveKind, DType, Mesh, Program, Sharding, Type};
use nn::params::{Init, ParamSpec};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::spmd::{assert_spmd_matches, for_each_mesh};
use testkit::Tol;
use train::optim::{
    new_name, state_name, AdafactorConfig, AdamConfig, LrSchedule, OptimError, Optimizer,
    SgdConfig, LR_OUTPUT, STEP,
};

#[path = "optim/reference.rs"]
mod reference;
use reference::*;

/// The run length every update program here is built for (only a cool-down reads it).
const RUN_STEPS: u64 = 6;

// ---------------------------------------------------------------- helpers

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

fn spec(name: &str, shape: &[usize]) -> ParamSpec {
    ParamSpec {
        name: name.to_string(),
        ty: Type::new(DType::F64, shape.to_vec()),
        init: Init::Normal(1.0),
    }
}

fn specs() -> Vec<ParamSpec> {
    vec![
        spec("vec", &[3]),
        spec("mat", &[4, 5]),
        spec("layer/t3", &[2, 3, 4]),
    ]
}

fn tensor(ty: &Type, v: &[f64]) -> HostTensor {
    HostTensor::from_f64_values(ty.clone(), v)
}

/// A program whose gradients are inputs: parameter `p`, parameter `in_grad/p`, output
/// `grad_p` = that input; then the optimizer's update.
fn update_program(opt: &Optimizer, params: &[ParamSpec]) -> Program {
    let b = Builder::new();
    for s in params {
        b.param(&s.name, s.ty.clone());
        let g = b.param(&format!("in_grad/{}", s.name), s.ty.clone());
        b.output(&autodiff::grad_output_name(&s.name), &g);
    }
    opt.append_update(&b, params, RUN_STEPS).unwrap();
    let p = b.finish();
    ir::verify(&p).unwrap();
    p
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64).sqrt()
}

// ---------------------------------------------------------------- reference comparisons

#[test]
fn adafactor_matches_naive_reference_for_five_steps() {
    // GShard's / the paper's defaults: relative step with parameter scaling, beta1 = 0.
    check_against_reference(&Optimizer::default(), 1);
    // Explicit schedule with warm-up, momentum, weight decay, beta2 cap, tight clipping.
    check_against_reference(
        &Optimizer::Adafactor(AdafactorConfig {
            lr: LrSchedule::Rsqrt {
                base: 0.3,
                warmup_steps: 3,
                linear_warmup: true,
                // The main job's kind of schedule: step 5 of RUN_STEPS at 2/3 of the rate.
                cooldown: 0.5,
            },
            multiply_by_parameter_scale: false,
            beta1: 0.9,
            beta2_cap: Some(0.5),
            clipping_threshold: Some(0.5),
            weight_decay: 0.1,
            ..AdafactorConfig::default()
        }),
        2,
    );
    // Unfactored second moments everywhere, no clipping.
    check_against_reference(
        &Optimizer::Adafactor(AdafactorConfig {
            factored: false,
            clipping_threshold: None,
            ..AdafactorConfig::default()
        }),
        3,
    );
}

#[test]
fn adam_matches_naive_reference_for_five_steps() {
    check_against_reference(&Optimizer::Adam(AdamConfig::default()), 4);
    check_against_reference(
        &Optimizer::Adam(AdamConfig {
            lr: LrSchedule::Rsqrt {
                base: 0.5,
                warmup_steps: 2,
                linear_warmup: true,
                // The whole run of RUN_STEPS cools down: lr(t) *= (7 - t) / 6.
                cooldown: 1.0,
            },
            beta2: 0.98,
            weight_decay: 0.01,
            ..AdamConfig::default()
        }),
        5,
    );
    check_against_reference(
        &Optimizer::Adam(AdamConfig {
            bias_correction: false,
            ..AdamConfig::default()
        }),
        6,
    );
}

#[test]
fn sgd_matches_naive_reference_for_five_steps() {
    check_against_reference(&Optimizer::Sgd(SgdConfig::default()), 7);
    check_against_reference(
        &Optimizer::Sgd(SgdConfig {
            momentum: 0.9,
            weight_decay: 0.01,
            ..SgdConfig::default()
        }),
        8,
    );
    check_against_reference(
        &Optimizer::Sgd(SgdConfig {
            lr: LrSchedule::Rsqrt {
                base: 0.2,
                warmup_steps: 0,
                linear_warmup: true,
                // The last 3 of RUN_STEPS: steps 4 and 5 at 3/3 and 2/3 of the rate.
                cooldown: 0.5,
            },
            momentum: 0.5,
            nesterov: true,
            ..SgdConfig::default()
        }),
        9,
    );
}

// ---------------------------------------------------------------- state and clipping

#[test]
fn adafactor_state_is_factored() {
    let opt = Optimizer::default();
    let (n, m) = (300, 500);
    let st = opt.state_specs(&[spec("w", &[n, m]), spec("t", &[2, 3, 4]), spec("b", &[7])]);
    let shapes: Vec<(&str, Vec<usize>, DType, Init)> = st
        .iter()
        .map(|s| (s.name.as_str(), s.ty.shape.clone(), s.ty.dtype, s.init))
        .collect();
    assert_eq!(
        shapes,
        vec![
            (STEP, vec![], DType::I32, Init::Zeros),
            ("opt/w/v_row", vec![n], DType::F64, Init::Zeros),
            ("opt/w/v_col", vec![m], DType::F64, Init::Zeros),
            ("opt/t/v_row", vec![2, 3], DType::F64, Init::Zeros),
            ("opt/t/v_col", vec![2, 4], DType::F64, Init::Zeros),
            ("opt/b/v", vec![7], DType::F64, Init::Zeros),
        ]
    );
    // O(n + m) memory for an n x m matrix.
    let w_state: usize = st
        .iter()
        .filter(|s| s.name.starts_with("opt/w/"))
        .map(|s| s.ty.num_elements())
        .sum();
    assert_eq!(w_state, n + m);
    // Momentum adds a full-size slot; Adam keeps two, SGD none or one.
    let with_m = Optimizer::Adafactor(AdafactorConfig {
        beta1: 0.9,
        ..AdafactorConfig::default()
    });
    let names = |o: &Optimizer| -> Vec<String> {
        o.state_specs(&[spec("w", &[4, 5])])
            .into_iter()
            .map(|s| s.name)
            .collect()
    };
    assert_eq!(
        names(&with_m),
        [STEP, "opt/w/v_row", "opt/w/v_col", "opt/w/m"]
    );
    assert_eq!(
        names(&Optimizer::Adam(AdamConfig::default())),
        [STEP, "opt/w/m", "opt/w/v"]
    );
    assert_eq!(names(&Optimizer::Sgd(SgdConfig::default())), [STEP]);
    assert_eq!(state_name("w", "v_row"), "opt/w/v_row");
    // The update program's state parameters and outputs have exactly these types.
    let params = [spec("w", &[n, m])];
    let p = update_program(&opt, &params);
    for s in opt.state_specs(&params) {
        let id = p.param(&s.name).unwrap();
        assert_eq!(p.ty(id), &s.ty, "{}", s.name);
        let out = p.output(&new_name(&s.name)).unwrap();
        assert_eq!(p.ty(out), &s.ty, "new/{}", s.name);
    }
}

/// A huge gradient after a history of tiny ones makes `RMS(U)` large; clipping brings the
/// update down to `RMS <= d * lr`.
#[test]
fn update_clipping_clips() {
    let params = [spec("w", &[4, 5]), spec("b", &[6])];
    for d in [1.0, 0.25] {
        let run = |clip: Option<f64>| -> Vec<f64> {
            let opt = Optimizer::Adafactor(AdafactorConfig {
                lr: LrSchedule::Constant { value: 0.01 },
                multiply_by_parameter_scale: false,
                clipping_threshold: clip,
                ..AdafactorConfig::default()
            });
            let prog = update_program(&opt, &params);
            let mut r = lcg(11);
            let mut inputs = HashMap::new();
            for s in &params {
                let n = s.ty.num_elements();
                let p: Vec<f64> = (0..n).map(|_| r()).collect();
                let g: Vec<f64> = (0..n).map(|_| 1e6 * (2.0 * r() - 1.0)).collect();
                inputs.insert(s.name.clone(), tensor(&s.ty, &p));
                inputs.insert(format!("in_grad/{}", s.name), tensor(&s.ty, &g));
            }
            for s in opt.state_specs(&params) {
                let v = vec![1e-6; s.ty.num_elements()];
                inputs.insert(s.name.clone(), tensor(&s.ty, &v));
            }
            // Step 100: beta2 = 1 - 100^-0.8 ~ 0.975, so U ~ g / sqrt(0.025 g^2) ~ 6.
            inputs.insert(STEP.into(), HostTensor::scalar_i32(99));
            let out = runtime::reference::run(&prog, &inputs).unwrap();
            params
                .iter()
                .map(|s| {
                    let old = inputs[&s.name].to_f64_vec();
                    let new = out[&new_name(&s.name)].to_f64_vec();
                    let delta: Vec<f64> = old.iter().zip(&new).map(|(a, b)| a - b).collect();
                    rms(&delta)
                })
                .collect()
        };
        let clipped = run(Some(d));
        let unclipped = run(None);
        for (c, u) in clipped.iter().zip(&unclipped) {
            assert!(
                *c <= d * 0.01 * (1.0 + 1e-12),
                "clipped RMS {c} > {}",
                d * 0.01
            );
            assert!((c - d * 0.01).abs() < 1e-12, "clipping should bind: {c}");
            assert!(*u > 4.0 * 0.01, "without clipping the update is large: {u}");
        }
    }
}

// ---------------------------------------------------------------- schedules

/// The `lr` output of the update program at 1-based step `t`.
fn lr_at(opt: &Optimizer, dtype: DType, t: i32) -> f64 {
    let params = [ParamSpec {
        name: "w".into(),
        ty: Type::new(dtype, [2]),
        init: Init::Zeros,
    }];
    let prog = update_program(opt, &params);
    let mut inputs = HashMap::new();
    for s in params.iter().chain(&opt.state_specs(&params)) {
        inputs.insert(s.name.clone(), HostTensor::zeros(s.ty.clone()));
    }
    inputs.insert("in_grad/w".into(), HostTensor::zeros(params[0].ty.clone()));
    inputs.insert(STEP.into(), HostTensor::scalar_i32(t - 1));
    let out = runtime::reference::run(&prog, &inputs).unwrap();
    assert_eq!(out[LR_OUTPUT].dtype(), dtype);
    out[LR_OUTPUT].to_f64_vec()[0]
}

#[test]
fn schedule_values() {
    let warm = LrSchedule::Rsqrt {
        base: 2.0,
        warmup_steps: 100,
        linear_warmup: true,
        cooldown: 0.0,
    };
    // base * min(t/w, 1) * rsqrt(max(t, w))
    let want = [(1, 2.0 * 0.01 * 0.1), (100, 2.0 * 0.1), (400, 2.0 * 0.05)];
    let relative = LrSchedule::relative_step();
    // min(1e-2, 1/sqrt(t)): flat at 1e-2 until 10k steps, then 1/sqrt(t).
    let want_rel = [(1, 0.01), (10_000, 0.01), (40_000, 0.005)];
    let constant = LrSchedule::Constant { value: 0.3 };
    // Cool-down over the last half of a 6-step run: rsqrt(t) * clamp((7 - t) / 3, 0, 1).
    let cool = LrSchedule::Rsqrt {
        base: 1.0,
        warmup_steps: 0,
        linear_warmup: false,
        cooldown: 0.5,
    };
    let want_cool = [
        (1, 1.0),
        (4, 0.5),
        (5, 2.0 / 3.0 / 5f64.sqrt()),
        (6, 1.0 / 3.0 / 6f64.sqrt()),
        (7, 0.0),
    ];
    assert_eq!(RUN_STEPS, 6, "want_cool is written for a 6-step run");
    // Step 4 runs at the full rate (rsqrt(4) = 0.5), step 5 below it.
    assert_eq!(cool.first_cooled_step(RUN_STEPS), Some(5));
    assert_eq!(warm.first_cooled_step(RUN_STEPS), None);
    for (s, want) in [
        (&warm, &want[..]),
        (&relative, &want_rel[..]),
        (&constant, &[(1, 0.3), (100, 0.3), (400, 0.3)][..]),
        (&cool, &want_cool[..]),
    ] {
        for &(t, w) in want {
            assert!(
                Tol::F64.accepts(s.value(t as f64, RUN_STEPS), w),
                "{s:?} at {t}: {} vs {w}",
                s.value(t as f64, RUN_STEPS)
            );
            let opt = Optimizer::Adam(AdamConfig {
                lr: s.clone(),
                ..AdamConfig::default()
            });
            let got = lr_at(&opt, DType::F64, t);
            assert!(Tol::F64.accepts(got, w), "{s:?} IR at {t}: {got} vs {w}");
            let got32 = lr_at(&opt, DType::F32, t);
            assert!(Tol::F32.accepts(got32, w), "{s:?} f32 at {t}: {got32}");
        }
    }
    // Warm-up 0: plain inverse square root.
    let plain = LrSchedule::Rsqrt {
        base: 1.0,
        warmup_steps: 0,
        linear_warmup: true,
        cooldown: 0.0,
    };
    assert_eq!(plain.value(4.0, RUN_STEPS), 0.5);
    // Adafactor's default is the relative step.
    assert_eq!(AdafactorConfig::default().lr, relative);
}

// ---------------------------------------------------------------- end to end

/// Minimise `sum(c * (w - target)^2)` for 200 steps: forward, autodiff, update in one
/// program, `new/*` fed back each step.
fn minimise_quadratic(opt: &Optimizer) -> (f64, f64) {
    let b = Builder::new();
    let params = vec![spec("w", &[4, 6]), spec("bias", &[5])];
    let mut loss = b.scalar(0.0, DType::F64);
    for s in &params {
        let w = b.param(&s.name, s.ty.clone());
        let target = b.param(&format!("target/{}", s.name), s.ty.clone());
        let c = b.param(&format!("curv/{}", s.name), s.ty.clone());
        let d = w.sub(&target);
        loss = loss.add(&d.mul(&d).mul(&c).sum_all());
    }
    b.output("loss", &loss);
    let fwd = b.finish();
    let with_grad = autodiff::grad(&fwd, "loss", &["w", "bias"]).unwrap();
    let b = Builder::from_program(with_grad);
    opt.append_update(&b, &params, RUN_STEPS).unwrap();
    let prog = b.finish();
    ir::verify(&prog).unwrap();

    let mut r = lcg(21);
    let mut inputs = HashMap::new();
    for s in &params {
        let n = s.ty.num_elements();
        let w: Vec<f64> = (0..n).map(|_| 2.0 * r() - 1.0).collect();
        let t: Vec<f64> = (0..n).map(|_| 2.0 * r() - 1.0).collect();
        // Curvatures spread over a decade: an ill-conditioned bowl.
        let c: Vec<f64> = (0..n).map(|_| 0.3 + 2.7 * r()).collect();
        inputs.insert(s.name.clone(), tensor(&s.ty, &w));
        inputs.insert(format!("target/{}", s.name), tensor(&s.ty, &t));
        inputs.insert(format!("curv/{}", s.name), tensor(&s.ty, &c));
    }
    for s in opt.state_specs(&params) {
        inputs.insert(s.name.clone(), HostTensor::zeros(s.ty));
    }
    let carried: Vec<String> = params
        .iter()
        .chain(&opt.state_specs(&params))
        .map(|s| s.name.clone())
        .collect();
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..200 {
        let out = runtime::reference::run(&prog, &inputs).unwrap();
        last = out["loss"].to_f64_vec()[0];
        first.get_or_insert(last);
        for name in &carried {
            inputs.insert(name.clone(), out[&new_name(name)].clone());
        }
    }
    (first.unwrap(), last)
}

#[test]
fn every_optimizer_minimises_a_quadratic() {
    let opts = [
        // The default relative step (1e-2 * RMS(w)) is made for 10^5-step runs: it moves
        // each weight by about 0.006 a step, too little to cross this bowl in 200 steps.
        (
            "adafactor (parameter scale, constant 0.1)",
            Optimizer::Adafactor(AdafactorConfig {
                lr: LrSchedule::Constant { value: 0.1 },
                ..AdafactorConfig::default()
            }),
        ),
        (
            "adafactor (explicit rsqrt schedule, momentum)",
            Optimizer::Adafactor(AdafactorConfig {
                lr: LrSchedule::Rsqrt {
                    base: 1.0,
                    warmup_steps: 10,
                    linear_warmup: true,
                    cooldown: 0.0,
                },
                multiply_by_parameter_scale: false,
                beta1: 0.5,
                ..AdafactorConfig::default()
            }),
        ),
        (
            "adam",
            Optimizer::Adam(AdamConfig {
                lr: LrSchedule::Constant { value: 0.05 },
                ..AdamConfig::default()
            }),
        ),
        ("sgd", Optimizer::Sgd(SgdConfig::default())),
        (
            "sgd momentum",
            Optimizer::Sgd(SgdConfig {
                lr: LrSchedule::Constant { value: 0.02 },
                momentum: 0.9,
                ..SgdConfig::default()
            }),
        ),
    ];
    for (name, opt) in opts {
        let (first, last) = minimise_quadratic(&opt);
        eprintln!("{name}: loss {first} -> {last}");
        assert!(
            last < first / 100.0,
            "{name}: loss fell only from {first} to {last}"
        );
    }
}

// ---------------------------------------------------------------- sharding

/// A [8, 4] weight split over the mesh: its state is annotated like it, propagation keeps
/// those shardings, the partitioned update gathers nothing and equals the single-device one.
#[test]
fn sharded_state_follows_its_parameter() {
    let opts = [
        Optimizer::Adafactor(AdafactorConfig {
            lr: LrSchedule::Constant { value: 0.1 },
            beta1: 0.9,
            weight_decay: 0.01,
            ..AdafactorConfig::default()
        }),
        Optimizer::default(),
        Optimizer::Adam(AdamConfig::default()),
        Optimizer::Sgd(SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        }),
    ];
    for_each_mesh(|mesh: &Mesh| {
        let axes: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
        // Dim 0 over the first axis; on 2-D meshes dim 1 over the second too.
        let w_sharding = Sharding::from_dims(&[&axes[..1], &axes[1..]]);
        for opt in &opts {
            let b = Builder::with_mesh(mesh.clone());
            let params = vec![spec("w", &[8, 4]), spec("bias", &[4])];
            let w = b.param("w", params[0].ty.clone());
            sharding::annotate::annotate(&w, w_sharding.clone()).unwrap();
            let bias = b.param("bias", params[1].ty.clone());
            let x = b.param("x", Type::new(DType::F64, [8]));
            let target = b.param("target", Type::new(DType::F64, [8, 4]));
            let y = x.broadcast_in_dim(&[8, 4], &[0]).mul(&w).add(&bias);
            let d = y.sub(&target);
            b.output("loss", &d.mul(&d).sum_all());
            let fwd = b.finish();
            let p = autodiff::grad(&fwd, "loss", &["w", "bias"]).unwrap();
            let b = Builder::from_program(p);
            opt.append_update(&b, &params, RUN_STEPS).unwrap();
            let prog = b.finish();

            // Annotations as written by append_update.
            let slot = |name: &str| -> Option<Sharding> {
                let s = name.rsplit('/').next().unwrap();
                match s {
                    "v_row" => Some(Sharding::from_dims(&[&axes[..1]])),
                    "v_col" => Some(Sharding::from_dims(&[&axes[1..]])),
                    "v" | "m" if name.starts_with("opt/w/") => Some(w_sharding.clone()),
                    _ => None,
                }
            };
            for s in opt.state_specs(&params) {
                let id = prog.param(&s.name).unwrap();
                assert_eq!(prog.instr(id).sharding, slot(&s.name), "{opt:?} {}", s.name);
                let out = prog.output(&new_name(&s.name)).unwrap();
                assert_eq!(
                    prog.instr(out).sharding,
                    slot(&s.name),
                    "{opt:?} new/{}",
                    s.name
                );
            }
            let nw = prog.output(&new_name("w")).unwrap();
            assert_eq!(prog.instr(nw).sharding.as_ref(), Some(&w_sharding));

            // Propagation keeps them and reaches the gradient.
            let done = sharding::propagate(&prog).unwrap();
            for s in opt.state_specs(&params) {
                if let Some(want) = slot(&s.name) {
                    let id = done.param(&s.name).unwrap();
                    assert_eq!(done.instr(id).sharding.as_ref(), Some(&want));
                    let out = done.output(&new_name(&s.name)).unwrap();
                    assert_eq!(done.instr(out).sharding.as_ref(), Some(&want));
                }
            }
            let g = done.output("grad_w").unwrap();
            assert_eq!(done.instr(g).sharding.as_ref(), Some(&w_sharding));

            // The partitioned step equals the single-device step.
            let mut r = lcg(5);
            let mut inputs = HashMap::new();
            for (name, ty) in [
                ("w", params[0].ty.clone()),
                ("bias", params[1].ty.clone()),
                ("x", Type::new(DType::F64, [8])),
                ("target", Type::new(DType::F64, [8, 4])),
            ] {
                let v: Vec<f64> = (0..ty.num_elements()).map(|_| 2.0 * r() - 1.0).collect();
                inputs.insert(name.to_string(), tensor(&ty, &v));
            }
            for s in opt.state_specs(&params) {
                let v: Vec<f64> = (0..s.ty.num_elements()).map(|_| 0.1 + r()).collect();
                inputs.insert(s.name.clone(), tensor(&s.ty, &v));
            }
            inputs.insert(STEP.into(), HostTensor::scalar_i32(3));
            let part = assert_spmd_matches(&prog, &inputs, Tol::F64);
            // The update is local: only reductions (RMS, means) communicate.
            for c in spmd::report::collectives(&part.program) {
                assert_eq!(c.kind, "all_reduce", "{opt:?} on {mesh}: {c:?}");
                assert!(c.shape.iter().product::<usize>() <= 8, "{c:?}");
            }
            assert!(part.program.instrs.iter().all(|i| !matches!(
                i.op.as_collective().map(|c| &c.kind),
                Some(CollectiveKind::AllGather { .. } | CollectiveKind::AllToAll { .. })
            )));
        }
    });
}

// ---------------------------------------------------------------- optax

/// Adafactor against optax 0.2.8 (jax 0.10.2, x64) on params `a` [5], `b` [3,4], `c` [2,3,4]
/// with `w0[k] = 1.5 sin(0.7k + 0.3 + i)`, target `cos(1.3k + i)` (k the flat index, i the
/// param's index), loss `sum((w - target)^2)`, 3 steps. optax settings:
///
/// - "default" = `optax.adafactor(learning_rate=lambda c: min(1e-2, 1/sqrt(c+1)),
///   min_dim_size_to_factor=1, decay_rate=0.8, multiply_by_parameter_scale=True,
///   clipping_threshold=1.0, momentum=None, eps=1e-30)` = our `AdafactorConfig::default()`;
/// - "momentum" = the same with `learning_rate=0.05, multiply_by_parameter_scale=False,
///   momentum=0.9` = ours with `lr: constant 0.05, multiply_by_parameter_scale: false,
///   beta1: 0.9`.
///
/// optax computes `1 - t^-0.8` in f32 even under x64; the numbers below come from the same
/// chain (`scale_by_factored_rms`, `clip_by_block_rms`, `scale_by_learning_rate`,
/// `scale_by_param_block_rms`, `ema(debias=False)`, `scale(-1)`; equal to
/// `optax.adafactor` to the last bit) with `decay_rate_fn` computing it in f64. The f32 decay
/// moves the results by at most 1.2e-11.
#[rustfmt::skip]
const OPTAX: &[(&str, &str, &[f64])] = &[
("default", "a", &[0.4729558557677354, 1.2324288949632993, 1.4576461017162616, 0.9833624265071669, 0.0919592164027927]),
("default", "b", &[1.4261387298623387, 1.325999928570017, 0.6006678387766733, -0.36654176228268187, -1.1835501205330736, -1.462256589476573, -1.052270716027821, -0.14258677863189745, 0.854217773725757, 1.4403666780850064, 1.3105717651268367, 0.5578212040887328]),
("default", "c", &[1.0940318109553302, 0.1760305531121195, -0.778365399900858, -1.390122244504152, -1.3502689599739799, -0.6935076485983351, 0.28645072249023407, 1.1697816714657572, 1.4782590319022937, 1.0522990615322074, 0.13096672170165866, -0.8165685665968823, -1.4053608011043828, -1.3410353009932392, -0.6570945135718925, 0.3201083162780434, 1.1561496678223668, 1.4727457763869223, 1.0807206226292048, 0.15623742715597655, -0.839659961128599, -1.424156430988265, -1.3202542804394295, -0.6105457606473126]),
("momentum", "a", &[0.47123159072764265, 1.2342113981642189, 1.459470416508646, 0.9851760812144941, 0.09028498814055264]),
("momentum", "b", &[1.4288507188438397, 1.3313692714559038, 0.6063785172708626, -0.3689151694069674, -1.1897464116022753, -1.4667820537929546, -1.0531247779480823, -0.1400441871041752, 0.856120535298015, 1.442000871481249, 1.3166048199841567, 0.5663511328930665]),
("momentum", "c", &[1.0966101883019452, 0.17977138744633314, -0.7800970200205494, -1.3940326486518229, -1.3543021261344066, -0.6938614011830916, 0.29025908267491984, 1.1719500929946742, 1.4803825989670114, 1.0573015910646364, 0.1367474739111238, -0.8165120990356088, -1.4084792235987944, -1.3450238818554558, -0.6589198861584161, 0.32295415801317595, 1.1613324127901026, 1.4752829616255658, 1.08109537460686, 0.15679583510632344, -0.8393877043437601, -1.4260436527490372, -1.3253606726712301, -0.6148689700297666]),
];

#[test]
fn adafactor_matches_optax() {
    let params = vec![spec("a", &[5]), spec("b", &[3, 4]), spec("c", &[2, 3, 4])];
    let configs = [
        ("default", AdafactorConfig::default()),
        (
            "momentum",
            AdafactorConfig {
                lr: LrSchedule::Constant { value: 0.05 },
                multiply_by_parameter_scale: false,
                beta1: 0.9,
                ..AdafactorConfig::default()
            },
        ),
    ];
    for (cname, cfg) in configs {
        let opt = Optimizer::Adafactor(cfg);
        let b = Builder::new();
        let mut loss = b.scalar(0.0, DType::F64);
        for s in &params {
            let w = b.param(&s.name, s.ty.clone());
            let t = b.param(&format!("target/{}", s.name), s.ty.clone());
            let d = w.sub(&t);
            loss = loss.add(&d.mul(&d).sum_all());
        }
        b.output("loss", &loss);
        let p = autodiff::grad(&b.finish(), "loss", &["a", "b", "c"]).unwrap();
        let b = Builder::from_program(p);
        opt.append_update(&b, &params, RUN_STEPS).unwrap();
        let prog = b.finish();
        let mut inputs = HashMap::new();
        for (i, s) in params.iter().enumerate() {
            let off = i as f64;
            let n = s.ty.num_elements();
            let w: Vec<f64> = (0..n)
                .map(|k| (0.7 * k as f64 + 0.3 + off).sin() * 1.5)
                .collect();
            let t: Vec<f64> = (0..n).map(|k| (1.3 * k as f64 + off).cos()).collect();
            inputs.insert(s.name.clone(), tensor(&s.ty, &w));
            inputs.insert(format!("target/{}", s.name), tensor(&s.ty, &t));
        }
        let carried: Vec<ParamSpec> = params
            .iter()
            .cloned()
            .chain(opt.state_specs(&params))
            .collect();
        for s in opt.state_specs(&params) {
            inputs.insert(s.name.clone(), HostTensor::zeros(s.ty));
        }
        for _ in 0..3 {
            let out = runtime::reference::run(&prog, &inputs).unwrap();
            for s in &carried {
                inputs.insert(s.name.clone(), out[&new_name(&s.name)].clone());
            }
        }
        for (c, pname, want) in OPTAX {
            if *c != cname {
                continue;
            }
            let s = params.iter().find(|s| s.name == *pname).unwrap();
            testkit::assert_close(
                &format!("optax {cname} {pname}"),
                &inputs[*pname],
                &tensor(&s.ty, want),
                Tol::F64,
            );
        }
    }
}

// ---------------------------------------------------------------- config and errors

#[test]
fn configs_deserialize_with_defaults_and_reject_unknown_fields() {
    let o: Optimizer = serde_json::from_str(r#"{"kind": "adafactor"}"#).unwrap();
    assert_eq!(o, Optimizer::default());
    let o: Optimizer = serde_json::from_str(
        r#"{"kind": "adafactor", "beta1": 0.9, "lr": {"kind": "rsqrt", "base": 1.0, "warmup_steps": 10000}}"#,
    )
    .unwrap();
    let Optimizer::Adafactor(c) = &o else {
        panic!("{o:?}")
    };
    assert_eq!(c.beta1, 0.9);
    // An omitted `linear_warmup` is the main job's choice: no linear warm-up factor.
    assert_eq!(
        c.lr,
        LrSchedule::Rsqrt {
            base: 1.0,
            warmup_steps: 10_000,
            linear_warmup: false,
            cooldown: 0.0,
        }
    );
    let o: Optimizer =
        serde_json::from_str(r#"{"kind": "adam", "beta2": 0.98, "weight_decay": 0.1}"#).unwrap();
    assert_eq!(
        o,
        Optimizer::Adam(AdamConfig {
            beta2: 0.98,
            weight_decay: 0.1,
            ..AdamConfig::default()
        })
    );
    let o: Optimizer = serde_json::from_str(r#"{"kind": "sgd", "momentum": 0.9}"#).unwrap();
    assert_eq!(
        o,
        Optimizer::Sgd(SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        })
    );
    for bad in [
        r#"{"kind": "adafactor", "beta_1": 0.9}"#,
        r#"{"kind": "adam", "lr": {"kind": "constant", "value": 0.1, "warmup": 3}}"#,
        r#"{"kind": "rmsprop"}"#,
    ] {
        assert!(serde_json::from_str::<Optimizer>(bad).is_err(), "{bad}");
    }
    // Round trip.
    for o in [
        Optimizer::default(),
        Optimizer::Adam(AdamConfig::default()),
        Optimizer::Sgd(SgdConfig::default()),
    ] {
        let s = serde_json::to_string(&o).unwrap();
        let mut back = serde_json::from_str::<Optimizer>(&s).unwrap();
        // serde_json parses floats to within 1 ulp unless its `float_roundtrip` feature is
        // on: 1e-30 comes back as 9.999999999999999e-31.
        if let Optimizer::Adafactor(c) = &mut back {
            assert!((c.eps1 - 1e-30).abs() <= 1e-45, "{}", c.eps1);
            c.eps1 = 1e-30;
        }
        assert_eq!(back, o, "{s}");
    }
}

#[test]
fn errors_name_the_parameter_and_the_fix() {
    let opt = Optimizer::default();
    // No gradient output.
    let b = Builder::new();
    b.param("w", Type::new(DType::F64, [2, 2]));
    let e = opt
        .append_update(&b, &[spec("w", &[2, 2])], RUN_STEPS)
        .unwrap_err();
    assert!(matches!(&e, OptimError::MissingGrad { name, .. } if name == "w"));
    let msg = e.to_string();
    assert!(
        msg.contains("grad_w") && msg.contains("autodiff::grad"),
        "{msg}"
    );
    // Unknown parameter.
    let e = opt
        .append_update(&b, &[spec("nope", &[2])], RUN_STEPS)
        .unwrap_err();
    assert!(
        matches!(&e, OptimError::MissingParam { name } if name == "nope"),
        "{e}"
    );
    // Spec type differs from the program's.
    let e = opt
        .append_update(&b, &[spec("w", &[4])], RUN_STEPS)
        .unwrap_err();
    assert!(matches!(e, OptimError::ParamType { .. }), "{e}");
    // Called twice: the outputs exist.
    let p = update_program(&opt, &[spec("w", &[2, 2])]);
    let b = Builder::from_program(p);
    let e = opt
        .append_update(&b, &[spec("w", &[2, 2])], RUN_STEPS)
        .unwrap_err();
    assert!(matches!(e, OptimError::OutputExists { .. }), "{e}");
    // Bad settings: momentum of 1.5, a cool-down longer than the run.
    let cool = LrSchedule::Rsqrt {
        base: 0.1,
        warmup_steps: 0,
        linear_warmup: false,
        cooldown: 1.5,
    };
    for (bad, want) in [
        (
            AdamConfig {
                beta1: 1.5,
                ..AdamConfig::default()
            },
            ["beta1", "[0, 1)"],
        ),
        (
            AdamConfig {
                lr: cool,
                ..AdamConfig::default()
            },
            ["lr.cooldown", "0 to 1"],
        ),
    ] {
        let e = Optimizer::Adam(bad)
            .append_update(&Builder::new(), &[], RUN_STEPS)
            .unwrap_err()
            .to_string();
        assert!(want.iter().all(|w| e.contains(w)), "{e}");
    }
    // Integer parameters are refused.
    let b = Builder::new();
    let i = b.param("i", Type::new(DType::I32, [2]));
    b.output("grad_i", &i);
    let e = opt
        .append_update(
            &b,
            &[ParamSpec {
                name: "i".into(),
                ty: Type::new(DType::I32, [2]),
                init: Init::Zeros,
            }],
            RUN_STEPS,
        )
        .unwrap_err();
    assert!(matches!(e, OptimError::NotFloat { .. }), "{e}");
}
