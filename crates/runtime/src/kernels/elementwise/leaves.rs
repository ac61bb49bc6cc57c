//! The leaves of a fused group over one chunk: an input copied into its lane (bf16
//! widened), an input read through a broadcast map (walked by runs of the innermost dims),
//! a splat and an iota.

use super::arith::bf;
use super::lanes::LaneMut;
use crate::tensor::Data;
use half::bf16;
use ir::DType;

/// Copy `n` elements of `src` from `start` into a scratch chunk.
#[inline(always)]
pub(super) fn load(src: &Data, start: usize, n: usize, o: LaneMut<'_>) {
    let r = start..start + n;
    match (src, o) {
        (Data::F32(v), LaneMut::F(o)) => o[..n].copy_from_slice(&v[r]),
        (Data::BF16(v), LaneMut::F(o)) => o[..n]
            .iter_mut()
            .zip(&v[r])
            .for_each(|(o, x)| *o = x.to_f32()),
        (Data::F64(v), LaneMut::D(o)) => o[..n].copy_from_slice(&v[r]),
        (Data::I32(v), LaneMut::I(o)) => o[..n].copy_from_slice(&v[r]),
        (Data::Bool(v), LaneMut::B(o)) => o[..n].copy_from_slice(&v[r]),
        (d, _) => panic!("fused input of dtype {} in the wrong lane", d.dtype()),
    }
}

/// Copy `m` elements of `src` from `off` (stride 1, or stride 0 = repeat) into `o[at..]`.
#[inline(always)]
pub(super) fn load_run(src: &Data, off: usize, stride: usize, m: usize, o: LaneMut<'_>, at: usize) {
    macro_rules! run {
        ($v:expr, $o:expr, $f:expr) => {{
            let o = &mut $o[at..at + m];
            if stride == 0 {
                o.fill($f($v[off]));
            } else {
                o.iter_mut()
                    .zip(&$v[off..off + m])
                    .for_each(|(o, &x)| *o = $f(x));
            }
        }};
    }
    match (src, o) {
        (Data::F32(v), LaneMut::F(o)) => run!(v, o, |x: f32| x),
        (Data::BF16(v), LaneMut::F(o)) => run!(v, o, |x: bf16| x.to_f32()),
        (Data::F64(v), LaneMut::D(o)) => run!(v, o, |x: f64| x),
        (Data::I32(v), LaneMut::I(o)) => run!(v, o, |x: i32| x),
        (Data::Bool(v), LaneMut::B(o)) => run!(v, o, |x: bool| x),
        (d, _) => panic!("fused broadcast of dtype {} in the wrong lane", d.dtype()),
    }
}

#[inline(always)]
pub(super) fn load_broadcast(
    src: &Data,
    shape: &[usize],
    st: &[usize],
    start: usize,
    n: usize,
    o: LaneMut<'_>,
) {
    if shape.is_empty() {
        load_run(src, 0, 0, n, o, 0);
        return;
    }
    // One dtype dispatch per chunk; the walk below is monomorphised, so short inner runs
    // (a broadcast over a trailing dim of 2, say) cost a few instructions each.
    match (src, o) {
        (Data::F32(v), LaneMut::F(o)) => walk_broadcast(v, shape, st, start, &mut o[..n], |x| x),
        (Data::BF16(v), LaneMut::F(o)) => {
            walk_broadcast(v, shape, st, start, &mut o[..n], |x: bf16| x.to_f32())
        }
        (Data::F64(v), LaneMut::D(o)) => walk_broadcast(v, shape, st, start, &mut o[..n], |x| x),
        (Data::I32(v), LaneMut::I(o)) => walk_broadcast(v, shape, st, start, &mut o[..n], |x| x),
        (Data::Bool(v), LaneMut::B(o)) => walk_broadcast(v, shape, st, start, &mut o[..n], |x| x),
        (d, _) => panic!("fused broadcast of dtype {} in the wrong lane", d.dtype()),
    }
}

/// Rows of `L` elements (`L` a constant, so each row is a few vector moves): row `t`,
/// element `u` is `f(v[off + t*rst + u*lst])`.
#[inline(always)]
pub(super) fn short_rows<T: Copy, U: Copy, const L: usize>(
    v: &[T],
    off: usize,
    lst: usize,
    rst: usize,
    seg: &mut [U],
    f: &impl Fn(T) -> U,
) {
    let rows = seg.len() / L;
    if rows == 0 {
        return;
    }
    let src = &v[off..=off + (rows - 1) * rst + (L - 1) * lst];
    let chunks = seg
        .chunks_exact_mut(L)
        .map(|r| <&mut [U; L]>::try_from(r).expect("L"));
    if lst == 0 && rst == 1 {
        // Each row one value repeated, the values consecutive (the one-hot masks'
        // `[G,S,E] -> [G,S,E,C]`): zipped, so the loop has no index arithmetic or bounds
        // checks and compiles to shuffles and full-width stores (a 64K-element broadcast
        // product 15-20 % faster alone; the small MoE layer's step 0.4-0.6 % in-process).
        for (row, &x) in chunks.zip(&src[..rows]) {
            *row = [f(x); L];
        }
    } else if lst == 0 {
        // Each row one value repeated.
        for (t, row) in chunks.enumerate() {
            *row = [f(src[t * rst]); L];
        }
    } else if rst == 0 {
        // Every row the same.
        let first: [U; L] = std::array::from_fn(|u| f(src[u * lst]));
        for row in chunks {
            *row = first;
        }
    } else {
        for (t, row) in chunks.enumerate() {
            let base = t * rst;
            *row = std::array::from_fn(|u| f(src[base + u * lst]));
        }
    }
}

/// `o[t] = f(v[offset of element start + t])` for the broadcast map `shape`/`st` (strides
/// of the operand per result dim, 0 where broadcast), walking runs of the innermost dim.
#[inline(always)]
pub(super) fn walk_broadcast<T: Copy, U: Copy>(
    v: &[T],
    shape: &[usize],
    st: &[usize],
    start: usize,
    o: &mut [U],
    f: impl Fn(T) -> U,
) {
    let r = shape.len();
    let n = o.len();
    // The index on the stack for the usual ranks (this runs once per chunk and input).
    let (mut small, mut large) = ([0usize; 8], Vec::new());
    let idx: &mut [usize] = if r <= small.len() {
        &mut small[..r]
    } else {
        large.resize(r, 0);
        &mut large
    };
    let mut rem = start;
    for d in (0..r).rev() {
        idx[d] = rem % shape[d];
        rem /= shape[d];
    }
    let mut off: usize = idx.iter().zip(st).map(|(i, s)| i * s).sum();
    let (last, lst) = (shape[r - 1], st[r - 1]);
    let mut pos = 0;
    while pos < n {
        if r >= 2 && last < 16 && idx[r - 1] == 0 && n - pos >= last {
            // Short innermost runs (a broadcast over a trailing dim of 2, say): whole rows
            // of the last two dims in one tight loop, no per-run bookkeeping.
            let (rows, rst) = (shape[r - 2] - idx[r - 2], st[r - 2]);
            let k = rows.min((n - pos) / last);
            let seg = &mut o[pos..pos + k * last];
            match last {
                2 => short_rows::<T, U, 2>(v, off, lst, rst, seg, &f),
                3 => short_rows::<T, U, 3>(v, off, lst, rst, seg, &f),
                4 => short_rows::<T, U, 4>(v, off, lst, rst, seg, &f),
                8 => short_rows::<T, U, 8>(v, off, lst, rst, seg, &f),
                _ => {
                    for (t, row) in seg.chunks_exact_mut(last).enumerate() {
                        let base = off + t * rst;
                        for (u, d) in row.iter_mut().enumerate() {
                            *d = f(v[base + u * lst]);
                        }
                    }
                }
            }
            pos += k * last;
            advance(idx, &mut off, shape, st, r - 2, k);
            continue;
        }
        let m = (last - idx[r - 1]).min(n - pos);
        let dst = &mut o[pos..pos + m];
        if lst == 0 {
            let x = f(v[off]);
            dst.fill(x);
        } else if lst == 1 {
            dst.iter_mut()
                .zip(&v[off..off + m])
                .for_each(|(d, &x)| *d = f(x));
        } else {
            for (t, d) in dst.iter_mut().enumerate() {
                *d = f(v[off + t * lst]);
            }
        }
        pos += m;
        advance(idx, &mut off, shape, st, r - 1, m);
    }
}

/// Move the multi-index `idx` (and its operand offset `off`) `k` steps along dim `d`, which
/// must not pass the dim's end; reaching it wraps to 0 and carries into the outer dims.
#[inline(always)]
pub(super) fn advance(
    idx: &mut [usize],
    off: &mut usize,
    shape: &[usize],
    st: &[usize],
    d: usize,
    k: usize,
) {
    idx[d] += k;
    *off += k * st[d];
    if idx[d] < shape[d] {
        return;
    }
    *off -= shape[d] * st[d];
    idx[d] = 0;
    let mut d = d;
    while d > 0 {
        d -= 1;
        idx[d] += 1;
        *off += st[d];
        if idx[d] < shape[d] {
            break;
        }
        *off -= st[d] * shape[d];
        idx[d] = 0;
    }
}

#[inline(always)]
pub(super) fn fill_splat(x: f64, dt: DType, o: LaneMut<'_>) {
    match o {
        LaneMut::F(o) => o.fill(if dt == DType::BF16 { bf(x) } else { x as f32 }),
        LaneMut::D(o) => o.fill(x),
        LaneMut::I(o) => o.fill(x as i32),
        LaneMut::B(o) => o.fill(x != 0.0),
    }
}

#[inline(always)]
pub(super) fn iota_chunk(stride: usize, size: usize, dt: DType, start: usize, o: LaneMut<'_>) {
    /// `o[i] = f((start + i) / stride % size)`, by runs: with `stride == 1` a run counts up
    /// to `size` (consecutive values, vectorised), otherwise a run repeats one value
    /// `stride` times (a fill). Two divisions per chunk, none per element.
    #[inline(always)]
    fn fill<T: Copy>(
        o: &mut [T],
        stride: usize,
        size: usize,
        start: usize,
        f: impl Fn(usize) -> T,
    ) {
        let mut q = (start / stride) % size;
        let mut r = start % stride;
        let mut i = 0;
        while i < o.len() {
            if stride == 1 {
                let run = (size - q).min(o.len() - i);
                for (t, x) in o[i..i + run].iter_mut().enumerate() {
                    *x = f(q + t);
                }
                i += run;
                q = 0;
            } else {
                let run = (stride - r).min(o.len() - i);
                o[i..i + run].fill(f(q));
                i += run;
                r = 0;
                q += 1;
                if q == size {
                    q = 0;
                }
            }
        }
    }
    match o {
        LaneMut::F(o) if dt == DType::BF16 => fill(o, stride, size, start, |q| bf(q as f64)),
        LaneMut::F(o) => fill(o, stride, size, start, |q| q as f32),
        LaneMut::D(o) => fill(o, stride, size, start, |q| q as f64),
        LaneMut::I(o) => fill(o, stride, size, start, |q| q as i32),
        LaneMut::B(o) => fill(o, stride, size, start, |q| q != 0),
    }
}
