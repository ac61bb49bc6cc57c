//! The collective seam: a [`Communicator`] carries out one collective op for the devices
//! this process runs. Two implementations: [`InProcess`] (all mesh positions in one address
//! space; each collective is a bulk copy/reduction between instructions) and, behind the
//! `mpi` feature of `runtime-mpi`, one mesh position per MPI rank.
//!
//! The executor calls collectives only between instructions, never from inside a worker task,
//! so no thread ever blocks waiting for a peer: with N devices on fewer threads the in-process
//! backend cannot deadlock (devices as tasks that met at a barrier deadlocked as soon as they
//! outnumbered the pool's threads).
//!
//! [`InProcess`] works natively on typed buffers with the reference's semantics
//! (`reference/collective.rs`): reductions run in rank order, floats accumulate in f64 and
//! round once (so results are bit-identical to the reference), i32 sums wrap, max/min
//! propagate NaN; gathers and all-to-alls are strided block copies, one task per receiving
//! device on the rayon pool (an all-to-all asked for its results transposed, through
//! [`Communicator::collective_transposed`], places its blocks in that layout: no second
//! pass). Because it shares memory ([`Communicator::shared_memory`]), the executor may
//! instead have each sender place its own all-to-all blocks ([`place_all_to_all`]) at the
//! end of its device task. [`wire_bytes`] is the byte count each device sends.

use crate::kernels::layout::copy_strided;
use crate::kernels::reduce::{fmax, fmin};
use crate::kernels::{strides, zeros};
use crate::tensor::{f64_to_bf16, Data, HostTensor};
use crate::with_data2;
use ir::{Collective, CollectiveKind, Mesh, Op, ReduceOp, Type};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};
use thiserror::Error;

mod pending;
pub use pending::{Pending, Reply, Results};

/// A failed collective: which one, and why.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CommError {
    #[error("collective {op} at instruction %{index}: {msg}")]
    Failed {
        index: usize,
        op: String,
        msg: String,
    },
    #[error("collective {op} at instruction %{index}: no answer from peers within {seconds} s; a rank may have died")]
    Timeout {
        index: usize,
        op: String,
        seconds: u64,
    },
}

/// Carries out collectives for the mesh positions this process executes.
pub trait Communicator: Send + Sync {
    /// The mesh positions run here, in the order of the `local` vectors passed below.
    fn local_positions(&self) -> Vec<usize>;

    /// Perform collective `op` (instruction `index`) on `mesh`: `local[j]` is the operand of
    /// `local_positions()[j]`; returns the results in the same order.
    fn collective(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, CommError>;

    /// [`Communicator::collective`] with each result transposed by `perm` (the executor
    /// asks this for an all-to-all whose only reader is a transpose). The default
    /// transposes the results; a backend may write them in that layout directly.
    fn collective_transposed(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: &[usize],
    ) -> Result<Vec<HostTensor>, CommError> {
        Ok(all_transposed(
            self.collective(index, op, mesh, local)?,
            perm,
        ))
    }

    /// Start collective `op` (as [`Communicator::collective`], its results transposed by
    /// `perm` when given, as [`Communicator::collective_transposed`]) and return without
    /// waiting for it where the backend can: the executor runs independent compute until
    /// [`Communicator::wait`]. Every process starts its collectives in one order (the
    /// plan's, a function of the program), and waits for them in one order too. The
    /// default completes the collective here, so every backend works unchanged.
    fn start(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: Option<&[usize]>,
    ) -> Pending {
        start_blocking(self, index, op, mesh, local, perm)
    }

    /// The results of a collective [`Communicator::start`] returned.
    fn wait(&self, pending: Pending) -> Results {
        pending.finish()
    }

    /// Whether every mesh position's buffers live in this process, so that an all-to-all's
    /// senders may place their blocks into the receivers' results themselves, inside their
    /// device tasks ([`place_all_to_all`]), instead of in a pass between segments.
    fn shared_memory(&self) -> bool {
        false
    }

    /// This process's index among the processes that run the mesh (0 when there is one).
    fn process_index(&self) -> usize {
        0
    }

    /// How many processes run the mesh.
    fn num_processes(&self) -> usize {
        1
    }

    /// Every process's `mine`, in process order, on every process (outside any program:
    /// gathering outputs, agreeing on a program, sharing a tokenizer).
    fn all_gather_bytes(&self, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        Ok(vec![mine])
    }
}

/// `t` transposed by `perm` (result dim `i` is `t`'s dim `perm[i]`).
fn transposed(t: &HostTensor, perm: &[usize]) -> HostTensor {
    let shape: Vec<usize> = perm.iter().map(|&d| t.ty.shape[d]).collect();
    let mut data = zeros(t.ty.dtype, t.data.len());
    crate::kernels::layout::transpose(&t.data, &t.ty.shape, perm, &mut data);
    HostTensor {
        ty: t.ty.with_shape(shape),
        data,
    }
}

/// Every result of a collective transposed by `perm`.
fn all_transposed(out: Vec<HostTensor>, perm: &[usize]) -> Vec<HostTensor> {
    out.iter().map(|t| transposed(t, perm)).collect()
}

/// Block `[start, start+len)` along `dim` of `x` (shape `shape`) as its own buffer.
pub fn take_block(x: &Data, shape: &[usize], dim: usize, start: usize, len: usize) -> Data {
    let mut bs = shape.to_vec();
    bs[dim] = len;
    let mut out = zeros(x.dtype(), bs.iter().product());
    move_block(x, shape, dim, start, len, &mut out, &bs, dim, 0);
    out
}

/// Fails unless every process passes the same `fingerprint` of `what` (e.g. the partitioned
/// program and its mesh): ranks launched with different programs or flags would otherwise
/// exchange mismatched buffers.
pub fn check_consistent(
    comm: &dyn Communicator,
    what: &str,
    fingerprint: &[u8],
) -> Result<(), CommError> {
    let all = comm.all_gather_bytes(fingerprint.to_vec())?;
    let odd: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, f)| f.as_slice() != all[0].as_slice())
        .map(|(i, _)| i.to_string())
        .collect();
    if odd.is_empty() {
        return Ok(());
    }
    Err(CommError::Failed {
        index: 0,
        op: "start-up check".into(),
        msg: format!(
            "rank(s) {} have a different {what} than rank 0; launch every rank with the same program, inputs and flags",
            odd.join(", ")
        ),
    })
}

/// Every mesh position's named tensors (`n` positions, in order), on every process:
/// `local[j]` belongs to `comm.local_positions()[j]`. With one process that is `local`
/// itself, borrowed (no copy on the decoding and checkpoint paths).
#[allow(clippy::type_complexity)]
pub fn gather_positions<'a>(
    comm: &dyn Communicator,
    local: &'a [std::collections::HashMap<String, HostTensor>],
    n: usize,
) -> Result<std::borrow::Cow<'a, [std::collections::HashMap<String, HostTensor>]>, CommError> {
    let positions = comm.local_positions();
    let fail = |msg: String| CommError::Failed {
        index: 0,
        op: "gather of outputs".into(),
        msg,
    };
    if comm.num_processes() == 1 {
        return Ok(std::borrow::Cow::Borrowed(local));
    }
    let mut named: Vec<(String, &HostTensor)> = Vec::new();
    for (pos, m) in positions.iter().zip(local) {
        for (name, t) in m {
            named.push((format!("{pos}:{name}"), t));
        }
    }
    let bytes = crate::io::write_safetensors(&named, None).map_err(|e| fail(e.to_string()))?;
    let mut out: Vec<std::collections::HashMap<String, HostTensor>> = vec![Default::default(); n];
    for part in comm.all_gather_bytes(bytes)? {
        let (tensors, _) = crate::io::read_safetensors(&part).map_err(|e| fail(e.to_string()))?;
        for (key, t) in tensors {
            let (pos, name) = key
                .split_once(':')
                .and_then(|(p, n)| Some((p.parse::<usize>().ok()?, n)))
                .ok_or_else(|| fail(format!("malformed tensor name `{key}`")))?;
            out.get_mut(pos)
                .ok_or_else(|| fail(format!("position {pos} is outside the mesh of {n}")))?
                .insert(name.to_string(), t);
        }
    }
    Ok(std::borrow::Cow::Owned(out))
}

/// Every mesh position in one process: collectives are copies between device buffers.
///
/// Operand buffers handed to a collective are kept (at most two per device) and reused for
/// the results of later collectives that overwrite every element (all-gather,
/// reduce-scatter, all-to-all): the MoE layer's four all-to-alls have one size, and fresh
/// buffers cost a page fault per 4 KiB (~90 MiB of them per step on 8 devices). An
/// all-reduce writes each member's result over that member's own operand.
///
/// With [`InProcess::with_comm_thread`], [`Communicator::start`] runs each collective on a
/// thread of its own (the copies of an all-to-all then overlap the devices' compute until
/// [`Communicator::wait`]); otherwise it completes the collective at once.
pub struct InProcess {
    n: usize,
    spare: Arc<Mutex<Vec<Data>>>,
    comm_thread: bool,
}

impl InProcess {
    pub fn new(num_devices: usize) -> InProcess {
        InProcess {
            n: num_devices,
            spare: Default::default(),
            comm_thread: false,
        }
    }

    /// With `on`, started collectives run on a communication thread (see the type's doc).
    pub fn with_comm_thread(self, on: bool) -> InProcess {
        InProcess {
            comm_thread: on,
            ..self
        }
    }

    /// A buffer of `n` elements whose contents the caller overwrites entirely.
    fn overwritten(&self, dtype: ir::DType, n: usize) -> Data {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        match spare
            .iter()
            .position(|d| d.dtype() == dtype && d.len() == n)
        {
            Some(i) => spare.swap_remove(i),
            None => zeros(dtype, n),
        }
    }

    /// Keep the operands of a finished collective for reuse (large ones, a bounded number).
    fn keep(&self, local: Vec<HostTensor>) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        for t in local {
            if t.data.len() >= 1 << 14 {
                spare.push(t.data);
            }
        }
        let cap = 2 * self.n;
        if spare.len() > cap {
            let extra = spare.len() - cap;
            spare.drain(..extra);
        }
    }
}

/// Bytes one device sends for collective `op` on `operand` with `k` group members
/// ([`Op::wire_bytes`], the formula `gshard inspect` reports too).
pub fn wire_bytes(op: &Op, operand: &Type, k: usize) -> usize {
    op.wire_bytes(operand.size_bytes(), k)
}

/// Elementwise reduction over the group's buffers in rank order (floats in f64, rounded
/// once; i32 wrapping). Every backend reduces with this function, in this order, so results
/// are bitwise the same whichever transport carried the operands.
pub fn reduce_group(xs: &[&Data], op: ReduceOp) -> Data {
    macro_rules! slices {
        ($var:ident) => {
            xs.iter()
                .map(|d| match d {
                    Data::$var(v) => v.as_slice(),
                    _ => unreachable!("one dtype per collective"),
                })
                .collect::<Vec<_>>()
        };
    }
    match xs[0] {
        Data::F32(_) => Data::F32(reduce_float(&slices!(F32), op, |v| v as f64, |a| a as f32)),
        Data::F64(_) => Data::F64(reduce_float(&slices!(F64), op, |v| v, |a| a)),
        Data::BF16(_) => Data::BF16(reduce_float(
            &slices!(BF16),
            op,
            |v| v.to_f64(),
            f64_to_bf16,
        )),
        Data::I32(_) => Data::I32(reduce_i32(&slices!(I32), op)),
        Data::Bool(_) => panic!("reducing collectives reject bool (verify)"),
    }
}

/// [`reduce_group`] over the `k` equal consecutive parts of `stacked` (the layout a
/// transport receives them in), in part order, without copying the parts out.
pub fn reduce_stacked(stacked: &Data, k: usize, op: ReduceOp) -> Data {
    let len = stacked.len() / k.max(1);
    macro_rules! parts {
        ($v:expr) => {
            (0..k)
                .map(|j| &$v[j * len..(j + 1) * len])
                .collect::<Vec<_>>()
        };
    }
    match stacked {
        Data::F32(v) => Data::F32(reduce_float(&parts!(v), op, |v| v as f64, |a| a as f32)),
        Data::F64(v) => Data::F64(reduce_float(&parts!(v), op, |v| v, |a| a)),
        Data::BF16(v) => Data::BF16(reduce_float(&parts!(v), op, |v| v.to_f64(), f64_to_bf16)),
        Data::I32(v) => Data::I32(reduce_i32(&parts!(v), op)),
        Data::Bool(_) => panic!("reducing collectives reject bool (verify)"),
    }
}

/// i32 reduction in operand order (sums wrap).
fn reduce_i32(xs: &[&[i32]], op: ReduceOp) -> Vec<i32> {
    let mut acc = vec![
        match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => i32::MIN,
            ReduceOp::Min => i32::MAX,
        };
        xs[0].len()
    ];
    for x in xs {
        for (a, &v) in acc.iter_mut().zip(x.iter()) {
            *a = match op {
                ReduceOp::Sum => a.wrapping_add(v),
                ReduceOp::Max => (*a).max(v),
                ReduceOp::Min => (*a).min(v),
            };
        }
    }
    acc
}

/// Elements per task: large enough to amortise scheduling, small enough to split a
/// megabyte buffer over the cores.
const CHUNK: usize = 1 << 14;

/// acc[i] = op(acc[i], x[i]) over every operand in order, chunk by chunk in parallel
/// (each element still sees the operands in rank order, so results do not depend on
/// the chunking).
fn reduce_float<T: Copy + Send + Sync>(
    xs: &[&[T]],
    op: ReduceOp,
    widen: impl Fn(T) -> f64 + Sync,
    narrow: impl Fn(f64) -> T + Sync,
) -> Vec<T> {
    let n = xs[0].len();
    let mut out: Vec<T> = Vec::with_capacity(n);
    let work = |(c, dst): (usize, &mut [std::mem::MaybeUninit<T>])| {
        let lo = c * CHUNK;
        let mut acc = vec![op.identity(); dst.len()];
        for x in xs {
            let x = &x[lo..lo + dst.len()];
            match op {
                ReduceOp::Sum => {
                    for (a, &v) in acc.iter_mut().zip(x) {
                        *a += widen(v);
                    }
                }
                ReduceOp::Max => {
                    for (a, &v) in acc.iter_mut().zip(x) {
                        *a = fmax(*a, widen(v));
                    }
                }
                ReduceOp::Min => {
                    for (a, &v) in acc.iter_mut().zip(x) {
                        *a = fmin(*a, widen(v));
                    }
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(acc) {
            d.write(narrow(a));
        }
    };
    // One chunk is reduced on this thread (no parallel task for a scalar).
    if n <= CHUNK {
        work((0, &mut out.spare_capacity_mut()[..n]));
    } else {
        out.spare_capacity_mut()[..n]
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(work);
    }
    // SAFETY: the chunks above cover all `n` spare elements and each was written once.
    unsafe { out.set_len(n) };
    out
}

/// Operands of fewer elements than this are moved in and out of a collective on the
/// calling thread (no parallel tasks), and share the executor's round of the next
/// collective.
pub(crate) const SMALL_COLLECTIVE: usize = 4096;

/// The reduction a collective applies (all-reduce and reduce-scatter).
fn reduction_of(kind: &CollectiveKind) -> Option<ReduceOp> {
    match kind {
        CollectiveKind::AllReduce { op } | CollectiveKind::ReduceScatter { op, .. } => Some(*op),
        CollectiveKind::AllGather { .. }
        | CollectiveKind::AllToAll { .. }
        | CollectiveKind::Permute { .. } => None,
    }
}

/// Copy block `[start, start+len)` along `dim` of `x` (shape `shape`) into `out` at
/// `[at, at+len)` along `dim` (shape `out_shape`).
#[allow(clippy::too_many_arguments)]
pub fn move_block(
    x: &Data,
    shape: &[usize],
    dim: usize,
    start: usize,
    len: usize,
    out: &mut Data,
    out_shape: &[usize],
    out_dim: usize,
    at: usize,
) {
    let (ist, ost) = (strides(shape), strides(out_shape));
    let mut block = shape.to_vec();
    block[dim] = len;
    let soff = start * ist[dim];
    let doff = at * ost[out_dim];
    with_data2!(x, out, a, b => copy_strided(a, soff, &ist, b, doff, &ost, &block));
}

/// Where the blocks of an all-to-all over groups of `k` go: the operand's block `r` along
/// `split` (`block` its shape, `ist` the operand's strides) lands in the result of member
/// `r`, at the sender's index along `concat`, stored with strides `ost` (row-major, or
/// row-major in the transposed layout `perm` asks for: `stored` is the stored shape).
struct A2aLayout {
    block: Vec<usize>,
    ist: Vec<usize>,
    ost: Vec<usize>,
    stored: Vec<usize>,
    split: usize,
    concat: usize,
}

impl A2aLayout {
    fn new(
        shape: &[usize],
        split: usize,
        concat: usize,
        k: usize,
        perm: Option<&[usize]>,
    ) -> A2aLayout {
        let m = shape[split] / k;
        let mut os = shape.to_vec();
        os[split] = m;
        os[concat] *= k;
        let mut block = shape.to_vec();
        block[split] = m;
        let (ost, stored) = match perm {
            Some(perm) => {
                let ps: Vec<usize> = perm.iter().map(|&d| os[d]).collect();
                let pst = strides(&ps);
                let mut ost = vec![0; os.len()];
                for (i, &d) in perm.iter().enumerate() {
                    ost[d] = pst[i];
                }
                (ost, ps)
            }
            None => (strides(&os), os),
        };
        A2aLayout {
            block,
            ist: strides(shape),
            ost,
            stored,
            split,
            concat,
        }
    }

    /// Offsets of block `r` in the operand and of sender `j`'s block in a result.
    fn offsets(&self, r: usize, j: usize) -> (usize, usize) {
        (
            r * self.block[self.split] * self.ist[self.split],
            j * self.block[self.concat] * self.ost[self.concat],
        )
    }
}

/// Element pointers to the results of an all-to-all, indexed by mesh position, that the
/// senders fill in place ([`place_all_to_all`]): each sender writes its own blocks, which
/// no other sender writes, so the device tasks may place theirs concurrently.
pub struct Sinks {
    ptrs: Vec<usize>,
    lens: Vec<usize>,
    /// The results' dtype (`None` with no buffers).
    dtype: Option<ir::DType>,
}

impl Sinks {
    /// Sinks for `bufs[i]`, the result buffer of mesh position `positions[i]`, on a mesh
    /// of `n` positions. The buffers must stay in place (not moved out of their `Vec`s,
    /// not read) until every sender has placed its blocks.
    pub fn new(n: usize, positions: &[usize], bufs: &mut [Data]) -> Sinks {
        let (mut ptrs, mut lens) = (vec![0; n], vec![0; n]);
        let dtype = bufs.first().map(Data::dtype);
        for (&p, b) in positions.iter().zip(bufs) {
            lens[p] = b.len();
            ptrs[p] = match b {
                Data::F32(v) => v.as_mut_ptr() as usize,
                Data::F64(v) => v.as_mut_ptr() as usize,
                Data::BF16(v) => v.as_mut_ptr() as usize,
                Data::I32(v) => v.as_mut_ptr() as usize,
                Data::Bool(v) => v.as_mut_ptr() as usize,
            };
        }
        Sinks { ptrs, lens, dtype }
    }
}

/// Place sender `pos`'s blocks of all-to-all `op` (operand `x` of shape `shape`) into every
/// receiver's result in `sinks` (stored transposed by `perm` when given): what
/// [`InProcess`] does for all senders at once, done by each sender as soon as its operand
/// exists. Errors name a mismatch (an operand of another dtype than the results, a
/// receiver without a buffer of the result's size).
///
/// # Safety
/// Every non-empty sink addresses a live buffer (the one [`Sinks::new`] was given) that
/// nothing reads or writes meanwhile except other senders placing their own blocks.
pub unsafe fn place_all_to_all(
    op: &Op,
    mesh: &Mesh,
    shape: &[usize],
    perm: Option<&[usize]>,
    pos: usize,
    x: &Data,
    sinks: &Sinks,
) -> Result<(), String> {
    let Some(Collective {
        kind: CollectiveKind::AllToAll {
            split_dim,
            concat_dim,
        },
        axes,
    }) = op.as_collective()
    else {
        return Err(format!("{} is not an all-to-all", op.name()));
    };
    let group = mesh
        .groups(axes)
        .into_iter()
        .find(|g| g.contains(&pos))
        .ok_or_else(|| format!("device {pos} is in no replica group"))?;
    if sinks.dtype != Some(x.dtype()) {
        return Err(format!(
            "an operand of {:?} for results of {:?}",
            x.dtype(),
            sinks.dtype
        ));
    }
    let j = group.iter().position(|&d| d == pos).expect("found above");
    let l = A2aLayout::new(shape, *split_dim, *concat_dim, group.len(), perm);
    let total = l.block.iter().product::<usize>() * group.len();
    for (r, &dst) in group.iter().enumerate() {
        if sinks.ptrs.get(dst).is_none_or(|&p| p == 0) || sinks.lens[dst] != total {
            return Err(format!(
                "no result buffer of {total} elements for device {dst}"
            ));
        }
        let (soff, doff) = l.offsets(r, j);
        let at = sinks.ptrs[dst];
        // SAFETY: the sink holds `total` elements of `x`'s dtype (both checked above);
        // sender `j`'s block is written by this call alone.
        unsafe {
            match x {
                Data::F32(v) => {
                    copy_blocks(v, soff, &l.ist, at as *mut f32, doff, &l.ost, &l.block)
                }
                Data::F64(v) => {
                    copy_blocks(v, soff, &l.ist, at as *mut f64, doff, &l.ost, &l.block)
                }
                Data::BF16(v) => copy_blocks(
                    v,
                    soff,
                    &l.ist,
                    at as *mut half::bf16,
                    doff,
                    &l.ost,
                    &l.block,
                ),
                Data::I32(v) => {
                    copy_blocks(v, soff, &l.ist, at as *mut i32, doff, &l.ost, &l.block)
                }
                Data::Bool(v) => {
                    copy_blocks(v, soff, &l.ist, at as *mut bool, doff, &l.ost, &l.block)
                }
            }
        }
    }
    Ok(())
}

/// Copy `n` elements from `src` to `dst` (not overlapping); a run of whole aligned lines
/// of the destination is written with non-temporal stores where the CPU has AVX-512: a
/// collective's block is read by its receiver only after the round, by when ordinary
/// stores' lines would have left the caches anyway, each read from memory first only to be
/// overwritten. In-process A/B on the small MoE layer at 8 devices (its all-to-alls'
/// blocks placed by the senders): 1.002-1.006; the large shape no different.
///
/// # Safety
/// As `copy_nonoverlapping`.
unsafe fn copy_run<T: Copy>(src: *const T, dst: *mut T, n: usize) {
    let bytes = n * size_of::<T>();
    #[cfg(target_arch = "x86_64")]
    if bytes >= 256
        && bytes.is_multiple_of(64)
        && (dst as usize).is_multiple_of(64)
        && crate::kernels::has_avx512f()
    {
        // SAFETY: the caller's contract; AVX-512F checked.
        unsafe { stream_lines(src.cast(), dst.cast(), bytes / 64) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// `lines` 64-byte lines from `src` to the line-aligned `dst`, non-temporal (fenced by the
/// caller before the data is read elsewhere).
///
/// # Safety
/// AVX-512F; both ranges valid and disjoint.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines(src: *const u8, dst: *mut u8, lines: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        for l in 0..lines {
            let v = _mm512_loadu_si512(src.add(64 * l).cast());
            _mm512_stream_si512(dst.add(64 * l).cast(), v);
        }
    }
}

/// Copy the `shape` block of `src` at `soff` (strides `sst`) to `dst + doff` (strides
/// `dstst`), dims contiguous in both merged first, one contiguous run at a time where
/// both innermost strides are one (an expert block's rows: runs of kilobytes).
///
/// # Safety
/// Every destination element of the block is writable and written by no one else meanwhile.
unsafe fn copy_blocks<T: Copy>(
    src: &[T],
    soff: usize,
    sst: &[usize],
    dst: *mut T,
    doff: usize,
    dstst: &[usize],
    shape: &[usize],
) {
    if shape.contains(&0) {
        return;
    }
    let (shape, [sst, dstst]) = crate::kernels::layout::collapse(shape, [sst, dstst]);
    let (shape, sst, dstst) = (&shape[..], &sst[..], &dstst[..]);
    let r = shape.len();
    if r == 0 {
        // SAFETY: the caller's contract.
        unsafe { *dst.add(doff) = src[soff] };
        return;
    }
    let (n, ls, ld) = (shape[r - 1], sst[r - 1], dstst[r - 1]);
    crate::kernels::odometer(&shape[..r - 1], |i| {
        let so = soff + i.iter().zip(sst).map(|(a, b)| a * b).sum::<usize>();
        let d = doff + i.iter().zip(dstst).map(|(a, b)| a * b).sum::<usize>();
        if ls == 1 && ld == 1 {
            let run = &src[so..so + n];
            // SAFETY: the caller's contract; `run` is a different buffer.
            unsafe { copy_run(run.as_ptr(), dst.add(d), n) };
        } else {
            for t in 0..n {
                // SAFETY: the caller's contract.
                unsafe { *dst.add(d + t * ld) = src[so + t * ls] };
            }
        }
    });
    // Streamed lines (`copy_run`) are weakly ordered: fenced before anything else (another
    // device's task, after the round) reads them.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE, baseline on x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Collective `op` on `comm`, its results transposed by `perm` when given: what
/// [`Communicator::start`] asks for, run to completion on the calling thread (a backend's
/// communication thread calls it too).
pub fn run_collective<C: Communicator + ?Sized>(
    comm: &C,
    index: usize,
    op: &Op,
    mesh: &Mesh,
    local: Vec<HostTensor>,
    perm: Option<&[usize]>,
) -> Results {
    match perm {
        Some(perm) => comm.collective_transposed(index, op, mesh, local, perm),
        None => comm.collective(index, op, mesh, local),
    }
}

/// [`Communicator::start`] that completes the collective before it returns (the trait's
/// default, and `InProcess` without its communication thread).
fn start_blocking<C: Communicator + ?Sized>(
    comm: &C,
    index: usize,
    op: &Op,
    mesh: &Mesh,
    local: Vec<HostTensor>,
    perm: Option<&[usize]>,
) -> Pending {
    Pending::done(
        index,
        op.name(),
        run_collective(comm, index, op, mesh, local, perm),
    )
}

impl Communicator for InProcess {
    fn local_positions(&self) -> Vec<usize> {
        (0..self.n).collect()
    }

    fn start(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: Option<&[usize]>,
    ) -> Pending {
        if !self.comm_thread {
            return start_blocking(self, index, op, mesh, local, perm);
        }
        let (pending, reply) = Pending::running(index, op.name());
        // The thread shares the spare buffers; it owns everything else it touches.
        let me = InProcess {
            n: self.n,
            spare: self.spare.clone(),
            comm_thread: false,
        };
        let (op, mesh, perm) = (op.clone(), mesh.clone(), perm.map(<[usize]>::to_vec));
        std::thread::spawn(move || {
            reply.send(run_collective(
                &me,
                index,
                &op,
                &mesh,
                local,
                perm.as_deref(),
            ));
        });
        pending
    }

    fn shared_memory(&self) -> bool {
        true
    }

    fn collective(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
    ) -> Result<Vec<HostTensor>, CommError> {
        self.run(index, op, mesh, local, None)
    }

    fn collective_transposed(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        perm: &[usize],
    ) -> Result<Vec<HostTensor>, CommError> {
        if let Some(Collective {
            kind: CollectiveKind::AllToAll { .. },
            ..
        }) = op.as_collective()
        {
            return self.run(index, op, mesh, local, Some(perm));
        }
        Ok(all_transposed(
            self.collective(index, op, mesh, local)?,
            perm,
        ))
    }
}

impl InProcess {
    /// Every collective; `a2a_perm`: an all-to-all's results are written transposed by it.
    fn run(
        &self,
        index: usize,
        op: &Op,
        mesh: &Mesh,
        local: Vec<HostTensor>,
        a2a_perm: Option<&[usize]>,
    ) -> Result<Vec<HostTensor>, CommError> {
        let fail = |msg: String| CommError::Failed {
            index,
            op: op.name().into(),
            msg,
        };
        if local.len() != mesh.num_devices() {
            return Err(fail(format!(
                "{} device buffers for a mesh of {}",
                local.len(),
                mesh.num_devices()
            )));
        }
        let Collective { kind, axes } = op
            .as_collective()
            .ok_or_else(|| fail("not a collective".into()))?;
        let groups = mesh.groups(axes);
        let ty = local[0].ty.clone();
        // (device, result) for every member of every group, computed in parallel.
        let jobs: Vec<(usize, usize, &Vec<usize>)> = groups
            .iter()
            .flat_map(|g| (0..g.len()).map(move |r| (g[r], r, g)))
            .collect();
        // Reductions are computed once per group, then shared by its members.
        // Small operands are handled on this thread (parallel tasks cost more than they
        // save there).
        let small = ty.num_elements() < SMALL_COLLECTIVE;
        let reduce = |g: &Vec<usize>| {
            let xs: Vec<&Data> = g.iter().map(|&d| &local[d].data).collect();
            reduction_of(kind).map(|r| reduce_group(&xs, r))
        };
        let reduced: Vec<Option<Data>> = if small {
            groups.iter().map(reduce).collect()
        } else {
            groups.par_iter().map(reduce).collect()
        };
        let group_of: Vec<usize> = {
            let mut v = vec![0; local.len()];
            for (gi, g) in groups.iter().enumerate() {
                for &d in g {
                    v[d] = gi;
                }
            }
            v
        };
        if let CollectiveKind::AllReduce { .. } = kind {
            // Each member's sum lands in its own operand buffer (just written by the
            // device, warm, and the collective's to keep), not in a fresh one: a gradient
            // all-reduce below the kept-buffer size otherwise faults in new pages for every
            // member (~100 us for eight 16 KiB results).
            let mut local = local;
            let write = |(d, t): (usize, &mut HostTensor)| {
                let r = reduced[group_of[d]].as_ref().expect("reduced above");
                with_data2!(r, &mut t.data, a, b => b.copy_from_slice(a));
            };
            if small {
                local.iter_mut().enumerate().for_each(write);
            } else {
                local.par_iter_mut().enumerate().for_each(write);
            }
            return Ok(local);
        }
        let result = |&(dev, r, g): &(usize, usize, &Vec<usize>)| {
            let xs: Vec<&Data> = g.iter().map(|&d| &local[d].data).collect();
            let red = || reduced[group_of[dev]].as_ref().expect("reduced above");
            let k = g.len();
            let shape = &ty.shape;
            let t = match kind {
                CollectiveKind::AllReduce { .. } => {
                    unreachable!("all-reduce results are written above")
                }
                CollectiveKind::AllGather { dim } => {
                    let mut os = shape.clone();
                    os[*dim] *= k;
                    let mut out = self.overwritten(ty.dtype, os.iter().product());
                    for (j, x) in xs.iter().enumerate() {
                        move_block(
                            x,
                            shape,
                            *dim,
                            0,
                            shape[*dim],
                            &mut out,
                            &os,
                            *dim,
                            j * shape[*dim],
                        );
                    }
                    HostTensor {
                        ty: ty.with_shape(os),
                        data: out,
                    }
                }
                CollectiveKind::ReduceScatter { dim, .. } => {
                    let full = red();
                    let m = shape[*dim] / k;
                    let mut os = shape.clone();
                    os[*dim] = m;
                    let mut out = self.overwritten(ty.dtype, os.iter().product());
                    move_block(full, shape, *dim, r * m, m, &mut out, &os, *dim, 0);
                    HostTensor {
                        ty: ty.with_shape(os),
                        data: out,
                    }
                }
                CollectiveKind::AllToAll {
                    split_dim,
                    concat_dim,
                } => {
                    let l = A2aLayout::new(shape, *split_dim, *concat_dim, k, a2a_perm);
                    // Every element is written: block `j` lands at `j` along `concat_dim`.
                    let mut out = self.overwritten(ty.dtype, l.block.iter().product::<usize>() * k);
                    for (j, x) in xs.iter().enumerate() {
                        let (soff, doff) = l.offsets(r, j);
                        with_data2!(*x, &mut out, a, b => copy_strided(a, soff, &l.ist, b, doff, &l.ost, &l.block));
                    }
                    HostTensor {
                        ty: ty.with_shape(l.stored),
                        data: out,
                    }
                }
                CollectiveKind::Permute { pairs } => {
                    match pairs.iter().find(|&&(_, dst)| dst == r) {
                        Some(&(src, _)) => HostTensor {
                            ty: ty.clone(),
                            data: xs[src].clone(),
                        },
                        None => HostTensor {
                            ty: ty.clone(),
                            data: zeros(ty.dtype, ty.num_elements()),
                        },
                    }
                }
            };
            (dev, t)
        };
        let results: Vec<(usize, HostTensor)> = if small {
            jobs.iter().map(result).collect()
        } else {
            jobs.par_iter().map(result).collect()
        };
        let mut out: Vec<Option<HostTensor>> = vec![None; local.len()];
        for (d, t) in results {
            out[d] = Some(t);
        }
        self.keep(local);
        out.into_iter()
            .enumerate()
            .map(|(d, t)| t.ok_or_else(|| fail(format!("device {d} is in no replica group"))))
            .collect()
    }
}
