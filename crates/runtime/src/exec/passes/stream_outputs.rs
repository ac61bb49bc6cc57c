//! Streamed outputs: a dot whose result is a program output that no step reads (a
//! weight's gradient) writes it with non-temporal stores
//! ([`DotPlan::stream_output`](crate::kernels::dot::DotPlan::stream_output)), past the
//! caches nothing will read it from. In-process A/B on the small MoE layer (1 MiB of such
//! results per device: the up-projection's weight gradient; the down-projection's runs on
//! the row-sparse path, which does not stream): 1.002-1.005 at 8 devices, 1.005 at 1; the
//! large shape no different.
//!
//! Exactness: the same values are stored, only how the stores reach memory changes.

use crate::exec::lower::outputs;
use crate::exec::plan::{Kind, Plan};
use ir::{Program, ValueId};

/// Mark the dots writing unread outputs as streaming them.
pub(crate) fn run(p: &Program, plan: &mut Plan) {
    let is_output = outputs(p);
    let mut read = vec![false; p.instrs.len()];
    for s in plan.steps.iter() {
        for &r in &s.reads {
            read[r.index()] = true;
        }
    }
    for s in plan.steps.iter_mut() {
        let v: ValueId = s.value;
        if let Kind::Dot(dp) = &mut s.kind {
            if is_output[v] && !read[v.index()] {
                dp.stream_output();
            }
        }
    }
}
