//! The time model of a step: each instruction by roofline (its FLOPs at the rate of its
//! dtype or its memory traffic at the memory bandwidth, whichever is longer), each
//! executor step a fixed time on top ([`crate::hardware::Device::step_seconds`], the
//! `dispatch` part), each collective by an alpha-beta model over the links of its mesh
//! axes and the hardware's topology. Compute and communication do not overlap (the
//! executor runs collectives between segments, bulk-synchronously), so the step is their
//! sum.
//!
//! A dot's rate is the profile's for its shape
//! ([`crate::hardware::Device::dot_flops_per_s`]: measured products of its size on
//! `this-cpu`, the peak where the profile gives no curve); other instructions' FLOPs run
//! at the dtype's peak.
//!
//! Collectives, for a group of `k` devices where each sends `w` bytes (the wire bytes: an
//! all-reduce's `2 (k-1)/k` of its operand, an all-to-all's `(k-1)/k`), with link bandwidth
//! `b` each way, `l` links per device and start-up time `a`:
//! - ring: all-reduce, all-gather and reduce-scatter run as rings over both directions,
//!   `w / (2b) + a s` with `s` the ring's steps (`2 (k-1)` for an all-reduce, `k-1` else);
//!   an all-to-all is limited by the ring's bisection (4 links cross it), `w k / (8b)`.
//! - 2-D torus (`sqrt k` a side): rings along both dimensions, `w / (l b) + a s` with
//!   `s = 2 (2 (sqrt k - 1))` for an all-reduce and half that else; an all-to-all crosses a
//!   bisection of `4 sqrt k` links (wrap-around, both ways), `w sqrt k / (8b)`, or the
//!   device's own `l` links, whichever is slower, plus `a sqrt k`. (GShard §5.3 measures
//!   all-to-all cost growing as `O(sqrt D)`.)
//! - islands: a group inside one island moves at the island's bandwidth; one across
//!   islands sends the share of its peers outside the island over the network links, in
//!   parallel with the share inside.
//! - shared memory (in-process devices): every device's `w` bytes go through the one
//!   machine's memory, `k w / b` per group and all groups one after the other.
//!
//! A collective-permute sends its bytes once over one link: `w / b + a`.

use crate::cost::{CollectiveCost, StepCost};
use crate::hardware::{Hardware, Topology};
use serde::Serialize;
use std::collections::BTreeMap;

/// A step's predicted time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepTime {
    pub step_seconds: f64,
    pub compute_seconds: f64,
    pub collective_seconds: f64,
    /// Seconds per op family.
    pub compute: BTreeMap<&'static str, f64>,
    /// Seconds per collective kind and axes (`all_to_all[expert]`).
    pub collectives: BTreeMap<String, f64>,
    /// Compute seconds of MoE expert work (part of `compute_seconds`).
    pub expert_seconds: f64,
}

impl StepTime {
    /// The largest part of the step: `(name, seconds)`.
    pub fn dominant(&self) -> (String, f64) {
        self.compute
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .chain(self.collectives.iter().map(|(k, v)| (k.clone(), *v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or_default()
    }
}

/// The time of one step of `cost` on `hw`, with `devices` devices in the mesh.
pub fn step_time(cost: &StepCost, hw: &Hardware, devices: usize) -> StepTime {
    let dev = &hw.device;
    // In-process devices share the machine: every device's work, one after the other.
    let copies = if dev.shared_by_devices {
        devices as f64
    } else {
        1.0
    };
    let mut t = StepTime::default();
    for o in &cost.ops {
        let rate = match o.gemm {
            Some([_, m, n, k]) => dev.dot_flops_per_s(o.dtype, m, n, k, devices),
            None => dev.peak_flops.of(o.dtype),
        };
        let flops = o.flops as f64 / rate;
        let bytes = o.bytes as f64 / dev.bytes_per_s(o.family);
        let s = copies * flops.max(bytes);
        *t.compute.entry(o.family.name()).or_insert(0.0) += s;
        t.compute_seconds += s;
        if o.expert {
            t.expert_seconds += s;
        }
    }
    // Every device pays each step's fixed time; in-process devices run their steps one
    // after another on one of the shared threads each.
    let rounds = if dev.shared_by_devices {
        devices.div_ceil(dev.threads.max(1) as usize) as f64
    } else {
        1.0
    };
    let dispatch = rounds * cost.work_steps as f64 * dev.step_seconds;
    if dispatch > 0.0 {
        t.compute.insert("dispatch", dispatch);
        t.compute_seconds += dispatch;
    }
    for c in &cost.collectives {
        let s = collective_seconds(c, hw, devices);
        *t.collectives
            .entry(format!("{}[{}]", c.kind, c.axes.join(",")))
            .or_insert(0.0) += s;
        t.collective_seconds += s;
    }
    t.step_seconds = t.compute_seconds + t.collective_seconds;
    t
}

/// The alpha-beta time of one collective (see the module doc).
pub fn collective_seconds(c: &CollectiveCost, hw: &Hardware, devices: usize) -> f64 {
    let net = &hw.network;
    let k = c.group.max(1) as f64;
    if c.group <= 1 {
        return 0.0;
    }
    let w = c.bytes as f64;
    let (b, a, links) = (net.link_bytes_per_s, net.latency_s, net.links as f64);
    let all_to_all = c.kind == "all_to_all";
    let permute = c.kind == "collective_permute";
    let all_reduce = c.kind == "all_reduce";
    if permute {
        return w / b + a;
    }
    match net.topology {
        Topology::Ring => {
            if all_to_all {
                w * k / (8.0 * b) + a * (k - 1.0)
            } else {
                let steps = if all_reduce { 2.0 } else { 1.0 } * (k - 1.0);
                w / (2.0 * b) + a * steps
            }
        }
        Topology::Torus2d => {
            let side = k.sqrt();
            if all_to_all {
                w * (side / (8.0 * b)).max(1.0 / (links * b)) + a * side
            } else {
                let steps = if all_reduce { 4.0 } else { 2.0 } * (side - 1.0).max(1.0);
                w / (links * b) + a * steps
            }
        }
        Topology::Islands => {
            let island = net.island_size.unwrap_or(1).max(1);
            let ib = net.island_bytes_per_s.unwrap_or(b);
            // Peers of a device in its group that share its island.
            let span = c.group.saturating_mul(c.stride);
            let inside = if span <= island {
                c.group
            } else if c.stride >= island {
                1
            } else {
                (island / c.stride).max(1)
            };
            let f_in = (inside as f64 - 1.0) / (k - 1.0);
            let steps = if all_to_all {
                1.0
            } else if all_reduce {
                2.0 * (k - 1.0)
            } else {
                k - 1.0
            };
            if f_in >= 1.0 {
                w / ib + a * steps
            } else if all_to_all {
                (w * f_in / ib).max(w * (1.0 - f_in) / (links * b)) + a * steps
            } else {
                // A ring across islands runs at its slowest link.
                w / (links * b) + a * steps
            }
        }
        Topology::SharedMemory => {
            let groups = (devices as f64 / k).max(1.0);
            groups * k * w / b + a
        }
    }
}
