//! [`RuntimeError`]: why a program could not be run, shared by the reference interpreter
//! and the executor.

use crate::alloc::{human_bytes, AllocError};
use crate::tensor::TensorError;
use ir::{Type, VerifyError};
use thiserror::Error;

/// Why a program could not be run. Messages name the parameter, instruction or device and
/// say what would fix it.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    #[error("parameter `{name}` ({expected}) is missing from the inputs{}; pass a {expected} tensor under that name", on_device(.device))]
    MissingInput {
        name: String,
        expected: Type,
        device: Option<usize>,
    },
    #[error("parameter `{name}` expects {expected} but the input{} is {got}; convert or reshape the input", on_device(.device))]
    InputTypeMismatch {
        name: String,
        expected: Type,
        got: Type,
        device: Option<usize>,
    },
    #[error("input `{name}`{} is malformed: {source}", on_device(.device))]
    MalformedInput {
        name: String,
        device: Option<usize>,
        source: TensorError,
    },
    #[error("the program's mesh has {expected} devices but {got} input maps were given; pass one map per mesh position")]
    DeviceCount { expected: usize, got: usize },
    #[error("instruction %{index} ({op}) is a collective but the program declares no mesh")]
    NoMesh { index: usize, op: String },
    #[error("instruction %{index} ({op}) communicates over mesh axes [{axes}] ({size} devices) but `run` executes one device; use `run_spmd`")]
    CollectiveOnOneDevice {
        index: usize,
        op: String,
        axes: String,
        size: usize,
    },
    #[error("the program does not verify: {0}")]
    Verify(#[from] VerifyError),
    #[error("cannot allocate {} for {what}{}: out of memory; use a smaller program or more devices", human_bytes(*.bytes), on(.device))]
    OutOfMemory {
        bytes: usize,
        /// The value, e.g. "`%3` (f32[1024,1024])".
        what: String,
        device: Option<usize>,
    },
}

fn on_device(d: &Option<usize>) -> String {
    d.map_or(String::new(), |d| format!(" of device {d}"))
}

fn on(d: &Option<usize>) -> String {
    d.map_or(String::new(), |d| format!(" on device {d}"))
}

impl RuntimeError {
    /// [`RuntimeError::OutOfMemory`] for value `%index` of type `ty`.
    pub fn out_of_memory(e: AllocError, index: usize, ty: &Type, device: Option<usize>) -> Self {
        RuntimeError::OutOfMemory {
            bytes: e.bytes,
            what: format!("`%{index}` ({ty})"),
            device,
        }
    }
}
