//! The SPMD oracle as a property: for random programs, shapes, shardings and meshes,
//! `gather(run_spmd(partition(p)))` equals `run(p)` on one device
//! (`testkit::spmd::check_spmd_matches`, which fills the padding of every input shard with NaN
//! / garbage, so an op that reads padding unmasked is caught).
//!
//! A case is two byte strings and a value seed. The *program* bytes decide the ops, their
//! attributes and shapes (dims from 0 to 16, most of them not dividing 2, 4 or 8); the
//! *sharding* bytes decide, at every annotation point (every parameter, every op result,
//! chain intermediates), whether to annotate (`sharding::mesh_split`) and with which mesh
//! axes per dim (none, one, or several on one dim in either order). Each annotation point
//! reads a fixed number of sharding bytes, so one program is built identically for every
//! mesh of `testkit::spmd::test_meshes` and only its shardings change. A zero byte is always
//! the simplest choice and reading past the end gives zeros, so proptest's shrinking (bytes
//! towards zero) reaches small programs with few annotations. A failure prints the mesh, the
//! annotated program, the partitioned program and the case, which
//! `PROP_ORACLE_REPLAY="<prog> <shard> <seed>"` replays alone.
//!
//! Properties:
//! - one test per op of the unpartitioned op set (`single_*`): the op on fresh parameters;
//! - `chains`: 3-6 random ops in a row (operands reused), so reshards between ops are
//!   exercised; `chains_every_value_sharded`: every value of the program gets a random
//!   layout, so handlers see layouts that propagation would never choose;
//! - `gradients`: a random float chain ending in `sum(y * W)`, differentiated with
//!   `autodiff::grad` before partitioning; the partitioned gradient program must equal the
//!   single-device one.
//!
//! Floats compare within `1e-10` (relative and absolute: sums run in another order), ints
//! and bools exactly. Case counts honour `PROPTEST_CASES`; the defaults keep the file to
//! seconds in a debug build. The big sweep:
//! `PROPTEST_CASES=10000 cargo test --release -p spmd --test prop_oracle`.

use ir::{
    BinaryOp, Builder, CompareOp, DType, DotDims, Mesh, Op, ReduceOp, RngDist, Type, UnaryOp,
};
use ir::{Program, Sharding, Value};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use runtime::HostTensor;
use std::collections::HashMap;
use testkit::spmd::{check_spmd_matches, test_meshes};
use testkit::{fixed_values, Tol};

#[path = "prop_oracle/gen.rs"]
mod gen;
use gen::*;

const TOL: Tol = Tol::new(1e-10, 1e-10);
/// Default cases per single-op test and per chain test (`PROPTEST_CASES` overrides both).
const SINGLE_CASES: u32 = 512;
const CHAIN_CASES: u32 = 1024;
const PROG_BYTES: usize = 160;
const SHARD_BYTES: usize = 192;
/// Sharding bytes read by one annotation point.
const PER_ANNOTATION: usize = 4;
/// Chains stop growing values beyond this many elements.
const MAX_ELEMS: usize = 256;

/// Build a program on every test mesh with `build` and check the partitioned run against
/// the single-device one.
fn check_all_meshes(
    prog: &[u8],
    shard: &[u8],
    seed: u64,
    build: impl Fn(&mut Gen) -> Program,
) -> Result<(), TestCaseError> {
    for mesh in test_meshes() {
        let mut g = Gen::new(&mesh, prog, shard, seed);
        let p = build(&mut g);
        check_spmd_matches(&p, &g.inputs, TOL)
            .map_err(|e| TestCaseError::fail(format!("on mesh {mesh}: {e}")))?;
    }
    Ok(())
}

/// The random input of one case; prints compactly (hex, trailing zeros dropped).
#[derive(Clone)]
struct Case {
    prog: Vec<u8>,
    shard: Vec<u8>,
    seed: u64,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |b: &[u8]| {
            let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
            let h: String = b[..n].iter().map(|x| format!("{x:02x}")).collect();
            if h.is_empty() {
                "00".to_string()
            } else {
                h
            }
        };
        let (p, s) = (hex(&self.prog), hex(&self.shard));
        write!(
            f,
            "Case {{ prog: {p}, shard: {s}, seed: {} }}; replay with PROP_ORACLE_REPLAY=\"{p} {s} {}\"",
            self.seed, self.seed
        )
    }
}

/// Parse the hex of a printed [`Case`] field.
fn unhex(h: &str) -> Vec<u8> {
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex byte"))
        .collect()
}

/// Run `cases` random cases (or `PROPTEST_CASES`) of a property over the case bytes.
///
/// `PROP_ORACLE_REPLAY="<prog hex> <shard hex> <seed>"` (the fields of a printed failing
/// [`Case`]) runs just that case instead, e.g.
/// `PROP_ORACLE_REPLAY="0501 02000001 0" cargo test -p spmd --test prop_oracle single_pad`.
fn run_prop(cases: u32, f: impl Fn(&[u8], &[u8], u64) -> Result<(), TestCaseError>) {
    if let Ok(replay) = std::env::var("PROP_ORACLE_REPLAY") {
        let parts: Vec<&str> = replay.split_whitespace().collect();
        let [prog, shard, seed] = parts[..] else {
            panic!("PROP_ORACLE_REPLAY needs three fields: <prog hex> <shard hex> <seed>");
        };
        let seed: u64 = seed.parse().expect("seed");
        if let Err(e) = f(&unhex(prog), &unhex(shard), seed) {
            panic!("{e}");
        }
        return;
    }
    let mut config = testkit::cases(cases);
    config.failure_persistence = None;
    if config.max_shrink_iters == u32::MAX {
        // Shrinking walks every byte towards zero: allow enough steps (failures only).
        config.max_shrink_iters = 4096;
    }
    let mut runner = TestRunner::new(config);
    let strategy = (
        vec(any::<u8>(), PROG_BYTES),
        vec(any::<u8>(), SHARD_BYTES),
        any::<u64>(),
    )
        .prop_map(|(prog, shard, seed)| Case { prog, shard, seed });
    if let Err(e) = runner.run(&strategy, |c| f(&c.prog, &c.shard, c.seed)) {
        panic!("{e}");
    }
}

/// One op on fresh (annotated) parameters, its result at an annotation point.
fn single(kind: Kind, cases: u32) {
    run_prop(cases, |p, s, seed| {
        check_all_meshes(p, s, seed, |g| {
            let y = g.op(kind, None);
            let y = g.shard(&y);
            g.b.output("y", &y);
            g.b.program()
        })
    })
}

macro_rules! single_op_tests {
    ($($name:ident => $kind:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                single(Kind::$kind, SINGLE_CASES);
            }
        )*
        /// Every kind has its test.
        #[test]
        fn every_kind_has_a_single_op_test() {
            let tested = [$(Kind::$kind),*];
            for k in ALL_KINDS {
                assert!(tested.contains(&k), "no single-op test for {k:?}");
            }
        }
    };
}

single_op_tests! {
    single_parameter => Parameter,
    single_constant_splat => ConstSplat,
    single_constant_dense => ConstDense,
    single_iota => Iota,
    single_unary => Unary,
    single_binary => Binary,
    single_compare => Compare,
    single_select => Select,
    single_convert => Convert,
    single_stop_gradient => StopGradient,
    single_copy => Copy,
    single_broadcast => Broadcast,
    single_reshape => Reshape,
    single_transpose => Transpose,
    single_slice => Slice,
    single_dynamic_slice => DynamicSlice,
    single_dynamic_update_slice => DynamicUpdateSlice,
    single_pad => Pad,
    single_concatenate => Concatenate,
    single_reduce => Reduce,
    single_dot_general => DotGeneral,
    single_conv => Conv,
    single_reverse => Reverse,
    single_cumsum => Cumsum,
    single_argmax => Argmax,
    single_gather => Gather,
    single_scatter_add => ScatterAdd,
    single_rng => Rng,
}

/// 3-6 random ops in a row on one value, with annotations between them.
#[test]
fn chains() {
    run_prop(CHAIN_CASES, |p, s, seed| {
        check_all_meshes(p, s, seed, |g| {
            let shape = g.shape(0, 3);
            let mut x = g.param(Type::new(DType::F64, shape));
            g.pool.push(x.clone());
            let n = 3 + g.c.below(4);
            for i in 0..n {
                let kind = g.c.pick(&ALL_KINDS);
                x = g.op(kind, Some(&x));
                x = g.small(&x);
                x = g.shard(&x);
                g.pool.push(x.clone());
                if g.c.below(4) == 3 {
                    g.b.output(&format!("t{i}"), &x);
                }
            }
            g.b.output("y", &x);
            g.b.program()
        })
    })
}

/// Chains where every value is annotated at random (or left to propagation), builder
/// helpers included.
#[test]
fn chains_every_value_sharded() {
    run_prop(CHAIN_CASES, |p, s, seed| {
        check_all_meshes(p, s, seed, |g| {
            let shape = g.shape(0, 3);
            let mut x = g.param(Type::new(DType::F64, shape));
            g.pool.push(x.clone());
            for _ in 0..1 + g.c.below(4) {
                let kind = g.c.pick(&ALL_KINDS);
                x = g.op(kind, Some(&x));
                x = g.small(&x);
                g.pool.push(x.clone());
            }
            g.b.output("y", &x);
            let mut prog = g.b.program();
            g.shard_everything(&mut prog);
            prog
        })
    })
}

/// A random float chain ending in `sum(y * W)`, differentiated before partitioning.
#[test]
fn gradients() {
    run_prop(CHAIN_CASES, |p, s, seed| {
        check_all_meshes(p, s, seed, |g| {
            g.float_only = true;
            let shape = g.shape(0, 3);
            let mut x = g.param(Type::new(DType::F64, shape));
            g.pool.push(x.clone());
            let n = 1 + g.c.below(5);
            for _ in 0..n {
                let kind = g.c.pick(&FLOAT_KINDS);
                x = g.op(kind, Some(&x));
                x = g.small(&x);
                x = g.shard(&x);
                g.pool.push(x.clone());
            }
            let w = g.values(DType::F64, x.ty().num_elements());
            let w = g.b.constant(w, x.ty());
            let loss = g.emit(Op::Binary(BinaryOp::Mul), &[&x, &w], None).sum_all();
            g.b.output("loss", &loss);
            let fwd = g.b.program();
            let wrt: Vec<&str> = g.float_params.iter().map(|s| s.as_str()).collect();
            autodiff::grad(&fwd, "loss", &wrt).expect("grad")
        })
    })
}
