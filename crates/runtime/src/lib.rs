//! gshard runtime: host tensors, safetensors (de)serialisation, the counter-based RNG and
//! the reference interpreter.
//!
//! - [`HostTensor`]: a typed, row-major tensor in host memory (f32, f64, bf16, i32, bool).
//! - [`io`]: safetensors bytes <-> named host tensors (no file IO; the `cli` crate owns files).
//! - [`rng`]: Philox-4x32-10 and the mapping from `(seed, stream, global index)` to a sample;
//!   pure functions shared by every executor so that sharded == unsharded.
//! - [`reference`](mod@reference): the naive, obviously-correct interpreter, single-device ([`reference::run`])
//!   and bulk-synchronous over a mesh ([`reference::run_spmd`]). It is the oracle every faster
//!   executor and every partitioned program is tested against.
//!
//! - [`exec`]: the bulk-synchronous device executor over a [`Communicator`] ([`comm`]): all
//!   mesh positions in one process ([`InProcess`]), or one per MPI rank. A program is
//!   lowered to a [`Plan`] and rewritten by named passes, each exact; native typed kernels
//!   ([`kernels`]: fused elementwise, GEMM-backed dot-general, ...), liveness-based buffer
//!   reuse, and an optional [`Profiler`] writing Chrome traces ([`profile`]).
//!
//! - [`alloc`]: [`LineAligned`], the global allocator binaries that run the executor install
//!   (tensor buffers on cache-line boundaries for the AVX-512 kernels), and fallible
//!   allocation: a tensor buffer the machine cannot hold is an error naming it
//!   ([`RuntimeError::OutOfMemory`], [`TensorError::OutOfMemory`], [`IoError::OutOfMemory`]),
//!   not an abort.
//! - [`probe`]: the calling core's FMA rate, which benchmarks report next to their times (a
//!   shared host's slow spells show there).
//!
//! The runtime never reads a `Sharding`: communication is explicit collective ops.

pub mod alloc;
pub mod comm;
pub mod error;
pub mod exec;
pub mod io;
pub mod kernels;
pub mod probe;
pub mod profile;
pub mod reference;
pub mod rng;
pub mod tensor;

pub use alloc::LineAligned;
pub use comm::{CommError, Communicator, InProcess};
pub use error::RuntimeError;
pub use exec::{
    run_devices, run_devices_profiled, CollectiveStat, ExecError, ExecOptions, Executable, Held,
    LiveBuffer, MemoryOptions, MemoryPlan, Passes, Plan, PlanError, RunResult,
};
pub use io::{read_safetensors, write_safetensors, IoError};
pub use profile::{merge_chrome_traces, Profiler, TraceEvent};
pub use reference::{run, run_spmd};
pub use tensor::{convert_value, f64_to_bf16, BlockDim, Data, HostTensor, TensorError};
