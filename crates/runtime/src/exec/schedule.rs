//! Scheduling of a run's device tasks on the one rayon pool, where the devices share this
//! process: a device task that ends keeps its thread busy until its segment's last task
//! ends ([`DeviceTask::end`]), and the pool's other threads stay awake through the run
//! ([`keep_awake`]), instead of falling asleep at every barrier to be woken by a futex.
//! Every wait ends by itself ([`busy_until`]), so none can deadlock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

thread_local! {
    /// Device tasks in progress on this thread (one inside another when a task waiting on
    /// its kernels' parallel parts ran another device's task).
    static TASKS_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// This thread is inside [`busy_until`]: a task it runs there does not wait again.
    static BUSY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks a run ended when dropped.
pub(super) struct RunEnd(pub(super) Arc<AtomicBool>);

impl Drop for RunEnd {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A device's task within a segment: counts the segment's unfinished tasks down when it
/// ends, unwinding included.
pub(super) struct DeviceTask<'a> {
    left: &'a AtomicUsize,
}

impl Drop for DeviceTask<'_> {
    fn drop(&mut self) {
        TASKS_HERE.with(|c| c.set(c.get() - 1));
        self.left.fetch_sub(1, Ordering::Release);
    }
}

impl<'a> DeviceTask<'a> {
    pub(super) fn start(left: &'a AtomicUsize) -> DeviceTask<'a> {
        TASKS_HERE.with(|c| c.set(c.get() + 1));
        DeviceTask { left }
    }

    /// End the task; with `wait`, and no other device task in progress beneath this one on
    /// this thread, keep the thread busy until the segment's last task ends ([`busy_until`],
    /// at most [`TASK_WAIT`]): a thread that went idle in rayon instead would fall asleep
    /// after a few dozen microseconds and wake up only after a futex round trip when the
    /// segment ends.
    pub(super) fn end(self, wait: bool) {
        let left = self.left;
        drop(self);
        if wait && TASKS_HERE.with(|c| c.get()) == 0 {
            busy_until(|| left.load(Ordering::Acquire) == 0, TASK_WAIT);
        }
    }
}

/// How long a thread waits with nothing to run before [`busy_until`] gives up.
const BUSY_IDLE: std::time::Duration = std::time::Duration::from_micros(300);
/// The longest a device task that ended waits for its segment's others.
const TASK_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// The longest a pool thread stays awake for one run ([`keep_awake`]).
const RUN_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Keep this pool thread busy until `done()`: run the pool's pending work (other devices'
/// tasks, the parallel parts of their kernels) or spin. A waiting thread may sit on top of
/// unfinished work that `done` waits for (a task it took while waiting inside a kernel's
/// parallel loop), so every wait ends by itself: after [`BUSY_IDLE`] without anything to
/// run, and after `most` in all. Waits do not nest (a task run inside one does not wait
/// again on top of it: a thread handling thousands of devices would otherwise nest a
/// frame per task and overflow its stack).
fn busy_until(done: impl Fn() -> bool, most: std::time::Duration) {
    if BUSY.with(|b| b.replace(true)) {
        return;
    }
    // Clears the flag however the wait ends (a job run here may panic).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            BUSY.with(|b| b.set(false));
        }
    }
    let _clear = Clear;
    let start = std::time::Instant::now();
    let mut idle_since: Option<std::time::Instant> = None;
    while !done() {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle_since = None;
            if start.elapsed() > most {
                return;
            }
        } else if idle_since
            .get_or_insert_with(std::time::Instant::now)
            .elapsed()
            > BUSY_IDLE
            || start.elapsed() > most
        {
            return;
        } else {
            // A pause between polls (each poll reads the other threads' queues, which
            // their owners write).
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

/// A pool thread's part in a run of in-process devices ([`Executable::run_shared`](super::Executable::run_shared)): take
/// device tasks and kernel parts as they appear, through the segments and the collectives
/// between them, until the run ends (or nothing comes for [`BUSY_IDLE`], or after
/// [`RUN_WAIT`]: a long run's barriers cost it little). Taken inside a device task (a
/// concurrent run's job, found while waiting in a kernel), it returns at once.
pub(super) fn keep_awake(running: &AtomicBool) {
    if TASKS_HERE.with(|c| c.get()) == 0 {
        busy_until(|| !running.load(Ordering::Acquire), RUN_WAIT);
    }
}
