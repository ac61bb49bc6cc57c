//! gshard's MPI backend: a [`runtime::Communicator`] over MPI (the `mpi` crate, i.e. rsmpi,
//! against the system's OpenMPI), so that `mpirun -np N gshard ... --backend mpi` runs the
//! same partitioned program as `--devices N` in one process, one mesh position per rank.
//!
//! Semantics are the in-process backend's, bit for bit: data-moving collectives are copies,
//! and reductions use the in-process arithmetic ([`runtime::comm::reduce_stacked`], the
//! stacked form of `reduce_group`) over the group members'
//! operands in rank order (f64 accumulation, one rounding), never with `MPI_Allreduce`,
//! whose summation order is the library's choice. An all-reduce is a reduce-scatter (one
//! `MPI_Alltoallv` of 1/k chunks, reduced locally in rank order) followed by an all-gather
//! of the reduced chunks: 2(k-1)/k of the buffer per rank, like a ring, and deterministic.
//!
//! Collectives run in the executor's order on one communication thread per rank
//! ([`MpiComm`]), so a started one (`Communicator::start`) is on the wire while the rank
//! computes.
//!
//! Faults: a rank that errors calls [`abort`] (MPI_Abort ends every rank); a rank that dies
//! is noticed by `mpirun`, which ends the others; a rank that hangs is caught by a watchdog
//! thread that aborts the job when a collective waits on its peers longer than
//! [`Options::peer_timeout`].
//!
//! An all-to-all whose group spans hosts may run as a two-level exchange
//! ([`AllToAllAlgo::TwoLevel`], schedule in [`hosts`]): one message per pair of hosts
//! instead of one per pair of ranks, with the same result bit for bit. Hosts are the ranks'
//! processor names, or [`HostLayout::Blocks`]. [`Traffic`] counts what crossed hosts.
//! [`Compress`] opts all-to-alls into bf16 or fp8 payloads and all-reduces into bf16, per
//! mesh axis (half or a quarter of the bytes, within the error bounds stated in
//! [`compress`]).
//!
//! Without the `mpi` cargo feature this crate builds a stand-in whose [`init`] returns an
//! error that says how to build an MPI-enabled binary, so the workspace builds and tests on
//! machines without OpenMPI.

use std::time::Duration;
use thiserror::Error;

pub mod compress;
pub mod hosts;
pub use compress::Compress;
pub use hosts::{AllToAllAlgo, HostId, HostLayout};

#[cfg(feature = "mpi")]
mod backend;
#[cfg(feature = "mpi")]
mod two_level;
#[cfg(feature = "mpi")]
mod worker;
#[cfg(feature = "mpi")]
pub use backend::{abort, active};
#[cfg(feature = "mpi")]
pub use worker::MpiComm;

/// Initialise MPI and start the backend: its watchdog and its communication thread.
#[cfg(feature = "mpi")]
pub fn init(opts: Options) -> Result<MpiComm, MpiError> {
    backend::init(opts).map(MpiComm::new)
}

#[cfg(not(feature = "mpi"))]
mod stand_in;
#[cfg(not(feature = "mpi"))]
pub use stand_in::{abort, active, init, MpiComm};

/// Whether this build links MPI.
pub const BUILT_WITH_MPI: bool = cfg!(feature = "mpi");

/// How the MPI backend behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// A collective that waits longer than this for its peers aborts the whole job (a peer
    /// hung, or died without mpirun noticing).
    pub peer_timeout: Duration,
    /// How all-to-alls whose group spans hosts move their blocks.
    pub all_to_all: AllToAllAlgo,
    /// Which ranks share a host.
    pub hosts: HostLayout,
    /// Which collectives send f32 payloads compressed ([`compress`]).
    pub compress: Compress,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            peer_timeout: Duration::from_secs(300),
            all_to_all: AllToAllAlgo::Flat,
            hosts: HostLayout::ByName,
            compress: Compress::default(),
        }
    }
}

/// Why the MPI backend could not start.
#[derive(Debug, Error)]
pub enum MpiError {
    #[error("this gshard was built without MPI support; rebuild with `cargo build --release -p cli --features mpi` (needs OpenMPI: `apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin libclang-dev`) and launch it with `mpirun -np N gshard ... --backend mpi`")]
    NotBuilt,
    #[error("MPI could not be initialised (was it initialised twice?)")]
    Init,
    #[error("{0}")]
    HostLayout(String),
    #[error("MPI provides thread level {0:?}, but gshard needs MPI_THREAD_MULTIPLE or MPI_THREAD_SERIALIZED (its watchdog may abort from a second thread)")]
    Threading(String),
}

/// Messages and payload bytes this rank sent to ranks on other hosts, over all collectives
/// since start (the messages the algorithms post; MPI's own control traffic is not counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub inter_host_messages: u64,
    pub inter_host_bytes: u64,
}
