//! Scalar rules of the elementwise ops and of reductions, per dtype. Inputs are exact values
//! of the operand dtype held in `f64`; the caller rounds results to the result dtype.
//!
//! Floats (f32, f64, bf16) compute in f64 and round once, which for `+ - * /` and `sqrt`
//! gives exactly the correctly rounded f32/bf16 result; f32 `exp` alone is gshard's own f32
//! rule ([`crate::kernels::vmath::exp_scalar`]), which the executor shares. i32 uses
//! two's-complement wrapping integer arithmetic. bool values are 0 / 1 and follow the float
//! rules followed by `!= 0` (verify only admits `not`, `and`, `or`, compare and select on
//! bool).
//!
//! Choices where `op.rs` leaves freedom:
//! - i32 `div` truncates toward zero, `x / 0 = 0`, `i32::MIN / -1 = i32::MIN` (wrapping);
//!   `rem` has the dividend's sign, `x % 0 = 0`, `i32::MIN % -1 = 0`.
//! - float `rem` is C `fmod` (dividend's sign; `x % 0 = NaN`).
//! - `max` / `min` propagate NaN; `max(-0, +0) = +0`, `min(-0, +0) = -0`.
//! - `sign(x)` is -1, 0 or 1 (keeps the sign of a zero; NaN stays NaN).
//! - `logistic(x) = 1 / (1 + exp(-x))`, evaluated as `exp(x) / (1 + exp(x))` for `x < 0` so
//!   neither branch overflows. `erf` is `libm::erf` (accurate to about 1 ulp).
//! - i32 `neg` / `abs` wrap (`-i32::MIN = i32::MIN`); `not` is bitwise on i32, logical on
//!   bool. Float-only functions applied to an i32 (rejected by verify) compute in f64 and
//!   convert back.
//! - Reductions: `sum` of an empty set is 0, `max` is -inf, `min` is +inf (for i32 these
//!   convert to 0, `i32::MIN`, `i32::MAX`); max/min propagate NaN; i32 sums wrap; float sums
//!   accumulate in f64 and round once.

use ir::{BinaryOp, CompareOp, DType, ReduceOp, UnaryOp};

/// `a > b ? a : b`, NaN-propagating.
pub fn max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && b.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`, NaN-propagating.
pub fn min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

pub fn unary(u: UnaryOp, dtype: DType, x: f64) -> f64 {
    if dtype == DType::I32 {
        let a = x as i32;
        let r = match u {
            UnaryOp::Neg => a.wrapping_neg(),
            UnaryOp::Abs => a.wrapping_abs(),
            UnaryOp::Sign => a.signum(),
            UnaryOp::Not => !a,
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Erf
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Floor => return float_unary(u, x),
        };
        return r as f64;
    }
    if dtype == DType::F32 && matches!(u, UnaryOp::Exp) {
        // gshard's f32 `exp` (the executor's rule, bit for bit).
        return crate::kernels::vmath::exp_scalar(x as f32) as f64;
    }
    float_unary(u, x)
}

fn float_unary(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Logistic => {
            if x >= 0.0 {
                1.0 / (1.0 + (-x).exp())
            } else {
                let e = x.exp();
                e / (1.0 + e)
            }
        }
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Not => (x == 0.0) as u8 as f64,
    }
}

pub fn binary(b: BinaryOp, dtype: DType, x: f64, y: f64) -> f64 {
    if dtype == DType::I32 {
        let (p, q) = (x as i32, y as i32);
        let r = match b {
            BinaryOp::Add => p.wrapping_add(q),
            BinaryOp::Sub => p.wrapping_sub(q),
            BinaryOp::Mul => p.wrapping_mul(q),
            BinaryOp::Div if q == 0 => 0,
            BinaryOp::Div => p.wrapping_div(q),
            BinaryOp::Rem if q == 0 => 0,
            BinaryOp::Rem => p.wrapping_rem(q),
            BinaryOp::Max => p.max(q),
            BinaryOp::Min => p.min(q),
            BinaryOp::And => p & q,
            BinaryOp::Or => p | q,
            BinaryOp::Pow => return float_binary(b, x, y),
        };
        return r as f64;
    }
    float_binary(b, x, y)
}

fn float_binary(b: BinaryOp, x: f64, y: f64) -> f64 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Max => max(x, y),
        BinaryOp::Min => min(x, y),
        BinaryOp::And => (x != 0.0 && y != 0.0) as u8 as f64,
        BinaryOp::Or => (x != 0.0 || y != 0.0) as u8 as f64,
    }
}

/// Comparison of exact values (IEEE: every comparison with NaN is false except `ne`).
pub fn compare(c: CompareOp, x: f64, y: f64) -> f64 {
    let r = match c {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    };
    r as u8 as f64
}

/// Reduce a sequence of `dtype` values with `op` (unrounded; see the module doc).
pub fn reduce(op: ReduceOp, dtype: DType, xs: impl Iterator<Item = f64>) -> f64 {
    match op {
        ReduceOp::Sum if dtype == DType::I32 => {
            xs.fold(0i32, |a, x| a.wrapping_add(x as i32)) as f64
        }
        ReduceOp::Sum => xs.fold(0.0, |a, x| a + x),
        ReduceOp::Max => xs.fold(op.identity(), max),
        ReduceOp::Min => xs.fold(op.identity(), min),
    }
}

/// Sum of products `x * y` (dot-general): wrapping for i32, f64 accumulation otherwise.
pub fn dot(dtype: DType, pairs: impl Iterator<Item = (f64, f64)>) -> f64 {
    if dtype == DType::I32 {
        pairs.fold(0i32, |a, (x, y)| {
            a.wrapping_add((x as i32).wrapping_mul(y as i32))
        }) as f64
    } else {
        pairs.fold(0.0, |a, (x, y)| a + x * y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_division_rules() {
        let d = |x: i32, y: i32| binary(BinaryOp::Div, DType::I32, x as f64, y as f64) as i32;
        let r = |x: i32, y: i32| binary(BinaryOp::Rem, DType::I32, x as f64, y as f64) as i32;
        assert_eq!(d(7, 2), 3);
        assert_eq!(d(-7, 2), -3);
        assert_eq!(d(7, 0), 0);
        assert_eq!(d(i32::MIN, -1), i32::MIN);
        assert_eq!(r(-7, 2), -1);
        assert_eq!(r(7, -2), 1);
        assert_eq!(r(7, 0), 0);
        assert_eq!(r(i32::MIN, -1), 0);
    }

    #[test]
    fn nan_and_zero_handling() {
        assert!(max(f64::NAN, 1.0).is_nan());
        assert!(min(1.0, f64::NAN).is_nan());
        assert!(max(-0.0, 0.0).is_sign_positive());
        assert!(max(0.0, -0.0).is_sign_positive());
        assert!(min(0.0, -0.0).is_sign_negative());
        assert_eq!(unary(UnaryOp::Logistic, DType::F64, -1000.0), 0.0);
        assert_eq!(unary(UnaryOp::Logistic, DType::F64, 1000.0), 1.0);
        assert_eq!(
            reduce(ReduceOp::Max, DType::F32, std::iter::empty()),
            f64::NEG_INFINITY
        );
        assert_eq!(
            reduce(
                ReduceOp::Sum,
                DType::I32,
                [i32::MAX as f64, 1.0].into_iter()
            ),
            i32::MIN as f64
        );
    }
}
