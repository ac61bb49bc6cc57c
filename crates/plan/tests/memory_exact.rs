//! The planned per-device peak (the executor's buffer planning walked on shapes alone,
//! `train::memory::plan_memory`) against the peak the executor measures when it runs: the
//! GShard MoE layer with its gradients on 1, 2, 4 and 8 devices, and the training step of
//! the default run (also with its MoE layers in 2 and 4 overlapped chunks) and of the
//! model-axis and weight-update-sharding meshes.

use ir::{DType, Mesh, Program};
use runtime::{Executable, HostTensor, InProcess, MemoryOptions};
use std::collections::HashMap;
use train::config::TrainConfig;
use train::trainer::{build_programs, init_tensor, step_program, Trainer};

/// Uniform noise in [-1, 1) for floats (in [0, 1) for `noise`), a counter for i32.
fn inputs(p: &Program, seed: u64) -> HashMap<String, HostTensor> {
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64) / ((1u64 << 53) as f64)
    };
    p.params()
        .into_iter()
        .map(|(name, v)| {
            let ty = p.ty(v).clone();
            let vals: Vec<f64> = (0..ty.num_elements())
                .map(|_| match name {
                    "noise" => next(),
                    _ => 2.0 * next() - 1.0,
                })
                .collect();
            (name.to_string(), HostTensor::from_f64_values(ty, &vals))
        })
        .collect()
}

fn moe_layer() -> Program {
    let path = format!(
        "{}/../runtime/tests/data/moe_relu_all.gsir",
        env!("CARGO_MANIFEST_DIR")
    );
    ir::text::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn moe_layer_planned_peak_is_the_measured_peak_on_1_2_4_8_devices() {
    let p = moe_layer();
    let ins = inputs(&p, 3);
    for d in [1usize, 2, 4, 8] {
        let mut q = p.clone();
        q.mesh = Some(Mesh::new(&[("expert", d)]).unwrap());
        let part = spmd::compile(&q).unwrap();
        let per_dev = driver::shard_inputs(&part, &ins).unwrap();
        let exe = Executable::new(&part.program).unwrap();
        let planned = train::memory::plan_of(&exe, MemoryOptions::in_process());
        for round in 0..2 {
            let r = exe.run(&InProcess::new(d), &per_dev, None).unwrap();
            assert_eq!(
                planned.plan.peak_bytes, r.peak_bytes_per_device,
                "{d} devices, run {round}: planned {} measured {}",
                planned.plan.peak_bytes, r.peak_bytes_per_device
            );
        }
        assert_eq!(planned.breakdown.total(), planned.plan.peak_bytes as u64);
        // Prepared for planning only (no offset tables), the same plan.
        let shapes = Executable::for_planning(&part.program).unwrap();
        assert_eq!(
            shapes.memory_plan(MemoryOptions::in_process()),
            planned.plan
        );
        assert!(shapes
            .run(&InProcess::new(d), &per_dev, None)
            .is_err_and(|e| matches!(e, runtime::ExecError::PlanningOnly)));
        // The same program planned for one device per process places no all-to-all early.
        let apart = exe.memory_plan(MemoryOptions::distributed());
        assert!(apart.peak_bytes <= planned.plan.peak_bytes, "{d} devices");
    }
}

/// A batch for the step program's non-state inputs: tokens in the vocabulary, one
/// sentence per row (segment 1), positions along the row, unit weights.
fn batch(p: &Program, state: &[String], vocab: usize) -> HashMap<String, HostTensor> {
    let mut out = HashMap::new();
    for (name, v) in p.params() {
        if state.iter().any(|s| s == name) || name == "seed" {
            continue;
        }
        let ty = p.ty(v).clone();
        let row = *ty.shape.last().unwrap_or(&1);
        let vals: Vec<f64> = (0..ty.num_elements())
            .map(|i| match ty.dtype {
                DType::I32 if name.contains("seg") => 1.0,
                DType::I32 if name.contains("pos") => (i % row) as f64,
                DType::I32 => (3 + (i * 7919) % (vocab - 3)) as f64,
                _ => 1.0,
            })
            .collect();
        out.insert(name.to_string(), HostTensor::from_f64_values(ty, &vals));
    }
    out
}

/// Plan the training step of `cfg`, run it twice on in-process devices and compare the
/// planned peak per device with the measured one (exact), the breakdown with the peak and
/// the plan prepared for planning only with the executor's.
fn planned_is_measured(cfg: &TrainConfig, what: &str) {
    let vocab = cfg.data.vocab_size;
    let programs = build_programs(cfg, vocab).unwrap();
    let state: Vec<String> = programs.all_state().map(|s| s.name.clone()).collect();
    let step = programs.step.program.clone();
    // Prepared as the trainer prepares it (with `model.overlap`, all-to-alls in flight).
    let exec = runtime::ExecOptions::native().with_overlap(cfg.model.overlap > 1);
    let exe = Executable::with_options(&step, exec).unwrap_or_else(|e| panic!("{what}: {e}"));
    let planned = train::memory::plan_of(&exe, MemoryOptions::in_process());
    // Global inputs of the step program (its partitioned params are local).
    let mut spec_program = step_program(cfg, vocab).unwrap().program;
    spec_program.mesh = None;
    let b = batch(&spec_program, &state, vocab);
    let init: HashMap<String, HostTensor> = programs
        .all_state()
        .enumerate()
        .map(|(k, s)| (s.name.clone(), init_tensor(s, 1, k as u64)))
        .collect();
    let mut tr = Trainer::new(cfg, programs, Some(init), 0).unwrap();
    for _ in 0..2 {
        tr.train_step(&b).unwrap();
    }
    let measured = tr.peak_bytes_per_device;
    assert_eq!(
        planned.breakdown.total(),
        planned.plan.peak_bytes as u64,
        "{what}"
    );
    // Prepared for planning only (no offset tables), the same plan.
    let shapes = Executable::for_planning_with(&step, exec).unwrap();
    let shapes = train::memory::plan_of(&shapes, MemoryOptions::in_process());
    assert_eq!(shapes.plan, planned.plan, "{what}");
    assert_eq!(
        planned.plan.peak_bytes,
        measured,
        "{what}: planned {} ({}) measured {measured}",
        planned.plan.peak_bytes,
        planned.breakdown.line()
    );
}

#[test]
fn default_run_step_planned_peak_is_the_measured_peak() {
    planned_is_measured(&TrainConfig::default(), "the default run");
}

#[test]
fn overlapped_run_step_planned_peak_is_the_measured_peak() {
    // The MoE layers cut into 2 and 4 chunks: their all-to-alls started early and waited
    // for late, each operand live from start to wait.
    for k in [2, 4] {
        let mut cfg = TrainConfig::default();
        cfg.model.overlap = k;
        planned_is_measured(&cfg, &format!("the default run with overlap {k}"));
    }
}

#[test]
fn model_axis_and_weight_sharding_planned_peaks_are_the_measured_peaks() {
    for (data, expert, model, shard) in [
        (2, 2, 2, ""),
        (2, 2, 2, "model"),
        (2, 4, 1, "data"),
        (2, 2, 2, "expert"),
        (1, 1, 1, ""),
    ] {
        let mut cfg = TrainConfig::default();
        cfg.mesh.data = data;
        cfg.mesh.expert = expert;
        cfg.mesh.model = model;
        cfg.mesh.shard_weights = shard.to_string();
        let what = format!("data={data},expert={expert},model={model} shard_weights={shard:?}");
        planned_is_measured(&cfg, &what);
    }
}

/// What one device holds of the default run's step on mesh `data x model`, at width 64 with 4
/// heads (so that `model` = 2 and 4 both divide the heads).
fn held(data: usize, model: usize, shard: &str) -> train::memory::Held {
    let mut cfg = TrainConfig::default();
    cfg.model.model_dim = 64;
    cfg.model.heads = 4;
    cfg.mesh.data = data;
    cfg.mesh.expert = 1;
    cfg.mesh.model = model;
    cfg.mesh.shard_weights = shard.to_string();
    cfg.validate().unwrap();
    let step = step_program(&cfg, cfg.data.vocab_size).unwrap();
    let part = spmd::compile(&step.program).unwrap();
    train::memory::held(&part.program)
}

#[test]
fn sharded_weights_and_gradients_fall_as_one_over_n() {
    let one = held(1, 1, "");
    assert!(one.weights > 0 && one.optimizer_state > 0 && one.saved_activations > 0);
    // Gradients are applied in the weights' layout, in f32 like them.
    assert_eq!(one.gradients, one.weights, "{one:?}");
    let near = |got: u64, want: f64, what: &str| {
        let r = got as f64 / want;
        assert!((0.97..=1.03).contains(&r), "{what}: {got} vs {want}");
    };
    for n in [2usize, 4] {
        let dp = held(n, 1, "");
        assert_eq!(dp.weights, one.weights, "data={n} replicates the weights");
        let zero = held(n, 1, "data");
        let what = format!("data={n}, weights sharded over data");
        near(zero.weights, one.weights as f64 / n as f64, &what);
        near(zero.gradients, one.gradients as f64 / n as f64, &what);
        assert!(zero.optimizer_state < dp.optimizer_state, "{what}");
        // Data parallelism splits the batch: the saved activations fall with it.
        near(
            dp.saved_activations,
            one.saved_activations as f64 / n as f64,
            "activations",
        );
        let tp = held(1, n, "");
        let what = format!("model={n}");
        assert!(
            tp.weights < one.weights && tp.saved_activations < one.saved_activations,
            "{what}"
        );
    }
}
