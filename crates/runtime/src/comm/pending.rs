//! Collectives in flight: [`Communicator::start`](super::Communicator::start) hands one
//! out as a [`Pending`], [`Communicator::wait`](super::Communicator::wait) turns it into
//! its results. A backend that cannot overlap returns a finished one from `start` (the
//! trait's default); one that can runs the collective elsewhere (a communication thread)
//! and answers through a channel.

use super::CommError;
use crate::tensor::HostTensor;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

/// How long a waiting thread with nothing else to run sleeps on the channel before it looks
/// for pool jobs again.
const IDLE_WAIT: Duration = Duration::from_micros(50);

/// What a collective returns: one result per local device.
pub type Results = Result<Vec<HostTensor>, CommError>;

/// A started collective (instruction `index`, op `op`), finished or still running.
pub struct Pending {
    index: usize,
    op: String,
    state: State,
}

enum State {
    Done(Results),
    Running(Receiver<Results>),
}

/// Where the thread running a [`Pending`] collective sends its results.
pub struct Reply(Sender<Results>);

impl Reply {
    /// Hand the results to the waiting side (dropped if it gave up).
    pub fn send(self, r: Results) {
        let _ = self.0.send(r);
    }
}

impl Pending {
    /// A collective that completed when it was started.
    pub fn done(index: usize, op: &str, r: Results) -> Pending {
        Pending {
            index,
            op: op.to_string(),
            state: State::Done(r),
        }
    }

    /// A collective another thread runs: it answers through the [`Reply`].
    pub fn running(index: usize, op: &str) -> (Pending, Reply) {
        let (tx, rx) = channel();
        let p = Pending {
            index,
            op: op.to_string(),
            state: State::Running(rx),
        };
        (p, Reply(tx))
    }

    /// Wait until the results exist (an error if the running side vanished), running the
    /// rayon pool's jobs meanwhile when called on one of its threads.
    pub fn finish(self) -> Results {
        let rx = match self.state {
            State::Done(r) => return r,
            State::Running(rx) => rx,
        };
        let vanished = || CommError::Failed {
            index: self.index,
            op: self.op.clone(),
            msg: "the thread running it ended without results".into(),
        };
        loop {
            match rx.try_recv() {
                Ok(r) => return r,
                Err(TryRecvError::Disconnected) => return Err(vanished()),
                // A pool thread waiting here runs the pool's jobs meanwhile (the
                // communication thread may have handed its copies to the pool), so the
                // wait ends even on a pool of one thread. With no job to run it sleeps on
                // the channel for a moment instead of spinning: the core is what the
                // communication thread (and, under MPI, another rank on the same machine)
                // needs to finish the collective.
                Err(TryRecvError::Empty) => {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        match rx.recv_timeout(IDLE_WAIT) {
                            Ok(r) => return r,
                            Err(RecvTimeoutError::Disconnected) => return Err(vanished()),
                            Err(RecvTimeoutError::Timeout) => {}
                        }
                    }
                }
            }
        }
    }
}
