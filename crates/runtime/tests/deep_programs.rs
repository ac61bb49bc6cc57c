//! Programs as deep as they are long: a chain of N elementwise ops, each reading the one
//! before, through everything `gshard run` does (parse, print, propagate and partition on a
//! mesh of 2, the executor, the reference interpreter). Everything runs on threads with
//! small stacks, so a recursion whose depth grows with the program overflows here first.

use ir::Program;
use runtime::{Executable, HostTensor, InProcess};
use std::collections::HashMap;

/// The stack of every thread a test runs on: far below the main thread's 8 MiB, far above
/// what a run needs when nothing recurses per instruction.
const STACK: usize = 512 << 10;

/// Run `f` on a pool of two threads with [`STACK`]-sized stacks (the executor's devices and
/// kernels run on that pool too).
fn small_stacks<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .stack_size(STACK)
        .build()
        .expect("a pool of two threads")
        .install(f)
}

/// `x` (f32[4], split over `x` when `mesh`), then `n` ops cycling through neg, exp, copy
/// and `add(v, v)`, the first one a multiply by a splat one reached through `n / 4` copies
/// (as deep a constant as `Program::splat_value` may meet). Outputs `y` (the last value)
/// and every op's value whose position in the chain is a multiple of `every` (when given).
/// Values are named by index: the text is what the printer prints.
fn chain(n: usize, mesh: bool, every: Option<usize>) -> String {
    let mut s = String::new();
    let at = if mesh {
        s.push_str("mesh [x=2]\n");
        " @{x}"
    } else {
        ""
    };
    s.push_str(&format!("%0 = f32[4] parameter(\"x\"){at}\n"));
    s.push_str("%1 = f32[4] constant(1.0)\n");
    let copies = n / 4;
    for k in 2..copies + 2 {
        s.push_str(&format!("%{k} = f32[4] copy(%{})\n", k - 1));
    }
    // The chain's op `i` is value `first + i`.
    let first = copies + 2;
    s.push_str(&format!("%{first} = f32[4] mul(%0, %{})\n", first - 1));
    for i in 1..n {
        let (me, v) = (first + i, first + i - 1);
        let line = match i % 4 {
            1 => format!("%{me} = f32[4] neg(%{v})"),
            2 => format!("%{me} = f32[4] exp(%{v})"),
            3 => format!("%{me} = f32[4] copy(%{v})"),
            _ => format!("%{me} = f32[4] add(%{v}, %{v})"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    for i in (1..n).filter(|i| every.is_some_and(|e| i % e == 0)) {
        s.push_str(&format!("output \"v{i}\" = %{}\n", first + i));
    }
    s.push_str(&format!("output \"y\" = %{}\n", first + n - 1));
    s
}

/// The chain's value in f64, for an oracle independent of every executor.
fn chain_f64(n: usize, x: f64) -> f64 {
    let mut v = x;
    for i in 1..n {
        v = match i % 4 {
            1 => -v,
            2 => v.exp(),
            3 => v,
            _ => v + v,
        };
    }
    v
}

const X: [f32; 4] = [0.5, -1.0, 2.0, 0.0];

fn full_input() -> HashMap<String, HostTensor> {
    [("x".to_string(), HostTensor::from_f32(vec![4], X.to_vec()))]
        .into_iter()
        .collect()
}

/// Parse the chain's text and print it back (the same text: it is in printed form).
fn parse_and_print(text: &str) -> Program {
    let p = ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(ir::text::print(&p) == text, "the chain prints as written");
    p
}

/// Values of output `y` against the f64 chain (a contraction: every executor ends there).
fn check_y(n: usize, y: &[f64]) {
    for (k, (&got, &x)) in y.iter().zip(&X).enumerate() {
        let want = chain_f64(n, x as f64);
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "y[{k}] = {got}, want {want}"
        );
    }
}

/// One device: the executor, the reference interpreter, and the printer on the way.
fn one_device(n: usize) {
    let p = parse_and_print(&chain(n, false, None));
    assert_eq!(p.len(), n + n / 4 + 2);
    let exe = Executable::new(&p).unwrap_or_else(|e| panic!("{e}"));
    let r = exe
        .run(&InProcess::new(1), &[full_input()], None)
        .unwrap_or_else(|e| panic!("{e}"));
    let y = r.outputs[0]["y"].to_f64_vec();
    check_y(n, &y);
    let reference = runtime::run(&p, &full_input()).unwrap_or_else(|e| panic!("{e}"));
    check_y(n, &reference["y"].to_f64_vec());
}

/// A mesh of 2: propagation, partitioning, both executors on the per-device program.
fn two_devices(n: usize) {
    let p = parse_and_print(&chain(n, true, None));
    let part = spmd::compile(&p).unwrap_or_else(|e| panic!("{e}"));
    let text = ir::text::print(&part.program);
    assert_eq!(ir::text::parse(&text).as_ref(), Ok(&part.program));
    let halves: Vec<HashMap<String, HostTensor>> = X
        .chunks(2)
        .map(|h| {
            [("x".to_string(), HostTensor::from_f32(vec![2], h.to_vec()))]
                .into_iter()
                .collect()
        })
        .collect();
    let r = runtime::run_devices(&part.program, &InProcess::new(2), &halves)
        .unwrap_or_else(|e| panic!("{e}"));
    let y: Vec<f64> = r.outputs.iter().flat_map(|o| o["y"].to_f64_vec()).collect();
    check_y(n, &y);
    let reference = runtime::run_spmd(&part.program, &halves).unwrap_or_else(|e| panic!("{e}"));
    let y: Vec<f64> = reference.iter().flat_map(|o| o["y"].to_f64_vec()).collect();
    check_y(n, &y);
}

#[test]
fn a_chain_of_60_000_ops_runs_on_one_device() {
    small_stacks(|| one_device(60_000));
}

#[test]
fn a_chain_of_60_000_ops_runs_partitioned_on_two_devices() {
    small_stacks(|| two_devices(60_000));
}

#[test]
fn a_chain_of_a_million_ops_runs_on_one_device() {
    small_stacks(|| one_device(1_000_000));
}

/// About 30-45 s in the test profile (propagation and partitioning of a million values).
#[test]
fn a_chain_of_a_million_ops_runs_partitioned_on_two_devices() {
    small_stacks(|| two_devices(1_000_000));
}

/// Long chains are cut into several fused groups: the values are those of the chain with
/// every hundredth value materialised as an output (a different cut), to the bit.
#[test]
fn cutting_a_long_chain_into_groups_keeps_every_bit() {
    let n = 5_000;
    let run = |text: &str| {
        let p = ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"));
        let exe = Executable::new(&p).unwrap_or_else(|e| panic!("{e}"));
        let r = exe
            .run(&InProcess::new(1), &[full_input()], None)
            .unwrap_or_else(|e| panic!("{e}"));
        (exe.fusion_stats(), r.outputs[0]["y"].to_f32_vec())
    };
    let (groups, y) = small_stacks(|| run(&chain(n, false, None)));
    let (cut_groups, y_cut) = small_stacks(|| run(&chain(n, false, Some(100))));
    assert_ne!(groups, cut_groups);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&y), bits(&y_cut));
    check_y(n, &y.iter().map(|&v| v as f64).collect::<Vec<_>>());
}
