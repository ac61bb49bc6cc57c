//! The MPI communicator: one mesh position per rank; every collective is one or two
//! `MPI_Alltoallv`/`MPI_Allgatherv` calls on a sub-communicator of the replica group
//! (created once per mesh and axis set with `MPI_Comm_split`, keyed by the rank in the group
//! so that sub-communicator rank = group rank), under a watchdog. An all-to-all whose group
//! spans hosts runs [`crate::two_level`] instead when asked. Messages to ranks on other hosts
//! are counted ([`Traffic`]).

use crate::compress::{self, narrow, widen, Compress};
use crate::hosts::{assign_hosts, AllToAllAlgo, HostId, TwoLevel};
use crate::{MpiError, Options, Traffic};
use ir::{Collective, CollectiveKind, Mesh, Op};
use mpi::datatype::Partition;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _};
use mpi::Threading;
use runtime::comm::{move_block, reduce_stacked, take_block};
use runtime::{CommError, Communicator, Data, HostTensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Raw MPI state. Field order is drop order: sub-communicators are freed before the
/// universe finalizes MPI.
struct State {
    /// (mesh text, axes) -> this rank's replica group.
    groups: HashMap<(String, Vec<String>), Group>,
    world: SimpleCommunicator,
    /// What this rank sent to other hosts.
    traffic: Traffic,
    _universe: Universe,
}

/// A replica group: its sub-communicator, this rank's rank in it, and its two-level
/// schedule (which also says which members are on other hosts).
struct Group {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    plan: TwoLevel,
}

// SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE (checked in `init`), so its handles may
// be used from any thread; `State` is only reached through a `Mutex`, one call at a time.
unsafe impl Send for State {}

/// What the watchdog watches: the collective in flight and when it started.
struct Watch {
    inflight: Mutex<Option<(Instant, String)>>,
    stop: AtomicBool,
    timeout: Duration,
    rank: usize,
}

/// Clears the watch when the collective returns.
struct Guard<'a>(&'a Watch);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        *self.0.inflight.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Watch {
    fn guard(&self, what: String) -> Guard<'_> {
        *self.inflight.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), what));
        Guard(self)
    }

    fn run(self: Arc<Watch>) {
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
            let late = self
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .filter(|(t, _)| t.elapsed() > self.timeout)
                .map(|(_, what)| what.clone());
            if let Some(what) = late {
                eprintln!(
                    "error: rank {}: {what} waited more than {} s for its peers: a rank died or hangs; aborting every rank (raise --peer-timeout if a peer is legitimately slow)",
                    self.rank,
                    self.timeout.as_secs()
                );
                abort(3);
            }
        }
    }
}

/// The MPI side of [`crate::MpiComm`]: collectives run on the calling thread, one at a
/// time (the state is behind a mutex); [`crate::worker`] orders and overlaps them.
pub(crate) struct Core {
    state: Mutex<State>,
    watch: Arc<Watch>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
    size: usize,
    local_ranks: usize,
    hosts: Vec<HostId>,
    all_to_all: AllToAllAlgo,
    compress: Compress,
}

/// Every rank's processor name (`MPI_Get_processor_name`), in rank order.
fn processor_names(world: &SimpleCommunicator) -> Vec<String> {
    const W: usize = 256;
    let mut mine = [0u8; W];
    let name = mpi::environment::processor_name().unwrap_or_default();
    let b = name.as_bytes();
    let n = b.len().min(W);
    mine[..n].copy_from_slice(&b[..n]);
    let mut all = vec![0u8; W * world.size() as usize];
    world.all_gather_into(&mine[..], &mut all[..]);
    all.chunks(W)
        .map(|c| {
            let end = c.iter().position(|&x| x == 0).unwrap_or(W);
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect()
}

/// Initialise MPI (MPI_THREAD_MULTIPLE, at least SERIALIZED) and start the watchdog.
pub(crate) fn init(opts: Options) -> Result<Core, MpiError> {
    // A rank waiting in a collective yields its core instead of polling on it (unless the
    // user chose otherwise): the collectives run on a communication thread while the rank
    // computes, and a polling wait would take the core the computation needs. Measured on
    // the test bed (2 hosts x 1 rank, 1 Gbit/s): overlapped all-to-alls hid none of their
    // time while polling, all of it yielding. Read by OpenMPI at MPI_Init, before the backend
    // starts its threads.
    const YIELD: &str = "OMPI_MCA_mpi_yield_when_idle";
    if std::env::var_os(YIELD).is_none() {
        std::env::set_var(YIELD, "1");
    }
    let (universe, level) =
        mpi::initialize_with_threading(Threading::Multiple).ok_or(MpiError::Init)?;
    if level < Threading::Serialized {
        return Err(MpiError::Threading(format!("{level:?}")));
    }
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    // Ranks sharing this machine (they share its cores).
    let local_ranks = world.split_shared(rank as i32).size().max(1) as usize;
    let hosts =
        assign_hosts(&processor_names(&world), &opts.hosts).map_err(MpiError::HostLayout)?;
    let watch = Arc::new(Watch {
        inflight: Mutex::new(None),
        stop: AtomicBool::new(false),
        timeout: opts.peer_timeout,
        rank,
    });
    let w = watch.clone();
    let thread = std::thread::Builder::new()
        .name("gshard-mpi-watchdog".into())
        .spawn(move || w.run())
        .ok();
    Ok(Core {
        state: Mutex::new(State {
            groups: HashMap::new(),
            world,
            traffic: Traffic::default(),
            _universe: universe,
        }),
        watch,
        thread,
        rank,
        size,
        local_ranks,
        hosts,
        all_to_all: opts.all_to_all,
        compress: opts.compress,
    })
}

/// Whether MPI is initialised and not yet finalised in this process.
pub fn active() -> bool {
    mpi::environment::is_initialized() && !mpi::environment::is_finalized()
}

/// End every rank of the job with exit code `code` (MPI_Abort), or just this process when
/// MPI is not active.
pub fn abort(code: i32) -> ! {
    if active() {
        use mpi::traits::Communicator as _;
        SimpleCommunicator::world().abort(code)
    }
    std::process::exit(code)
}

impl Drop for Core {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `n` items as MPI counts (i32), or an error naming the limit.
fn count(n: usize, what: &str) -> Result<i32, String> {
    i32::try_from(n).map_err(|_| {
        format!("{what}: {n} bytes in one message exceed MPI's 2^31-1 count; use more devices or smaller tensors")
    })
}

/// A buffer MPI can be given even when empty. An empty `Vec`'s pointer is dangling, and
/// OpenMPI's `MPI_IN_PLACE` is `(void*)1`, which is exactly the dangling pointer of an empty
/// `Vec<u8>`: passed as is, an empty buffer would be taken for "in place".
fn real(mut v: Vec<u8>) -> Vec<u8> {
    if v.capacity() == 0 {
        v.reserve(1);
    }
    v
}

/// [`real`] for borrowed bytes: an empty slice becomes an empty slice of a static.
fn real_slice(s: &[u8]) -> &[u8] {
    static PAD: [u8; 1] = [0];
    if s.is_empty() {
        &PAD[..0]
    } else {
        s
    }
}

/// Whether blocks along `dim` of `shape` are contiguous runs of memory (every dim before it
/// has size 1), so the k blocks are the buffer's k consecutive slices.
fn outermost(shape: &[usize], dim: usize) -> bool {
    shape[..dim].iter().all(|&s| s == 1)
}

/// The k blocks along `dim` back to back: the buffer itself when they are contiguous.
fn blocks_along<'a>(x: &'a Data, shape: &[usize], dim: usize, k: usize) -> Cow<'a, [u8]> {
    if outermost(shape, dim) {
        return x.as_bytes();
    }
    let m = shape[dim] / k;
    let mut send = Vec::with_capacity(x.len() * x.dtype().size_bytes());
    for j in 0..k {
        send.extend_from_slice(&take_block(x, shape, dim, j * m, m).as_bytes());
    }
    Cow::Owned(send)
}

fn prefix(counts: &[i32]) -> Vec<i32> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            let d = at;
            at += c;
            d
        })
        .collect()
}

/// Byte counts as MPI counts (i32), or an error naming the limit.
fn counts(v: &[usize], what: &str) -> Result<Vec<i32>, String> {
    v.iter().map(|&n| count(n, what)).collect()
}

/// `MPI_Alltoallv` of bytes: `send` holds the pieces for ranks 0..k back to back
/// (`scounts`); the pieces received from ranks 0..k land back to back in `recv`
/// (`rcounts`, which must add up to its length).
fn exchange_into(
    c: &SimpleCommunicator,
    send: &[u8],
    scounts: &[usize],
    rcounts: &[usize],
    recv: &mut [u8],
) -> Result<(), String> {
    count(send.len(), "send buffer")?;
    count(recv.len(), "receive buffer")?;
    let (sc, rc) = (
        counts(scounts, "send piece")?,
        counts(rcounts, "receive piece")?,
    );
    let (sd, rd) = (prefix(&sc), prefix(&rc));
    let sp = Partition::new(real_slice(send), &sc[..], &sd[..]);
    let mut rp = PartitionMut::new(recv, &rc[..], &rd[..]);
    c.all_to_all_varcount_into(&sp, &mut rp);
    Ok(())
}

/// `MPI_Allgatherv` of bytes: every rank's `mine` (of `counts[j]` bytes) back to back in
/// `recv`.
fn gather_into(
    c: &SimpleCommunicator,
    mine: &[u8],
    piece_counts: &[usize],
    recv: &mut [u8],
) -> Result<(), String> {
    count(recv.len(), "gather buffer")?;
    let rc = counts(piece_counts, "gathered piece")?;
    let rd = prefix(&rc);
    let mut rp = PartitionMut::new(recv, &rc[..], &rd[..]);
    c.all_gather_varcount_into(real_slice(mine), &mut rp);
    Ok(())
}

/// [`exchange_into`] a new byte buffer.
fn exchange(
    c: &SimpleCommunicator,
    send: &[u8],
    scounts: &[usize],
    rcounts: &[usize],
) -> Result<Vec<u8>, String> {
    let mut recv = real(vec![0u8; rcounts.iter().sum()]);
    exchange_into(c, send, scounts, rcounts, &mut recv)?;
    Ok(recv)
}

/// [`gather_into`] a new byte buffer.
fn gather_all(
    c: &SimpleCommunicator,
    mine: &[u8],
    piece_counts: &[usize],
) -> Result<Vec<u8>, String> {
    let mut recv = real(vec![0u8; piece_counts.iter().sum()]);
    gather_into(c, mine, piece_counts, &mut recv)?;
    Ok(recv)
}

/// A receive into `n` elements of `dtype`: straight into the typed buffer (no copy), or
/// through bytes for bool. A zero-length buffer gets one padding element (see [`real`]).
fn typed(
    dtype: ir::DType,
    n: usize,
    recv: impl FnOnce(&mut [u8]) -> Result<(), String>,
) -> Result<Data, String> {
    let mut out = runtime::kernels::zeros(dtype, n.max(1));
    match out.as_bytes_mut() {
        Some(bytes) => recv(&mut bytes[..n * dtype.size_bytes()])?,
        None => {
            let mut bytes = real(vec![0u8; n * dtype.size_bytes()]);
            recv(&mut bytes)?;
            out = Data::from_bytes(dtype, &bytes).expect("whole elements");
        }
    }
    truncate(&mut out, n);
    Ok(out)
}

/// Drop the padding element of a zero-length typed buffer.
fn truncate(d: &mut Data, n: usize) {
    match d {
        Data::F32(v) => v.truncate(n),
        Data::F64(v) => v.truncate(n),
        Data::BF16(v) => v.truncate(n),
        Data::I32(v) => v.truncate(n),
        Data::Bool(v) => v.truncate(n),
    }
}

/// Split `bytes` into consecutive pieces of `lens` bytes, decoded as `dtype`.
fn pieces(bytes: &[u8], lens: &[usize], dtype: ir::DType) -> Vec<Data> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            let d = Data::from_bytes(dtype, &bytes[at..at + n]).expect("whole elements");
            at += n;
            d
        })
        .collect()
}

/// The k received all-to-all blocks (`got`, `piece` bytes each, from ranks 0..k, each of
/// shape `bs`) concatenated along `concat` into a result of shape `os`.
fn place_blocks(
    got: &[u8],
    (piece, k): (usize, usize),
    dtype: ir::DType,
    bs: &[usize],
    os: &[usize],
    concat: usize,
) -> Data {
    if outermost(bs, concat) {
        return Data::from_bytes(dtype, got).expect("whole elements");
    }
    let cl = bs[concat];
    let mut out = runtime::kernels::zeros(dtype, os.iter().product());
    for (j, p) in pieces(got, &vec![piece; k], dtype).iter().enumerate() {
        move_block(p, bs, concat, 0, cl, &mut out, os, concat, j * cl);
    }
    out
}

impl Core {
    /// This process's rank in `MPI_COMM_WORLD` (= the mesh position it runs).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of ranks on this machine (including this one).
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    /// "rank r of n on HOST (LIBRARY)", for logs.
    pub fn describe(&self) -> String {
        // MPI calls: one thread at a time (MPI_THREAD_SERIALIZED suffices).
        let _st = self.lock();
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let lib = mpi::environment::library_version()
            .unwrap_or_default()
            .trim_end_matches('\0')
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        format!("rank {} of {} on {host} ({lib})", self.rank, self.size)
    }

    /// What this rank has sent to ranks on other hosts so far.
    pub fn traffic(&self) -> Traffic {
        self.lock().traffic
    }

    /// Every rank's host, in rank order.
    pub fn hosts(&self) -> &[HostId] {
        &self.hosts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// The sub-communicator of this rank's replica group over `axes`, its rank in it and the
    /// group size (created on first use; every rank reaches the same collectives in the
    /// same order, so the collective `MPI_Comm_split` calls match up).
    fn group(
        &mut self,
        mesh: &Mesh,
        axes: &[String],
        rank: usize,
        hosts: &[HostId],
    ) -> Result<(&Group, &mut Traffic), String> {
        let key = (mesh.to_string(), axes.to_vec());
        if !self.groups.contains_key(&key) {
            let groups = mesh.groups(axes);
            let (gi, r) = groups
                .iter()
                .enumerate()
                .find_map(|(gi, g)| g.iter().position(|&p| p == rank).map(|r| (gi, r)))
                .ok_or_else(|| format!("rank {rank} is in no replica group of {mesh}"))?;
            let k = groups[gi].len();
            let c = self
                .world
                .split_by_color_with_key(Color::with_value(gi as i32), r as i32)
                .ok_or("MPI_Comm_split returned no communicator")?;
            let plan = TwoLevel::new(&groups[gi].iter().map(|&p| hosts[p]).collect::<Vec<_>>());
            self.groups.insert(
                key.clone(),
                Group {
                    comm: c,
                    rank: r,
                    size: k,
                    plan,
                },
            );
        }
        Ok((&self.groups[&key], &mut self.traffic))
    }
}

impl Communicator for Core {
    fn local_positions(&self) -> Vec<usize> {
        vec![self.rank]
    }

    fn process_index(&self) -> usize {
        self.rank
    }

    fn num_processes(&self) -> usize {
        self.size
    }

    fn collective(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        mut local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, CommError> {
        let fail = |msg: String| CommError::Failed {
            index,
            op: op.name().into(),
            msg,
        };
        if mesh.num_devices() != self.size {
            return Err(fail(format!(
                "the mesh {mesh} has {} devices but the job has {} MPI ranks; launch with `mpirun -np {}` (one device per rank)",
                mesh.num_devices(),
                self.size,
                mesh.num_devices()
            )));
        }
        if local.len() != 1 {
            return Err(fail(format!(
                "{} device buffers on one rank; the MPI backend runs one device per rank",
                local.len()
            )));
        }
        let Collective { kind, axes } = op
            .as_collective()
            .ok_or_else(|| fail("not a collective".into()))?;
        let mesh_axes: Vec<&str> = mesh.axes.iter().map(|a| a.name.as_str()).collect();
        self.compress.check_axes(&mesh_axes).map_err(fail)?;
        let x = local.remove(0);
        let ty = x.ty.clone();
        let shape = ty.shape.clone();
        let w = ty.dtype.size_bytes();
        let mut st = self.lock();
        let (g, traffic) = st.group(mesh, axes, self.rank, &self.hosts).map_err(fail)?;
        let (c, r, k) = (&g.comm, g.rank, g.size);
        // Counts the messages to other hosts of an exchange sending `sizes[j]` bytes to j.
        let note = |traffic: &mut Traffic, sizes: &[usize]| {
            for (j, &n) in sizes.iter().enumerate() {
                if n > 0 && g.plan.remote(r, j) {
                    traffic.inter_host_messages += 1;
                    traffic.inter_host_bytes += n as u64;
                }
            }
        };
        let _watch = self
            .watch
            .guard(format!("{} at instruction %{index}", op.name()));
        let out = match kind {
            CollectiveKind::AllReduce { op: red }
                if ty.dtype == ir::DType::F32
                    && self
                        .compress
                        .codec(compress::Kind::AllReduce, axes)
                        .is_some() =>
            {
                // The same reduce-scatter and all-gather with bf16 payloads.
                let n = x.data.len();
                let bounds: Vec<(usize, usize)> =
                    (0..k).map(|j| (j * n / k, (j + 1) * n / k)).collect();
                let sizes: Vec<usize> = bounds.iter().map(|(a, b)| (b - a) * 2).collect();
                let mine_len = sizes[r];
                let got = exchange(c, &narrow(&x.data.as_bytes()), &sizes, &vec![mine_len; k])
                    .map_err(fail)?;
                note(traffic, &sizes);
                let stacked = Data::from_bytes(ty.dtype, &widen(&got)).expect("whole elements");
                let mine = reduce_stacked(&stacked, k, *red);
                let all = gather_all(c, &narrow(&mine.as_bytes()), &sizes).map_err(fail)?;
                note(traffic, &vec![mine_len; k]);
                HostTensor {
                    ty: ty.clone(),
                    data: Data::from_bytes(ty.dtype, &widen(&all)).expect("whole elements"),
                }
            }
            CollectiveKind::AllReduce { op: red } => {
                let n = x.data.len();
                let bounds: Vec<(usize, usize)> =
                    (0..k).map(|j| (j * n / k, (j + 1) * n / k)).collect();
                let sizes: Vec<usize> = bounds.iter().map(|(a, b)| (b - a) * w).collect();
                let (a, b) = bounds[r];
                // Reduce-scatter: chunk j to rank j; reduce the k copies of chunk r in rank
                // order.
                let stacked = typed(ty.dtype, (b - a) * k, |recv| {
                    exchange_into(c, &x.data.as_bytes(), &sizes, &vec![(b - a) * w; k], recv)
                })
                .map_err(fail)?;
                note(traffic, &sizes);
                let mine = reduce_stacked(&stacked, k, *red);
                // All-gather of the reduced chunks.
                note(traffic, &vec![sizes[r]; k]);
                let data = typed(ty.dtype, n, |r| gather_into(c, &mine.as_bytes(), &sizes, r))
                    .map_err(fail)?;
                HostTensor {
                    ty: ty.clone(),
                    data,
                }
            }
            CollectiveKind::ReduceScatter { dim, op: red } => {
                let m = shape[*dim] / k;
                let mut os = shape.clone();
                os[*dim] = m;
                let piece = os.iter().product::<usize>() * w;
                let send = blocks_along(&x.data, &shape, *dim, k);
                let counts = vec![piece; k];
                let stacked = typed(ty.dtype, x.data.len(), |recv| {
                    exchange_into(c, &send, &counts, &counts, recv)
                })
                .map_err(fail)?;
                note(traffic, &counts);
                HostTensor {
                    ty: ty.with_shape(os),
                    data: reduce_stacked(&stacked, k, *red),
                }
            }
            CollectiveKind::AllGather { dim } => {
                let piece = x.data.len() * w;
                let mut os = shape.clone();
                os[*dim] *= k;
                note(traffic, &vec![piece; k]);
                let data = if outermost(&shape, *dim) {
                    // Blocks along the outermost non-trivial dim: the gather order is the
                    // layout.
                    typed(ty.dtype, x.data.len() * k, |r| {
                        gather_into(c, &x.data.as_bytes(), &vec![piece; k], r)
                    })
                    .map_err(fail)?
                } else {
                    let all = gather_all(c, &x.data.as_bytes(), &vec![piece; k]).map_err(fail)?;
                    let mut out = runtime::kernels::zeros(ty.dtype, os.iter().product());
                    for (j, p) in pieces(&all, &vec![piece; k], ty.dtype).iter().enumerate() {
                        move_block(
                            p,
                            &shape,
                            *dim,
                            0,
                            shape[*dim],
                            &mut out,
                            &os,
                            *dim,
                            j * shape[*dim],
                        );
                    }
                    out
                };
                HostTensor {
                    ty: ty.with_shape(os),
                    data,
                }
            }
            CollectiveKind::AllToAll {
                split_dim,
                concat_dim,
            } => {
                let m = shape[*split_dim] / k;
                let mut bs = shape.clone();
                bs[*split_dim] = m;
                let piece = bs.iter().product::<usize>() * w;
                let send = blocks_along(&x.data, &shape, *split_dim, k);
                let mut os = bs.clone();
                os[*concat_dim] *= k;
                let counts = vec![piece; k];
                let two_level = self.all_to_all == AllToAllAlgo::TwoLevel && g.plan.helps();
                let codec = (ty.dtype == ir::DType::F32)
                    .then(|| self.compress.codec(compress::Kind::AllToAll, axes))
                    .flatten();
                let out = if two_level || codec.is_some() {
                    // Raw bytes in (encoded when compressing), blocks placed afterwards.
                    let (wire, wp) = match codec {
                        Some(codec) => (
                            Cow::Owned(compress::encode(codec, &send, k)),
                            compress::wire_len(codec, piece / 4),
                        ),
                        None => (send, piece),
                    };
                    let got = if two_level {
                        crate::two_level::all_to_all(c, &g.plan, r, &wire, wp, traffic)
                    } else {
                        note(traffic, &vec![wp; k]);
                        exchange(c, &wire, &vec![wp; k], &vec![wp; k]).map_err(fail)?
                    };
                    let got = match codec {
                        Some(codec) => compress::decode(codec, &got, k, piece / 4),
                        None => got,
                    };
                    place_blocks(&got, (piece, k), ty.dtype, &bs, &os, *concat_dim)
                } else if outermost(&bs, *concat_dim) {
                    note(traffic, &counts);
                    // Blocks from ranks 0..k land back to back: the receive order is the layout.
                    typed(ty.dtype, x.data.len(), |r| {
                        exchange_into(c, &send, &counts, &counts, r)
                    })
                    .map_err(fail)?
                } else {
                    note(traffic, &counts);
                    let got = exchange(c, &send, &counts, &counts).map_err(fail)?;
                    place_blocks(&got, (piece, k), ty.dtype, &bs, &os, *concat_dim)
                };
                HostTensor {
                    ty: ty.with_shape(os),
                    data: out,
                }
            }
            CollectiveKind::Permute { pairs } => {
                // Receiver d takes the first pair naming it (the in-process rule), so a
                // source sends only along the pair that will be taken.
                let first_src = |d: usize| pairs.iter().find(|&&(_, dst)| dst == d).map(|p| p.0);
                let bytes = x.data.as_bytes();
                let mut scounts = vec![0; k];
                let mut send = Vec::new();
                for (d, sc) in scounts.iter_mut().enumerate() {
                    if first_src(d) == Some(r) {
                        *sc = bytes.len();
                        send.extend_from_slice(&bytes);
                    }
                }
                let mut rcounts = vec![0; k];
                if let Some(s) = first_src(r) {
                    rcounts[s] = bytes.len();
                }
                let got = exchange(c, &send, &scounts, &rcounts).map_err(fail)?;
                note(traffic, &scounts);
                let data = if got.is_empty() && !bytes.is_empty() {
                    runtime::kernels::zeros(ty.dtype, x.data.len())
                } else {
                    Data::from_bytes(ty.dtype, &got).expect("whole elements")
                };
                HostTensor {
                    ty: ty.clone(),
                    data,
                }
            }
        };
        Ok(vec![out])
    }

    fn all_gather_bytes(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        let fail = |msg: String| CommError::Failed {
            index: 0,
            op: "all-gather of bytes".into(),
            msg,
        };
        let st = self.lock();
        let _watch = self
            .watch
            .guard("an exchange of start-up data or outputs".into());
        let mut sizes = vec![0u64; self.size];
        st.world
            .all_gather_into(&(mine.len() as u64), &mut sizes[..]);
        let lens: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
        let all = gather_all(&st.world, &mine, &lens).map_err(fail)?;
        let mut at = 0;
        Ok(lens
            .iter()
            .map(|&n| {
                let p = all[at..at + n].to_vec();
                at += n;
                p
            })
            .collect())
    }
}
