//! `verify()`: SSA order, operand and result types, parameter and output names, shardings
//! against the mesh, checkpoint marks against their scopes' paths. Errors print the program
//! around the fault.

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
    // Each scope's mark is checked once (`None`: not yet).
    let mut marks: Vec<Option<Result<(), String>>> = vec![None; p.scopes.len()];
    for (i, ins) in p.instrs.iter().enumerate() {
        if let Some(slot) = marks.get_mut(ins.scope.index()) {
            if let Err(e) = slot.get_or_insert_with(|| p.scopes.get(ins.scope).check()) {
                return Err(fail(i, e.clone()));
            }
        }
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
