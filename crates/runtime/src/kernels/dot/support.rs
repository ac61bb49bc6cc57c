//! Known non-zeros: a buffer's [`Support`] (its non-zeros' positions and values, found by
//! one pass), what a caller knows of an operand ([`Known`], [`Values`]), and a sparse
//! path's term lists built from a support instead of a scan ([`terms_from_support`]).

use super::float::GemmFloat;
use super::plan::View;
use super::scan::{for_nonzero, sampled_dense, Term};
use crate::kernels::with_avx2;
use rayon::prelude::*;

/// The flat positions of a buffer's non-zeros (anything but `+0` and `-0`; NaN counts), in
/// increasing order: found once by one pass over the buffer ([`Support::of`]) and shared by
/// every sparse product that reads the buffer (or a buffer with the same non-zeros, such as
/// the `0/1` mask `x != 0` of a combine weight `x`), each listing its terms from it
/// ([`terms_from_support`]) instead of scanning the buffer again.
#[derive(Debug, Clone, PartialEq)]
pub struct Support {
    pub(super) pos: Vec<u32>,
    /// The scanned buffer's value at each position.
    pub(super) vals: Vec<f64>,
    /// The scanned buffer's length.
    pub(super) of_len: usize,
}

impl Support {
    /// The support of `x` when at most a tenth of it is non-zero (and it has under 2^32
    /// elements); `None` for a denser buffer (told apart by samples first, as the sparse
    /// path does).
    pub fn of<T: GemmFloat>(x: &[T]) -> Option<Support> {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        if x.len() > u32::MAX as usize || sampled_dense(x) {
            return None;
        }
        let limit = x.len() / 10;
        let (found, over) = (AtomicUsize::new(0), AtomicBool::new(false));
        let chunk = |(c, xs): (usize, &[T])| {
            let (mut pos, mut vals) = (Vec::new(), Vec::new());
            if over.load(Ordering::Relaxed) {
                return (pos, vals);
            }
            let base = c * SUPPORT_CHUNK;
            with_avx2(
                #[inline(always)]
                || {
                    for_nonzero(xs, |t, v| {
                        pos.push((base + t) as u32);
                        vals.push(v.to_f64());
                    })
                },
            );
            if found.fetch_add(pos.len(), Ordering::Relaxed) + pos.len() > limit {
                over.store(true, Ordering::Relaxed);
            }
            (pos, vals)
        };
        let parts: Vec<(Vec<u32>, Vec<f64>)> = if x.len() >= SUPPORT_PAR_LEN {
            x.par_chunks(SUPPORT_CHUNK).enumerate().map(chunk).collect()
        } else {
            x.chunks(SUPPORT_CHUNK).enumerate().map(chunk).collect()
        };
        (!over.into_inner()).then(|| {
            let (pos, vals): (Vec<Vec<u32>>, Vec<Vec<f64>>) = parts.into_iter().unzip();
            Support {
                pos: pos.concat(),
                vals: vals.concat(),
                of_len: x.len(),
            }
        })
    }

    /// The f32 buffer it was found on, again: its values at its positions, zeros
    /// elsewhere (an f32 value round-trips through the f64 kept exactly).
    pub fn dense(&self) -> Vec<f32> {
        self.dense_as()
    }

    /// [`Support::dense`] in the buffer's own float type.
    pub(super) fn dense_as<T: GemmFloat>(&self) -> Vec<T> {
        let mut x = vec![T::ZERO; self.of_len];
        for (&q, &v) in self.pos.iter().zip(&self.vals) {
            x[q as usize] = T::from_f64(v);
        }
        x
    }

    /// Whether every value of the buffer it was found on is finite (its zeros are).
    pub(super) fn all_finite(&self) -> bool {
        self.vals.iter().all(|v| v.is_finite())
    }

    /// Whether it was found on a buffer of `len` elements.
    pub(super) fn fits(&self, len: usize) -> bool {
        self.of_len == len
    }

    /// How many non-zeros.
    pub fn len(&self) -> usize {
        self.pos.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }
}

/// Elements per part of [`Support::of`]'s pass (a multiple of 64: whole bit-mask blocks).
pub(super) const SUPPORT_CHUNK: usize = 1 << 14;

/// Buffers at least this long are scanned in parallel parts by [`Support::of`] (a 64K-float
/// mask takes ~5 us on one thread; split, a device task could wait for a part taken by a
/// thread busy with another device's kernel).
pub(super) const SUPPORT_PAR_LEN: usize = 1 << 20;

/// [`sparse_terms`]'s lists from a known support of `x` (read through `view`; an lhs when
/// `lhs`): each batch entry's terms grouped by line, each line's in increasing step (the
/// order the sparse path adds them in), with their values as `vals` says. Where the steps'
/// offsets increase with the step, memory order already has each line's terms in step
/// order, and a stable counting sort by line is enough; otherwise the terms are sorted.
/// A long support (one device holding the whole layer) is located in parallel parts, and
/// its batch entries sorted in parallel.
pub(super) fn terms_from_support<T: GemmFloat>(
    x: &[T],
    view: &View,
    sup: &Support,
    vals: Values,
    lhs: bool,
) -> Vec<Vec<Term<T>>> {
    let b = view.batch_off.len();
    let (lines, steps) = if lhs {
        (view.rows.len(), &view.cols)
    } else {
        (view.cols.len(), &view.rows)
    };
    let locate = |(&at, &v): (&u32, &f64)| {
        let at = at as usize;
        let [bb, i, j] = view.locate(at);
        let (q, kk) = if lhs { (i, j) } else { (j, i) };
        let v = match vals {
            Values::Scanned => T::from_f64(v),
            Values::Ones => T::ONE,
            Values::Read => x[at],
        };
        (bb, (q as u32, kk as u32, v))
    };
    let parallel = sup.pos.len() >= SUPPORT_PAR_MIN;
    let located: Vec<(usize, Term<T>)> = if parallel {
        sup.pos
            .par_chunks(SUPPORT_PAR_MIN / 2)
            .zip(sup.vals.par_chunks(SUPPORT_PAR_MIN / 2))
            .flat_map_iter(|(p, v)| p.iter().zip(v).map(locate).collect::<Vec<_>>())
            .collect()
    } else {
        sup.pos.iter().zip(&sup.vals).map(locate).collect()
    };
    let in_order = steps.windows(2).all(|w| w[0] < w[1]);
    // One batch entry's terms (in memory order) grouped by line, each line's by step.
    let group = |part: &[(usize, Term<T>)]| -> Vec<Term<T>> {
        if !(in_order && lines <= 4 * part.len() + 4096) {
            let mut list: Vec<Term<T>> = part.iter().map(|t| t.1).collect();
            list.sort_unstable_by_key(|t| (t.0, t.1));
            return list;
        }
        let mut start = vec![0usize; lines + 1];
        for t in part {
            start[t.1 .0 as usize + 1] += 1;
        }
        for q in 1..=lines {
            start[q] += start[q - 1];
        }
        let mut list: Vec<Term<T>> = vec![(0, 0, T::ZERO); part.len()];
        for t in part {
            let at = &mut start[t.1 .0 as usize];
            list[*at] = t.1;
            *at += 1;
        }
        list
    };
    // The batch entries' parts: contiguous when the batch dims are outermost (the usual
    // case), else gathered.
    let mut parts: Vec<std::ops::Range<usize>> = vec![0..0; b];
    let contiguous = located.windows(2).all(|w| w[0].0 <= w[1].0);
    if contiguous {
        let mut at = 0;
        for (bb, part) in parts.iter_mut().enumerate() {
            let end = at + located[at..].iter().take_while(|t| t.0 == bb).count();
            *part = at..end;
            at = end;
        }
        if parallel {
            parts.into_par_iter().map(|r| group(&located[r])).collect()
        } else {
            parts.into_iter().map(|r| group(&located[r])).collect()
        }
    } else {
        let mut split: Vec<Vec<(usize, Term<T>)>> = vec![Vec::new(); b];
        for t in located {
            split[t.0].push(t);
        }
        split.iter().map(|part| group(part)).collect()
    }
}

/// Supports at least this long are located and sorted in parallel parts.
pub(super) const SUPPORT_PAR_MIN: usize = 4096;

/// What the caller already knows of an operand's non-zeros (see [`Support`]).
#[derive(Clone, Copy, Debug)]
pub enum Known<'a> {
    /// Nothing: the product lists the non-zeros itself when a sparse path may pay.
    Unknown,
    /// More than a tenth non-zero.
    Dense,
    /// Exactly these non-zeros, with their values as `Values` says.
    Sparse(&'a Support, Values),
}

/// Where an operand's values at its known non-zeros come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// The support's: it was found on this very buffer.
    Scanned,
    /// All one: the operand is `convert(x != 0)` of the buffer the support was found on.
    Ones,
    /// Read from the operand at each position.
    Read,
}
