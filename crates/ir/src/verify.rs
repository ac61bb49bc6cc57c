//! `verify()`: SSA order, operand and result types, parameter and output names, shardings
//! against the mesh. Errors print the program around the fault.

use crate::error::VerifyError;
use crate::infer::infer_type;
use crate::op::Op;
use crate::program::Program;
use crate::text::print::print_context;

/// Check every invariant of a program. Run after every pass in tests and debug builds.
pub fn verify(p: &Program) -> Result<(), VerifyError> {
    let fail = |i: usize, msg: String| VerifyError {
        index: i,
        op: p
            .instrs
            .get(i)
            .map(|x| x.op.name())
            .unwrap_or("?")
            .to_string(),
        msg,
        context: print_context(p, i, 10),
    };
    let mut names: std::collections::HashSet<&str> = Default::default();
    for (i, ins) in p.instrs.iter().enumerate() {
        for o in &ins.operands {
            if o.index() >= i {
                return Err(fail(i, format!("operand {o} does not precede its use")));
            }
        }
        let tys: Vec<_> = ins
            .operands
            .iter()
            .map(|o| &p.instrs[o.index()].ty)
            .collect();
        if let Err(e) = infer_type(&ins.op, &tys, Some(&ins.ty), p.mesh.as_ref()) {
            return Err(fail(i, e.to_string()));
        }
        if let Op::Parameter { name } = &ins.op {
            if !names.insert(name.as_str()) {
                return Err(fail(i, format!("parameter name \"{name}\" is used twice")));
            }
        }
        if let Some(s) = &ins.sharding {
            let Some(mesh) = &p.mesh else {
                return Err(fail(
                    i,
                    "has a sharding but the program declares no mesh".into(),
                ));
            };
            if let Err(e) = s.validate(mesh, &ins.ty.shape) {
                return Err(fail(i, e.to_string()));
            }
        }
    }
    let mut outs: std::collections::HashSet<&str> = Default::default();
    for (name, v) in &p.outputs {
        if v.index() >= p.instrs.len() {
            return Err(fail(
                p.instrs.len().saturating_sub(1),
                format!("output \"{name}\" refers to {v}, which does not exist"),
            ));
        }
        if !outs.insert(name.as_str()) {
            return Err(fail(
                v.index(),
                format!("output name \"{name}\" is used twice"),
            ));
        }
    }
    Ok(())
}
