//! The `--backend` flags, defined once: where the devices of a partitioned program run.
//! `inprocess` (default) runs every mesh position as a task in this process; `mpi` runs one
//! position per MPI rank (launch with `mpirun -np N gshard ... --backend mpi`).
//!
//! [`with_backend`] owns the MPI lifetime: it initialises MPI, runs the command, and on an
//! error prints it with the rank and ends every rank (MPI_Abort) instead of returning, since
//! a rank that just exited would leave its peers waiting in a collective.

use anyhow::Result;
use runtime::Communicator;
use std::sync::Arc;
use std::time::Duration;

/// Transports for the devices of a partitioned program.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Every device in this process (threads on one rayon pool).
    #[default]
    Inprocess,
    /// One device per MPI rank: `mpirun -np N gshard ... --backend mpi`.
    Mpi,
}

/// How an all-to-all whose replica group spans hosts moves its blocks (MPI backend).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllToAllArg {
    /// Every rank sends one message to every other rank.
    #[default]
    Flat,
    /// Within each host first (shared memory), then one message per pair of hosts, then
    /// within each host again: fewer, larger messages between hosts, the same result.
    TwoLevel,
}

#[derive(clap::Args, Clone, Debug, Default)]
pub struct BackendArgs {
    /// Where the devices run: `inprocess`, or `mpi` (one device per rank, under mpirun).
    #[arg(long, value_enum, default_value_t = Backend::Inprocess)]
    pub backend: Backend,
    /// MPI backend: abort every rank when a collective waits longer than this many seconds
    /// for its peers (a rank hung or died).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub peer_timeout: u64,
    /// MPI backend: how all-to-alls whose group spans hosts move their blocks.
    #[arg(long, value_enum, default_value_t = AllToAllArg::Flat)]
    pub all_to_all: AllToAllArg,
    /// MPI backend: treat the ranks as this many hosts of consecutive ranks (default: ranks
    /// with the same machine name share a host).
    #[arg(long, value_name = "N")]
    pub hosts: Option<usize>,
    /// MPI backend: send the f32 payloads of these collectives compressed, comma-separated
    /// `KIND[:CODEC][@AXIS]`: `all-to-all` (bf16, each element within 2^-8 relative),
    /// `all-to-all:fp8` (e4m3 with a scale per 128 elements, a quarter of the bytes, within
    /// 2^-4 relative plus 2^-18.8 of the block's largest), `all-reduce` (bf16 gradient sums,
    /// within 2^-7 of the sum of magnitudes); `@AXIS` limits it to collectives over that
    /// mesh axis.
    #[arg(long, value_delimiter = ',', value_name = "KIND[:CODEC][@AXIS]")]
    pub compress: Vec<String>,
}

impl BackendArgs {
    /// The all-to-all algorithm as the CLI spells it.
    pub fn all_to_all_name(&self) -> &'static str {
        match self.all_to_all {
            AllToAllArg::Flat => "flat",
            AllToAllArg::TwoLevel => "two-level",
        }
    }

    /// The compression rules, parsed (a one-line error naming the bad item).
    pub fn compression(&self) -> Result<runtime_mpi::Compress> {
        runtime_mpi::Compress::parse(&self.compress).map_err(anyhow::Error::msg)
    }

    /// The compression rules as the CLI spells them.
    pub fn compress_names(&self) -> Vec<String> {
        self.compression()
            .map(|c| c.rules.iter().map(|r| r.to_string()).collect())
            .unwrap_or_default()
    }
}

/// What a command gets from [`with_backend`]: the MPI communicator, or `None` for the
/// in-process backend.
pub type Mpi = Option<Arc<runtime_mpi::MpiComm>>;

/// Run `f` on the chosen backend. With MPI, an error is printed (with the rank) and ends the
/// whole job with exit code 2 through MPI_Abort.
pub fn with_backend(args: &BackendArgs, f: impl FnOnce(Mpi) -> Result<()>) -> Result<()> {
    match args.backend {
        Backend::Inprocess => {
            if args.all_to_all != AllToAllArg::Flat
                || args.hosts.is_some()
                || !args.compress.is_empty()
            {
                anyhow::bail!("--all-to-all, --hosts and --compress apply to the MPI backend; add `--backend mpi` and launch under mpirun, or drop them");
            }
            f(None)
        }
        Backend::Mpi => {
            let comm = Arc::new(runtime_mpi::init(runtime_mpi::Options {
                peer_timeout: Duration::from_secs(args.peer_timeout.max(1)),
                all_to_all: match args.all_to_all {
                    AllToAllArg::Flat => runtime_mpi::AllToAllAlgo::Flat,
                    AllToAllArg::TwoLevel => runtime_mpi::AllToAllAlgo::TwoLevel,
                },
                hosts: args.hosts.map_or(
                    runtime_mpi::HostLayout::ByName,
                    runtime_mpi::HostLayout::Blocks,
                ),
                compress: args.compression()?,
            })?);
            let (rank, size) = (comm.rank(), comm.size());
            // Ranks on one machine share its cores: give each rank's kernels its share
            // (more threads than cores slow every rank), unless RAYON_NUM_THREADS says
            // otherwise.
            if std::env::var_os("RAYON_NUM_THREADS").is_none() {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let threads = (cores / comm.local_ranks()).max(1);
                // Fails only if the pool already started; then it keeps its size.
                let _ = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build_global();
            }
            match f(Some(comm.clone())) {
                Ok(()) => {
                    drop(comm);
                    Ok(())
                }
                Err(e) if size > 1 => {
                    let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
                    eprintln!(
                        "error: rank {rank} of {size}: {}",
                        msg.join(": ").replace('\n', " ")
                    );
                    runtime_mpi::abort(2)
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// The communicator as the executor's trait object.
pub fn as_comm(mpi: &Mpi) -> Option<Arc<dyn Communicator>> {
    mpi.as_ref().map(|c| c.clone() as Arc<dyn Communicator>)
}

/// Whether this process prints and writes files (the only process, or MPI rank 0).
pub fn is_root(mpi: &Mpi) -> bool {
    mpi.as_ref().is_none_or(|c| c.process_index() == 0)
}

/// A fingerprint (SHA-256) of a partitioned program's text, mesh included, that every rank
/// must share.
pub fn fingerprint(p: &ir::Program) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(p.to_string().as_bytes()).to_vec()
}
