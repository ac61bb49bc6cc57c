//! The explaining parts of `gshard inspect`: collectives and summary rows as JSON, and
//! `--draw`, the picture of how one value is laid out over the mesh.

use anyhow::{bail, Context, Result};
use ir::{Program, Sharding, Type, ValueId};
use serde_json::{json, Value};
use spmd::report::summary::ScopeRow;
use spmd::report::why::{self, WhyEntry};
use spmd::why::{Link, Moved};
use spmd::Partitioned;
use std::path::Path;

fn link_json(p: &Program, l: &Link) -> Value {
    let scope = p.scopes.get(l.scope);
    json!({
        "value": l.value.0,
        "op": l.op,
        "parameter": l.param,
        "scope": scope.path,
        "grad": scope.grad,
        "sharding": l.sharding.to_string(),
        "how": why::how(l),
    })
}

/// One collective with its scope and cause (`cause` is null when unknown).
pub fn collective_json(p: &Program, e: &WhyEntry) -> Value {
    let c = &e.info;
    let cause = e.cause.map(|cause| {
        let (moved, from, to, global) = match &cause.reshard {
            Some(r) => (
                match r.moved {
                    Moved::Operand { position, .. } => format!("operand {position}"),
                    Moved::Result => "result".to_string(),
                    Moved::Internal => "internal".to_string(),
                },
                Some(r.from.to_string()),
                Some(r.to.to_string()),
                Some(r.global.to_string()),
            ),
            None => ("exchange".to_string(), None, None, None),
        };
        json!({
            "serves": cause.serves.0,
            "serves_op": cause.serves_op,
            "moved": moved,
            "from": from,
            "to": to,
            "global": global,
            "summary": why::describe_moved(cause),
            "required": cause.required.iter().map(|l| link_json(p, l)).collect::<Vec<_>>(),
            "had": cause.had.iter().map(|l| link_json(p, l)).collect::<Vec<_>>(),
            "full_gather": if e.flagged { why::describe_gather(p, cause) } else { None },
            "avoid": cause.full_gather.as_ref().filter(|_| e.flagged).map(|a| json!({
                "value": a.value.0,
                "sharding": a.sharding.to_string(),
                "scope": p.scopes.get(a.scope).path,
                "culprit": a.culprit.as_ref().map(|l| link_json(p, l)),
            })),
        })
    });
    json!({
        "kind": c.kind.replace('_', "-"),
        "axes": c.axes,
        "dtype": c.dtype.name(),
        "shape": c.shape,
        "bytes": c.bytes,
        "instruction": c.index,
        "scope": e.scope,
        "grad": e.grad,
        "layer": e.layer,
        "cause": cause,
    })
}

/// One row of the summary by scope.
pub fn row_json(r: &ScopeRow) -> Value {
    json!({
        "scope": r.scope,
        "instructions": r.instructions,
        "flops": r.flops,
        "collective_bytes": r.collective_bytes.iter().map(|(k, b)| (k.replace('_', "-"), json!(b))).collect::<serde_json::Map<_, _>>(),
        "saved_activation_bytes": r.saved_bytes,
    })
}

/// The global type and sharding of `name`: a parameter, an output or `%N` of the program.
fn find(p: &Program, part: &Partitioned, name: &str) -> Result<(Type, Sharding)> {
    if let Some(l) = part
        .params
        .iter()
        .chain(&part.outputs)
        .find(|l| l.name == name)
    {
        return Ok((l.global.clone(), l.sharding.clone()));
    }
    if let Some(n) = name.strip_prefix('%') {
        let i: u32 = n
            .parse()
            .with_context(|| format!("`{name}` is not a value number such as %12"))?;
        if i as usize >= p.len() {
            bail!(
                "the program has no value {name} (it has {} instructions)",
                p.len()
            );
        }
        let done = sharding::propagate(p)?;
        let ins = done.instr(ValueId(i));
        return Ok((ins.ty.clone(), ins.sharding.clone().expect("propagated")));
    }
    let names: Vec<&str> = part
        .params
        .iter()
        .chain(&part.outputs)
        .map(|l| l.name.as_str())
        .take(12)
        .collect();
    bail!(
        "no parameter or output named `{name}`; give one (e.g. {}) or a value number such as %12",
        names.join(", ")
    )
}

/// `--draw NAME`: the PNG of how `name` is laid out over the mesh.
pub fn draw(p: &Program, part: &Partitioned, name: &str, out: Option<&Path>) -> Result<()> {
    let (ty, sharding) = find(p, part, name)?;
    let mesh = part.program.mesh.as_ref().expect("partitioned");
    let default = format!("{}.png", name.replace(['/', '%'], "_"));
    let path = out.unwrap_or(Path::new(&default));
    let pic = train::pictures::ShardingPicture {
        name,
        ty: &ty,
        sharding: &sharding,
        mesh,
    };
    train::pictures::draw_sharding(path, &pic)?;
    println!("{name} {ty} {sharding} on mesh {mesh}");
    for t in train::pictures::tiles(mesh, &sharding, ty.rank()) {
        let ids: Vec<String> = t.devices.iter().map(|d| d.to_string()).collect();
        let idx: Vec<String> = t.index.iter().map(|i| i.to_string()).collect();
        println!("  tile [{}] on devices {}", idx.join(","), ids.join(","));
    }
    println!("wrote {}", path.display());
    Ok(())
}
