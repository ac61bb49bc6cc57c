//! gshard IR: the one representation every stage shares.
//!
//! A [`Program`] is a flat SSA list of typed instructions over a closed [`Op`] set (the
//! collectives included, so a partitioned program is the same IR). This crate is pure data
//! plus shape inference, [`verify`], a text format ([`text::print`] / [`text::parse`]) and a
//! [`builder`] for model code. It knows nothing of execution, threads, MPI or files.

pub mod builder;
pub mod dtype;
pub mod error;
pub mod infer;
pub mod mesh;
pub mod op;
pub mod program;
pub mod scope;
pub mod text;
pub mod verify;

pub use builder::{Builder, ScopeGuard, Value};
pub use dtype::{strides, DType, Type};
pub use error::{MeshError, ParseError, ShapeError, VerifyError};
pub use infer::infer_type;
pub use mesh::{Mesh, MeshAxis, Sharding};
pub use op::{
    BinaryOp, Collective, CollectiveKind, CompareOp, DotDims, Literal, Op, OpClass, ReduceOp,
    RngDist, UnaryOp,
};
pub use program::{Instr, Program, ValueId};
pub use scope::{Scope, ScopeId, Scopes};
pub use verify::verify;
