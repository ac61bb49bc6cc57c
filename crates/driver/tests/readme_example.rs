//! The README's library example, verbatim (a second test keeps the two texts equal).

use ir::{Builder, DType, Mesh, Type};
use runtime::{HostTensor, InProcess};
use std::collections::HashMap;

#[test]
fn eight_devices_compute_what_one_does() {
    // A two-layer MLP's squared error, written as if for one device, with one annotation:
    // the batch dim of `x` is split over the axis `data` of a mesh of 8 devices.
    let b = Builder::with_mesh(Mesh::new(&[("data", 8)]).unwrap());
    let f32s = |shape: &[usize]| Type::new(DType::F32, shape.to_vec());
    let x = sharding::split(&b.param("x", f32s(&[64, 16])), 0, "data").unwrap();
    let h = x.matmul(&b.param("w1", f32s(&[16, 32]))).relu();
    let y = h.matmul(&b.param("w2", f32s(&[32, 4])));
    let err = y.sub(&b.param("t", f32s(&[64, 4])));
    b.output("loss", &err.mul(&err).sum_all());
    // The backward pass is IR too; propagate the sharding and partition the whole step.
    let step = autodiff::grad(&b.finish(), "loss", &["w1", "w2"]).unwrap();
    let part = spmd::compile(&step).unwrap();
    // Whole inputs: the driver cuts each device's block and assembles the outputs.
    let mut inputs = HashMap::new();
    for (name, v) in step.params() {
        let shape = step.ty(v).shape.clone();
        let values = (0..shape.iter().product()).map(|i: usize| (i % 7) as f32 - 3.0);
        inputs.insert(
            name.to_string(),
            HostTensor::from_f32(shape, values.collect()),
        );
    }
    let eight = driver::run(&part, &inputs).unwrap().outputs;
    let one = runtime::run_devices(&step, &InProcess::new(1), &[inputs]).unwrap();
    // The loss and the gradients are all-reduced: each device holds the whole values.
    let close = |(a, b): (f32, f32)| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
    for name in ["loss", "grad_w1", "grad_w2"] {
        let (a, b) = (&eight[name], &one.outputs[0][name]);
        let same = a.to_f32_vec().into_iter().zip(b.to_f32_vec()).all(close);
        assert!(same, "{name}");
    }
}
// (end of the README's example)

#[test]
fn the_readme_shows_this_file() {
    // The example: everything after this file's doc comment, up to the line above.
    let this = include_str!("readme_example.rs")
        .split_once("\n\n")
        .unwrap()
        .1;
    let example = this
        .split("// (end of the README's example)")
        .next()
        .unwrap();
    assert!(
        include_str!("../../../README.md").contains(&format!("```rust\n{example}```\n")),
        "README.md's library example differs from crates/driver/tests/readme_example.rs"
    );
}
