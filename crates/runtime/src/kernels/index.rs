//! `gather` and `scatter_add` with the reference's index rules: an index `< 0` or `>= dim`
//! gathers zeros and scatters nothing.
//!
//! Views: `x` is `[P, A, I]` (`P` = dims before `axis`, the first `batch_dims` of which are
//! shared with the indices, `A` = the axis, `I` = dims after it), the indices are `[Bt, J]`
//! and the result / updates are `[P, J, I]`. Each index moves one contiguous row of `I`
//! elements. Scatter-add of floats accumulates in f64 and rounds once, like the reference.

use crate::tensor::{f64_to_bf16, Data};
use half::bf16;

/// The dim a gather or scatter-add indexes (`axis` of `x`), and how many leading dims of
/// `x` the indices share (`batch_dims`, all before `axis`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis {
    pub axis: usize,
    pub batch_dims: usize,
}

/// `(P, A, I, Q, J)`: `Q` is the number of non-batch leading rows per batch entry.
fn views(x_shape: &[usize], idx_shape: &[usize], ax: Axis) -> [usize; 5] {
    let Axis { axis, batch_dims } = ax;
    let p: usize = x_shape[..axis].iter().product();
    let a = x_shape[axis];
    let i: usize = x_shape[axis + 1..].iter().product();
    let q: usize = x_shape[batch_dims..axis].iter().product();
    let j: usize = idx_shape[batch_dims..].iter().product();
    [p, a, i, q, j]
}

/// Call `f(src_row, dst_row)` for every in-range index: the row of `x` it reads and the row
/// of the result it fills (both in units of `I` elements).
fn for_each_row(idx: &[i32], [p, a, _, q, j]: [usize; 5], mut f: impl FnMut(Option<usize>, usize)) {
    for pp in 0..p {
        let bt = pp.checked_div(q).unwrap_or(0);
        for jj in 0..j {
            let k = idx[bt * j + jj];
            let src = (k >= 0 && (k as usize) < a).then(|| pp * a + k as usize);
            f(src, pp * j + jj);
        }
    }
}

/// `gather(x, idx, axis, batch_dims)` into `out`.
pub fn gather(
    x: &Data,
    x_shape: &[usize],
    idx: &Data,
    idx_shape: &[usize],
    ax: Axis,
    out: &mut Data,
) {
    let Data::I32(idx) = idx else {
        panic!("gather indices are i32")
    };
    let v = views(x_shape, idx_shape, ax);
    let inner = v[2];
    fn go<T: Copy>(x: &[T], o: &mut [T], idx: &[i32], v: [usize; 5], inner: usize, zero: T) {
        for_each_row(idx, v, |src, dst| {
            let d = &mut o[dst * inner..(dst + 1) * inner];
            match src {
                Some(s) => d.copy_from_slice(&x[s * inner..(s + 1) * inner]),
                None => d.fill(zero),
            }
        });
    }
    match (x, out) {
        (Data::F32(x), Data::F32(o)) => go(x, o, idx, v, inner, 0.0),
        (Data::F64(x), Data::F64(o)) => go(x, o, idx, v, inner, 0.0),
        (Data::BF16(x), Data::BF16(o)) => go(x, o, idx, v, inner, bf16::ZERO),
        (Data::I32(x), Data::I32(o)) => go(x, o, idx, v, inner, 0),
        (Data::Bool(x), Data::Bool(o)) => go(x, o, idx, v, inner, false),
        (x, o) => panic!("gather of {} into {}", x.dtype(), o.dtype()),
    }
}

/// `base` plus every update added where gather would read it (`out` has `base`'s type).
pub fn scatter_add(
    base: &Data,
    x_shape: &[usize],
    idx: &Data,
    idx_shape: &[usize],
    upd: &Data,
    ax: Axis,
    out: &mut Data,
) {
    let Data::I32(idx) = idx else {
        panic!("scatter indices are i32")
    };
    let v = views(x_shape, idx_shape, ax);
    /// The scatter in the accumulation type `A`: `widen` each value into it, `add` there,
    /// `narrow` each sum back once.
    fn go<T: Copy, A: Copy, W, S, N>(
        base: &[T],
        upd: &[T],
        o: &mut [T],
        idx: &[i32],
        v: [usize; 5],
        (widen, add, narrow): (W, S, N),
    ) where
        W: Fn(T) -> A,
        S: Fn(A, A) -> A,
        N: Fn(A) -> T,
    {
        let inner = v[2];
        // Rows no update reaches are the base's values (through the same widen/narrow);
        // only the rows updates reach are accumulated, each in its own slot of a compact
        // buffer (base row first, then its updates in index order, rounded once): a large
        // table with few touched rows (an embedding gradient) costs no full-size f64 copy.
        o.iter_mut()
            .zip(base)
            .for_each(|(o, &b)| *o = narrow(widen(b)));
        // `P * A` rows of `inner` elements (also when `inner` is 0).
        let rows = v[0] * v[1];
        let mut slot = vec![u32::MAX; rows];
        let mut touched: Vec<usize> = Vec::new();
        let mut acc: Vec<A> = Vec::new();
        for_each_row(idx, v, |dst, src| {
            if let Some(d) = dst {
                if slot[d] == u32::MAX {
                    slot[d] = touched.len() as u32;
                    touched.push(d);
                    acc.extend(base[d * inner..(d + 1) * inner].iter().map(|&b| widen(b)));
                }
                let at = slot[d] as usize * inner;
                let a = &mut acc[at..at + inner];
                for (a, &u) in a.iter_mut().zip(&upd[src * inner..(src + 1) * inner]) {
                    *a = add(*a, widen(u));
                }
            }
        });
        for (t, &d) in touched.iter().enumerate() {
            let a = &acc[t * inner..(t + 1) * inner];
            o[d * inner..(d + 1) * inner]
                .iter_mut()
                .zip(a)
                .for_each(|(o, &a)| *o = narrow(a));
        }
    }
    match (base, upd, out) {
        (Data::F32(b), Data::F32(u), Data::F32(o)) => {
            let rule = (|x: f32| x as f64, |a: f64, b: f64| a + b, |a: f64| a as f32);
            go(b, u, o, idx, v, rule)
        }
        (Data::F64(b), Data::F64(u), Data::F64(o)) => {
            let rule = (|x: f64| x, |a: f64, b: f64| a + b, |a: f64| a);
            go(b, u, o, idx, v, rule)
        }
        (Data::BF16(b), Data::BF16(u), Data::BF16(o)) => {
            let rule = (|x: bf16| x.to_f64(), |a: f64, b: f64| a + b, f64_to_bf16);
            go(b, u, o, idx, v, rule)
        }
        (Data::I32(b), Data::I32(u), Data::I32(o)) => {
            let rule = (|x: i32| x, |a: i32, b: i32| a.wrapping_add(b), |a: i32| a);
            go(b, u, o, idx, v, rule)
        }
        (b, _, o) => panic!("scatter_add of {} into {}", b.dtype(), o.dtype()),
    }
}
