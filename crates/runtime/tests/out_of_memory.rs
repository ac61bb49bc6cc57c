//! A program whose one intermediate the machine cannot hold (1 TiB, or 2 TiB as the
//! reference interpreter's f64 values) fails with an error naming that value, its size and
//! the fix, on the executor and on the reference interpreter, instead of aborting; so do
//! host tensors and safetensors buffers of that size.

use ir::{DType, Type};
use runtime::{
    ExecError, ExecOptions, Executable, HostTensor, InProcess, RuntimeError, TensorError,
};
use std::collections::HashMap;

/// f32[2^38]: 1 TiB, far more than the memory and swap of any machine this runs on (the
/// runtime refuses an allocation larger than those before asking the system, so the test
/// does not depend on the kernel's overcommit setting).
const HUGE: usize = 1 << 38;

/// `%2` = a 1 TiB broadcast of `x`, summed to a scalar.
fn program() -> ir::Program {
    ir::text::parse(&format!(
        "%0 = f32[] parameter(\"x\")\n\
         %1 = f32[{HUGE}] broadcast(%0) dims=[]\n\
         %2 = f32[{HUGE}] exp(%1)\n\
         %3 = f32[] reduce(%2) op=sum dims=[0]\n\
         output \"s\" = %3\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"))
}

fn inputs() -> HashMap<String, HostTensor> {
    [("x".to_string(), HostTensor::scalar_f32(0.5))]
        .into_iter()
        .collect()
}

#[test]
fn the_executor_reports_a_value_it_cannot_hold() {
    for reference_kernels in [false, true] {
        executor_reports_a_value_it_cannot_hold(reference_kernels);
    }
}

fn executor_reports_a_value_it_cannot_hold(reference_kernels: bool) {
    let options = if reference_kernels {
        ExecOptions::reference()
    } else {
        ExecOptions::native()
    };
    let exe = Executable::with_options(&program(), options).unwrap_or_else(|e| panic!("{e}"));
    let Err(e) = exe.run(&InProcess::new(1), &[inputs()], None) else {
        panic!("a 1 TiB buffer cannot be allocated here")
    };
    let ExecError::Runtime(RuntimeError::OutOfMemory {
        bytes,
        what,
        device,
    }) = &e
    else {
        panic!("{e}")
    };
    // The native kernels hold f32; the reference kernels compute in f64.
    let per_element = if reference_kernels { 8 } else { 4 };
    assert_eq!(*bytes, HUGE * per_element);
    assert_eq!(*device, Some(0));
    assert!(
        what.starts_with("`%") && what.ends_with(&format!("(f32[{HUGE}])")),
        "{what}"
    );
    let msg = e.to_string();
    let size = if reference_kernels {
        "2.0 TiB"
    } else {
        "1.0 TiB"
    };
    assert!(
        msg.starts_with(&format!("cannot allocate {size} for `%")),
        "{msg}"
    );
    assert!(
        msg.ends_with(&format!(
            "(f32[{HUGE}]) on device 0: out of memory; use a smaller program or more devices"
        )),
        "{msg}"
    );
    // The executable stays usable: a later run fails the same way.
    assert!(exe.run(&InProcess::new(1), &[inputs()], None).is_err());
}

#[test]
fn the_reference_interpreter_reports_a_value_it_cannot_hold() {
    let e = runtime::run(&program(), &inputs()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "cannot allocate 2.0 TiB for `%1` (f32[{HUGE}]): out of memory; use a smaller program or more devices"
        )
    );
}

#[test]
fn host_tensors_and_safetensors_report_memory_that_is_not_there() {
    let ty = Type::new(DType::F32, vec![HUGE]);
    let e = HostTensor::try_zeros(ty.clone()).unwrap_err();
    assert_eq!(
        e,
        TensorError::OutOfMemory {
            ty: ty.clone(),
            bytes: HUGE * 4
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "cannot allocate 1.0 TiB for a f32[{HUGE}] tensor: out of memory; use smaller tensors"
        )
    );
    assert!(HostTensor::try_from_f64_fn(ty, |i| i as f64).is_err());
    // A header declaring a 1 TiB tensor over a buffer that has its bytes is rejected before
    // any allocation: the length check comes first. So only writing can meet the limit,
    // and small tensors round-trip.
    let t = HostTensor::try_from_f64_fn(Type::new(DType::BF16, vec![3]), |i| i as f64 - 1.0)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        t,
        HostTensor::from_f64_values(t.ty.clone(), &[-1.0, 0.0, 1.0])
    );
    let bytes = runtime::write_safetensors(&[("t".into(), &t)], None).unwrap();
    let (back, _) = runtime::read_safetensors(&bytes).unwrap();
    assert_eq!(back[0].1, t);
}
