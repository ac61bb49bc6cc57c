//! Fused elementwise evaluation.
//!
//! A [`Fused`] group is a small expression DAG (`nodes`, operands before users, the root
//! last) over one flat element index: elementwise ops (unary, binary, compare, select,
//! convert), leaves that read an external buffer elementwise ([`Node::Input`]) or through a
//! broadcast index map ([`Node::Broadcast`]), and generated leaves ([`Node::Splat`],
//! [`Node::Iota`]). The executor builds groups from chains of elementwise ops, reshapes and
//! copies (identities here) of one element count: every intermediate of the chain stays in
//! an L1-sized scratch chunk ([`CHUNK`] elements) and only the root is written to memory.
//! The output is split into tasks on the rayon pool when large. Inputs whose values are
//! their own lane (all but bf16) are read in place, and a computed root is written straight
//! into the output, so a chunk costs no copies; on CPUs with AVX2 the whole evaluation is
//! compiled a second time for AVX2 (eight lanes per instruction, the same operations in the
//! same order: identical values) and chosen at run time. Splat constants that are operands of
//! f32 binaries, compares and selects are read as registers (no lane loads), and an f32
//! binary root whose other operand is the in-place input (a GEMM epilogue's `dot * x`,
//! `max(dot, 0)`) computes straight from the output chunk, without copying it to scratch.
//! Two groups have one-pass kernels of their own: the ReLU epilogue `max(x, +0)` (or its
//! coded form) over the in-place input (about 10 us against 2 for 64K values on a Zen 5
//! core), and the ReLU's derivative applied to a gradient
//! (`g * select(d > 0, 1, select(d == 0, 0.5, 0))`, the expert's backward epilogue), which the
//! interpreter would run as seven passes per chunk (27-38 us against 9 us for 64K elements).
//!
//! Scratch types: f32 and bf16 values live in `f32` lanes (bf16 values are exact in f32),
//! f64 in `f64`, i32 in `i32`, bool in `bool`. Rounding follows the reference exactly:
//! f32 `+ - * /`, `rem`, `sqrt`, `floor`, `abs`, `neg`, `sign`, `max`, `min` and compares
//! are native (equal to the f64-then-round result); other f32 functions are computed in f64
//! and rounded once; every bf16 op is computed in f64 and rounded to bf16 once.

use super::reduce::{fmax, fmax32, fmin, fmin32, sel32};
use super::PAR_MIN;
use crate::tensor::{f64_to_bf16, Data};
use half::bf16;
use ir::{BinaryOp, CompareOp, DType, UnaryOp};
use rayon::prelude::*;

/// Elements per scratch chunk.
pub const CHUNK: usize = 1024;

/// One node of a fused group; operands are indices of earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// Element `i` of external input `k`.
    Input(usize),
    /// A constant (converted to the node's dtype).
    Splat(f64),
    /// `(i / stride) % size`.
    Iota {
        stride: usize,
        size: usize,
    },
    /// External input `input` read through a broadcast: element `i` of the collapsed
    /// `shape` reads `sum idx[d] * st[d]`.
    Broadcast {
        input: usize,
        shape: Vec<usize>,
        st: Vec<usize>,
    },
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Compare(CompareOp, usize, usize),
    Select(usize, usize, usize),
    Convert(usize),
    /// f32: `max(x, 0)`, but `-0` where `x < 0` (a ReLU whose zeros keep whether the input
    /// was zero or negative; see the executor's coded ReLUs).
    ReluCode(usize),
    /// f32: `-1` where `x` is `-0`, else `x`: the pre-activation of a [`Node::ReluCode`] as
    /// every compare with zero sees it.
    ReluDecode(usize),
}

/// A fused elementwise group producing `len` elements; the root is the last node.
#[derive(Clone, Debug, PartialEq)]
pub struct Fused {
    pub len: usize,
    pub nodes: Vec<(Node, DType)>,
    pub n_inputs: usize,
}

impl Fused {
    /// Short description for profiles: the op names of the group.
    pub fn ops(&self) -> usize {
        self.nodes
            .iter()
            .filter(|(n, _)| {
                !matches!(
                    n,
                    Node::Input(_) | Node::Splat(_) | Node::Iota { .. } | Node::Broadcast { .. }
                )
            })
            .count()
    }
}

/// Collapse a broadcast map: drop size-1 dims, merge dims contiguous in the operand (or
/// both repeated).
pub fn collapse_broadcast(shape: &[usize], st: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut sh: Vec<usize> = Vec::new();
    let mut ss: Vec<usize> = Vec::new();
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let (Some(n), Some(s)) = (sh.last_mut(), ss.last_mut()) {
            if *s == st[d] * shape[d] {
                *n *= shape[d];
                *s = st[d];
                continue;
            }
        }
        sh.push(shape[d]);
        ss.push(st[d]);
    }
    (sh, ss)
}

enum Sc {
    F(Vec<f32>),
    D(Vec<f64>),
    I(Vec<i32>),
    B(Vec<bool>),
}

/// A node's values over the current chunk, read-only: its scratch, or an input read in place.
#[derive(Clone, Copy)]
enum Lane<'a> {
    F(&'a [f32]),
    D(&'a [f64]),
    I(&'a [i32]),
    B(&'a [bool]),
}

/// Where a node's values over the current chunk go: its scratch, or the output itself.
enum LaneMut<'a> {
    F(&'a mut [f32]),
    D(&'a mut [f64]),
    I(&'a mut [i32]),
    B(&'a mut [bool]),
}

impl Sc {
    fn lane(&self, n: usize) -> Lane<'_> {
        match self {
            Sc::F(x) => Lane::F(&x[..n]),
            Sc::D(x) => Lane::D(&x[..n]),
            Sc::I(x) => Lane::I(&x[..n]),
            Sc::B(x) => Lane::B(&x[..n]),
        }
    }
    fn lane_mut(&mut self, n: usize) -> LaneMut<'_> {
        match self {
            Sc::F(x) => LaneMut::F(&mut x[..n]),
            Sc::D(x) => LaneMut::D(&mut x[..n]),
            Sc::I(x) => LaneMut::I(&mut x[..n]),
            Sc::B(x) => LaneMut::B(&mut x[..n]),
        }
    }
}

/// Elements `start..start + n` of an input whose values are their own lane (everything but
/// bf16, which is widened into scratch): read in place, no copy.
fn in_place(d: &Data, start: usize, n: usize) -> Option<Lane<'_>> {
    let r = start..start + n;
    match d {
        Data::F32(v) => Some(Lane::F(&v[r])),
        Data::F64(v) => Some(Lane::D(&v[r])),
        Data::I32(v) => Some(Lane::I(&v[r])),
        Data::Bool(v) => Some(Lane::B(&v[r])),
        Data::BF16(_) => None,
    }
}

fn scratch(dt: DType) -> Sc {
    match dt {
        DType::F32 | DType::BF16 => Sc::F(vec![0.0; CHUNK]),
        DType::F64 => Sc::D(vec![0.0; CHUNK]),
        DType::I32 => Sc::I(vec![0; CHUNK]),
        DType::Bool => Sc::B(vec![false; CHUNK]),
    }
}

thread_local! {
    /// Scratch lanes of finished evaluations on this thread, for the next one: a group run
    /// on many small parts (a GEMM epilogue per expert, a small group per step) would
    /// otherwise allocate and zero a lane per node per part.
    static SPARE: std::cell::RefCell<Vec<Sc>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One scratch lane per node of `f` (from this thread's spares where possible). Contents
/// are arbitrary: every lane is written before it is read (as between chunks).
fn take_scratch(f: &Fused) -> Vec<Sc> {
    SPARE.with(|cell| {
        let Ok(mut spare) = cell.try_borrow_mut() else {
            return f.nodes.iter().map(|(_, dt)| scratch(*dt)).collect();
        };
        f.nodes
            .iter()
            .map(|(_, dt)| {
                let fits = |s: &Sc| {
                    matches!(
                        (s, dt),
                        (Sc::F(_), DType::F32 | DType::BF16)
                            | (Sc::D(_), DType::F64)
                            | (Sc::I(_), DType::I32)
                            | (Sc::B(_), DType::Bool)
                    )
                };
                match spare.iter().rposition(fits) {
                    Some(i) => spare.swap_remove(i),
                    None => scratch(*dt),
                }
            })
            .collect()
    })
}

/// Keep the lanes for the next evaluation on this thread (a bounded number).
fn give_scratch(sc: Vec<Sc>) {
    SPARE.with(|cell| {
        if let Ok(mut spare) = cell.try_borrow_mut() {
            for s in sc {
                if spare.len() < 64 {
                    spare.push(s);
                }
            }
        }
    });
}

#[inline]
fn bf(x: f64) -> f32 {
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
fn unary_f32(u: UnaryOp, x: &[f32], o: &mut [f32]) {
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
        // Vectorised, bit-identical to the f64 rule below.
        UnaryOp::Exp => super::vmath::exp_f32(x, o),
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
trait Src: Copy {
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
struct Splat32(f32);

impl Src for Splat32 {
    #[inline(always)]
    fn at(self, _: usize) -> f32 {
        self.0
    }
}

/// The value of node `j` when it is an f32 splat (its lane holds that value everywhere).
fn splat_of(f: &Fused, j: usize) -> Option<Splat32> {
    match f.nodes[j] {
        (Node::Splat(x), DType::F32) => Some(Splat32(x as f32)),
        _ => None,
    }
}

/// Run `$body` with `$v` bound to node `$j`'s operand: its splat value when it is one, else
/// its lane `$lane` sliced to `$n` (each choice a separate instantiation of the body).
macro_rules! with_src {
    ($f:expr, $j:expr, $lane:expr, $n:expr, |$v:ident| $body:expr) => {
        match splat_of($f, $j) {
            Some($v) => $body,
            None => {
                let $v: &[f32] = &$lane[..$n];
                $body
            }
        }
    };
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
fn binary_f32(b: BinaryOp, x: impl Src, y: impl Src, o: &mut [f32]) {
    with_binop!(b, |f| for (i, o) in o.iter_mut().enumerate() {
        *o = f(x.at(i), y.at(i));
    })
}

/// `o[i] = o[i] b y[i]` (`SLOT_FIRST`) or `y[i] b o[i]`: [`binary_f32`] over values that
/// are already in the output.
#[inline(always)]
fn binary_f32_inplace<const SLOT_FIRST: bool>(b: BinaryOp, o: &mut [f32], y: impl Src) {
    with_binop!(b, |f| for (i, o) in o.iter_mut().enumerate() {
        *o = if SLOT_FIRST {
            f(*o, y.at(i))
        } else {
            f(y.at(i), *o)
        };
    })
}

fn unary_i32(u: UnaryOp, x: i32) -> i32 {
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

fn binary_i32(b: BinaryOp, p: i32, q: i32) -> i32 {
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

#[inline(always)]
fn compare<T: PartialOrd + Copy>(c: CompareOp, x: &[T], y: &[T], o: &mut [bool]) {
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
trait Select: Copy {
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
fn select<T: Select>(p: &[bool], t: &[T], f: &[T], o: &mut [T]) {
    let n = o.len();
    let (p, t, f) = (&p[..n], &t[..n], &f[..n]);
    for i in 0..n {
        o[i] = T::pick(p[i], t[i], f[i]);
    }
}

/// Convert a chunk from `from` to `to` (the `convert` rule).
#[inline(always)]
fn convert(from: DType, to: DType, x: Lane<'_>, o: LaneMut<'_>, n: usize) {
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

/// Copy `n` elements of `src` from `start` into a scratch chunk.
#[inline(always)]
fn load(src: &Data, start: usize, n: usize, o: LaneMut<'_>) {
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
fn load_run(src: &Data, off: usize, stride: usize, m: usize, o: LaneMut<'_>, at: usize) {
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
fn load_broadcast(
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
fn short_rows<T: Copy, U: Copy, const L: usize>(
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
fn walk_broadcast<T: Copy, U: Copy>(
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
fn advance(idx: &mut [usize], off: &mut usize, shape: &[usize], st: &[usize], d: usize, k: usize) {
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
fn fill_splat(x: f64, dt: DType, o: LaneMut<'_>) {
    match o {
        LaneMut::F(o) => o.fill(if dt == DType::BF16 { bf(x) } else { x as f32 }),
        LaneMut::D(o) => o.fill(x),
        LaneMut::I(o) => o.fill(x as i32),
        LaneMut::B(o) => o.fill(x != 0.0),
    }
}

#[inline(always)]
fn iota_chunk(stride: usize, size: usize, dt: DType, start: usize, o: LaneMut<'_>) {
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

/// How a node is evaluated per chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Plan {
    /// Into its scratch (or the output, for the root).
    Eval,
    /// An input read in place: nothing to do.
    Direct,
    /// A compare of f32 lanes whose only user is an f32 select or convert, which evaluates
    /// it in the same loop (no bool lane in between).
    Folded,
    /// The in-place input (f32) whose only user is the root: never copied into scratch.
    Slot,
    /// An f32 binary root with the `Slot` as one operand: evaluated straight from the
    /// output chunk that holds the slot's values (or from the values given for it) into
    /// the output chunk.
    SlotRoot,
}

/// The plan of each node: inputs read in place, compares folded into their user.
fn plan(f: &Fused, inputs: &[&Data], inplace: Option<usize>) -> Vec<Plan> {
    let mut users = vec![0usize; f.nodes.len()];
    let mut user = vec![usize::MAX; f.nodes.len()];
    for (j, (node, _)) in f.nodes.iter().enumerate() {
        let ops: &[usize] = match node {
            Node::Unary(_, a) | Node::Convert(a) | Node::ReluCode(a) | Node::ReluDecode(a) => {
                std::slice::from_ref(a)
            }
            Node::Binary(_, a, b) | Node::Compare(_, a, b) => &[*a, *b],
            Node::Select(p, t, e) => &[*p, *t, *e],
            _ => &[],
        };
        for &a in ops {
            users[a] += 1;
            user[a] = j;
        }
    }
    let f32_lane = |j: usize| matches!(f.nodes[j].1, DType::F32 | DType::BF16);
    let root = f.nodes.len() - 1;
    f.nodes
        .iter()
        .enumerate()
        .map(|(j, (node, _))| match node {
            Node::Input(k) if Some(*k) != inplace && in_place(inputs[*k], 0, 0).is_some() => {
                Plan::Direct
            }
            Node::Compare(_, x, y)
                if j != root && users[j] == 1 && f32_lane(*x) && f32_lane(*y) =>
            {
                let u = user[j];
                match (&f.nodes[u].0, f.nodes[u].1) {
                    (Node::Select(p, t, e), DType::F32) if *p == j && *t != j && *e != j => {
                        Plan::Folded
                    }
                    (Node::Convert(_), DType::F32) => Plan::Folded,
                    _ => Plan::Eval,
                }
            }
            _ => Plan::Eval,
        })
        .collect()
}

/// `o[i] = (x[i] c y[i]) as f32` (the compare, then its convert), branch-free.
#[inline(always)]
fn compare_f32(c: CompareOp, x: &[f32], y: impl Src, o: &mut [f32]) {
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
fn select_cmp(c: CompareOp, x: &[f32], y: impl Src, t: impl Src, e: impl Src, o: &mut [f32]) {
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

/// Evaluate one chunk (`n` elements from `start`) of every node into its scratch `sc[j]`,
/// except inputs read in place (`direct[j]`) and the root when `root` is given (written
/// there: the output itself). Splats are pre-filled once per task (never the root here).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn eval_chunk(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    n: usize,
    sc: &mut [Sc],
    plan: &[Plan],
    inplace: Option<usize>,
    mut root: Option<LaneMut<'_>>,
    slot_vals: Option<&[f32]>,
) {
    let last = f.nodes.len() - 1;
    for (j, (node, dt)) in f.nodes.iter().enumerate() {
        if plan[j] == Plan::SlotRoot {
            let (Node::Binary(b, x, y), Some(LaneMut::F(o))) = (node, root.take()) else {
                unreachable!("a slot root is an f32 binary written into the output")
            };
            let slot_first = plan[*x] == Plan::Slot;
            let other = if slot_first { *y } else { *x };
            let lane = match plan[other] {
                Plan::Direct => {
                    let Node::Input(k) = f.nodes[other].0 else {
                        unreachable!("only inputs are read in place")
                    };
                    in_place(inputs[k], start, n).expect("a direct input has its own lane")
                }
                _ => sc[other].lane(n),
            };
            let Lane::F(v) = lane else {
                unreachable!("a slot root reads f32 lanes")
            };
            with_src!(f, other, v, n, |v| match (slot_vals, slot_first) {
                (Some(x), true) => binary_f32(*b, &x[..n], v, o),
                (Some(x), false) => binary_f32(*b, v, &x[..n], o),
                (None, true) => binary_f32_inplace::<true>(*b, o, v),
                (None, false) => binary_f32_inplace::<false>(*b, o, v),
            });
            continue;
        }
        if plan[j] != Plan::Eval {
            continue;
        }
        let (before, rest) = sc.split_at_mut(j);
        let get = |a: usize| -> Lane<'_> {
            if plan[a] == Plan::Direct {
                let Node::Input(k) = f.nodes[a].0 else {
                    unreachable!("only inputs are read in place")
                };
                in_place(inputs[k], start, n).expect("a direct input has its own lane")
            } else {
                before[a].lane(n)
            }
        };
        let o = match root.take() {
            Some(r) if j == last => r,
            r => {
                root = r;
                rest[0].lane_mut(n)
            }
        };
        eval_node(f, node, *dt, &get, plan, o, inputs, start, n, inplace);
    }
}

/// One node over one chunk: operands through `get`, values into `o`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn eval_node<'a>(
    f: &Fused,
    node: &Node,
    dt: DType,
    get: &impl Fn(usize) -> Lane<'a>,
    plan: &[Plan],
    o: LaneMut<'_>,
    inputs: &[&Data],
    start: usize,
    n: usize,
    inplace: Option<usize>,
) {
    match node {
        Node::Input(k) if Some(*k) == inplace => {} // loaded from the output chunk
        Node::Input(k) => load(inputs[*k], start, n, o),
        Node::Splat(_) => {} // filled once per task
        Node::Iota { stride, size } => iota_chunk(*stride, *size, dt, start, o),
        Node::Broadcast { input, shape, st } => {
            load_broadcast(inputs[*input], shape, st, start, n, o)
        }
        Node::Unary(u, a) => match (get(*a), o) {
            (Lane::F(x), LaneMut::F(o)) if dt == DType::BF16 => o
                .iter_mut()
                .zip(x)
                .for_each(|(o, &x)| *o = bf(unary_f64(*u, x as f64))),
            (Lane::F(x), LaneMut::F(o)) => unary_f32(*u, x, o),
            (Lane::D(x), LaneMut::D(o)) => o
                .iter_mut()
                .zip(x)
                .for_each(|(o, &x)| *o = unary_f64(*u, x)),
            (Lane::I(x), LaneMut::I(o)) => o
                .iter_mut()
                .zip(x)
                .for_each(|(o, &x)| *o = unary_i32(*u, x)),
            (Lane::B(x), LaneMut::B(o)) => o.iter_mut().zip(x).for_each(|(o, &x)| {
                *o = match u {
                    UnaryOp::Not => !x,
                    _ => unary_f64(*u, x as u8 as f64) != 0.0,
                }
            }),
            _ => panic!("unary lanes mismatch"),
        },
        Node::Binary(b, a, c) => match (get(*a), get(*c), o) {
            (Lane::F(x), Lane::F(y), LaneMut::F(o)) if dt == DType::BF16 => {
                for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                    *o = bf(binary_f64(*b, x as f64, y as f64));
                }
            }
            (Lane::F(x), Lane::F(y), LaneMut::F(o)) => {
                let n = o.len();
                match (splat_of(f, *a), splat_of(f, *c)) {
                    (None, Some(y)) => binary_f32(*b, &x[..n], y, o),
                    (Some(x), None) => binary_f32(*b, x, &y[..n], o),
                    _ => binary_f32(*b, &x[..n], &y[..n], o),
                }
            }
            (Lane::D(x), Lane::D(y), LaneMut::D(o)) => {
                for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                    *o = binary_f64(*b, x, y);
                }
            }
            (Lane::I(x), Lane::I(y), LaneMut::I(o)) => {
                let it = o.iter_mut().zip(x.iter().zip(y));
                match b {
                    BinaryOp::Add => it.for_each(|(o, (&x, &y))| *o = x.wrapping_add(y)),
                    BinaryOp::Sub => it.for_each(|(o, (&x, &y))| *o = x.wrapping_sub(y)),
                    BinaryOp::Mul => it.for_each(|(o, (&x, &y))| *o = x.wrapping_mul(y)),
                    _ => it.for_each(|(o, (&x, &y))| *o = binary_i32(*b, x, y)),
                }
            }
            (Lane::B(x), Lane::B(y), LaneMut::B(o)) => {
                let it = o.iter_mut().zip(x.iter().zip(y));
                match b {
                    BinaryOp::And => it.for_each(|(o, (&x, &y))| *o = x & y),
                    BinaryOp::Or => it.for_each(|(o, (&x, &y))| *o = x | y),
                    _ => it.for_each(|(o, (&x, &y))| {
                        *o = binary_f64(*b, x as u8 as f64, y as u8 as f64) != 0.0
                    }),
                }
            }
            _ => panic!("binary lanes mismatch"),
        },
        Node::Compare(c, a, b) => {
            let LaneMut::B(o) = o else {
                panic!("compare writes bool")
            };
            match (get(*a), get(*b)) {
                (Lane::F(x), Lane::F(y)) => compare(*c, x, y, o),
                (Lane::D(x), Lane::D(y)) => compare(*c, x, y, o),
                (Lane::I(x), Lane::I(y)) => compare(*c, x, y, o),
                (Lane::B(x), Lane::B(y)) => compare(*c, x, y, o),
                _ => panic!("compare lanes mismatch"),
            }
        }
        Node::Select(p, tj, ej) if plan[*p] == Plan::Folded => {
            let (Node::Compare(c, xj, yj), LaneMut::F(o)) = (&f.nodes[*p].0, o) else {
                unreachable!("only f32 compares are folded into an f32 select")
            };
            let (Lane::F(x), Lane::F(y), Lane::F(t), Lane::F(e)) =
                (get(*xj), get(*yj), get(*tj), get(*ej))
            else {
                unreachable!("a folded compare and its select read f32 lanes")
            };
            let n = o.len();
            // Splat operands are read as registers (8 instantiations).
            with_src!(f, *yj, y, n, |y| with_src!(f, *tj, t, n, |t| with_src!(
                f,
                *ej,
                e,
                n,
                |e| select_cmp(*c, x, y, t, e, o)
            )))
        }
        Node::Convert(a) if plan[*a] == Plan::Folded => {
            let (Node::Compare(c, xj, yj), LaneMut::F(o)) = (&f.nodes[*a].0, o) else {
                unreachable!("only f32 compares are folded into an f32 convert")
            };
            let (Lane::F(x), Lane::F(y)) = (get(*xj), get(*yj)) else {
                unreachable!("a folded compare reads f32 lanes")
            };
            let n = o.len();
            with_src!(f, *yj, y, n, |y| compare_f32(*c, x, y, o))
        }
        Node::Select(p, t, e) => {
            let Lane::B(p) = get(*p) else {
                panic!("select predicate is bool")
            };
            match (get(*t), get(*e), o) {
                (Lane::F(t), Lane::F(e), LaneMut::F(o)) => select(p, t, e, o),
                (Lane::D(t), Lane::D(e), LaneMut::D(o)) => select(p, t, e, o),
                (Lane::I(t), Lane::I(e), LaneMut::I(o)) => select(p, t, e, o),
                (Lane::B(t), Lane::B(e), LaneMut::B(o)) => select(p, t, e, o),
                _ => panic!("select lanes mismatch"),
            }
        }
        Node::Convert(a) => convert(f.nodes[*a].1, dt, get(*a), o, n),
        Node::ReluCode(a) => {
            let (Lane::F(x), LaneMut::F(o)) = (get(*a), o) else {
                panic!("a coded ReLU reads and writes f32")
            };
            for (o, &x) in o.iter_mut().zip(x) {
                *o = relu_code(x);
            }
        }
        Node::ReluDecode(a) => {
            let (Lane::F(x), LaneMut::F(o)) = (get(*a), o) else {
                panic!("a coded ReLU's decode reads and writes f32")
            };
            for (o, &x) in o.iter_mut().zip(x) {
                *o = relu_decode(x);
            }
        }
    }
}

/// Stores a scratch chunk into an output buffer of one dtype.
trait Store: Copy + Send + Sync {
    /// Whether the root can be evaluated straight into an output chunk of this type.
    const DIRECT: bool;
    /// The output chunk as the root's lane (only called when `DIRECT`).
    fn direct(o: &mut [Self]) -> LaneMut<'_>;
    fn store(sc: &Sc, o: &mut [Self]);
    /// The inverse of `store` (for in-place evaluation).
    fn load(x: &[Self], sc: &mut Sc);
}

impl Store for f32 {
    const DIRECT: bool = true;
    #[inline(always)]
    fn direct(o: &mut [f32]) -> LaneMut<'_> {
        LaneMut::F(o)
    }
    #[inline(always)]
    fn store(sc: &Sc, o: &mut [f32]) {
        let Sc::F(x) = sc else { panic!("f32 lane") };
        o.copy_from_slice(&x[..o.len()]);
    }
    #[inline(always)]
    fn load(x: &[f32], sc: &mut Sc) {
        let Sc::F(o) = sc else { panic!("f32 lane") };
        o[..x.len()].copy_from_slice(x);
    }
}
impl Store for bf16 {
    const DIRECT: bool = false;
    fn direct(_: &mut [bf16]) -> LaneMut<'_> {
        unreachable!("bf16 values are rounded from an f32 lane")
    }
    #[inline(always)]
    fn store(sc: &Sc, o: &mut [bf16]) {
        let Sc::F(x) = sc else { panic!("bf16 lane") };
        o.iter_mut()
            .zip(x)
            .for_each(|(o, &x)| *o = bf16::from_f32(x));
    }
    #[inline(always)]
    fn load(x: &[bf16], sc: &mut Sc) {
        let Sc::F(o) = sc else { panic!("bf16 lane") };
        o.iter_mut().zip(x).for_each(|(o, x)| *o = x.to_f32());
    }
}
impl Store for f64 {
    const DIRECT: bool = true;
    #[inline(always)]
    fn direct(o: &mut [f64]) -> LaneMut<'_> {
        LaneMut::D(o)
    }
    #[inline(always)]
    fn store(sc: &Sc, o: &mut [f64]) {
        let Sc::D(x) = sc else { panic!("f64 lane") };
        o.copy_from_slice(&x[..o.len()]);
    }
    #[inline(always)]
    fn load(x: &[f64], sc: &mut Sc) {
        let Sc::D(o) = sc else { panic!("f64 lane") };
        o[..x.len()].copy_from_slice(x);
    }
}
impl Store for i32 {
    const DIRECT: bool = true;
    #[inline(always)]
    fn direct(o: &mut [i32]) -> LaneMut<'_> {
        LaneMut::I(o)
    }
    #[inline(always)]
    fn store(sc: &Sc, o: &mut [i32]) {
        let Sc::I(x) = sc else { panic!("i32 lane") };
        o.copy_from_slice(&x[..o.len()]);
    }
    #[inline(always)]
    fn load(x: &[i32], sc: &mut Sc) {
        let Sc::I(o) = sc else { panic!("i32 lane") };
        o[..x.len()].copy_from_slice(x);
    }
}
impl Store for bool {
    const DIRECT: bool = true;
    #[inline(always)]
    fn direct(o: &mut [bool]) -> LaneMut<'_> {
        LaneMut::B(o)
    }
    #[inline(always)]
    fn store(sc: &Sc, o: &mut [bool]) {
        let Sc::B(x) = sc else { panic!("bool lane") };
        o.copy_from_slice(&x[..o.len()]);
    }
    #[inline(always)]
    fn load(x: &[bool], sc: &mut Sc) {
        let Sc::B(o) = sc else { panic!("bool lane") };
        o[..x.len()].copy_from_slice(x);
    }
}

/// [`Node::ReluCode`] of one value: `max(x, 0)`, but `-0` where `x < 0`.
#[inline(always)]
fn relu_code(x: f32) -> f32 {
    sel32(x < 0.0, -0.0, fmax32(x, 0.0))
}

/// [`Node::ReluDecode`] of one value: `-1` where `x` is `-0` (a negative pre-activation),
/// else `x`.
#[inline(always)]
fn relu_decode(x: f32) -> f32 {
    sel32(x.to_bits() == 0x8000_0000, -1.0, x)
}

/// A group with a one-pass kernel of its own, the ReLU's derivative applied to a gradient:
/// `g * select(d > c1, t, select(d == c2, u, v))` (the product in either order: it commutes),
/// `g` and `d` f32 inputs, `d` read as is or through [`Node::ReluDecode`] (a coded ReLU), `c1, c2, t, u,
/// v` f32 splats. The interpreter runs it as seven passes over each chunk; this is one, with
/// the same operations on every element (the same values).
#[derive(Clone, Copy, Debug, PartialEq)]
struct ReluGrad {
    /// The input holding `g`.
    g: usize,
    /// The input holding `d`, and whether it is read through a decode.
    d: usize,
    coded: bool,
    c1: f32,
    c2: f32,
    t: f32,
    u: f32,
    v: f32,
}

/// `o[i] = f(x[i])` with `x` the values `pre` when given, else `o`'s own (in place).
#[inline(always)]
fn map_in_place(o: &mut [f32], pre: Option<&[f32]>, f: impl Fn(f32) -> f32) {
    match pre {
        Some(x) => o.iter_mut().zip(x).for_each(|(d, &v)| *d = f(v)),
        None => o.iter_mut().for_each(|d| *d = f(*d)),
    }
}

/// The forms of a ReLU epilogue with a one-pass kernel ([`relu_in_place_of`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Relu {
    /// `max(x, +0)`.
    InputFirst,
    /// `max(+0, x)`.
    ZeroFirst,
    /// The coded ReLU of `x` ([`Node::ReluCode`]).
    Coded,
}

/// Whether the group is a ReLU of the f32 in-place input `x` alone, `max(x, +0)` (either
/// operand order) or coded: one pass over the output, where the chunk evaluator takes
/// several (about 10 us against 2 for 64K values on a Zen 5 core).
fn relu_in_place_of(f: &Fused, inplace: Option<usize>) -> Option<Relu> {
    let k = inplace?;
    let input = |n: &Node| *n == Node::Input(k);
    match f.nodes.as_slice() {
        [(a, DType::F32), (Node::ReluCode(0), DType::F32)] if input(a) => Some(Relu::Coded),
        [(a, DType::F32), (b, DType::F32), (Node::Binary(BinaryOp::Max, x, y), DType::F32)] => {
            let zero = |n: &Node| matches!(n, Node::Splat(z) if z.to_bits() == 0);
            let input_at = if input(a) && zero(b) {
                0
            } else if zero(a) && input(b) {
                1
            } else {
                return None;
            };
            match (*x, *y) {
                (0, 1) | (1, 0) if *x == input_at => Some(Relu::InputFirst),
                (0, 1) | (1, 0) => Some(Relu::ZeroFirst),
                _ => None,
            }
        }
        _ => None,
    }
}

fn relu_grad_of(f: &Fused) -> Option<ReluGrad> {
    let node = |j: usize| &f.nodes[j];
    let splat = |j: usize| splat_of(f, j).map(|s| s.0);
    let f32_input = |j: usize| match node(j) {
        (Node::Input(k), DType::F32) => Some(*k),
        _ => None,
    };
    let (Node::Binary(BinaryOp::Mul, x, y), DType::F32) = node(f.nodes.len() - 1) else {
        return None;
    };
    let (g, sel) = match (f32_input(*x), f32_input(*y)) {
        (Some(g), _) => (g, *y),
        (None, Some(g)) => (g, *x),
        _ => return None,
    };
    let (Node::Select(p1, a1, b1), DType::F32) = node(sel) else {
        return None;
    };
    let (Node::Select(p2, a2, b2), DType::F32) = node(*b1) else {
        return None;
    };
    let (Node::Compare(CompareOp::Gt, d1, k1), DType::Bool) = node(*p1) else {
        return None;
    };
    let (Node::Compare(CompareOp::Eq, d2, k2), DType::Bool) = node(*p2) else {
        return None;
    };
    if d1 != d2 {
        return None;
    }
    let (d, coded) = match node(*d1) {
        (Node::ReluDecode(m), DType::F32) => (f32_input(*m)?, true),
        _ => (f32_input(*d1)?, false),
    };
    Some(ReluGrad {
        g,
        d,
        coded,
        c1: splat(*k1)?,
        c2: splat(*k2)?,
        t: splat(*a1)?,
        u: splat(*a2)?,
        v: splat(*b2)?,
    })
}

/// [`ReluGrad`] over one range: `g` from `gs` (or `o` itself when `None`), `d` from `ds`.
#[inline(always)]
fn relu_grad(r: &ReluGrad, ds: &[f32], gs: Option<&[f32]>, o: &mut [f32]) {
    let n = o.len();
    let ds = &ds[..n];
    let factor = |x: f32| {
        let d = if r.coded { relu_decode(x) } else { x };
        sel32(d > r.c1, r.t, sel32(d == r.c2, r.u, r.v))
    };
    match gs {
        Some(gs) => {
            let gs = &gs[..n];
            for i in 0..n {
                o[i] = gs[i] * factor(ds[i]);
            }
        }
        None => {
            for i in 0..n {
                o[i] *= factor(ds[i]);
            }
        }
    }
}

/// Run `f` over `start..start + out.len()` with its one-pass kernel when it has one (an
/// f32 output, inputs stored as f32). Returns whether it ran. The group is matched on each
/// call, as `plan` is: a few node lookups (most groups fail at the root) against at least
/// one chunk of elements.
fn run_special<T: Store>(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [T],
    inplace: Option<usize>,
    pre: Option<&[f32]>,
) -> bool {
    if !T::DIRECT || out.len() < CHUNK {
        return false;
    }
    if let Some(form) = relu_in_place_of(f, inplace) {
        let LaneMut::F(o) = T::direct(out) else {
            return false;
        };
        // One loop per form, so that each vectorises without a per-element branch; the
        // node's own operand order (`fmax32` is symmetric but for which NaN it keeps).
        super::with_avx2(
            #[inline(always)]
            || match form {
                Relu::InputFirst => map_in_place(o, pre, |v| fmax32(v, 0.0)),
                Relu::ZeroFirst => map_in_place(o, pre, |v| fmax32(0.0, v)),
                Relu::Coded => map_in_place(o, pre, relu_code),
            },
        );
        return true;
    }
    let Some(r) = relu_grad_of(f) else {
        return false;
    };
    let LaneMut::F(o) = T::direct(out) else {
        return false;
    };
    // `d` must be read from its input (the in-place one's is ignored), stored as f32.
    let range = start..start + o.len();
    let (false, Data::F32(ds)) = (Some(r.d) == inplace, inputs[r.d]) else {
        return false;
    };
    let gs = if Some(r.g) == inplace {
        pre
    } else {
        match inputs[r.g] {
            Data::F32(g) => Some(&g[range.clone()]),
            _ => return false,
        }
    };
    super::with_avx2(
        #[inline(always)]
        || relu_grad(&r, &ds[range], gs, o),
    );
    true
}

/// Evaluate elements `start..start + out.len()` into `out`. Input `inplace` (read only as
/// `Node::Input`) comes from `pre` (its values over the same range) or, without one, from
/// `out` itself.
fn run_range<T: Store>(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [T],
    inplace: Option<usize>,
    pre: Option<&[f32]>,
) {
    if run_special(f, inputs, start, out, inplace, pre) {
        return;
    }
    // Compiled a second time for AVX2 (the per-chunk loops, all inlined, work on eight lanes
    // at a time): the same operations in the same order, so the same values.
    super::with_avx2(
        #[inline(always)]
        || run_range_impl(f, inputs, start, out, inplace, pre),
    )
}

#[inline(always)]
fn run_range_impl<T: Store>(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [T],
    inplace: Option<usize>,
    pre: Option<&[f32]>,
) {
    let mut sc = take_scratch(f);
    for ((node, dt), s) in f.nodes.iter().zip(sc.iter_mut()) {
        if let Node::Splat(x) = node {
            fill_splat(*x, *dt, s.lane_mut(CHUNK));
        }
    }
    let inplace_node = inplace.and_then(|k| f.nodes.iter().position(|(n, _)| *n == Node::Input(k)));
    // Inputs whose values are their own lane are read in place (no copy into scratch);
    // compares feeding one select or convert are evaluated inside it.
    let mut plan = plan(f, inputs, inplace);
    let root = f.nodes.len() - 1;
    // A computed root is written straight into the output (no scratch, no copy).
    let root_direct = T::DIRECT
        && !matches!(
            f.nodes[root].0,
            Node::Input(_) | Node::Splat(_) | Node::Iota { .. }
        );
    // An f32 binary root that is the in-place input's only user reads it where it already
    // is (the output chunk, or `pre`): no copy into scratch.
    if let (Some(j), true) = (inplace_node, root_direct) {
        let slot_root = match f.nodes[root] {
            (Node::Binary(_, x, y), DType::F32) => (x == j) != (y == j),
            _ => false,
        };
        let users = f
            .nodes
            .iter()
            .filter(|(node, _)| match node {
                Node::Unary(_, a) | Node::Convert(a) | Node::ReluCode(a) | Node::ReluDecode(a) => {
                    *a == j
                }
                Node::Binary(_, a, b) | Node::Compare(_, a, b) => *a == j || *b == j,
                Node::Select(p, t, e) => *p == j || *t == j || *e == j,
                _ => false,
            })
            .count();
        if slot_root && users == 1 && f.nodes[j].1 == DType::F32 {
            plan[j] = Plan::Slot;
            plan[root] = Plan::SlotRoot;
        }
    }
    for c in (0..out.len()).step_by(CHUNK) {
        let n = CHUNK.min(out.len() - c);
        let slot_vals = pre.map(|x| &x[c..c + n]);
        if let Some(j) = inplace_node.filter(|&j| plan[j] != Plan::Slot) {
            match slot_vals {
                Some(x) => f32::load(x, &mut sc[j]),
                None => T::load(&out[c..c + n], &mut sc[j]),
            }
        }
        let o = &mut out[c..c + n];
        if root_direct {
            eval_chunk(
                f,
                inputs,
                start + c,
                n,
                &mut sc,
                &plan,
                inplace,
                Some(T::direct(o)),
                slot_vals,
            );
        } else {
            eval_chunk(f, inputs, start + c, n, &mut sc, &plan, inplace, None, None);
            T::store(&sc[root], o);
        }
    }
    give_scratch(sc);
}

fn drive<T: Store>(f: &Fused, inputs: &[&Data], out: &mut [T], inplace: Option<usize>) {
    let n = out.len();
    if n < PAR_MIN {
        run_range(f, inputs, 0, out, inplace, None);
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let task = (n / (threads * 4)).div_ceil(CHUNK).max(4) * CHUNK;
    out.par_chunks_mut(task)
        .enumerate()
        .for_each(|(c, part)| run_range(f, inputs, c * task, part, inplace, None));
}

/// Evaluate elements `start..start + out.len()` of an f32 group, serially, on this thread
/// (one batch entry of a GEMM's epilogue): input `slot` (an f32 value read only as
/// `Node::Input`) is taken from `slot_vals` over the same range, or from `out` itself when
/// `None` (in place); `inputs[slot]` is ignored.
pub fn run_fused_part(
    f: &Fused,
    inputs: &[&Data],
    start: usize,
    out: &mut [f32],
    slot: usize,
    slot_vals: Option<&[f32]>,
) {
    debug_assert!(start + out.len() <= f.len);
    debug_assert!(slot_vals.is_none_or(|x| x.len() == out.len()));
    run_range(f, inputs, start, out, Some(slot), slot_vals)
}

/// Evaluate the group into `out` (the root's dtype, `f.len` elements).
pub fn run_fused(f: &Fused, inputs: &[&Data], out: &mut Data) {
    run_fused_inplace(f, inputs, out, None)
}

/// [`run_fused`] where `out` already holds input `inplace` (which must be read only through
/// `Node::Input`, i.e. elementwise); `inputs[inplace]` is then ignored.
pub fn run_fused_inplace(f: &Fused, inputs: &[&Data], out: &mut Data, inplace: Option<usize>) {
    debug_assert_eq!(out.len(), f.len);
    debug_assert_eq!(inputs.len(), f.n_inputs);
    if f.len == 0 {
        return;
    }
    match out {
        Data::F32(o) => drive(f, inputs, o, inplace),
        Data::F64(o) => drive(f, inputs, o, inplace),
        Data::BF16(o) => drive(f, inputs, o, inplace),
        Data::I32(o) => drive(f, inputs, o, inplace),
        Data::Bool(o) => drive(f, inputs, o, inplace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One value of every class of f32 the ReLU kernels must treat as the interpreter does:
    /// signed zeros, normals, subnormals, infinities and NaNs of both signs.
    const SPECIALS: [f32; 10] = [
        0.0,
        -0.0,
        1.5,
        -1.5,
        1e-45,
        -1e-45,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];

    /// A coded ReLU equals `max(x, 0)` as a value, and its decode compares with zero (either
    /// side, every compare) exactly as `x` does, for every class of f32.
    #[test]
    fn coded_relus_compare_like_their_input() {
        let xs: Vec<f32> = SPECIALS
            .into_iter()
            .chain([f32::MIN_POSITIVE, -f32::MIN_POSITIVE])
            .collect();
        let n = xs.len();
        let f = Fused {
            len: n,
            nodes: vec![
                (Node::Input(0), DType::F32),
                (Node::ReluCode(0), DType::F32),
                (Node::ReluDecode(1), DType::F32),
            ],
            n_inputs: 1,
        };
        let code = Fused {
            nodes: f.nodes[..2].to_vec(),
            ..f.clone()
        };
        let input = Data::F32(xs.clone());
        let (mut h, mut d) = (Data::F32(vec![0.0; n]), Data::F32(vec![0.0; n]));
        run_fused(&code, &[&input], &mut h);
        run_fused(&f, &[&input], &mut d);
        let (Data::F32(h), Data::F32(d)) = (h, d) else {
            unreachable!()
        };
        for i in 0..n {
            let (x, h, d) = (xs[i], h[i], d[i]);
            let relu = fmax32(x, 0.0);
            assert!(
                (relu.is_nan() && h.is_nan()) || relu == h,
                "code({x}) = {h}, max = {relu}"
            );
            assert_eq!(h.is_sign_negative() && h == 0.0, x < 0.0, "code({x}) = {h}");
            for c in CompareOp::ALL {
                // The group's own compare kernel, on one element.
                let cmp = |a: f32, b: f32| {
                    let mut o = [false];
                    compare(c, &[a], &[b], &mut o);
                    o[0]
                };
                assert_eq!(cmp(d, 0.0), cmp(x, 0.0), "{c:?}({x}, 0) via {d}");
                assert_eq!(cmp(0.0, d), cmp(0.0, x), "{c:?}(0, {x}) via {d}");
            }
        }
    }

    /// The ReLU-gradient group `g * select(d > 0, 1, select(d == 0, 0.5, 0))`: its one-pass
    /// kernel is taken (coded `d` or not, the product in either order, the gradient read
    /// from an input, in place or from a GEMM's values) and gives the interpreter's bits on
    /// every class of f32 in both operands; a group that differs in one compare is left to
    /// the interpreter.
    #[test]
    fn relu_gradients_take_one_pass_with_the_interpreters_bits() {
        let specials = SPECIALS;
        // Every (g, d) pair of specials, then ordinary values; past one chunk, and not a
        // whole number of chunks.
        let n = 3 * CHUNK + 37;
        let mut seed = 12345u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        };
        let (mut gs, mut ds) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let k = specials.len();
            let (g, d) = if i < k * k {
                (specials[i / k], specials[i % k])
            } else {
                (next(), next())
            };
            gs.push(g);
            ds.push(d);
        }
        let group = |coded: bool, g_first: bool, gt: CompareOp| {
            let mut nodes = vec![(Node::Input(0), DType::F32), (Node::Input(1), DType::F32)];
            let d = if coded {
                nodes.push((Node::ReluDecode(1), DType::F32));
                2
            } else {
                1
            };
            let z = nodes.len();
            nodes.push((Node::Splat(0.0), DType::F32));
            nodes.push((Node::Compare(gt, d, z), DType::Bool));
            nodes.push((Node::Compare(CompareOp::Eq, d, z), DType::Bool));
            nodes.push((Node::Splat(0.5), DType::F32));
            nodes.push((Node::Select(z + 2, z + 3, z), DType::F32));
            nodes.push((Node::Splat(1.0), DType::F32));
            nodes.push((Node::Select(z + 1, z + 5, z + 4), DType::F32));
            let (a, b) = if g_first { (0, z + 6) } else { (z + 6, 0) };
            nodes.push((Node::Binary(BinaryOp::Mul, a, b), DType::F32));
            Fused {
                len: n,
                nodes,
                n_inputs: 2,
            }
        };
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for coded in [false, true] {
            // A coded ReLU holds `-0` where the pre-activation was negative.
            let d_vals: Vec<f32> = if coded {
                ds.iter().map(|&x| relu_code(x)).collect()
            } else {
                ds.clone()
            };
            let (g, d) = (Data::F32(gs.clone()), Data::F32(d_vals));
            for g_first in [true, false] {
                let f = group(coded, g_first, CompareOp::Gt);
                let r = relu_grad_of(&f).expect("the ReLU gradient is recognised");
                assert_eq!((r.g, r.d, r.coded), (0, 1, coded));
                // The interpreter, chunk by chunk, node by node.
                let mut want = vec![0.0f32; n];
                run_range_impl(&f, &[&g, &d], 0, &mut want, None, None);
                // Read from an input.
                let mut out = Data::F32(vec![7.0; n]);
                run_fused(&f, &[&g, &d], &mut out);
                let Data::F32(got) = &out else { unreachable!() };
                assert_eq!(bits(got), bits(&want), "coded {coded}, g first {g_first}");
                // In place, over the output (a GEMM epilogue), and from the GEMM's values.
                let mut got = gs.clone();
                run_fused_part(&f, &[&g, &d], 0, &mut got, 0, None);
                assert_eq!(bits(&got), bits(&want), "in place");
                let mut got = vec![7.0f32; n - 5];
                run_fused_part(&f, &[&g, &d], 5, &mut got, 0, Some(&gs[5..]));
                assert_eq!(bits(&got), bits(&want[5..]), "from the GEMM's values");
            }
            assert_eq!(relu_grad_of(&group(coded, true, CompareOp::Ge)), None);
        }
    }

    /// A ReLU epilogue (`max(x, +0)` of the in-place input, either operand order, or its
    /// coded form) takes one pass with the interpreter's bits on every class of f32 (NaNs
    /// of both signs, `-0`, infinities, subnormals), in place and from a GEMM's values;
    /// `max(x, -0)`, a non-zero constant, or an input that is not the in-place one stay
    /// with the interpreter.
    #[test]
    fn relu_epilogues_take_one_pass_with_the_interpreters_bits() {
        let specials = SPECIALS;
        let n = 2 * CHUNK + 11;
        let xs: Vec<f32> = (0..n)
            .map(|i| specials.get(i).copied().unwrap_or((i as f32 * 0.37).sin()))
            .collect();
        let group = |x_first: bool, zero: f64| {
            let nodes = if x_first {
                vec![
                    (Node::Input(0), DType::F32),
                    (Node::Splat(zero), DType::F32),
                    (Node::Binary(BinaryOp::Max, 0, 1), DType::F32),
                ]
            } else {
                vec![
                    (Node::Splat(zero), DType::F32),
                    (Node::Input(0), DType::F32),
                    (Node::Binary(BinaryOp::Max, 0, 1), DType::F32),
                ]
            };
            Fused {
                len: n,
                nodes,
                n_inputs: 1,
            }
        };
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let x = Data::F32(xs.clone());
        let coded = Fused {
            len: n,
            nodes: vec![
                (Node::Input(0), DType::F32),
                (Node::ReluCode(0), DType::F32),
            ],
            n_inputs: 1,
        };
        for form in [Relu::InputFirst, Relu::ZeroFirst, Relu::Coded] {
            let x_first = form == Relu::InputFirst;
            let f = if form == Relu::Coded {
                coded.clone()
            } else {
                group(x_first, 0.0)
            };
            assert_eq!(relu_in_place_of(&f, Some(0)), Some(form));
            assert_eq!(relu_in_place_of(&f, None), None, "not in place");
            let mut want = vec![0.0f32; n];
            run_range_impl(&f, &[&x], 0, &mut want, None, None);
            let mut got = xs.clone();
            run_fused_part(&f, &[&x], 0, &mut got, 0, None);
            assert_eq!(bits(&got), bits(&want), "in place, {form:?}");
            let mut got = vec![7.0f32; n - 3];
            run_fused_part(&f, &[&x], 3, &mut got, 0, Some(&xs[3..]));
            assert_eq!(
                bits(&got),
                bits(&want[3..]),
                "from the GEMM's values, {form:?}"
            );
            for other in [-0.0, 0.5] {
                assert_eq!(relu_in_place_of(&group(x_first, other), Some(0)), None);
            }
        }
    }

    /// Iota chunks written by runs equal `(start + i) / stride % size` at every chunk start
    /// (mid-run, mid-period, wrapping), for counting (`stride == 1`) and repeating runs.
    #[test]
    fn iota_chunks_follow_the_index_rule() {
        for (stride, size) in [(1, 1), (1, 7), (1, 4000), (3, 5), (16, 2), (1000, 3)] {
            for start in [0, 1, 5, 999, 1024, 4001, 12345] {
                for n in [0, 1, 17, 1024] {
                    let want: Vec<i32> = (0..n)
                        .map(|i| ((start + i) / stride % size) as i32)
                        .collect();
                    let mut i = vec![-1i32; n];
                    iota_chunk(stride, size, DType::I32, start, LaneMut::I(&mut i));
                    assert_eq!(i, want, "stride {stride} size {size} start {start} n {n}");
                    let mut f = vec![-1.0f32; n];
                    iota_chunk(stride, size, DType::F32, start, LaneMut::F(&mut f));
                    assert!(f.iter().zip(&want).all(|(&f, &w)| f == w as f32));
                    let mut d = vec![-1.0f64; n];
                    iota_chunk(stride, size, DType::F64, start, LaneMut::D(&mut d));
                    assert!(d.iter().zip(&want).all(|(&d, &w)| d == w as f64));
                    let mut b = vec![false; n];
                    iota_chunk(stride, size, DType::Bool, start, LaneMut::B(&mut b));
                    assert!(b.iter().zip(&want).all(|(&b, &w)| b == (w != 0)));
                }
            }
        }
    }
}
