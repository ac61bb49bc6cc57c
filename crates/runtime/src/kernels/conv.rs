//! `conv` as im2col plus one GEMM.
//!
//! For lhs `[N, S.., Cin]`, kernel `[K.., Cin, Cout]` and result `[N, O.., Cout]`, every
//! output position `(n, o)` gets one row of an `[N * prod(O), prod(K) * Cin]` matrix holding
//! its window (`Cin` contiguous lhs elements per kernel position, zeros where the window
//! hangs over the padding). The kernel, read row-major, already is the
//! `[prod(K) * Cin, Cout]` matrix, and the row-major product is the result layout, so the
//! GEMM ([`super::dot`], with its dtype rules: f32 accumulation for f32/bf16, wrapping i32)
//! writes the result in place. Padding enters as explicit zeros, like the reference.

use super::dot::{dot, DotPlan};
use super::PAR_MIN;
use crate::tensor::Data;
use ir::DotDims;
use rayon::prelude::*;

/// The window rows of every output position (see the module doc).
fn im2col<T: Copy + Default + Send + Sync>(
    x: &[T],
    xs: &[usize],
    ks: &[usize],
    os: &[usize],
    pad_lo: &[usize],
) -> Vec<T> {
    let k = pad_lo.len();
    let cin = xs[k + 1];
    let xst = super::strides(xs);
    let window: usize = ks.iter().product::<usize>() * cin;
    let rows = xs[0] * os.iter().product::<usize>();
    let mut col = vec![T::default(); rows * window];
    if window == 0 || cin == 0 {
        return col;
    }
    let pos_per_n: usize = os.iter().product();
    let fill = |r: usize, dst: &mut [T]| {
        let n = r / pos_per_n.max(1);
        let mut rest = r % pos_per_n.max(1);
        let mut o = vec![0usize; k];
        for i in (0..k).rev() {
            o[i] = rest % os[i];
            rest /= os[i];
        }
        let mut at = 0;
        super::odometer(ks, |j| {
            let inside = (0..k).all(|i| {
                let p = o[i] + j[i];
                p >= pad_lo[i] && p - pad_lo[i] < xs[1 + i]
            });
            if inside {
                let off = n * xst[0]
                    + (0..k)
                        .map(|i| (o[i] + j[i] - pad_lo[i]) * xst[1 + i])
                        .sum::<usize>();
                dst[at..at + cin].copy_from_slice(&x[off..off + cin]);
            }
            at += cin;
        });
    };
    if col.len() >= PAR_MIN {
        col.par_chunks_mut(window)
            .enumerate()
            .for_each(|(r, dst)| fill(r, dst));
    } else {
        col.chunks_mut(window)
            .enumerate()
            .for_each(|(r, dst)| fill(r, dst));
    }
    col
}

/// `out = conv(x, w)` with zero padding `pad_lo` (the high padding follows from the shapes).
pub fn conv(
    x: &Data,
    xs: &[usize],
    w: &Data,
    ws: &[usize],
    pad_lo: &[usize],
    out_shape: &[usize],
    out: &mut Data,
) {
    let k = pad_lo.len();
    let (ks, os) = (&ws[..k], &out_shape[1..=k]);
    let col = match x {
        Data::F32(v) => Data::F32(im2col(v, xs, ks, os, pad_lo)),
        Data::F64(v) => Data::F64(im2col(v, xs, ks, os, pad_lo)),
        Data::BF16(v) => Data::BF16(im2col(v, xs, ks, os, pad_lo)),
        Data::I32(v) => Data::I32(im2col(v, xs, ks, os, pad_lo)),
        Data::Bool(_) => panic!("conv of bool (the verifier should have caught this)"),
    };
    let rows = xs[0] * os.iter().product::<usize>();
    let window = ks.iter().product::<usize>() * xs[k + 1];
    let (ls, rs) = ([rows, window], [window, ws[k + 1]]);
    let dims = DotDims {
        lhs_contract: vec![1],
        rhs_contract: vec![0],
        ..Default::default()
    };
    dot(&DotPlan::new(&ls, &rs, &dims), &ls, &col, &rs, w, out);
}
