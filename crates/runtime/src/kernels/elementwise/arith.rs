//! The unary and binary rules of fused groups: the reference's f64 rules (bf16 and the
//! transcendental f32 functions but `exp` go through them), the f32 chunk loops (native
//! `+ - * /`, `max`, `min`, the f32 `exp` rule on vector lanes), whose operands are lanes
//! or splat registers ([`Src`]), and the i32 rules (wrapping).

use crate::kernels::reduce::{fmax, fmax32, fmin, fmin32};
use crate::tensor::f64_to_bf16;
use ir::{BinaryOp, UnaryOp};

#[inline]
pub(super) fn bf(x: f64) -> f32 {
    f64_to_bf16(x).to_f32()
}

/// The reference's float unary rule, in f64.
pub fn unary_f64(u: UnaryOp, x: f64) -> f64 {
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

/// The reference's float binary rule, in f64.
pub fn binary_f64(b: BinaryOp, x: f64, y: f64) -> f64 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Max => fmax(x, y),
        BinaryOp::Min => fmin(x, y),
        BinaryOp::And => (x != 0.0 && y != 0.0) as u8 as f64,
        BinaryOp::Or => (x != 0.0 || y != 0.0) as u8 as f64,
    }
}

#[inline(always)]
pub(super) fn unary_f32(u: UnaryOp, x: &[f32], o: &mut [f32]) {
    let it = o.iter_mut().zip(x);
    match u {
        UnaryOp::Neg => it.for_each(|(o, &x)| *o = -x),
        UnaryOp::Abs => it.for_each(|(o, &x)| *o = x.abs()),
        UnaryOp::Sign => it.for_each(|(o, &x)| {
            *o = if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }),
        UnaryOp::Floor => it.for_each(|(o, &x)| *o = x.floor()),
        UnaryOp::Sqrt => it.for_each(|(o, &x)| *o = x.sqrt()),
        // gshard's f32 rule, vectorised (the reference applies its scalar form).
        UnaryOp::Exp => crate::kernels::vmath::exp_f32(x, o),
        UnaryOp::Log
        | UnaryOp::Log1p
        | UnaryOp::Rsqrt
        | UnaryOp::Tanh
        | UnaryOp::Logistic
        | UnaryOp::Erf
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Not => it.for_each(|(o, &x)| *o = unary_f64(u, x as f64) as f32),
    }
}

/// An f32 operand of a chunk loop: a lane (sliced to the chunk), or a splat constant
/// held in a register (no lane to load from).
pub(super) trait Src: Copy {
    fn at(self, i: usize) -> f32;
}

impl Src for &[f32] {
    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        self[i]
    }
}

/// A splat constant as an operand.
#[derive(Clone, Copy)]
pub(super) struct Splat32(pub(super) f32);

impl Src for Splat32 {
    #[inline(always)]
    fn at(self, _: usize) -> f32 {
        self.0
    }
}

/// `$body` with `$f` bound to binary op `$b`'s f32 rule (a closure; one instantiation of
/// the body per op, so its loop has no per-element dispatch).
macro_rules! with_binop {
    ($b:expr, |$f:ident| $body:expr) => {
        match $b {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            BinaryOp::Sub => {
                let $f = |x: f32, y: f32| x - y;
                $body
            }
            BinaryOp::Mul => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            BinaryOp::Div => {
                let $f = |x: f32, y: f32| x / y;
                $body
            }
            BinaryOp::Rem => {
                let $f = |x: f32, y: f32| x % y;
                $body
            }
            BinaryOp::Max => {
                let $f = fmax32;
                $body
            }
            BinaryOp::Min => {
                let $f = fmin32;
                $body
            }
            b @ (BinaryOp::Pow | BinaryOp::And | BinaryOp::Or) => {
                let $f = |x: f32, y: f32| binary_f64(b, x as f64, y as f64) as f32;
                $body
            }
        }
    };
}

#[inline(always)]
pub(super) fn binary_f32(b: BinaryOp, x: impl Src, y: impl Src, o: &mut [f32]) {
    with_binop!(b, |f| for (i, o) in o.iter_mut().enumerate() {
        *o = f(x.at(i), y.at(i));
    })
}

/// `o[i] = o[i] b y[i]` (`SLOT_FIRST`) or `y[i] b o[i]`: [`binary_f32`] over values that
/// are already in the output.
#[inline(always)]
pub(super) fn binary_f32_inplace<const SLOT_FIRST: bool>(b: BinaryOp, o: &mut [f32], y: impl Src) {
    with_binop!(b, |f| for (i, o) in o.iter_mut().enumerate() {
        *o = if SLOT_FIRST {
            f(*o, y.at(i))
        } else {
            f(y.at(i), *o)
        };
    })
}

pub(super) fn unary_i32(u: UnaryOp, x: i32) -> i32 {
    match u {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Sign => x.signum(),
        UnaryOp::Not => !x,
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
        | UnaryOp::Floor => unary_f64(u, x as f64) as i32,
    }
}

pub(super) fn binary_i32(b: BinaryOp, p: i32, q: i32) -> i32 {
    match b {
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
        BinaryOp::Pow => binary_f64(b, p as f64, q as f64) as i32,
    }
}
