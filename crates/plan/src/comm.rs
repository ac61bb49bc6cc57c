//! What the communication options of the MPI backend would change, predicted on the same
//! step cost and hardware profile as the plan ([`options`]; `gshard plan` prints them):
//!
//! - **compression**: the f32 payloads of the all-to-alls as bf16 (half the bytes) or fp8
//!   (e4m3 with an f32 scale per 128 elements: 132 of 512 bytes), of the all-reduces as
//!   bf16; the collectives' times recomputed with those bytes. Payloads already bf16 are
//!   unchanged.
//! - **overlap k**: each MoE layer's all-to-alls and expert work in k chunks, chunk i's
//!   all-to-all in flight while another chunk computes. A pipeline of k stages hides
//!   `min(A_k, C) (k-1)/k` of the step, `A_k` the all-to-alls' time with k start-ups each
//!   (k messages of 1/k the bytes) and `C` the expert work's time (instructions under a
//!   scope `experts`, forward and backward).
//! - **two-level all-to-all** (islands only): one message per pair of islands instead of
//!   one per pair of devices across them, at the price of two passes inside each island
//!   (gather the blocks for a remote island, spread the blocks from it). The alpha-beta
//!   model charges one start-up per all-to-all, so the fewer messages do not show in its
//!   time; the option reports the message counts and the passes' time.

use crate::cost::{CollectiveCost, StepCost};
use crate::hardware::{Hardware, Topology};
use crate::time::{collective_seconds, StepTime};
use ir::DType;
use serde::Serialize;

/// One option's predicted step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CommOption {
    pub option: String,
    pub step_seconds: f64,
    pub all_to_all_seconds: f64,
    pub all_reduce_seconds: f64,
    /// Seconds of all-to-all hidden behind expert work (overlap).
    pub hidden_seconds: f64,
    /// Anything the numbers need said (e.g. message counts).
    pub note: String,
}

/// Bytes on the wire per f32 byte, by codec.
const BF16: f64 = 0.5;
const FP8: f64 = (128.0 + 4.0) / 512.0;

/// Sum of `kind`'s collective times with each f32 payload's bytes scaled by `f32_scale`.
fn seconds_of(
    cost: &StepCost,
    hw: &Hardware,
    devices: usize,
    kind: &str,
    f32_scale: f64,
    startups: f64,
) -> f64 {
    cost.collectives
        .iter()
        .filter(|c| c.kind == kind)
        .map(|c| {
            let scale = if c.dtype == DType::F32 {
                f32_scale
            } else {
                1.0
            };
            let scaled = CollectiveCost {
                bytes: (c.bytes as f64 * scale) as u64,
                ..c.clone()
            };
            let startup = CollectiveCost {
                bytes: 0,
                ..c.clone()
            };
            collective_seconds(&scaled, hw, devices)
                + (startups - 1.0) * collective_seconds(&startup, hw, devices)
        })
        .sum()
}

/// The predicted step under each option (see the module doc); the first row is the plan.
pub fn options(cost: &StepCost, hw: &Hardware, devices: usize, t: &StepTime) -> Vec<CommOption> {
    let a2a = |scale: f64, k: f64| seconds_of(cost, hw, devices, "all_to_all", scale, k);
    let ar = |scale: f64| seconds_of(cost, hw, devices, "all_reduce", scale, 1.0);
    let (a0, r0) = (a2a(1.0, 1.0), ar(1.0));
    let rest = t.step_seconds - a0 - r0;
    let expert = t.expert_seconds;
    let row = |option: &str, a: f64, r: f64, k: usize| {
        let hidden = if k > 1 {
            a.min(expert) * (k - 1) as f64 / k as f64
        } else {
            0.0
        };
        CommOption {
            option: option.to_string(),
            step_seconds: rest + a + r - hidden,
            all_to_all_seconds: a,
            all_reduce_seconds: r,
            hidden_seconds: hidden,
            note: String::new(),
        }
    };
    let mut out = vec![
        row("as planned (flat, blocking, f32)", a0, r0, 1),
        row("all-to-all bf16", a2a(BF16, 1.0), r0, 1),
        row("all-to-all fp8", a2a(FP8, 1.0), r0, 1),
        row("all-reduce bf16", a0, ar(BF16), 1),
    ];
    for k in [2usize, 4] {
        out.push(row(&format!("overlap {k}"), a2a(1.0, k as f64), r0, k));
    }
    out.push(row(
        "overlap 4 + fp8 + all-reduce bf16",
        a2a(FP8, 4.0),
        ar(BF16),
        4,
    ));
    out.push(two_level(cost, hw, rest, a0, r0));
    out
}

/// The two-level all-to-all's row: message counts and the passes inside islands.
fn two_level(cost: &StepCost, hw: &Hardware, rest: f64, a0: f64, r0: f64) -> CommOption {
    let net = &hw.network;
    let mut row = CommOption {
        option: "two-level all-to-all".into(),
        step_seconds: rest + a0 + r0,
        all_to_all_seconds: a0,
        all_reduce_seconds: r0,
        hidden_seconds: 0.0,
        note: String::new(),
    };
    let island = net.island_size.unwrap_or(1).max(1);
    if net.topology != Topology::Islands {
        row.note = "no islands in this profile: every all-to-all stays flat".into();
        return row;
    }
    let ib = net.island_bytes_per_s.unwrap_or(net.link_bytes_per_s);
    let (mut flat, mut two, mut extra) = (0u64, 0u64, 0.0);
    for c in cost.collectives.iter().filter(|c| c.kind == "all_to_all") {
        let span = c.group.saturating_mul(c.stride);
        if span <= island {
            continue;
        }
        // Group members per island, and islands the group spans.
        let inside = if c.stride >= island {
            1
        } else {
            (island / c.stride).max(1)
        };
        let islands = c.group.div_ceil(inside);
        flat += (c.group - inside) as u64;
        two += (islands - 1) as u64;
        let remote = c.bytes as f64 * (c.group - inside) as f64 / (c.group - 1).max(1) as f64;
        extra += 2.0 * remote / ib;
    }
    if flat == 0 {
        row.note = "every all-to-all group fits in one island: nothing to combine".into();
        return row;
    }
    row.all_to_all_seconds = a0 + extra;
    row.step_seconds += extra;
    row.note = format!(
        "messages across islands per device per step: {flat} flat, {two} two-level; the time adds the two passes inside islands (the model charges no per-message start-up)"
    );
    row
}
