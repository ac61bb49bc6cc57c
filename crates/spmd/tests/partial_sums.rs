//! Linear ops on pending partial sums: `a + b` and `a - b` of partial sums over the same
//! axes, and a widening float convert of one, stay a partial sum, so a sum of gradient contributions (a tied embedding used as
//! input table and output projection) meets one all-reduce instead of one per term, and
//! the values are the single device's.

use ir::{Builder, DType, Mesh, Type};
use runtime::HostTensor;
use sharding::{replicate, split};
use std::collections::HashMap;
use testkit::spmd::assert_spmd_matches;
use testkit::Tol;

fn f64t(shape: &[usize]) -> Type {
    Type::new(DType::F64, shape.to_vec())
}

fn all_reduces(part: &spmd::Partitioned) -> usize {
    spmd::report::collectives(&part.program)
        .iter()
        .filter(|c| c.kind == "all_reduce")
        .count()
}

fn inputs(p: &ir::Program) -> HashMap<String, HostTensor> {
    p.params()
        .into_iter()
        .map(|(name, v)| {
            let ty = p.ty(v).clone();
            let vals: Vec<f64> = (0..ty.num_elements())
                .map(|i| ((i * 37 + name.len() * 11) % 17) as f64 / 7.0 - 1.0)
                .collect();
            (name.to_string(), HostTensor::from_f64_values(ty, &vals))
        })
        .collect()
}

#[test]
fn a_sum_of_partial_sums_is_reduced_once() {
    // Three `[8, 3]` contributions contracted over a batch of 16 split 4 ways.
    let b = Builder::with_mesh(Mesh::new(&[("d", 4)]).unwrap());
    let term = |x: &str, y: &str| {
        let x = split(&b.param(x, f64t(&[16, 8])), 0, "d").unwrap();
        let y = split(&b.param(y, f64t(&[16, 3])), 0, "d").unwrap();
        b.einsum("BI,BO->IO", &[&x, &y])
    };
    let g = term("x1", "y1")
        .add(&term("x2", "y2"))
        .sub(&term("x3", "y3"));
    b.output("g", &replicate(&g).unwrap());
    let p = b.finish();
    let part = assert_spmd_matches(&p, &inputs(&p), Tol::new(1e-12, 1e-12));
    assert_eq!(all_reduces(&part), 1, "{}", ir::text::print(&part.program));
}

#[test]
fn partial_sums_over_different_axes_are_reduced_apart() {
    // One term is partial over `a`, the other over `b`: each needs its own reduction.
    let b = Builder::with_mesh(Mesh::new(&[("a", 2), ("b", 2)]).unwrap());
    let term = |x: &str, y: &str, axis: &str| {
        let x = split(&b.param(x, f64t(&[64, 8])), 0, axis).unwrap();
        let y = split(&b.param(y, f64t(&[64, 3])), 0, axis).unwrap();
        b.einsum("BI,BO->IO", &[&x, &y])
    };
    let g = term("x1", "y1", "a").add(&term("x2", "y2", "b"));
    b.output("g", &replicate(&g).unwrap());
    let p = b.finish();
    let part = assert_spmd_matches(&p, &inputs(&p), Tol::new(1e-12, 1e-12));
    assert_eq!(all_reduces(&part), 2, "{}", ir::text::print(&part.program));
}

#[test]
fn a_widened_partial_sum_is_reduced_once_in_the_wider_type() {
    // An f32 contribution (a mixed-precision projection's gradient) widened and added to an
    // f64 one: one all-reduce, in f64, after the convert.
    let b = Builder::with_mesh(Mesh::new(&[("d", 4)]).unwrap());
    let term = |x: &str, y: &str, dtype: DType| {
        let t = |shape: &[usize]| Type::new(dtype, shape.to_vec());
        let x = split(&b.param(x, t(&[16, 8])), 0, "d").unwrap();
        let y = split(&b.param(y, t(&[16, 3])), 0, "d").unwrap();
        b.einsum("BI,BO->IO", &[&x, &y])
    };
    let narrow = term("x1", "y1", DType::F32).convert(DType::F64);
    let g = narrow.add(&term("x2", "y2", DType::F64));
    b.output("g", &replicate(&g).unwrap());
    let p = b.finish();
    let part = assert_spmd_matches(&p, &inputs(&p), Tol::new(1e-6, 1e-6));
    let text = ir::text::print(&part.program);
    assert_eq!(all_reduces(&part), 1, "{text}");
    assert!(text.contains("f64[8,3] all_reduce"), "{text}");
}

#[test]
fn a_narrowed_partial_sum_is_reduced_before_the_convert() {
    // Rounding each part to f32 is not rounding their sum: the reduction stays in f64.
    let b = Builder::with_mesh(Mesh::new(&[("d", 4)]).unwrap());
    let x = split(&b.param("x", f64t(&[16, 8])), 0, "d").unwrap();
    let y = split(&b.param("y", f64t(&[16, 3])), 0, "d").unwrap();
    let g = b.einsum("BI,BO->IO", &[&x, &y]).convert(DType::F32);
    b.output("g", &replicate(&g).unwrap());
    let p = b.finish();
    let part = assert_spmd_matches(&p, &inputs(&p), Tol::new(1e-6, 1e-6));
    let text = ir::text::print(&part.program);
    assert_eq!(all_reduces(&part), 1, "{text}");
    assert!(text.contains("f64[8,3] all_reduce"), "{text}");
}
