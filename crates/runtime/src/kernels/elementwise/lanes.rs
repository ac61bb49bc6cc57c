//! Scratch lanes of the chunk interpreter: one typed [`Sc`] buffer of [`super::CHUNK`]
//! elements per node (kept per thread between evaluations), read-only and writable views
//! of a chunk ([`Lane`], [`LaneMut`]: a node's scratch, an input read in place, or the
//! output itself), and the stores between a lane and an output buffer of each dtype
//! ([`Store`]).

use super::{Fused, CHUNK};
use crate::tensor::Data;
use half::bf16;
use ir::DType;

pub(super) enum Sc {
    F(Vec<f32>),
    D(Vec<f64>),
    I(Vec<i32>),
    B(Vec<bool>),
}

/// A node's values over the current chunk, read-only: its scratch, or an input read in place.
#[derive(Clone, Copy)]
pub(super) enum Lane<'a> {
    F(&'a [f32]),
    D(&'a [f64]),
    I(&'a [i32]),
    B(&'a [bool]),
}

/// Where a node's values over the current chunk go: its scratch, or the output itself.
pub(super) enum LaneMut<'a> {
    F(&'a mut [f32]),
    D(&'a mut [f64]),
    I(&'a mut [i32]),
    B(&'a mut [bool]),
}

impl Sc {
    pub(super) fn lane(&self, n: usize) -> Lane<'_> {
        match self {
            Sc::F(x) => Lane::F(&x[..n]),
            Sc::D(x) => Lane::D(&x[..n]),
            Sc::I(x) => Lane::I(&x[..n]),
            Sc::B(x) => Lane::B(&x[..n]),
        }
    }
    pub(super) fn lane_mut(&mut self, n: usize) -> LaneMut<'_> {
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
pub(super) fn in_place(d: &Data, start: usize, n: usize) -> Option<Lane<'_>> {
    let r = start..start + n;
    match d {
        Data::F32(v) => Some(Lane::F(&v[r])),
        Data::F64(v) => Some(Lane::D(&v[r])),
        Data::I32(v) => Some(Lane::I(&v[r])),
        Data::Bool(v) => Some(Lane::B(&v[r])),
        Data::BF16(_) => None,
    }
}

pub(super) fn scratch(dt: DType) -> Sc {
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
pub(super) fn take_scratch(f: &Fused) -> Vec<Sc> {
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
pub(super) fn give_scratch(sc: Vec<Sc>) {
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

/// Stores a scratch chunk into an output buffer of one dtype.
pub(super) trait Store: Copy + Send + Sync {
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
