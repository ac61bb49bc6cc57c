//! The element types of the float paths ([`GemmFloat`]: f32 and f64) and their reusable
//! per-thread buffers (permuted operand copies, result tiles).

use super::scan::fold_nonzero_bits;
use std::cell::RefCell;
use std::ops::{Add, Mul};

/// Element types the float paths run on.
pub trait GemmFloat:
    Copy + Send + Sync + Default + PartialEq + Add<Output = Self> + Mul<Output = Self> + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// Exactly, as f64 (and back: exact for a value that came from this type).
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// One step of a product's chain: `acc + self * x` as the dense path adds it (f32: one
    /// fused multiply-add, as the FMA micro-kernels; f64: a product, then a sum).
    fn chain(self, x: Self, acc: Self) -> Self;
    /// Bit `t` set for each non-zero (NaN included) of the `run.len() <= 64` values.
    fn nonzero_bits64(run: &[Self]) -> u64 {
        fold_nonzero_bits(run)
    }
    /// Run `f` with this thread's two reusable buffers for permuted operand copies (fresh
    /// ones if the thread is already inside a dot, e.g. one that rayon stole while waiting).
    /// Reuse matters: a fresh 32 MiB buffer costs 8192 page faults on every call.
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R;
    /// Run `f` with this thread's reusable `n`-element result tile (a GEMM whose result is
    /// placed through offset tables multiplies into it first); fresh if already in use.
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

thread_local! {
    static SCRATCH_F32: RefCell<(Vec<f32>, Vec<f32>)> = RefCell::default();
    static SCRATCH_F64: RefCell<(Vec<f64>, Vec<f64>)> = RefCell::default();
    static TILE_F32: RefCell<Vec<f32>> = RefCell::default();
    static TILE_F64: RefCell<Vec<f64>> = RefCell::default();
}

pub(super) fn tile<T: Copy + Default, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    n: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < n {
                buf.resize(n, T::default());
            }
            f(&mut buf[..n])
        }
        Err(_) => f(&mut vec![T::default(); n]),
    })
}

pub(super) fn scratch<T, R>(
    key: &'static std::thread::LocalKey<RefCell<(Vec<T>, Vec<T>)>>,
    f: impl FnOnce(&mut Vec<T>, &mut Vec<T>) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let (a, b) = &mut *bufs;
            f(a, b)
        }
        Err(_) => f(&mut Vec::new(), &mut Vec::new()),
    })
}

impl GemmFloat for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn chain(self, x: f32, acc: f32) -> f32 {
        self.mul_add(x, acc)
    }
    /// AVX2 compares and movemasks where the CPU has them (a scalar fold compiles to one
    /// compare per value).
    fn nonzero_bits64(run: &[f32]) -> u64 {
        crate::kernels::sgemm::nonzero_bits64(run).unwrap_or_else(|| fold_nonzero_bits(run))
    }
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> R) -> R {
        scratch(&SCRATCH_F32, f)
    }
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        tile(&TILE_F32, n, f)
    }
}

impl GemmFloat for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
    #[inline(always)]
    fn chain(self, x: f64, acc: f64) -> f64 {
        acc + self * x
    }
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<f64>, &mut Vec<f64>) -> R) -> R {
        scratch(&SCRATCH_F64, f)
    }
    fn with_tile<R>(n: usize, f: impl FnOnce(&mut [f64]) -> R) -> R {
        tile(&TILE_F64, n, f)
    }
}
