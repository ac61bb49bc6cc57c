//! [`MpiComm`]: the MPI communicator the executor talks to. Its collectives run on one
//! communication thread, in the order the executor issues them, so that
//! [`Communicator::start`] returns at once and the executor computes while the exchange is
//! on the wire (the MoE layer's chunked all-to-alls, `overlap = k`); [`Communicator::wait`]
//! takes the results.
//!
//! Order is what makes this safe: MPI requires every rank to enter the collectives of one
//! communicator in the same order, and every rank's executor issues them in plan order, so
//! one first-in-first-out thread per rank keeps them matched. A blocking
//! [`Communicator::collective`] runs on the calling thread when nothing is in flight (no
//! hop through the thread) and otherwise queues behind the collectives in flight. Results
//! are the blocking ones bit for bit: the same code runs, only on another thread.

use crate::backend::Core;
use crate::{HostId, Traffic};
use ir::{Mesh, Op};
use runtime::comm::{run_collective, Pending, Reply, Results};
use runtime::{CommError, Communicator, HostTensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, SendError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A collective handed to the communication thread.
struct Job {
    index: usize,
    op: Op,
    mesh: Mesh,
    local: Vec<HostTensor>,
    perm: Option<Vec<usize>>,
    reply: Reply,
}

impl Job {
    /// Run the collective on `core` (its operands move in; the reply stays).
    fn run(&mut self, core: &Core) -> Results {
        let local = std::mem::take(&mut self.local);
        run_collective(
            core,
            self.index,
            &self.op,
            &self.mesh,
            local,
            self.perm.as_deref(),
        )
    }

    /// Run the collective on the calling thread and answer it.
    fn answer(mut self, core: &Core) {
        let r = self.run(core);
        self.reply.send(r);
    }
}

/// A communicator over `MPI_COMM_WORLD`: this process runs mesh position `rank`.
pub struct MpiComm {
    core: Arc<Core>,
    /// Collectives queued or running on the communication thread.
    in_flight: Arc<AtomicUsize>,
    /// Dropped first: the thread ends, then the last `core` finalizes MPI on this thread.
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl MpiComm {
    pub(crate) fn new(core: Core) -> MpiComm {
        let core = Arc::new(core);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = channel::<Job>();
        let (c, n) = (core.clone(), in_flight.clone());
        let thread = std::thread::Builder::new()
            .name("gshard-mpi-comm".into())
            .spawn(move || {
                for mut job in rx {
                    let r = job.run(&c);
                    // Counted out before the answer: once the caller holds it, nothing of
                    // this job is left on the thread.
                    n.fetch_sub(1, Ordering::SeqCst);
                    job.reply.send(r);
                }
            })
            .ok();
        // Without a thread (the system refused one) every collective runs blocking.
        let jobs = thread.as_ref().map(|_| tx);
        MpiComm {
            core,
            in_flight,
            jobs,
            thread,
        }
    }

    /// This process's rank in `MPI_COMM_WORLD` (= the mesh position it runs).
    pub fn rank(&self) -> usize {
        self.core.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.core.size()
    }

    /// Number of ranks on this machine (including this one).
    pub fn local_ranks(&self) -> usize {
        self.core.local_ranks()
    }

    /// "rank r of n on HOST (LIBRARY)", for logs.
    pub fn describe(&self) -> String {
        self.core.describe()
    }

    /// What this rank has sent to ranks on other hosts so far.
    pub fn traffic(&self) -> Traffic {
        self.core.traffic()
    }

    /// Every rank's host, in rank order.
    pub fn hosts(&self) -> &[HostId] {
        self.core.hosts()
    }

    /// Queue a collective on the communication thread (run it here when there is none).
    fn queue(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: Option<&[usize]>,
    ) -> Pending {
        let (pending, reply) = Pending::running(index, op.name());
        let job = Job {
            index,
            op: op.clone(),
            mesh: mesh.clone(),
            local,
            perm: perm.map(<[usize]>::to_vec),
            reply,
        };
        match &self.jobs {
            Some(tx) => {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                if let Err(SendError(job)) = tx.send(job) {
                    // The thread is gone (it panicked): run here, nothing is queued.
                    self.in_flight.fetch_sub(1, Ordering::SeqCst);
                    job.answer(&self.core);
                }
            }
            None => job.answer(&self.core),
        }
        pending
    }

    /// Whether nothing is queued or running on the communication thread.
    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Communicator for MpiComm {
    fn local_positions(&self) -> Vec<usize> {
        self.core.local_positions()
    }

    fn process_index(&self) -> usize {
        self.core.process_index()
    }

    fn num_processes(&self) -> usize {
        self.core.num_processes()
    }

    fn collective(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, CommError> {
        if self.idle() {
            return self.core.collective(index, op, mesh, local);
        }
        self.queue(index, op, mesh, local, None).finish()
    }

    fn collective_transposed(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: &[usize],
    ) -> Result<Vec<HostTensor>, CommError> {
        if self.idle() {
            return self
                .core
                .collective_transposed(index, op, mesh, local, perm);
        }
        self.queue(index, op, mesh, local, Some(perm)).finish()
    }

    fn start(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: Option<&[usize]>,
    ) -> Pending {
        self.queue(index, op, mesh, local, perm)
    }

    fn all_gather_bytes(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        if !self.idle() {
            return Err(CommError::Failed {
                index: 0,
                op: "all-gather of bytes".into(),
                msg: "called while collectives are in flight; wait for them first".into(),
            });
        }
        self.core.all_gather_bytes(mine)
    }
}
