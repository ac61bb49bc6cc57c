//! Shardings over the whole program: the pure sharding algebra ([`algebra`]), GShard's and
//! GSPMD's annotation API ([`annotate`]: `replicate`, `split`, `shard`, `mesh_split`), the
//! per-op propagation rules ([`rules`]) and the fixpoint pass ([`propagate()`]).
//!
//! Nothing here executes a tensor: tests are programs in, shardings out.

pub mod algebra;
pub mod annotate;
pub mod propagate;
pub mod rules;

pub use annotate::{mesh_split, replicate, shard, split, ShardingError};
pub use propagate::{propagate, propagate_explained, provenance_chain, Provenance};
