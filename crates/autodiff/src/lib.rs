//! Reverse-mode autodiff as an IR -> IR pass.
//!
//! [`grad`] appends the backward pass of a program to the program itself, as ordinary
//! instructions (no tape), and adds one output `grad_<param>` per requested parameter. The
//! per-op rules live in one exhaustive table, [`rules::vjp`]. Because the backward pass is
//! plain IR, sharding propagation and the SPMD partitioner treat it like any other code
//! (GShard partitions the whole training step).
//!
//! Only values that both depend on a requested parameter and reach the loss get a
//! cotangent, and backward instructions that no output uses are removed, so the appended
//! code contains no dead work. New instructions carry no sharding; propagation fills it.
//! Each carries the scope of the forward instruction it differentiates, marked `grad`; the
//! copy that puts an annotation back on a cotangent has the scope of that cotangent.
//!
//! Contributions to one value that are the per-chunk pieces of one computation (a tensor
//! cut into chunks that each go through the same code) are put back together as that
//! computation instead of summed (`chunks`): pads of disjoint ranges become a
//! concatenation, dots over the chunks of a contracted dim one dot of concatenations, so a
//! chunked program's gradients are the unchunked one's bit for bit.
//!
//! [`remat::remat`] then trades FLOPs for memory: it recomputes in the backward pass the
//! forward values that a [`remat::Policy`] (per layer, all but dot products, or checkpoint
//! regions, listed by scope path or placed by the model code) does not keep alive.

mod chunks;
pub mod remat;
pub mod rules;

use ir::{Builder, Op, Program, Type, Value, ValueId};
use thiserror::Error;

/// Why [`grad`] refused a request. Each message names the offending thing and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GradError {
    #[error("loss `{name}` is not an output of the program (outputs: {outputs}); pass the name of a scalar float output")]
    UnknownLoss { name: String, outputs: String },
    #[error("loss `{name}` has type {ty}, but must be a float scalar; reduce it to a scalar (sum or mean) and convert it to a float dtype")]
    LossNotFloatScalar { name: String, ty: Type },
    #[error("`{name}` is not a parameter of the program (parameters: {params}); differentiate with respect to parameters only")]
    UnknownParam { name: String, params: String },
    #[error("parameter `{name}` has type {ty}; only float parameters have gradients, so drop it from wrt")]
    ParamNotFloat { name: String, ty: Type },
    #[error("output `{name}` already exists; list each parameter once in wrt and rename any existing output called `{name}`")]
    OutputExists { name: String },
}

/// The name of the output that holds the gradient of parameter `param`.
pub fn grad_output_name(param: &str) -> String {
    format!("grad_{param}")
}

/// Append the gradient of output `loss` (a float scalar) with respect to the float
/// parameters `wrt`.
///
/// Returns `p` with every instruction and output unchanged (ids included), followed by the
/// backward pass (the cotangent of a value that carries a sharding annotation carries the
/// same annotation), plus one output `grad_<param>` per entry of `wrt`, of the parameter's type
/// (zeros when the loss does not depend on it). The seed cotangent is 1.0; contributions to
/// one value are added in a fixed order (reverse program order of their users), except
/// the chunks of one computation, which are put back together (see the module doc).
pub fn grad(p: &Program, loss: &str, wrt: &[&str]) -> Result<Program, GradError> {
    let loss_id = p.output(loss).ok_or_else(|| GradError::UnknownLoss {
        name: loss.to_string(),
        outputs: list(p.outputs.iter().map(|(n, _)| n.as_str())),
    })?;
    let loss_ty = p.ty(loss_id).clone();
    if !(loss_ty.dtype.is_float() && loss_ty.rank() == 0) {
        return Err(GradError::LossNotFloatScalar {
            name: loss.to_string(),
            ty: loss_ty,
        });
    }
    let mut params = Vec::new();
    for (i, &name) in wrt.iter().enumerate() {
        let id = p.param(name).ok_or_else(|| GradError::UnknownParam {
            name: name.to_string(),
            params: list(p.params().into_iter().map(|(n, _)| n)),
        })?;
        let ty = p.ty(id);
        if !ty.dtype.is_float() {
            return Err(GradError::ParamNotFloat {
                name: name.to_string(),
                ty: ty.clone(),
            });
        }
        let out = grad_output_name(name);
        if p.output(&out).is_some() || wrt[..i].contains(&name) {
            return Err(GradError::OutputExists { name: out });
        }
        params.push((name, id));
    }

    let active = active_values(p, loss_id, &params);
    let n = p.len();
    let b = Builder::from_program(p.clone());
    let mut cts: Vec<Vec<Value>> = vec![Vec::new(); n];
    let mut param_grads: Vec<Option<Value>> = vec![None; n];
    // Backward instructions get the scope of what they differentiate, with the `grad` marker.
    let grad_scope = |v: ValueId| b.grad_scope(p.instrs[v.index()].scope);
    b.set_scope(grad_scope(loss_id));
    cts[loss_id.index()].push(b.splat(1.0, loss_ty));
    for i in (0..n).rev() {
        let contributions = std::mem::take(&mut cts[i]);
        if !active[i] || contributions.is_empty() {
            continue;
        }
        b.set_scope(grad_scope(ValueId(i as u32)));
        // Contributions that are the chunks of one computation become that computation
        // (`chunks`); others are added.
        let mut g = chunks::sum(&b, contributions);
        let instr = &p.instrs[i];
        // A value's user annotation applies to its cotangent too (as JAX transposes a
        // sharding constraint into the same constraint): the gradient then flows back in
        // the layout the user chose, e.g. E-split through the experts of an MoE layer.
        // The copy that re-imposes the annotation moves the incoming cotangent, so it sits
        // with the code that produced it (the transpose of a forward reshard lands in the
        // backward pass of the scope that did the forward one).
        // Except a parameter's re-annotated copy (a weight gathered for its use, see
        // `nn::params` on weight-update sharding): its cotangent goes to the parameter's own
        // layout, so a split weight's gradient is reduce-scattered, never summed whole first.
        let weight_view = matches!(instr.op, Op::Copy)
            && instr.operands.first().is_some_and(|o| {
                let src = &p.instrs[o.index()];
                matches!(src.op, Op::Parameter { .. }) && src.sharding.is_some()
            });
        if let Some(s) = instr.sharding.as_ref().filter(|_| !weight_view) {
            let at = b.set_scope(b.scope_of(g.id));
            g = g.copy();
            g.set_sharding(Some(s.clone()));
            b.set_scope(at);
        }
        if let Op::Parameter { .. } = instr.op {
            param_grads[i] = Some(g);
            continue;
        }
        let operands: Vec<Value> = instr.operands.iter().map(|&o| b.value(o)).collect();
        let out = b.value(ValueId(i as u32));
        let operand_cts = rules::vjp(&b, instr, &operands, &out, &g);
        assert_eq!(
            operand_cts.len(),
            operands.len(),
            "vjp rule for {} returned the wrong number of cotangents",
            instr.op.name()
        );
        for (o, ct) in operands.iter().zip(operand_cts) {
            let Some(ct) = ct else { continue };
            assert_eq!(
                ct.ty(),
                o.ty(),
                "vjp rule for {} gave a cotangent of the wrong type",
                instr.op.name()
            );
            if active[o.id.index()] {
                cts[o.id.index()].push(ct);
            }
        }
    }
    for (name, id) in params {
        b.set_scope(grad_scope(id));
        let g = param_grads[id.index()]
            .take()
            .unwrap_or_else(|| b.splat(0.0, p.ty(id).clone()));
        b.output(&grad_output_name(name), &g);
    }
    let mut out = b.program();
    remove_dead_tail(&mut out, n);
    debug_assert!(
        ir::verify(&out).is_ok(),
        "{}",
        ir::verify(&out).unwrap_err()
    );
    Ok(out)
}

/// Values that get a cotangent: float values that depend on a `wrt` parameter (not through
/// `stop_gradient`) and that the loss depends on through such values.
fn active_values(p: &Program, loss: ValueId, params: &[(&str, ValueId)]) -> Vec<bool> {
    let n = p.len();
    let mut varies = vec![false; n];
    for &(_, id) in params {
        varies[id.index()] = true;
    }
    for (i, instr) in p.instrs.iter().enumerate() {
        if instr.ty.dtype.is_float()
            && !matches!(instr.op, Op::StopGradient)
            && instr.operands.iter().any(|o| varies[o.index()])
        {
            varies[i] = true;
        }
    }
    let mut active = vec![false; n];
    active[loss.index()] = varies[loss.index()];
    for i in (0..n).rev() {
        if active[i] {
            for o in &p.instrs[i].operands {
                active[o.index()] |= varies[o.index()];
            }
        }
    }
    active
}

/// Drop instructions at index `>= first` that no output uses, renumbering only those;
/// instructions before `first` keep their ids.
fn remove_dead_tail(p: &mut Program, first: usize) {
    let n = p.len();
    let mut live = vec![false; n];
    for (_, v) in &p.outputs {
        live[v.index()] = true;
    }
    for i in (first..n).rev() {
        if live[i] {
            for o in &p.instrs[i].operands {
                live[o.index()] = true;
            }
        }
    }
    let mut map: Vec<ValueId> = (0..n as u32).map(ValueId).collect();
    let tail = p.instrs.split_off(first);
    for (k, mut instr) in tail.into_iter().enumerate() {
        let i = first + k;
        if !live[i] {
            continue;
        }
        for o in &mut instr.operands {
            *o = map[o.index()];
        }
        map[i] = p.push(instr);
    }
    for (_, v) in &mut p.outputs {
        *v = map[v.index()];
    }
}

fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests;
