//! The executor's plan of the GShard MoE layer with its gradients (`gshard export
//! moe-layer`, the fixture of `exec_moe.rs`), partitioned over `expert=2`: a snapshot of
//! every step (`Plan`'s text), so a change to lowering or to a pass shows as a diff of
//! the steps it changes. Update with `UPDATE_EXPECT=1 cargo test -p runtime --test
//! exec_plan`.

use expect_test::expect_file;
use ir::{Mesh, Program};
use runtime::exec::{ExecOptions, Passes};
use runtime::Executable;

fn fixture(name: &str) -> Program {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    ir::text::parse(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn partitioned(devices: usize) -> Program {
    let mut p = fixture("moe_relu_all.gsir");
    p.mesh = Some(Mesh::new(&[("expert", devices)]).unwrap());
    spmd::compile(&p).unwrap().program
}

#[test]
fn moe_layer_plan_over_two_devices() {
    let exe = Executable::new(&partitioned(2)).unwrap();
    expect_file!["data/moe_relu_all.expert2.plan"].assert_eq(&exe.plan().to_string());
    assert_eq!(exe.num_steps(), exe.plan().len());
}

#[test]
fn moe_layer_plan_on_one_device() {
    let exe = Executable::new(&fixture("moe_relu_all.gsir")).unwrap();
    expect_file!["data/moe_relu_all.plan"].assert_eq(&exe.plan().to_string());
}

/// The reference mode runs no pass: one step per live instruction, each computed by the
/// reference interpreter.
#[test]
fn reference_mode_plans_one_oracle_step_per_instruction() {
    let p = partitioned(2);
    let exe = Executable::with_options(&p, ExecOptions::reference()).unwrap();
    assert_eq!(exe.options().passes, Passes::None);
    let text = exe.plan().to_string();
    let kinds = |k: &str| {
        text.lines()
            .filter(|l| l.contains(&format!("= {k}(")))
            .count()
    };
    assert_eq!(
        kinds("oracle") + kinds("oracle_collective") + kinds("param") + kinds("partition_id"),
        exe.num_steps()
    );
    assert_eq!(exe.fusion_stats(), (0, 0));
    assert_eq!(exe.coded_relus(), 0);
    assert!(exe.num_steps() > Executable::new(&p).unwrap().num_steps());
}

/// The plan is a function of the program alone: the same text however often, on whatever
/// thread, prepared (so every process of a run orders its collectives the same way).
#[test]
fn the_plan_is_a_function_of_the_program() {
    let p = partitioned(4);
    let text = Executable::new(&p).unwrap().plan().to_string();
    let others: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|_| s.spawn(|| Executable::new(&p).unwrap().plan().to_string()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for o in others {
        assert_eq!(o, text);
    }
}
