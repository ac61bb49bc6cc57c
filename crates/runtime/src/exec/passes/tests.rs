//! Each pass on a program of a few lines: what it changed in the plan (a snapshot of the
//! steps it removed and added), the plan's invariants, and a run that gives the reference
//! interpreter's bits (integer-valued inputs keep every sum exact in any order, so dots
//! too must match bit for bit).

use super::{Pass, REWRITES, SCHEDULE};
use crate::exec::lower::lower;
use crate::exec::{Executable, Passes, Plan};
use crate::kernels::dot::Tables;
use crate::{HostTensor, InProcess};
use expect_test::{expect, Expect};
use ir::Program;
use std::collections::HashMap;

fn program(text: &str) -> Program {
    ir::text::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The plan of `p` after lowering and every pass up to `name`, and what `name` changed.
fn through(p: &Program, name: &str) -> (Plan, String) {
    let mut plan = lower(p, Passes::All, Tables::Built);
    plan.verify(p)
        .unwrap_or_else(|e| panic!("after lowering: {e}"));
    let all: Vec<(&str, Pass)> = REWRITES.iter().chain(&SCHEDULE).copied().collect();
    for (n, pass) in all {
        let before = plan.to_string();
        pass(p, &mut plan);
        plan.verify(p).unwrap_or_else(|e| panic!("after {n}: {e}"));
        if n == name {
            let after = plan.to_string();
            return (plan, changes(&before, &after));
        }
    }
    panic!("no pass {name}")
}

/// The steps of `before` not in `after` (`-`) and of `after` not in `before` (`+`),
/// compared without their step ids (which shift when a step goes).
fn changes(before: &str, after: &str) -> String {
    let body = |l: &str| l.split_once(' ').map_or(l, |(_, rest)| rest).to_string();
    let (b, a): (Vec<String>, Vec<String>) = (
        before.lines().map(body).collect(),
        after.lines().map(body).collect(),
    );
    let mut out = String::new();
    for l in b.iter().filter(|l| !a.contains(l)) {
        out.push_str(&format!("- {l}\n"));
    }
    for l in a.iter().filter(|l| !b.contains(l)) {
        out.push_str(&format!("+ {l}\n"));
    }
    out
}

/// Small integers (exact in every sum here), different per parameter and device.
fn inputs(p: &Program, device: usize) -> HashMap<String, HostTensor> {
    p.params()
        .into_iter()
        .enumerate()
        .map(|(k, (name, v))| {
            let ty = p.ty(v).clone();
            let vals: Vec<f64> = (0..ty.num_elements())
                .map(|i| ((i * 7 + k * 5 + device * 3) % 11) as f64 - 5.0)
                .collect();
            (name.to_string(), HostTensor::from_f64_values(ty, &vals))
        })
        .collect()
}

/// Run `p` on its mesh's devices (or one) and compare every output bit for bit with the
/// reference interpreter.
fn matches_reference(p: &Program) {
    let n = p.mesh.as_ref().map_or(1, |m| m.num_devices());
    let ins: Vec<_> = (0..n).map(|d| inputs(p, d)).collect();
    let want = crate::reference::run_spmd(p, &ins).unwrap_or_else(|e| panic!("{e}"));
    let got = Executable::new(p)
        .unwrap_or_else(|e| panic!("{e}"))
        .run(&InProcess::new(n), &ins, None)
        .unwrap_or_else(|e| panic!("{e}"));
    for (d, (g, w)) in got.outputs.iter().zip(&want).enumerate() {
        for (name, wt) in w {
            let bits = |t: &HostTensor| -> Vec<u64> {
                t.to_f64_vec().iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(g[name].ty, wt.ty, "{name} on device {d}");
            assert_eq!(bits(&g[name]), bits(wt), "{name} on device {d}");
        }
    }
}

/// What pass `name` did to `text`'s plan, and that the executor still gives the
/// reference's bits.
fn check(text: &str, name: &str, want: Expect) {
    let p = program(text);
    let (_, changed) = through(&p, name);
    want.assert_eq(&changed);
    matches_reference(&p);
}

#[test]
fn coded_relus_code_the_relu_and_decode_its_compares() {
    check(
        r#"
%x = f32[4,8] parameter("x")
%w = f32[8,16] parameter("w")
%v = f32[16,4] parameter("v")
%g = f32[4,16] parameter("g")
%a = f32[4,16] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%z = f32[4,16] constant(0.0)
%h = f32[4,16] max(%a, %z)
%y = f32[4,4] dot_general(%h, %v) lhs_contract=[1] rhs_contract=[0]
%p = bool[4,16] gt(%a, %z)
%ga = f32[4,16] select(%p, %g, %z)
output "y" = %y
output "ga" = %ga
"#,
        "coded_relus",
        expect![[r#"
            - %6 = fused(%4) nodes=3 | fused[1] %6 (max)
            - %9 = fused(%4, %3) nodes=5 | fused[2] %9 (gt,select)
            + %6 = fused(%4) nodes=2 | fused[1] %6 (max)
            + %9 = fused(%6, %3) nodes=6 | fused[2] %9 (gt,select)
        "#]],
    );
}

#[test]
fn transposes_fold_into_dots_and_all_to_alls() {
    check(
        r#"
mesh [e=2, one=1]
%x = f32[4,8] parameter("x")
%w = f32[8,6] parameter("w")
%d = f32[4,6] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%i = f32[4,6] all_reduce(%d) op=sum axes=[one]
%t = f32[6,4] transpose(%i) perm=[1, 0]
%e = f32[4,6] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%r = f32[4,6] all_reduce(%e) op=sum axes=[e]
%u = f32[6,4] transpose(%r) perm=[1, 0]
%q = f32[4,2,8] parameter("q")
%a = f32[4,2,8] all_to_all(%q) split_dim=1 concat_dim=1 axes=[e]
%b = f32[2,4,8] transpose(%a) perm=[1, 0, 2]
output "t" = %t
output "u" = %u
output "b" = %b
"#,
        "transposes",
        expect![[r#"
            - %2 = dot(%0, %1) B=1 M=4 N=6 K=8 | dot_general %2
            - %3 = collective(%2) | all_reduce %3
            - %4 = kernel(%3) | transpose %4
            - %5 = dot(%0, %1) B=1 M=4 N=6 K=8 | dot_general %5
            - %7 = kernel(%6) | transpose %7
            - %9 = collective(%8) | all_to_all %9
            - %10 = kernel(%9) | transpose %10
            + %4 = dot(%0, %1) B=1 M=4 N=6 K=8 transposed | dot_general %2 +transpose %4
            + %5 = dot(%0, %1) B=1 M=4 N=6 K=8 transposed | dot_general %5 +transpose %7 (before the sum)
            + %7 = alias(%6) | transpose %7
            + %9 = collective(%8) out_perm=[1, 0, 2] | all_to_all %9 +transpose %10
            + %10 = move(%9) | transpose %10
        "#]],
    );
}

#[test]
fn identities_become_aliases() {
    check(
        r#"
mesh [e=2, one=1]
%x = f32[4,8] parameter("x")
%s = f32[4,8] slice(%x) start=[0, 0] limit=[4, 8]
%c = f32[4,8] all_gather(%s) dim=0 axes=[one]
%r = f32[32] reshape(%c)
%k = f32[32] exp(%r)
output "r" = %r
output "k" = %k
"#,
        "identities",
        expect![[r#"
            - %1 = kernel(%0) | slice %1
            - %2 = collective(%1) | all_gather %2
            - %3 = fused(%2) nodes=1 | fused[1] %3 (reshape)
            + %1 = alias(%0) | slice %1
            + %2 = alias(%1) | all_gather %2
            + %3 = alias(%2) | reshape %3
        "#]],
    );
}

/// A dot read only through `dot * mask`, summed over every row (`masked_dots` alone) or
/// over its columns (`masked_dot_sums`).
const MASKED: &str = r#"
%x = f32[2,4,8] parameter("x")
%w = f32[2,8,6] parameter("w")
%m = f32[2,4,6] parameter("m")
%d = f32[2,4,6] dot_general(%x, %w) lhs_batch=[0] rhs_batch=[0] lhs_contract=[2] rhs_contract=[1]
%p = f32[2,4,6] mul(%d, %m)
%s = f32[2,4] reduce(%p) op=sum dims=[2]
output "s" = %s
"#;

#[test]
fn masked_dots_read_their_masks() {
    check(
        MASKED,
        "masked_dots",
        expect![[r#"
        - %3 = dot(%0, %1) B=2 M=4 N=6 K=8 | dot_general %3
        + %3 = masked_dot(%0, %1, %2) B=2 M=4 N=6 K=8 | dot_general %3
    "#]],
    );
}

#[test]
fn masked_dot_sums_drop_the_product_and_its_sum() {
    check(
        MASKED,
        "masked_dot_sums",
        expect![[r#"
        - %3 = masked_dot(%0, %1, %2) B=2 M=4 N=6 K=8 | dot_general %3
        - %4 = fused(%3, %2) nodes=3 | fused[1] %4 (mul)
        - %5 = kernel(%4) | reduce %5
        + %5 = masked_dot_sums(%0, %1, %2) B=2 M=4 N=6 K=8 dot=%3 | dot_general %3 +sums %5
    "#]],
    );
    let rows = MASKED
        .replace("dims=[2]", "dims=[1]")
        .replace("f32[2,4] reduce", "f32[2,6] reduce");
    let (_, changed) = through(&program(&rows), "masked_dot_sums");
    assert_eq!(changed, "", "a sum over rows keeps the product");
    matches_reference(&program(&rows));
}

#[test]
fn dot_epilogues_merge_a_group_into_its_dot() {
    check(
        r#"
%x = f32[2,4,8] parameter("x")
%w = f32[2,8,6] parameter("w")
%b = f32[2,4,6] parameter("b")
%d = f32[2,4,6] dot_general(%x, %w) lhs_batch=[0] rhs_batch=[0] lhs_contract=[2] rhs_contract=[1]
%y = f32[2,4,6] add(%d, %b)
%z = f32[2,4,6] constant(0.0)
%r = f32[2,4,6] max(%y, %z)
output "r" = %r
"#,
        "dot_epilogues",
        expect![[r#"
            - %3 = dot(%0, %1) B=2 M=4 N=6 K=8 | dot_general %3
            - %6 = fused(%3, %2) nodes=5 | fused[2] %6 (add,max)
            + %6 = dot_fused(%0, %1, %2) B=2 M=4 N=6 K=8 dot=%3 nodes=5 | dot_general %3 +fused[2] %6 (add,max)
        "#]],
    );
}

#[test]
fn sums_of_products_are_one_step() {
    check(
        r#"
%y = f32[4,8] parameter("y")
%g = f32[4,8] parameter("g")
%p = f32[4,8] mul(%y, %g)
%s = f32[] reduce(%p) op=sum dims=[0, 1]
output "s" = %s
"#,
        "sum_products",
        expect![[r#"
            - %2 = fused(%0, %1) nodes=3 | fused[1] %2 (mul)
            - %3 = kernel(%2) | reduce %3
            + %3 = sum_product(%0, %1) | reduce %3 +product %2
        "#]],
    );
}

#[test]
fn indicator_dots_read_the_indicator_from_its_source() {
    check(
        r#"
%c = f32[4,8] parameter("c")
%x = f32[8,6] parameter("x")
%z = f32[4,8] constant(0.0)
%n = bool[4,8] ne(%c, %z)
%m = f32[4,8] convert(%n)
%d = f32[4,6] dot_general(%m, %x) lhs_contract=[1] rhs_contract=[0]
output "d" = %d
output "c2" = %c
"#,
        "indicator_dots",
        expect![[r#"
            - %4 = fused(%0) nodes=4 | fused[2] %4 (ne,convert)
            - %5 = dot(%4, %1) B=1 M=4 N=6 K=8 | dot_general %5
            + %5 = dot(%0, %1) B=1 M=4 N=6 K=8 lhs=indicator | dot_general %5
        "#]],
    );
}

#[test]
fn rounds_let_small_collectives_wait_for_the_next() {
    let text = r#"
mesh [e=2]
%x = f32[64,64] parameter("x")
%l = f32[] parameter("l")
%s = f32[] all_reduce(%l) op=sum axes=[e]
%t = f32[] add(%s, %s)
%y = f32[64,64] exp(%x)
%b = f32[64,64] all_reduce(%y) op=sum axes=[e]
output "t" = %t
output "b" = %b
"#;
    // The order is what changes: the whole plan after the pass.
    let p = program(text);
    let (plan, _) = through(&p, "rounds");
    expect![[r#"
        s0 %0 = param() "x" | parameter %0
        s1 %1 = param() "l" | parameter %1
        s2 %4 = fused(%0) nodes=2 | fused[1] %4 (exp)
        s3 %2 = collective(%1) | all_reduce %2
        s4 %5 = collective(%4) | all_reduce %5
        s5 %3 = fused(%2) nodes=2 | fused[1] %3 (add)
    "#]]
    .assert_eq(&plan.to_string());
    matches_reference(&p);
    let exe = Executable::new(&program(text)).unwrap();
    assert_eq!(exe.collective_rounds(), 1);
}

#[test]
fn a_small_collective_of_a_small_collective_waits_past_a_large_one() {
    // `%u` reads `%s`, so it cannot share `%s`'s round: it waits for the round after the
    // large `%b` (sharded weights give such chains: a norm summed over one axis, then another).
    let text = r#"
mesh [e=2]
%x = f32[64,64] parameter("x")
%l = f32[] parameter("l")
%s = f32[] all_reduce(%l) op=sum axes=[e]
%u = f32[] all_reduce(%s) op=sum axes=[e]
%y = f32[64,64] exp(%x)
%b = f32[64,64] all_reduce(%y) op=sum axes=[e]
output "u" = %u
output "b" = %b
"#;
    let p = program(text);
    let (plan, _) = through(&p, "rounds");
    expect![[r#"
        s0 %0 = param() "x" | parameter %0
        s1 %1 = param() "l" | parameter %1
        s2 %4 = fused(%0) nodes=2 | fused[1] %4 (exp)
        s3 %2 = collective(%1) | all_reduce %2
        s4 %5 = collective(%4) | all_reduce %5
        s5 %3 = collective(%2) | all_reduce %3
    "#]]
    .assert_eq(&plan.to_string());
    matches_reference(&p);
}

#[test]
fn stream_outputs_mark_unread_dot_outputs() {
    let p = program(
        r#"
%x = f32[4,8] parameter("x")
%w = f32[8,6] parameter("w")
%d = f32[4,6] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%e = f32[4,6] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%f = f32[4] reduce(%e) op=sum dims=[1]
output "d" = %d
output "e" = %e
output "f" = %f
"#,
    );
    let (plan, changed) = through(&p, "stream_outputs");
    assert_eq!(changed, "", "streaming shows in no step's text");
    // (`DotPlan` keeps the mark to itself: its `Debug` shows it.)
    let streams: Vec<(u32, bool)> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            crate::exec::plan::Kind::Dot(d) => {
                Some((s.value.0, format!("{d:?}").contains("stream_out: true")))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        streams,
        [(2, true), (3, false)],
        "only the unread output streams"
    );
    matches_reference(&p);
}

#[test]
fn verify_names_the_step_that_breaks_an_invariant() {
    use crate::exec::ids::StepId;
    use crate::exec::plan::PlanProblem;
    let p = program(
        r#"
%x = f32[4,8] parameter("x")
%y = f32[4,8] exp(%x)
%t = f32[8,4] transpose(%y) perm=[1, 0]
output "t" = %t
"#,
    );
    let mut plan = lower(&p, Passes::All, Tables::Built);
    assert_eq!(plan.verify(&p), Ok(()));
    // The transpose before the group it reads.
    let steps = std::mem::take(&mut plan.steps).into_vec();
    let mut swapped: Vec<_> = steps.into_iter().collect();
    swapped.swap(1, 2);
    plan.steps = crate::exec::ids::IdVec::from_vec(swapped);
    let e = plan.verify(&p).unwrap_err();
    assert_eq!(e.step, StepId(1));
    assert_eq!(
        e.problem,
        PlanProblem::ReadBeforeProduced {
            value: ir::ValueId(1)
        }
    );
    assert_eq!(
        e.to_string(),
        "step s1 (transpose %2): reads %1, which no earlier step produces"
    );
}

#[test]
fn liveness_computed_before_a_rewrite_fails_its_check() {
    use crate::exec::liveness::Liveness;
    use crate::exec::plan::PlanProblem;
    let p = program(
        r#"
%x = f32[4,8] parameter("x")
%w = f32[8,6] parameter("w")
%q = f32[4,8] parameter("q")
%d = f32[4,6] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
%o = f32[4,8] exp(%q)
%t = f32[6,4] transpose(%d) perm=[1, 0]
output "o" = %o
output "t" = %t
"#,
    );
    let mut plan = lower(&p, Passes::All, Tables::Built);
    let live = Liveness::of(&p, &plan);
    assert_eq!(live.verify(&p, &plan), Ok(()));
    // The dot moves to its transpose's place, after the step that released its operands.
    super::transposes::run(&p, &mut plan);
    let e = live.verify(&p, &plan).unwrap_err();
    assert!(
        matches!(e.problem, PlanProblem::ReadAfterRelease { .. }),
        "{e}"
    );
    assert_eq!(Liveness::of(&p, &plan).verify(&p, &plan), Ok(()));
}
