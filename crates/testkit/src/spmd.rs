//! The SPMD oracle: `gather(run_spmd(partition(p)))` must equal `run(p)` on one device.
//!
//! - [`shard_host`] / [`unshard_host`]: cut a global host tensor into a device's (padded)
//!   shard, and assemble a global tensor from every device's shard (partial-sum axes are
//!   summed, replicas are read once). The oracle fills input padding with [`poison`]
//!   (NaN for floats), so an op that reads padding without masking it is caught.
//! - [`run_partitioned`]: propagate + partition a program, run it on every device of its
//!   mesh with the reference interpreter, and assemble the outputs.
//! - [`check_spmd_matches`] / [`assert_spmd_matches`]: compare that with the single-device
//!   reference run; a mismatch names the output and element and prints the mesh, the
//!   annotated program and the partitioned program.
//! - [`test_meshes`] / [`for_each_mesh`]: the meshes every oracle test runs on:
//!   `[x=1]`, `[x=2]`, `[x=4]`, `[x=8]`, `[a=2, b=2]`, `[a=2, b=4]`.

use crate::{check_close, Tol};
use ir::{DType, Mesh, Program, Sharding, Type};
use runtime::HostTensor;
use spmd::layout::shard_ranges;
use std::collections::HashMap;

/// The meshes of the oracle tests: one axis of 1, 2, 4 and 8 devices, and two 2-D meshes.
pub fn test_meshes() -> Vec<Mesh> {
    let specs: [&[(&str, usize)]; 6] = [
        &[("x", 1)],
        &[("x", 2)],
        &[("x", 4)],
        &[("x", 8)],
        &[("a", 2), ("b", 2)],
        &[("a", 2), ("b", 4)],
    ];
    specs
        .iter()
        .map(|s| Mesh::new(s).expect("valid test mesh"))
        .collect()
}

/// Run `f` on every mesh of [`test_meshes`]; a panic inside `f` is re-raised with the mesh
/// named first.
#[track_caller]
pub fn for_each_mesh(mut f: impl FnMut(&Mesh)) {
    for mesh in test_meshes() {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mesh)));
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic".into());
            panic!("on mesh {mesh}: {msg}");
        }
    }
}

/// Multi-index iteration over `shape` (row-major), calling `f(flat, index)`.
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Device `pos`'s shard of a global host tensor, with every padded element zero. Partial
/// axes do not cut the value (each member holds the whole tile).
pub fn shard_host(t: &HostTensor, s: &Sharding, mesh: &Mesh, pos: usize) -> HostTensor {
    shard_host_padded(t, s, mesh, pos, 0.0)
}

/// The value [`run_partitioned`] puts in the padding of input shards: padding is undefined (an
/// uneven shard's tail holds whatever the device had there), so a partitioned program that
/// reads it without masking must show it. NaN for floats, a large odd number for i32, `true`
/// for bool.
pub fn poison(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 => f64::NAN,
        DType::I32 => 1_000_003.0,
        DType::Bool => 1.0,
    }
}

/// [`shard_host`] with every padded element set to `pad`.
pub fn shard_host_padded(
    t: &HostTensor,
    s: &Sharding,
    mesh: &Mesh,
    pos: usize,
    pad: f64,
) -> HostTensor {
    let ranges = shard_ranges(t.shape(), s, mesh, pos);
    let local: Vec<usize> = ranges.iter().map(|r| r.padded).collect();
    let g = t.to_f64_vec();
    let gs = ir::strides(t.shape());
    let mut out = vec![pad; local.iter().product()];
    for_each_index(&local, |li, c| {
        let mut gi = 0;
        for d in 0..c.len() {
            if c[d] >= ranges[d].len {
                return;
            }
            gi += (ranges[d].offset + c[d]) * gs[d];
        }
        out[li] = g[gi];
    });
    HostTensor::from_f64_values(t.ty.with_shape(local), &out)
}

/// Assemble a global tensor of type `global` from every device's shard under `s`: each tile
/// is read from the devices at rank 0 of every replicated axis, and summed over the
/// partial-sum axes of `s`. Padding is ignored.
pub fn unshard_host(shards: &[HostTensor], global: &Type, s: &Sharding, mesh: &Mesh) -> HostTensor {
    let mut out = vec![0.0; global.num_elements()];
    let gs = ir::strides(&global.shape);
    let used = s.split_axes();
    for (pos, sh) in shards.iter().enumerate() {
        let canonical = mesh
            .axes
            .iter()
            .filter(|a| !used.contains(&a.name) && !s.partial.contains(&a.name))
            .all(|a| mesh.coord(pos, &a.name) == Some(0));
        if !canonical {
            continue;
        }
        let ranges = shard_ranges(&global.shape, s, mesh, pos);
        let v = sh.to_f64_vec();
        for_each_index(sh.shape(), |li, c| {
            let mut gi = 0;
            for d in 0..c.len() {
                if c[d] >= ranges[d].len {
                    return;
                }
                gi += (ranges[d].offset + c[d]) * gs[d];
            }
            out[gi] += v[li];
        });
    }
    HostTensor::from_f64_values(global.clone(), &out)
}

/// Propagate and partition `p`, run the per-device program on every device of its mesh
/// (inputs sharded with [`shard_host_padded`], padding [`poison`]ed) and assemble the
/// outputs with [`unshard_host`].
/// `Err` says which stage failed and prints the program(s).
pub fn run_partitioned(
    p: &Program,
    inputs: &HashMap<String, HostTensor>,
) -> Result<(HashMap<String, HostTensor>, spmd::Partitioned), String> {
    let part = spmd::compile(p).map_err(|e| {
        format!(
            "partitioning failed: {e}\n--- program ---\n{}",
            ir::text::print(p)
        )
    })?;
    let show = |what: String| {
        format!(
            "{what}\n--- program ---\n{}--- partitioned ---\n{}",
            ir::text::print(p),
            ir::text::print(&part.program)
        )
    };
    ir::verify(&part.program)
        .map_err(|e| show(format!("the partitioned program does not verify: {e}")))?;
    let mesh = part
        .program
        .mesh
        .clone()
        .ok_or_else(|| show("no mesh".into()))?;
    let mut per_dev = Vec::with_capacity(mesh.num_devices());
    for pos in 0..mesh.num_devices() {
        let mut m = HashMap::new();
        for l in &part.params {
            let t = inputs
                .get(&l.name)
                .ok_or_else(|| show(format!("no input for parameter `{}`", l.name)))?;
            let pad = poison(t.dtype());
            m.insert(
                l.name.clone(),
                shard_host_padded(t, &l.sharding, &mesh, pos, pad),
            );
        }
        per_dev.push(m);
    }
    let outs = runtime::reference::run_spmd(&part.program, &per_dev)
        .map_err(|e| show(format!("run_spmd failed: {e}")))?;
    let mut result = HashMap::new();
    for l in &part.outputs {
        let shards: Vec<HostTensor> = outs.iter().map(|o| o[&l.name].clone()).collect();
        result.insert(
            l.name.clone(),
            unshard_host(&shards, &l.global, &l.sharding, &mesh),
        );
    }
    Ok((result, part))
}

/// `p` without its mesh and shardings: the single-device program.
pub fn unpartitioned(p: &Program) -> Program {
    let mut single = p.clone();
    single.mesh = None;
    for i in &mut single.instrs {
        i.sharding = None;
    }
    single
}

/// Check that the partitioned run of `p` equals the single-device reference run: float
/// outputs within `tol`, integer and bool outputs exactly. `Err` names the output and the
/// worst element, and prints the mesh, the annotated program and the partitioned program.
pub fn check_spmd_matches(
    p: &Program,
    inputs: &HashMap<String, HostTensor>,
    tol: Tol,
) -> Result<spmd::Partitioned, String> {
    let want = runtime::reference::run(&unpartitioned(p), inputs).map_err(|e| {
        format!(
            "the single-device run failed: {e}\n--- program ---\n{}",
            ir::text::print(p)
        )
    })?;
    let (got, part) = run_partitioned(p, inputs)?;
    let mut names: Vec<&String> = want.keys().collect();
    names.sort();
    for name in names {
        let w = &want[name];
        let g = &got[name];
        let t = if w.dtype().is_float() {
            tol
        } else {
            Tol::EXACT
        };
        let bad = if g.ty != w.ty {
            Some(format!("type {} vs {}", g.ty, w.ty))
        } else {
            check_close(g, w, t).err()
        };
        if let Some(msg) = bad {
            return Err(format!(
                "output `{name}`: partitioned vs single device: {msg}\n  partitioned: {:?}\n  single:      {:?}\n--- program ---\n{}--- partitioned ---\n{}",
                g.to_f64_vec(),
                w.to_f64_vec(),
                ir::text::print(p),
                ir::text::print(&part.program)
            ));
        }
    }
    Ok(part)
}

/// [`check_spmd_matches`] that panics with its message.
#[track_caller]
pub fn assert_spmd_matches(
    p: &Program,
    inputs: &HashMap<String, HostTensor>,
    tol: Tol,
) -> spmd::Partitioned {
    check_spmd_matches(p, inputs, tol).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_then_unshard_is_the_identity() {
        let t = HostTensor::from_f64([5, 3], (0..15).map(|x| x as f64).collect());
        for mesh in test_meshes() {
            let axes: Vec<String> = mesh.axes.iter().map(|a| a.name.clone()).collect();
            for s in [
                Sharding::replicated(2),
                Sharding::split(2, 0, &axes[0]),
                Sharding {
                    dims: vec![vec![], axes.clone()],
                    partial: vec![],
                },
            ] {
                let shards: Vec<HostTensor> = (0..mesh.num_devices())
                    .map(|pos| shard_host(&t, &s, &mesh, pos))
                    .collect();
                let back = unshard_host(&shards, &t.ty, &s, &mesh);
                assert_eq!(back.to_f64_vec(), t.to_f64_vec(), "{mesh} {s}");
            }
        }
    }

    #[test]
    fn partial_axes_are_summed() {
        let mesh = Mesh::new(&[("x", 2)]).unwrap();
        let s = Sharding {
            dims: vec![vec![]],
            partial: vec!["x".into()],
        };
        let ty = Type::new(ir::DType::F64, [2]);
        let shards = vec![
            HostTensor::from_f64([2], vec![1.0, 2.0]),
            HostTensor::from_f64([2], vec![10.0, 20.0]),
        ];
        assert_eq!(
            unshard_host(&shards, &ty, &s, &mesh).to_f64_vec(),
            vec![11.0, 22.0]
        );
    }
}
