//! The executor's `overlap` pass (`ExecOptions::overlap`): the MoE layer with its gradients
//! (`tests/data/moe_relu_all.gsir`) on `expert=4`, its four all-to-alls split into a start
//! and a wait. The plan holds four starts, each before its wait, with steps between; the
//! outputs are those of the blocking plan bit for bit, whether the communicator completes a
//! collective at its start or runs it on a communication thread; the planned peak is the
//! measured one; a pool of one thread finishes too; the trace shows each all-to-all in
//! flight across the steps between.

use ir::{Mesh, Program};
use runtime::{ExecOptions, Executable, HostTensor, InProcess, MemoryOptions, Profiler};
use std::collections::HashMap;

fn program() -> Program {
    let path = format!(
        "{}/tests/data/moe_relu_all.gsir",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut p = ir::text::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    p.mesh = Some(Mesh::new(&[("expert", 4)]).unwrap());
    p
}

/// Per device, uniform noise in [-1, 1) (in [0, 1) for `noise`) of its block's type.
fn inputs(p: &Program) -> Vec<HashMap<String, HostTensor>> {
    let mesh = p.mesh.as_ref().unwrap();
    let mut s = 7u64;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64) / ((1u64 << 53) as f64)
    };
    (0..mesh.num_devices())
        .map(|_| {
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
        })
        .collect()
}

fn bits(t: &HostTensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn started_all_to_alls_give_the_blocking_bits_and_the_planned_peak() {
    let part = spmd::compile(&program()).unwrap();
    let p = &part.program;
    let ins = inputs(p);
    let blocking = Executable::new(p).unwrap();
    let want = blocking.run(&InProcess::new(4), &ins, None).unwrap();
    let exe = Executable::with_options(p, ExecOptions::native().with_overlap(true)).unwrap();
    let text = exe.plan().to_string();
    let starts: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(" = start("))
        .map(|(i, _)| i)
        .collect();
    let waits: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(" = wait("))
        .map(|(i, _)| i)
        .collect();
    assert_eq!((starts.len(), waits.len()), (4, 4), "{text}");
    assert!(
        starts.iter().zip(&waits).any(|(s, w)| w > &(s + 1)),
        "no step runs while an all-to-all is in flight:\n{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.contains(" = collective(") && l.contains("all_to_all")),
        "a blocking all-to-all is left:\n{text}"
    );
    for thread in [false, true] {
        let comm = InProcess::new(4).with_comm_thread(thread);
        for round in 0..2 {
            let got = exe.run(&comm, &ins, None).unwrap();
            for (d, (g, w)) in got.outputs.iter().zip(&want.outputs).enumerate() {
                for (name, t) in w {
                    assert!(
                        bits(&g[name]) == bits(t),
                        "comm thread {thread}, round {round}, device {d}: {name} differs"
                    );
                }
            }
            let planned = exe.memory_plan(MemoryOptions::in_process());
            assert_eq!(
                planned.peak_bytes, got.peak_bytes_per_device,
                "comm thread {thread}: planned against measured peak"
            );
            let a2a = got.collectives.iter().find(|c| c.kind == "all_to_all");
            assert_eq!(a2a.map(|c| c.count), Some(4));
        }
    }
    // On a pool of one thread the waits run the communication thread's copies themselves.
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let got = one
        .install(|| exe.run(&InProcess::new(4).with_comm_thread(true), &ins, None))
        .unwrap();
    assert!(got.outputs == want.outputs, "one thread");
    // The trace: each all-to-all's event spans its flight, from its start to its wait.
    let prof = Profiler::new();
    exe.run(&InProcess::new(4).with_comm_thread(true), &ins, Some(&prof))
        .unwrap();
    let trace = prof.chrome_trace();
    assert!(trace.contains("in flight from step"), "{trace}");
    // And the time each device blocked at a wait, under the collective's name.
    assert!(trace.contains("waiting at step"), "{trace}");
    let blocked = prof.totals().get("all_to_all").map(|t| t.count);
    assert_eq!(
        blocked,
        Some(4 * 4),
        "one wait event per all-to-all and device"
    );
    assert!(trace.contains("\"ph\":\"b\"") && trace.contains("\"ph\":\"e\""));
}
