//! Compares, selects and converts over a chunk: bool-valued compares, branch-free selects,
//! the `convert` rule between lanes, and the f32 compare folded into its select or
//! convert (no bool lane in between).

use super::arith::{bf, Src};
use super::lanes::{Lane, LaneMut};
use crate::kernels::reduce::sel32;
use half::bf16;
use ir::{CompareOp, DType};

#[inline(always)]
pub(super) fn compare<T: PartialOrd + Copy>(c: CompareOp, x: &[T], y: &[T], o: &mut [bool]) {
    let it = o.iter_mut().zip(x.iter().zip(y));
    match c {
        CompareOp::Eq => it.for_each(|(o, (x, y))| *o = x == y),
        CompareOp::Ne => it.for_each(|(o, (x, y))| *o = x != y),
        CompareOp::Lt => it.for_each(|(o, (x, y))| *o = x < y),
        CompareOp::Le => it.for_each(|(o, (x, y))| *o = x <= y),
        CompareOp::Gt => it.for_each(|(o, (x, y))| *o = x > y),
        CompareOp::Ge => it.for_each(|(o, (x, y))| *o = x >= y),
    }
}

/// Branch-free select (random predicates would mispredict a branch every other element).
pub(super) trait Select: Copy {
    fn pick(c: bool, a: Self, b: Self) -> Self;
}

impl Select for f32 {
    #[inline]
    fn pick(c: bool, a: f32, b: f32) -> f32 {
        sel32(c, a, b)
    }
}

impl Select for f64 {
    #[inline]
    fn pick(c: bool, a: f64, b: f64) -> f64 {
        let m = (c as u64).wrapping_neg();
        f64::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
    }
}

impl Select for i32 {
    #[inline]
    fn pick(c: bool, a: i32, b: i32) -> i32 {
        let m = (c as i32).wrapping_neg();
        (a & m) | (b & !m)
    }
}

impl Select for bool {
    #[inline]
    fn pick(c: bool, a: bool, b: bool) -> bool {
        (c & a) | (!c & b)
    }
}

#[inline(always)]
pub(super) fn select<T: Select>(p: &[bool], t: &[T], f: &[T], o: &mut [T]) {
    let n = o.len();
    let (p, t, f) = (&p[..n], &t[..n], &f[..n]);
    for i in 0..n {
        o[i] = T::pick(p[i], t[i], f[i]);
    }
}

/// Convert a chunk from `from` to `to` (the `convert` rule).
#[inline(always)]
pub(super) fn convert(from: DType, to: DType, x: Lane<'_>, o: LaneMut<'_>, n: usize) {
    match (x, o) {
        (Lane::F(x), LaneMut::F(o)) => {
            if to == DType::BF16 && from == DType::F32 {
                o[..n]
                    .iter_mut()
                    .zip(&x[..n])
                    .for_each(|(o, &x)| *o = bf16::from_f32(x).to_f32());
            } else {
                o[..n].copy_from_slice(&x[..n]);
            }
        }
        (Lane::F(x), LaneMut::D(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as f64),
        (Lane::F(x), LaneMut::I(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as i32),
        (Lane::F(x), LaneMut::B(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x != 0.0),
        (Lane::D(x), LaneMut::F(o)) => {
            if to == DType::BF16 {
                o[..n]
                    .iter_mut()
                    .zip(&x[..n])
                    .for_each(|(o, &x)| *o = bf(x));
            } else {
                o[..n]
                    .iter_mut()
                    .zip(&x[..n])
                    .for_each(|(o, &x)| *o = x as f32);
            }
        }
        (Lane::D(x), LaneMut::D(o)) => o[..n].copy_from_slice(&x[..n]),
        (Lane::D(x), LaneMut::I(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as i32),
        (Lane::D(x), LaneMut::B(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x != 0.0),
        (Lane::I(x), LaneMut::F(o)) => {
            if to == DType::BF16 {
                o[..n]
                    .iter_mut()
                    .zip(&x[..n])
                    .for_each(|(o, &x)| *o = bf(x as f64));
            } else {
                o[..n]
                    .iter_mut()
                    .zip(&x[..n])
                    .for_each(|(o, &x)| *o = x as f32);
            }
        }
        (Lane::I(x), LaneMut::D(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as f64),
        (Lane::I(x), LaneMut::I(o)) => o[..n].copy_from_slice(&x[..n]),
        (Lane::I(x), LaneMut::B(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x != 0),
        (Lane::B(x), LaneMut::F(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as u8 as f32),
        (Lane::B(x), LaneMut::D(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as u8 as f64),
        (Lane::B(x), LaneMut::I(o)) => o[..n]
            .iter_mut()
            .zip(&x[..n])
            .for_each(|(o, &x)| *o = x as i32),
        (Lane::B(x), LaneMut::B(o)) => o[..n].copy_from_slice(&x[..n]),
    }
}

/// `o[i] = (x[i] c y[i]) as f32` (the compare, then its convert), branch-free.
#[inline(always)]
pub(super) fn compare_f32(c: CompareOp, x: &[f32], y: impl Src, o: &mut [f32]) {
    let n = o.len();
    let x = &x[..n];
    macro_rules! go {
        ($op:tt) => {
            for i in 0..n {
                o[i] = sel32(x[i] $op y.at(i), 1.0, 0.0);
            }
        };
    }
    match c {
        CompareOp::Eq => go!(==),
        CompareOp::Ne => go!(!=),
        CompareOp::Lt => go!(<),
        CompareOp::Le => go!(<=),
        CompareOp::Gt => go!(>),
        CompareOp::Ge => go!(>=),
    }
}

/// `o[i] = if x[i] c y[i] { t[i] } else { e[i] }`, branch-free.
#[inline(always)]
pub(super) fn select_cmp(
    c: CompareOp,
    x: &[f32],
    y: impl Src,
    t: impl Src,
    e: impl Src,
    o: &mut [f32],
) {
    let n = o.len();
    let x = &x[..n];
    macro_rules! go {
        ($op:tt) => {
            for i in 0..n {
                o[i] = sel32(x[i] $op y.at(i), t.at(i), e.at(i));
            }
        };
    }
    match c {
        CompareOp::Eq => go!(==),
        CompareOp::Ne => go!(!=),
        CompareOp::Lt => go!(<),
        CompareOp::Le => go!(<=),
        CompareOp::Gt => go!(>),
        CompareOp::Ge => go!(>=),
    }
}
