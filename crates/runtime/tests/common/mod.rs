//! Helpers shared by the runtime integration tests: input maps, one-call runs, comparisons,
//! and the proptest case count.
#![allow(dead_code)]

pub mod oracle;

use ir::Program;
use runtime::HostTensor;
use std::collections::HashMap;

/// An input map from `(name, tensor)` pairs.
pub fn inputs(v: Vec<(&str, HostTensor)>) -> HashMap<String, HostTensor> {
    v.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

/// Run `p` on one device and return its outputs (panics on error).
pub fn run1(p: &Program, v: Vec<(&str, HostTensor)>) -> HashMap<String, HostTensor> {
    runtime::run(p, &inputs(v)).unwrap_or_else(|e| panic!("{e}"))
}

/// Output `name` of a single-device run as f64 values.
pub fn out(p: &Program, v: Vec<(&str, HostTensor)>, name: &str) -> Vec<f64> {
    run1(p, v)[name].to_f64_vec()
}

/// Elementwise `|a - b| <= tol * (1 + |b|)`, NaN matching NaN.
pub fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "lengths differ: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "element {i}: {x} vs {y} (tol {tol})\n{a:?}\n{b:?}");
    }
}

/// Exact equality, NaN matching NaN.
pub fn assert_same(a: &[f64], b: &[f64]) {
    assert_close(a, b, 0.0);
}

/// A proptest config running 48 cases, or `PROPTEST_CASES` when that is set.
pub fn cases() -> proptest::prelude::ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    proptest::prelude::ProptestConfig::with_cases(n)
}
