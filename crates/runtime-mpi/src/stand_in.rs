//! The stand-in built without the `mpi` feature: [`init`] explains how to get an MPI build,
//! and [`MpiComm`] has no values, so code written against the backend type-checks everywhere.

use crate::{HostId, MpiError, Options, Traffic};
use ir::{Mesh, Op};
use runtime::{CommError, Communicator, HostTensor};

/// No MPI in this build: this type has no values.
pub enum MpiComm {}

/// Always [`MpiError::NotBuilt`].
pub fn init(_opts: Options) -> Result<MpiComm, MpiError> {
    Err(MpiError::NotBuilt)
}

/// MPI is never active in this build.
pub fn active() -> bool {
    false
}

/// Exit with `code` (there are no peers to end).
pub fn abort(code: i32) -> ! {
    std::process::exit(code)
}

impl MpiComm {
    pub fn rank(&self) -> usize {
        match *self {}
    }

    pub fn size(&self) -> usize {
        match *self {}
    }

    pub fn local_ranks(&self) -> usize {
        match *self {}
    }

    pub fn describe(&self) -> String {
        match *self {}
    }

    pub fn traffic(&self) -> Traffic {
        match *self {}
    }

    pub fn hosts(&self) -> &[HostId] {
        match *self {}
    }
}

impl Communicator for MpiComm {
    fn local_positions(&self) -> Vec<usize> {
        match *self {}
    }

    fn collective(
        &self,
        _index: usize,
        _op: &Op,
        _mesh: &Mesh,
        _local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, CommError> {
        match *self {}
    }
}
