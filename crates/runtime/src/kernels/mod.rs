//! Native kernels of the executor ([`crate::exec`]): every op on typed buffers ([`Data`]),
//! with the reference interpreter's exact semantics (`reference/{eval,scalar}.rs`) and no
//! per-op conversion to f64.
//!
//! - [`elementwise`]: unary/binary/compare/select/convert as *fused groups*: the executor
//!   merges chains of elementwise ops (plus splat constants, iotas and broadcasts feeding
//!   them) of one element count into one pass over L1-sized chunks.
//! - [`dot`]: dot-general normalised to batched `[B,M,K] x [B,K,N]` GEMMs on [`sgemm`] (our
//!   AVX2/FMA micro-kernel for f32, skipping all-zero rows exactly) or the `gemm` crate
//!   (strides where the dims merge, a cache-friendly permuted copy where they do not), the
//!   batch split over the rayon pool, a sparse path for one-hot-ish operands, and a
//!   row-sparse GEMM for ReLU-sparse operands (AVX-512; the dense kernel's bits).
//! - [`layout`]: strided copies (transpose, broadcast, slice family, pad, concatenate,
//!   reverse), iota, constants, the RNG.
//! - [`conv`]: convolution as im2col plus one GEMM through [`dot`].
//! - [`reduce`]: reduce, cumsum, argmax. [`index`]: gather, scatter-add.
//!
//! Numerics (the contract checked by `tests/exec_kernels.rs` against the reference):
//! data movement, integer ops, comparisons and `+ - * / sqrt` are bit-exact; transcendental
//! f32 functions are computed in f64 and rounded once, exactly like the reference, except
//! `exp`, whose f32 rule both share ([`vmath::exp_scalar`], on vector lanes here); f32/bf16
//! sums (reduce, cumsum, scatter-add, all-reduce) accumulate in f64 and round once; dot
//! products and convolutions accumulate in f32 (bf16 operands widened to f32), within 1e-5
//! of the reference relative to `sum |x_i y_i|`.

pub mod conv;
pub mod dot;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod reduce;
pub mod sgemm;
pub mod vmath;

use crate::alloc::AllocError;
use crate::tensor::{f64_to_bf16, Data};
use ir::DType;

/// Element counts above which a kernel splits its work over the rayon pool.
pub const PAR_MIN: usize = 1 << 16;

/// Run `f` compiled for AVX2 when the CPU has it, otherwise as is.
///
/// The project builds for the baseline x86-64 target, where the compiler vectorises with
/// SSE2 only (no 8-lane float or i32 min/max, blends or gathers). Loops written for the
/// auto-vectoriser (fused groups, reductions, argmax, the sparse products) are called through this: `f`
/// and everything it calls that is `#[inline(always)]` are inlined into a function built
/// with AVX2 enabled (callers mark the closure `#[inline(always)]`: a closure left out of
/// line would be compiled for the baseline). The same operations in the same order run
/// either way, so results do not depend on the path.
#[inline(always)]
pub fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        /// # Safety
        /// The CPU supports AVX2.
        #[target_feature(enable = "avx2")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX2 was detected.
        return unsafe { run(f) };
    }
    f()
}

/// [`with_avx2`] with FMA too: `f32::mul_add` inside `f` is then one instruction
/// (vectorised with its loop), not a call to libm's `fmaf`.
#[inline]
pub fn with_avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() && std::is_x86_feature_detected!("fma") {
        /// # Safety
        /// The CPU supports AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { run(f) };
    }
    f()
}

/// Whether this CPU has AVX2 (std caches the detection: one atomic load).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Whether this CPU has AVX-512F (the sixteen-lane kernels: the wide and row-sparse GEMM
/// tiles, argmax rows); `false` off x86-64.
#[inline]
pub(crate) fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Lane mask of the first `n` of 16 lanes (the AVX-512 kernels' masked loads and stores).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn lanes(n: usize) -> std::arch::x86_64::__mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// `match` over the five [`Data`] variants binding the vector as `$v`; `$body` must be
/// generic in the element type.
#[macro_export]
#[doc(hidden)]
macro_rules! with_data {
    ($d:expr, $v:ident => $body:expr) => {
        match $d {
            $crate::tensor::Data::F32($v) => $body,
            $crate::tensor::Data::F64($v) => $body,
            $crate::tensor::Data::BF16($v) => $body,
            $crate::tensor::Data::I32($v) => $body,
            $crate::tensor::Data::Bool($v) => $body,
        }
    };
}

/// Like [`with_data!`] for two buffers that must have the same variant (`$a` read, `$b`
/// written); panics on a dtype mismatch, which the verifier rules out.
#[macro_export]
#[doc(hidden)]
macro_rules! with_data2 {
    ($a:expr, $b:expr, $x:ident, $y:ident => $body:expr) => {
        match ($a, $b) {
            ($crate::tensor::Data::F32($x), $crate::tensor::Data::F32($y)) => $body,
            ($crate::tensor::Data::F64($x), $crate::tensor::Data::F64($y)) => $body,
            ($crate::tensor::Data::BF16($x), $crate::tensor::Data::BF16($y)) => $body,
            ($crate::tensor::Data::I32($x), $crate::tensor::Data::I32($y)) => $body,
            ($crate::tensor::Data::Bool($x), $crate::tensor::Data::Bool($y)) => $body,
            (a, b) => panic!(
                "kernel dtype mismatch: {} vs {} (the verifier should have caught this)",
                a.dtype(),
                b.dtype()
            ),
        }
    };
}

/// A zero-filled buffer of `n` elements, or the error when it cannot be allocated
/// ([`Data::try_zeros`]).
pub fn try_zeros(dtype: DType, n: usize) -> Result<Data, AllocError> {
    Data::try_zeros(dtype, n)
}

/// A zero-filled buffer of `n` elements ([`Data::zeros`]).
pub fn zeros(dtype: DType, n: usize) -> Data {
    Data::zeros(dtype, n)
}

/// Bytes of a buffer's elements.
pub fn bytes(d: &Data) -> usize {
    d.len() * d.dtype().size_bytes()
}

/// The single element of a scalar buffer as an f64 (a start index, a seed, a pad value).
pub fn scalar_f64(d: &Data) -> f64 {
    match d {
        Data::F32(v) => v[0] as f64,
        Data::F64(v) => v[0],
        Data::BF16(v) => v[0].to_f64(),
        Data::I32(v) => v[0] as f64,
        Data::Bool(v) => v[0] as u8 as f64,
    }
}

/// Fill `out` with `x` converted to its dtype by the `convert` rule.
pub fn fill_value(out: &mut Data, x: f64) {
    match out {
        Data::F32(v) => v.fill(x as f32),
        Data::F64(v) => v.fill(x),
        Data::BF16(v) => v.fill(f64_to_bf16(x)),
        Data::I32(v) => v.fill(x as i32),
        Data::Bool(v) => v.fill(x != 0.0),
    }
}

/// Row-major strides of `shape` in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    ir::strides(shape)
}

/// `f(i, x)` for every multi-index of `shape` in row-major order, with the multi-index
/// kept incrementally (never empty shapes; once for a scalar).
pub fn odometer(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut i = vec![0usize; shape.len()];
    loop {
        f(&i);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            i[d] += 1;
            if i[d] < shape[d] {
                break;
            }
            i[d] = 0;
        }
    }
}
