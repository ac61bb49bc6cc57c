//! Data movement as strided copies, plus the generators (iota, constants, RNG).
//!
//! One primitive, [`copy_strided`], moves a `shape`-shaped block between two strided views
//! (`element i at off + sum i[d] * st[d]`). Adjacent dims that are contiguous in both views
//! are merged first, so most copies become runs of `copy_from_slice`/`fill`; a transpose
//! whose innermost destination dim is strided in the source goes through 32x32 tiles so both
//! sides stay in cache. [`gather_copy`] (contiguous destination) splits the destination over
//! its outer dim on the rayon pool. Transpose, broadcast (stride 0), slice, dynamic slice,
//! dynamic-update-slice, pad and concatenate are all expressed with these two.

use super::{fill_value, scalar_f64, strides, PAR_MIN};
use crate::rng;
use crate::tensor::{f64_to_bf16, Data};
use crate::{with_data, with_data2};
use ir::{DType, Literal, RngDist};
use rayon::prelude::*;

const TILE: usize = 32;

/// Drop size-1 dims and merge adjacent dims that are contiguous in every stride set.
pub(crate) fn collapse(shape: &[usize], sts: [&[usize]; 2]) -> (Vec<usize>, [Vec<usize>; 2]) {
    let mut sh: Vec<usize> = Vec::new();
    let mut out: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let Some(&last) = sh.last() {
            let k = sh.len() - 1;
            if (0..2).all(|s| out[s][k] == sts[s][d] * shape[d]) {
                let _ = last;
                sh[k] *= shape[d];
                for s in 0..2 {
                    out[s][k] = sts[s][d];
                }
                continue;
            }
        }
        sh.push(shape[d]);
        for s in 0..2 {
            out[s].push(sts[s][d]);
        }
    }
    (sh, out)
}

/// Call `f(a, b)` with the offsets of both views for every multi-index of `shape`.
fn for_each_offset2(
    shape: &[usize],
    sa: &[usize],
    sb: &[usize],
    a0: usize,
    b0: usize,
    mut f: impl FnMut(usize, usize),
) {
    if shape.contains(&0) {
        return;
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let (mut a, mut b) = (a0, b0);
    loop {
        f(a, b);
        let mut d = r;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            a += sa[d];
            b += sb[d];
            if idx[d] < shape[d] {
                break;
            }
            a -= sa[d] * shape[d];
            b -= sb[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/// Copy the `shape` block of `src` (offset `soff`, strides `sst`) into `dst` (offset `doff`,
/// strides `dstst`). Sequential.
pub fn copy_strided<T: Copy>(
    src: &[T],
    soff: usize,
    sst: &[usize],
    dst: &mut [T],
    doff: usize,
    dstst: &[usize],
    shape: &[usize],
) {
    if shape.contains(&0) {
        return;
    }
    let (shape, [ss, ds]) = collapse(shape, [sst, dstst]);
    let r = shape.len();
    if r == 0 {
        dst[doff] = src[soff];
        return;
    }
    let (n, ls, ld) = (shape[r - 1], ss[r - 1], ds[r - 1]);
    // Tiled transpose: destination contiguous innermost, source contiguous along dim q.
    if ld == 1 && ls != 1 && ls != 0 {
        if let Some(q) = (0..r - 1).rev().find(|&q| ss[q] == 1) {
            let nq = shape[q];
            let dq = ds[q];
            let outer: Vec<usize> = (0..r - 1).filter(|&d| d != q).collect();
            let osh: Vec<usize> = outer.iter().map(|&d| shape[d]).collect();
            let oss: Vec<usize> = outer.iter().map(|&d| ss[d]).collect();
            let ods: Vec<usize> = outer.iter().map(|&d| ds[d]).collect();
            for_each_offset2(&osh, &oss, &ods, soff, doff, |so, dof| {
                for jb in (0..nq).step_by(TILE) {
                    let je = (jb + TILE).min(nq);
                    for ib in (0..n).step_by(TILE) {
                        let ie = (ib + TILE).min(n);
                        for j in jb..je {
                            let drow = dof + j * dq;
                            let srow = so + j;
                            for i in ib..ie {
                                dst[drow + i] = src[srow + i * ls];
                            }
                        }
                    }
                }
            });
            return;
        }
    }
    for_each_offset2(
        &shape[..r - 1],
        &ss[..r - 1],
        &ds[..r - 1],
        soff,
        doff,
        |so, dof| {
            if ls == 1 && ld == 1 {
                dst[dof..dof + n].copy_from_slice(&src[so..so + n]);
            } else if ls == 0 && ld == 1 {
                dst[dof..dof + n].fill(src[so]);
            } else {
                for j in 0..n {
                    dst[dof + j * ld] = src[so + j * ls];
                }
            }
        },
    );
}

/// Copy the strided `shape` view of `src` into the contiguous row-major `dst`, splitting
/// the destination's outer dim over the rayon pool when large.
pub fn gather_copy<T: Copy + Send + Sync>(
    src: &[T],
    soff: usize,
    sst: &[usize],
    shape: &[usize],
    dst: &mut [T],
) {
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let dst_st = strides(shape);
    let (sh, [ss, ds]) = collapse(shape, [sst, &dst_st]);
    if n < PAR_MIN || sh.is_empty() || sh[0] < 2 {
        copy_strided(src, soff, &ss, dst, 0, &ds, &sh);
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let rows = sh[0].div_ceil(threads * 4).max(1);
    let row = ds[0];
    dst[..sh[0] * row]
        .par_chunks_mut(rows * row)
        .enumerate()
        .for_each(|(c, chunk)| {
            let r0 = c * rows;
            let mut shape = sh.clone();
            shape[0] = chunk.len() / row;
            copy_strided(src, soff + r0 * ss[0], &ss, chunk, 0, &ds, &shape);
        });
}

/// `out[i] = x[perm^-1 ...]`: result dim `i` is operand dim `perm[i]`.
pub fn transpose(x: &Data, in_shape: &[usize], perm: &[usize], out: &mut Data) {
    let ist = strides(in_shape);
    let sst: Vec<usize> = perm.iter().map(|&p| ist[p]).collect();
    let shape: Vec<usize> = perm.iter().map(|&p| in_shape[p]).collect();
    with_data2!(x, out, a, b => gather_copy(a, 0, &sst, &shape, b));
}

/// Operand dim `k` is result dim `dims[k]`; the other result dims repeat it.
pub fn broadcast(
    x: &Data,
    in_shape: &[usize],
    dims: &[usize],
    out_shape: &[usize],
    out: &mut Data,
) {
    let ist = strides(in_shape);
    let mut sst = vec![0usize; out_shape.len()];
    for (k, &d) in dims.iter().enumerate() {
        sst[d] = ist[k];
    }
    with_data2!(x, out, a, b => gather_copy(a, 0, &sst, out_shape, b));
}

/// The window of `out_shape` starting at `start` (slice and dynamic slice).
pub fn window(x: &Data, in_shape: &[usize], start: &[usize], out_shape: &[usize], out: &mut Data) {
    let ist = strides(in_shape);
    let off: usize = start.iter().zip(&ist).map(|(a, s)| a * s).sum();
    with_data2!(x, out, a, b => gather_copy(a, off, &ist, out_shape, b));
}

/// i32 scalar starts, each clamped into `[0, dim - size]`.
pub fn clamped_starts(shape: &[usize], sizes: &[usize], starts: &[&Data]) -> Vec<usize> {
    (0..shape.len())
        .map(|d| {
            let hi = (shape[d] - sizes[d]) as i64;
            (scalar_f64(starts[d]) as i64).clamp(0, hi) as usize
        })
        .collect()
}

/// `x` with the window at `start` replaced by `u`.
pub fn dynamic_update_slice(
    x: &Data,
    shape: &[usize],
    u: &Data,
    u_shape: &[usize],
    start: &[usize],
    out: &mut Data,
) {
    let st = strides(shape);
    let off: usize = start.iter().zip(&st).map(|(a, s)| a * s).sum();
    let ust = strides(u_shape);
    with_data2!(x, &mut *out, a, b => gather_copy(a, 0, &st, shape, b));
    with_data2!(u, out, a, b => copy_strided(a, 0, &ust, b, off, &st, u_shape));
}

/// `x` placed at `low` inside a result filled with the scalar `value`.
pub fn pad(
    x: &Data,
    in_shape: &[usize],
    value: &Data,
    low: &[usize],
    out_shape: &[usize],
    out: &mut Data,
) {
    fill_value(out, scalar_f64(value));
    let ost = strides(out_shape);
    let off: usize = low.iter().zip(&ost).map(|(a, s)| a * s).sum();
    let ist = strides(in_shape);
    with_data2!(x, out, a, b => copy_strided(a, 0, &ist, b, off, &ost, in_shape));
}

/// The operands (with their shapes) concatenated along `dim`.
pub fn concatenate(xs: &[(&Data, &[usize])], dim: usize, out_shape: &[usize], out: &mut Data) {
    let ost = strides(out_shape);
    let mut at = 0usize;
    for (x, shape) in xs {
        let ist = strides(shape);
        with_data2!(*x, &mut *out, a, b => copy_strided(a, 0, &ist, b, at * ost[dim], &ost, shape));
        at += shape[dim];
    }
}

/// `out[i] = i_dim` along `dim` of `shape`.
pub fn iota(shape: &[usize], dim: usize, out: &mut Data) {
    let st = strides(shape);
    let (stride, size) = (st[dim], shape[dim]);
    let val = |i: usize| (i / stride) % size;
    match out {
        Data::F32(v) => v
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = val(i) as f32),
        Data::F64(v) => v
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = val(i) as f64),
        Data::BF16(v) => v
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = f64_to_bf16(val(i) as f64)),
        Data::I32(v) => v
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = val(i) as i32),
        Data::Bool(v) => v.iter_mut().enumerate().for_each(|(i, o)| *o = val(i) != 0),
    }
}

/// A constant literal in the buffer's dtype (the `convert` rule).
pub fn constant(value: &Literal, out: &mut Data) {
    match value {
        Literal::Splat(x) => fill_value(out, *x),
        Literal::Dense(xs) => match out {
            Data::F32(v) => v.iter_mut().zip(xs).for_each(|(o, &x)| *o = x as f32),
            Data::F64(v) => v.copy_from_slice(xs),
            Data::BF16(v) => v.iter_mut().zip(xs).for_each(|(o, &x)| *o = f64_to_bf16(x)),
            Data::I32(v) => v.iter_mut().zip(xs).for_each(|(o, &x)| *o = x as i32),
            Data::Bool(v) => v.iter_mut().zip(xs).for_each(|(o, &x)| *o = x != 0.0),
        },
    }
}

/// The `rng` op: element `i` of the local `shape` is the sample at `i + offsets` of
/// `global_shape` (see `crate::rng`).
///
/// Along the last dim, consecutive local elements have consecutive global indices, so each
/// run of a row is generated by [`rng::bits_run`] (sixteen Philox counters at a time) from
/// its first element's index; only the start of a run computes an index from coordinates.
pub fn random(
    dist: RngDist,
    stream: u64,
    global_shape: &[usize],
    seed: i32,
    offsets: &[i64],
    shape: &[usize],
    out: &mut Data,
) {
    let dtype = out.dtype();
    let rank = shape.len();
    assert!(
        global_shape.len() == rank && offsets.len() == rank,
        "rng: a {rank}-d result of a {}-d global shape with {} offsets (the verifier rejects this)",
        global_shape.len(),
        offsets.len()
    );
    if rank == 0 {
        // A scalar: element 0.
        with_data!(out, v => v[0] = FromF64::from_f64(rng::sample(dist, dtype, seed, stream, 0)));
        return;
    }
    let gst: Vec<i64> = strides(global_shape).iter().map(|&s| s as i64).collect();
    let st = strides(shape);
    let last = shape[rank - 1];
    // The global index of the local element at `coords` (as `rng::linear_index`).
    let index_of = |coords: &[usize]| -> u64 {
        let global = coords
            .iter()
            .zip(offsets)
            .map(|(&c, &o)| (c as i64).wrapping_add(o));
        rng::index_by_strides(gst.iter().copied(), global)
    };
    const CHUNK: usize = 4096;
    let normal = dist == RngDist::Normal;
    with_data!(out, v => {
        v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, part)| {
            let mut x0 = [0u32; CHUNK];
            let mut x1 = [0u32; CHUNK];
            let start = c * CHUNK;
            let mut coords: Vec<usize> = (0..rank).map(|d| (start / st[d]) % shape[d]).collect();
            let mut done = 0;
            while done < part.len() {
                let len = (last - coords[rank - 1]).min(part.len() - done);
                let first = index_of(&coords);
                let (w0, w1) = (&mut x0[..len], &mut x1[..len]);
                rng::bits_run(seed, stream, first, w0, normal.then_some(&mut *w1));
                let dst = &mut part[done..done + len];
                if normal {
                    for ((o, &a), &b) in dst.iter_mut().zip(w0.iter()).zip(w1.iter()) {
                        *o = FromF64::from_f64(rng::sample_from_words(dist, dtype, a, b));
                    }
                } else {
                    Sampled::uniform(dst, w0, dtype);
                }
                done += len;
                // Next run: the start of the following row (odometer carry).
                coords[rank - 1] += len;
                let mut d = rank - 1;
                while d > 0 && coords[d] == shape[d] {
                    coords[d] = 0;
                    d -= 1;
                    coords[d] += 1;
                }
            }
        })
    });
}

/// Element types of `rng` results: uniform samples from Philox word 0.
trait Sampled: FromF64 + Sized {
    /// `dst[t]` = the uniform sample of word `x0[t]` rounded to `dtype` (this type), as
    /// `rng::sample_from_words` gives it.
    fn uniform(dst: &mut [Self], x0: &[u32], dtype: DType) {
        for (o, &a) in dst.iter_mut().zip(x0) {
            *o = Self::from_f64(rng::sample_from_words(RngDist::Uniform, dtype, a, 0));
        }
    }
}

/// `(x0 >> 8) * 2^-24` is exact in f32 (24 bits, a power-of-two scale) and below 1: the
/// rounding of the f64 value is the value itself, computed in f32 lanes.
impl Sampled for f32 {
    fn uniform(dst: &mut [f32], x0: &[u32], _: DType) {
        super::with_avx2(
            #[inline(always)]
            || {
                for (o, &a) in dst.iter_mut().zip(x0) {
                    *o = (a >> 8) as f32 * rng::TWO_POW_M24 as f32;
                }
            },
        )
    }
}
impl Sampled for f64 {
    fn uniform(dst: &mut [f64], x0: &[u32], _: DType) {
        for (o, &a) in dst.iter_mut().zip(x0) {
            *o = (a >> 8) as f64 * rng::TWO_POW_M24;
        }
    }
}
impl Sampled for half::bf16 {}
impl Sampled for i32 {}
impl Sampled for bool {}

/// Conversion from an exact f64 value by the `convert` rule (for generic generators).
pub trait FromF64 {
    fn from_f64(x: f64) -> Self;
}

impl FromF64 for f32 {
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
}
impl FromF64 for f64 {
    fn from_f64(x: f64) -> f64 {
        x
    }
}
impl FromF64 for half::bf16 {
    fn from_f64(x: f64) -> half::bf16 {
        f64_to_bf16(x)
    }
}
impl FromF64 for i32 {
    fn from_f64(x: f64) -> i32 {
        x as i32
    }
}
impl FromF64 for bool {
    fn from_f64(x: f64) -> bool {
        x != 0.0
    }
}

/// Flip `x` (of `shape`) along `dims`: each innermost row is copied whole, or reversed when
/// the innermost dim is flipped, from its mirrored source row.
pub fn reverse(x: &Data, shape: &[usize], dims: &[usize], out: &mut Data) {
    with_data2!(x, out, a, b => reverse_rows(a, shape, dims, b));
}

fn reverse_rows<T: Copy>(x: &[T], shape: &[usize], dims: &[usize], out: &mut [T]) {
    let Some((&inner, outer)) = shape.split_last() else {
        out.copy_from_slice(x);
        return;
    };
    let st = strides(shape);
    let flip_inner = dims.contains(&outer.len());
    let mut row = 0;
    super::odometer(outer, |i| {
        let src: usize = (0..outer.len())
            .map(|d| {
                let id = if dims.contains(&d) {
                    outer[d] - 1 - i[d]
                } else {
                    i[d]
                };
                id * st[d]
            })
            .sum();
        let (s, o) = (&x[src..src + inner], &mut out[row..row + inner]);
        if flip_inner {
            o.iter_mut().zip(s.iter().rev()).for_each(|(o, &v)| *o = v);
        } else {
            o.copy_from_slice(s);
        }
        row += inner;
    });
}
