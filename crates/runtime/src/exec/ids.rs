//! Typed indices of the executor's plan, and [`IdVec`], a vector indexed by one of them.
//!
//! Values are the program's own [`ValueId`]s; a plan's steps are [`StepId`]s; a buffer
//! (a value and the aliases sharing it) is a [`BufClass`], named by its root value; a
//! [`SupportKey`] names the non-zeros that values share (the class whose positions they
//! are). Indexing an [`IdVec`] is indexing its `Vec` (one bounds check, no conversion
//! beyond widening a `u32`).

use ir::ValueId;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An index type of an [`IdVec`].
pub(crate) trait Id: Copy {
    fn from_index(i: usize) -> Self;
    fn index(self) -> usize;
}

impl Id for ValueId {
    #[inline]
    fn from_index(i: usize) -> ValueId {
        ValueId(u32::try_from(i).expect("a program's values fit in u32"))
    }

    #[inline]
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// Declares a `u32` newtype index with its [`Id`] impl and a prefixed `Display`.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub(crate) u32);

        impl Id for $name {
            #[inline]
            fn from_index(i: usize) -> $name {
                $name(u32::try_from(i).expect("plan indices fit in u32"))
            }

            #[inline]
            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A step of a [`Plan`](super::Plan), its position in the plan's order.
    StepId,
    "s"
);
id_type!(
    /// A buffer: a value and the aliases sharing its memory, named by that root value.
    BufClass,
    "b"
);
id_type!(
    /// The non-zero positions values share: a buffer class whose support stands for every
    /// value with this key (its own, or an indicator `convert(x != 0)` of it).
    SupportKey,
    "k"
);

impl StepId {
    /// The index of the step after this one.
    pub(crate) fn next(self) -> StepId {
        StepId(self.0 + 1)
    }
}

impl BufClass {
    /// The class rooted at value `v`.
    #[inline]
    pub(crate) fn of(v: ValueId) -> BufClass {
        BufClass(v.0)
    }

    /// The value whose buffer the class is.
    #[inline]
    pub(crate) fn root(self) -> ValueId {
        ValueId(self.0)
    }
}

impl SupportKey {
    /// The key of the non-zeros of buffer class `c`.
    #[inline]
    pub(crate) fn of(c: BufClass) -> SupportKey {
        SupportKey(c.0)
    }

    /// The buffer class whose non-zeros these are.
    #[inline]
    pub(crate) fn class(self) -> BufClass {
        BufClass(self.0)
    }
}

/// A `Vec<T>` indexed by `I`.
pub(crate) struct IdVec<I, T> {
    raw: Vec<T>,
    _id: PhantomData<fn(I) -> I>,
}

impl<I: Id, T> IdVec<I, T> {
    pub(crate) fn new() -> IdVec<I, T> {
        IdVec::from_vec(Vec::new())
    }

    pub(crate) fn from_vec(raw: Vec<T>) -> IdVec<I, T> {
        IdVec {
            raw,
            _id: PhantomData,
        }
    }

    /// `n` copies of `x`.
    pub(crate) fn filled(x: T, n: usize) -> IdVec<I, T>
    where
        T: Clone,
    {
        IdVec::from_vec(vec![x; n])
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Append `x`; returns its index.
    pub(crate) fn push(&mut self, x: T) -> I {
        self.raw.push(x);
        I::from_index(self.raw.len() - 1)
    }

    #[inline]
    pub(crate) fn get(&self, i: I) -> Option<&T> {
        self.raw.get(i.index())
    }

    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.raw.iter()
    }

    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.raw.iter_mut()
    }

    /// The indices, in order.
    pub(crate) fn ids(&self) -> impl DoubleEndedIterator<Item = I> {
        (0..self.raw.len()).map(I::from_index)
    }

    /// `(index, element)` pairs, in order.
    pub(crate) fn iter_enumerated(&self) -> impl Iterator<Item = (I, &T)> {
        self.raw
            .iter()
            .enumerate()
            .map(|(i, x)| (I::from_index(i), x))
    }

    /// Keep the elements for which `keep` holds, in order (indices after a removed one
    /// shift down).
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.raw.retain(keep);
    }

    pub(crate) fn into_vec(self) -> Vec<T> {
        self.raw
    }
}

impl<I, T> Index<I> for IdVec<I, T>
where
    I: Id,
{
    type Output = T;

    #[inline]
    fn index(&self, i: I) -> &T {
        &self.raw[i.index()]
    }
}

impl<I, T> IndexMut<I> for IdVec<I, T>
where
    I: Id,
{
    #[inline]
    fn index_mut(&mut self, i: I) -> &mut T {
        &mut self.raw[i.index()]
    }
}

impl<I: Id, T> FromIterator<T> for IdVec<I, T> {
    fn from_iter<It: IntoIterator<Item = T>>(it: It) -> IdVec<I, T> {
        IdVec::from_vec(it.into_iter().collect())
    }
}

impl<I: Id, T: Clone> Clone for IdVec<I, T> {
    fn clone(&self) -> IdVec<I, T> {
        IdVec::from_vec(self.raw.clone())
    }
}

impl<I: Id, T: fmt::Debug> fmt::Debug for IdVec<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.raw.fmt(f)
    }
}

impl<I: Id, T> Default for IdVec<I, T> {
    fn default() -> IdVec<I, T> {
        IdVec::new()
    }
}
