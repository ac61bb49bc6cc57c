//! Dev-only test helpers shared by the whole project.
//!
//! - [`Tol`]: named tolerances, so tests say *which* precision they expect instead of
//!   scattering literals.
//! - [`assert_close`] / [`check_close`]: elementwise comparison of host tensors whose failure
//!   message names the worst element (index and values).
//! - [`check_grads`]: the autodiff oracle. It runs [`autodiff::grad`], evaluates the result
//!   with the reference interpreter and compares every gradient element with central finite
//!   differences, all in f64.
//! - [`strategies`]: proptest strategies for shapes and random f64 tensors, and [`cases`], a
//!   proptest config that honours `PROPTEST_CASES`.
//! - [`spmd`]: the partitioner's oracle: shard host tensors, run a partitioned program on
//!   every device of a mesh, assemble the outputs and compare them with the single-device
//!   run ([`spmd::assert_spmd_matches`]); the meshes every oracle test uses
//!   ([`spmd::for_each_mesh`]).
//! - [`phrases`]: a synthetic German/French-to-English corpus for training tests.
//!
//! Nothing here is used by library code; crates take it as a dev-dependency.

pub mod phrases;
pub mod spmd;
pub mod strategies;

pub use strategies::{cases, fixed_values};

use ir::{DType, Program};
use runtime::HostTensor;
use std::collections::HashMap;

/// An elementwise tolerance: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
}

impl Tol {
    /// Computations done in f64 that should agree to rounding.
    pub const F64: Tol = Tol::new(1e-12, 1e-12);
    /// Computations done in f32.
    pub const F32: Tol = Tol::new(1e-5, 1e-6);
    /// Computations done in bf16 (8 bits of mantissa).
    pub const BF16: Tol = Tol::new(1e-2, 1e-2);
    /// Analytic gradients against central finite differences in f64 ([`check_grads`]).
    pub const FD: Tol = Tol::new(1e-5, 1e-6);
    /// Exact equality.
    pub const EXACT: Tol = Tol::new(0.0, 0.0);

    pub const fn new(rtol: f64, atol: f64) -> Tol {
        Tol { rtol, atol }
    }

    /// The tolerance for results computed in `dtype` (exact for integers and bools).
    pub fn for_dtype(dtype: DType) -> Tol {
        match dtype {
            DType::F64 => Tol::F64,
            DType::F32 => Tol::F32,
            DType::BF16 => Tol::BF16,
            DType::I32 | DType::Bool => Tol::EXACT,
        }
    }

    /// The largest difference allowed from `want`.
    pub fn allowed(&self, want: f64) -> f64 {
        self.atol + self.rtol * want.abs()
    }

    /// Whether `got` is close enough to `want`. NaNs match NaNs and infinities match
    /// infinities of the same sign.
    pub fn accepts(&self, got: f64, want: f64) -> bool {
        if got.is_nan() || want.is_nan() {
            return got.is_nan() && want.is_nan();
        }
        if got.is_infinite() || want.is_infinite() {
            return got == want;
        }
        (got - want).abs() <= self.allowed(want)
    }
}

/// Compare two tensors elementwise (as f64; dtypes may differ, shapes must match).
/// `Err` describes the worst element: its index, both values and the allowed difference.
pub fn check_close(got: &HostTensor, want: &HostTensor, tol: Tol) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("shape mismatch: got {}, want {}", got.ty, want.ty));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut bad = 0;
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if tol.accepts(a, b) {
            continue;
        }
        bad += 1;
        // Non-finite mismatches rank above every finite one.
        let excess = match (a - b).abs() / tol.allowed(b).max(f64::MIN_POSITIVE) {
            e if e.is_finite() => e,
            _ => f64::INFINITY,
        };
        if worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    let Some((i, _)) = worst else { return Ok(()) };
    Err(format!(
        "{bad} of {} elements differ beyond rtol={} atol={}; worst at {:?} (flat {i}): got {}, want {} (|diff| = {:e}, allowed {:e})",
        g.len(),
        tol.rtol,
        tol.atol,
        unravel(i, got.shape()),
        g[i],
        w[i],
        (g[i] - w[i]).abs(),
        tol.allowed(w[i]),
    ))
}

/// Panic unless `got` is close to `want` (see [`check_close`]); `name` labels the message.
#[track_caller]
pub fn assert_close(name: &str, got: &HostTensor, want: &HostTensor, tol: Tol) {
    if let Err(msg) = check_close(got, want, tol) {
        panic!("{name}: {msg}");
    }
}

/// Row-major multi-index of flat index `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    idx
}

/// A map of named inputs, for [`runtime::run`] and [`check_grads`].
pub fn inputs(pairs: &[(&str, HostTensor)]) -> HashMap<String, HostTensor> {
    pairs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect()
}

/// `p` with every float type widened to f64 (values, parameters and constants alike), so
/// that it computes the same function in f64. Integer and bool values are unchanged.
pub fn promote_to_f64(p: &Program) -> Program {
    let mut p = p.clone();
    for instr in &mut p.instrs {
        if instr.ty.dtype.is_float() {
            instr.ty.dtype = DType::F64;
        }
    }
    p
}

/// Check the gradients of output `loss` with respect to the parameters `wrt` at `inputs`
/// against central finite differences; panics with the worst element on a mismatch.
///
/// The check runs in f64: float types of `p` and of `inputs` are widened first
/// ([`promote_to_f64`]), so f32 and bf16 programs are checked for their mathematical
/// gradient. The step is `1e-6 * max(1, |x|)`. The gradient of `p` itself (unwidened) must
/// also pass `ir::verify`, which catches rules that emit ill-typed code for narrow dtypes.
#[track_caller]
pub fn check_grads(
    p: &Program,
    loss: &str,
    wrt: &[&str],
    inputs: &HashMap<String, HostTensor>,
    tol: Tol,
) {
    fd_check(p, loss, wrt, std::slice::from_ref(inputs), tol, false)
}

/// [`check_grads`] for a program over a mesh, run with [`runtime::run_spmd`]
/// (`inputs[pos]` feeds mesh position `pos`).
///
/// The function checked is the sum over devices of each device's `loss`, as a function of
/// every device's inputs: seeding every device with 1.0 and transposing the collectives
/// computes exactly that, so `grad_<param>` on device `d` must match the finite difference
/// taken by perturbing `param` on device `d` alone.
#[track_caller]
pub fn check_grads_spmd(
    p: &Program,
    loss: &str,
    wrt: &[&str],
    inputs: &[HashMap<String, HostTensor>],
    tol: Tol,
) {
    fd_check(p, loss, wrt, inputs, tol, true)
}

#[track_caller]
fn fd_check(
    p: &Program,
    loss: &str,
    wrt: &[&str],
    inputs: &[HashMap<String, HostTensor>],
    tol: Tol,
    spmd: bool,
) {
    let fail = |msg: String| -> ! { panic!("check_grads(loss `{loss}`, wrt {wrt:?}): {msg}") };
    let narrow = autodiff::grad(p, loss, wrt).unwrap_or_else(|e| fail(e.to_string()));
    if let Err(e) = ir::verify(&narrow) {
        fail(format!("the gradient program does not verify: {e}"));
    }
    let p = promote_to_f64(p);
    let inputs: Vec<HashMap<String, HostTensor>> = inputs
        .iter()
        .map(|m| {
            m.iter()
                .map(|(n, t)| {
                    let t = if t.dtype().is_float() {
                        t.convert(DType::F64)
                    } else {
                        t.clone()
                    };
                    (n.clone(), t)
                })
                .collect()
        })
        .collect();
    let run = |prog: &Program, ins: &[HashMap<String, HostTensor>], what: &str| {
        let out = if spmd {
            runtime::run_spmd(prog, ins)
        } else {
            runtime::run(prog, &ins[0]).map(|o| vec![o])
        };
        out.unwrap_or_else(|e| fail(format!("running the {what} program: {e}")))
    };
    let gp = autodiff::grad(&p, loss, wrt).unwrap_or_else(|e| fail(e.to_string()));
    let got = run(&gp, &inputs, "gradient");

    // The forward program reduced to the loss alone, for the finite differences.
    let mut fwd = p.clone();
    fwd.outputs.retain(|(n, _)| n == loss);
    fwd.prune();
    let total_loss = |ins: &[HashMap<String, HostTensor>]| -> f64 {
        run(&fwd, ins, "forward")
            .iter()
            .map(|o| o[loss].to_f64_vec()[0])
            .sum()
    };
    for (dev, dev_inputs) in inputs.iter().enumerate() {
        for &name in wrt {
            let x = dev_inputs
                .get(name)
                .unwrap_or_else(|| fail(format!("no input given for `{name}`")));
            let xs = x.to_f64_vec();
            let mut fd = Vec::with_capacity(xs.len());
            let mut perturbed = inputs.clone();
            for i in 0..xs.len() {
                let h = 1e-6 * xs[i].abs().max(1.0);
                let mut at = |v: f64| {
                    let mut ys = xs.clone();
                    ys[i] = v;
                    let t = HostTensor::from_f64(x.shape().to_vec(), ys);
                    perturbed[dev].insert(name.to_string(), t);
                    total_loss(&perturbed)
                };
                let (hi, lo) = (at(xs[i] + h), at(xs[i] - h));
                fd.push((hi - lo) / (2.0 * h));
            }
            let want = HostTensor::from_f64(x.shape().to_vec(), fd);
            let out = autodiff::grad_output_name(name);
            let have = &got[dev][&out];
            if let Err(msg) = check_close(have, &want, tol) {
                let on = if spmd {
                    format!(" on device {dev}")
                } else {
                    String::new()
                };
                fail(format!(
                    "{out}{on} (analytic) vs central differences: {msg}\n  analytic: {}\n  numeric:  {}",
                    preview(have),
                    preview(&want)
                ));
            }
        }
    }
}

/// The first 32 values of a tensor, for failure messages.
fn preview(t: &HostTensor) -> String {
    let v = t.to_f64_vec();
    let head: Vec<String> = v.iter().take(32).map(|x| format!("{x:.6e}")).collect();
    let more = if v.len() > 32 { ", ..." } else { "" };
    format!("[{}{more}]", head.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ir::{Builder, Type};

    #[test]
    fn check_close_names_the_worst_element() {
        let want = HostTensor::from_f64([2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let got = HostTensor::from_f32([2, 2], vec![1.0, 2.1, 3.5, 4.0]);
        assert_eq!(check_close(&got, &want, Tol::F32).unwrap_err(),
            "2 of 4 elements differ beyond rtol=0.00001 atol=0.000001; worst at [1, 0] (flat 2): got 3.5, want 3 (|diff| = 5e-1, allowed 3.1e-5)");
        assert!(check_close(&got, &want, Tol::new(0.2, 0.0)).is_ok());
        let short = HostTensor::from_f64([4], vec![1.0; 4]);
        assert!(check_close(&short, &want, Tol::F64)
            .unwrap_err()
            .contains("shape mismatch"));
    }

    #[test]
    fn non_finite_values_match_only_themselves() {
        let t = Tol::new(1.0, 1.0);
        assert!(t.accepts(f64::NAN, f64::NAN));
        assert!(!t.accepts(0.0, f64::NAN));
        assert!(t.accepts(f64::INFINITY, f64::INFINITY));
        assert!(!t.accepts(f64::NEG_INFINITY, f64::INFINITY));
        assert!(!t.accepts(1e300, f64::INFINITY));
    }

    fn exp_program() -> (Program, HashMap<String, HostTensor>) {
        let b = Builder::new();
        let x = b.param("x", Type::new(DType::F64, [3]));
        b.output("loss", &x.exp().sum_all());
        let ins = inputs(&[("x", HostTensor::from_f64([3], vec![0.5, 1.0, 2.0]))]);
        (b.finish(), ins)
    }

    #[test]
    fn check_grads_accepts_a_correct_gradient() {
        let (p, ins) = exp_program();
        check_grads(&p, "loss", &["x"], &ins, Tol::FD);
    }

    /// Exact equality is too strict for finite differences, so this must fail, naming the
    /// gradient output and showing both vectors.
    #[test]
    fn check_grads_reports_a_mismatch() {
        let (p, ins) = exp_program();
        let err = std::panic::catch_unwind(|| check_grads(&p, "loss", &["x"], &ins, Tol::EXACT))
            .expect_err("an exact comparison with finite differences must fail");
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(
            msg.starts_with(
                "check_grads(loss `loss`, wrt [\"x\"]): grad_x (analytic) vs central differences:"
            ),
            "{msg}"
        );
        assert!(msg.contains("analytic: [1.648721e0"), "{msg}");
    }
}
