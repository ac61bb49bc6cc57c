//! Property tests of the text format: random valid programs covering every op round-trip
//! through `print` and `parse`, and mutated program texts never make the parser panic.
//!
//! Programs are built from a list of proptest-generated words, one per instruction: the
//! word picks the op kind (low bits) and seeds a small RNG for its details, so shrinking the
//! words shrinks and simplifies the program. Case counts honour `PROPTEST_CASES`.

use ir::text::{parse, print};
use ir::{
    infer_type, verify, BinaryOp, CollectiveKind, CompareOp, DType, DotDims, Instr, Literal, Mesh,
    Op, Program, ReduceOp, RngDist, Sharding, Type, UnaryOp, ValueId,
};
use proptest::prelude::*;

/// splitmix64: a tiny deterministic RNG for the details of one instruction.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `num / den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
}

const FLOATS: [DType; 3] = [DType::F32, DType::F64, DType::BF16];
const NUMERIC: [DType; 4] = [DType::F32, DType::F64, DType::BF16, DType::I32];
const INT_OR_BOOL: [DType; 2] = [DType::I32, DType::Bool];

/// Number of op kinds the generator knows; [`kind_of`] maps every `Op` to one.
const NUM_KINDS: usize = 33;

/// The generator's kind index of an op (an exhaustive match, so a new `Op` variant fails to
/// compile here until the generator learns it).
fn kind_of(op: &Op) -> usize {
    match op {
        Op::Parameter { .. } => 0,
        Op::Constant { .. } => 1,
        Op::Iota { .. } => 2,
        Op::Unary(_) => 3,
        Op::Binary(_) => 4,
        Op::Compare(_) => 5,
        Op::Select => 6,
        Op::Convert => 7,
        Op::StopGradient => 8,
        Op::Copy => 9,
        Op::Broadcast { .. } => 10,
        Op::Reshape => 11,
        Op::Transpose { .. } => 12,
        Op::Slice { .. } => 13,
        Op::DynamicSlice { .. } => 14,
        Op::DynamicUpdateSlice => 15,
        Op::Pad { .. } => 16,
        Op::Concatenate { .. } => 17,
        Op::Reduce { .. } => 18,
        Op::DotGeneral(_) => 19,
        Op::Cumsum { .. } => 20,
        Op::Argmax { .. } => 21,
        Op::Gather { .. } => 22,
        Op::ScatterAdd { .. } => 23,
        Op::Rng { .. } => 24,
        Op::PartitionId => 25,
        Op::Collective(c) => match c.kind {
            CollectiveKind::AllReduce { .. } => 26,
            CollectiveKind::AllGather { .. } => 27,
            CollectiveKind::ReduceScatter { .. } => 28,
            CollectiveKind::AllToAll { .. } => 29,
            CollectiveKind::Permute { .. } => 30,
        },
        Op::Conv { .. } => 31,
        Op::Reverse { .. } => 32,
    }
}

/// Characters for parameter and output names: quotes, escapes, comment and value markers,
/// non-ASCII and control characters, to exercise string escaping.
const NAME_CHARS: [char; 18] = [
    'a', 'b', 'x', '_', '0', ' ', '"', '\\', '\n', '\t', '#', '%', '@', 'é', '中', '🙂', '\u{1b}',
    '\r',
];

fn rand_name(r: &mut Rng, unique: usize) -> String {
    let len = r.below(5);
    let mut s: String = (0..len).map(|_| r.pick(&NAME_CHARS)).collect();
    s.push_str(&unique.to_string());
    s
}

/// A random type with a dtype from `dtypes` and rank `min_rank..=3`; dims are small, and
/// now and then zero.
fn rand_type(r: &mut Rng, dtypes: &[DType], min_rank: usize) -> Type {
    let rank = min_rank + r.below(4 - min_rank);
    let shape: Vec<usize> = (0..rank)
        .map(|_| if r.chance(1, 12) { 0 } else { 1 + r.below(4) })
        .collect();
    Type::new(r.pick(dtypes), shape)
}

/// A constant value valid for `dtype`, never NaN (NaN != NaN would fail the comparison).
fn rand_value(r: &mut Rng, dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 => {
            let special = [
                0.0,
                -0.0,
                1.0,
                -2.5,
                0.1,
                1.0 / 3.0,
                1e-10,
                1e300,
                -1e-300,
                5e-324,
                f64::MIN_POSITIVE,
                f64::MAX,
                f64::INFINITY,
                f64::NEG_INFINITY,
                1e16,
                123456789.0,
            ];
            if r.chance(1, 2) {
                r.pick(&special)
            } else {
                let v = f64::from_bits(r.next());
                if v.is_nan() {
                    0.5
                } else {
                    v
                }
            }
        }
        DType::I32 => {
            let special = [0.0, -1.0, 1.0, i32::MIN as f64, i32::MAX as f64];
            if r.chance(1, 2) {
                r.pick(&special)
            } else {
                f64::from(r.next() as i32)
            }
        }
        DType::Bool => r.pick(&[0.0, 1.0]),
    }
}

/// The meshes programs are built over (`None`: no collectives, no shardings).
fn rand_mesh(r: &mut Rng) -> Option<Mesh> {
    match r.below(6) {
        0 => None,
        1 | 2 => Some(Mesh::new(&[("a", 2), ("b", 2)]).unwrap()),
        3 => Some(Mesh::new(&[("a", 2), ("b", 3)]).unwrap()),
        4 => Some(Mesh::with_devices(&[("x", 4)], vec![3, 1, 0, 2]).unwrap()),
        _ => {
            let mut devices: Vec<u32> = (0..8).collect();
            r.shuffle(&mut devices);
            Some(Mesh::with_devices(&[("data", 2), ("e_1", 1), ("0th", 4)], devices).unwrap())
        }
    }
}

/// A random valid sharding of a rank-`rank` value: every axis splits a dim, is partial,
/// or replicates; axes are visited in random order so groups come out in any order.
fn rand_sharding(r: &mut Rng, mesh: &Mesh, rank: usize) -> Sharding {
    let mut s = Sharding::replicated(rank);
    let mut names: Vec<String> = mesh.axes.iter().map(|a| a.name.clone()).collect();
    r.shuffle(&mut names);
    for name in names {
        match r.below(4) {
            0 | 1 if rank > 0 => {
                let d = r.below(rank);
                s.dims[d].push(name);
            }
            2 => s.partial.push(name),
            _ => {}
        }
    }
    s
}

/// Random distinct mesh axes in random order (possibly none).
fn rand_axes(r: &mut Rng, mesh: &Mesh) -> Vec<String> {
    let mut names: Vec<String> = mesh.axes.iter().map(|a| a.name.clone()).collect();
    r.shuffle(&mut names);
    names.truncate(r.below(names.len() + 1));
    names
}

/// Builds a valid program instruction by instruction.
struct Gen {
    p: Program,
    unique: usize,
}

impl Gen {
    fn ty(&self, v: ValueId) -> Type {
        self.p.ty(v).clone()
    }

    /// Append `op`, with its type from `infer_type` (a failure is a generator bug).
    fn push(&mut self, op: Op, operands: Vec<ValueId>, declared: Option<Type>) -> ValueId {
        let tys: Vec<&Type> = operands.iter().map(|&o| self.p.ty(o)).collect();
        let ty = infer_type(&op, &tys, declared.as_ref(), self.p.mesh.as_ref())
            .unwrap_or_else(|e| panic!("generator bug: {e}"));
        // Scopes (metadata) vary with the position: the root, nested paths, the `grad`
        // marker, a path that needs escapes, checkpoint marks (the path itself or a prefix
        // of it); interned in another order than a parse would.
        const PATHS: [&str; 5] = ["", "encoder/layer1/attn", "moe", "a \"b\"\\c/d", "x"];
        let k = (self.p.len() * 7 + self.unique) % (4 * PATHS.len());
        let path = PATHS[k % PATHS.len()];
        let checkpoint = match k / (2 * PATHS.len()) {
            _ if path.is_empty() => None,
            0 => None,
            _ if k.is_multiple_of(3) => Some(path.to_string()),
            _ => path.split('/').next().map(str::to_string),
        };
        let scope = self.p.scopes.intern(ir::Scope {
            path: path.to_string(),
            grad: k % (2 * PATHS.len()) >= PATHS.len(),
            checkpoint,
        });
        self.p.push(Instr {
            op,
            operands,
            ty,
            sharding: None,
            scope,
        })
    }

    fn param(&mut self, r: &mut Rng, ty: Type) -> ValueId {
        self.unique += 1;
        let name = rand_name(r, self.unique);
        self.push(Op::Parameter { name }, vec![], Some(ty))
    }

    /// An existing value whose type satisfies `ok` (usually), or a new parameter of type
    /// `make()`.
    fn choose(
        &mut self,
        r: &mut Rng,
        ok: impl Fn(&Type) -> bool,
        make: impl FnOnce(&mut Rng) -> Type,
    ) -> ValueId {
        let found: Vec<usize> = (0..self.p.len())
            .filter(|&i| ok(&self.p.instrs[i].ty))
            .collect();
        if !found.is_empty() && r.chance(3, 4) {
            return ValueId(r.pick(&found) as u32);
        }
        let ty = make(r);
        assert!(
            ok(&ty),
            "generator bug: made {ty} that its predicate rejects"
        );
        self.param(r, ty)
    }

    /// A value with a dtype in `dtypes` and rank at least `min_rank`.
    fn operand(&mut self, r: &mut Rng, dtypes: &[DType], min_rank: usize) -> ValueId {
        self.choose(
            r,
            |t| dtypes.contains(&t.dtype) && t.rank() >= min_rank,
            |r| rand_type(r, dtypes, min_rank),
        )
    }

    /// A value of exactly type `ty`.
    fn of_type(&mut self, r: &mut Rng, ty: &Type) -> ValueId {
        self.choose(r, |t| t == ty, |_| ty.clone())
    }

    /// `n` i32 scalars (dynamic slice starts, rng offsets).
    fn indices(&mut self, r: &mut Rng, n: usize) -> Vec<ValueId> {
        (0..n)
            .map(|_| self.of_type(r, &Type::scalar(DType::I32)))
            .collect()
    }

    /// Append one instruction of kind `kind` (see [`kind_of`]).
    fn step(&mut self, r: &mut Rng, kind: usize) {
        let mesh = self.p.mesh.clone();
        let v = match (kind, &mesh) {
            (0, _) => {
                let t = rand_type(r, &DType::ALL, 0);
                self.param(r, t)
            }
            (1, _) => {
                let t = rand_type(r, &DType::ALL, 0);
                let value = if t.num_elements() <= 16 && r.chance(2, 3) {
                    Literal::Dense(
                        (0..t.num_elements())
                            .map(|_| rand_value(r, t.dtype))
                            .collect(),
                    )
                } else {
                    Literal::Splat(rand_value(r, t.dtype))
                };
                self.push(Op::Constant { value }, vec![], Some(t))
            }
            (2, _) => {
                let t = rand_type(r, &NUMERIC, 1);
                let dim = r.below(t.rank());
                self.push(Op::Iota { dim }, vec![], Some(t))
            }
            (3, _) => {
                let u = r.pick(&UnaryOp::ALL);
                let dtypes: &[DType] = match u {
                    UnaryOp::Not => &INT_OR_BOOL,
                    UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => &NUMERIC,
                    _ => &FLOATS,
                };
                let x = self.operand(r, dtypes, 0);
                self.push(Op::Unary(u), vec![x], None)
            }
            (4, _) => {
                let b = r.pick(&BinaryOp::ALL);
                let dtypes: &[DType] = match b {
                    BinaryOp::And | BinaryOp::Or => &INT_OR_BOOL,
                    BinaryOp::Pow => &FLOATS,
                    _ => &NUMERIC,
                };
                let x = self.operand(r, dtypes, 0);
                let y = self.of_type(r, &self.ty(x));
                self.push(Op::Binary(b), vec![x, y], None)
            }
            (5, _) => {
                let c = r.pick(&CompareOp::ALL);
                let x = self.operand(r, &DType::ALL, 0);
                let y = self.of_type(r, &self.ty(x));
                self.push(Op::Compare(c), vec![x, y], None)
            }
            (6, _) => {
                let t = self.operand(r, &DType::ALL, 0);
                let f = self.of_type(r, &self.ty(t));
                let pred = self.of_type(r, &self.ty(t).with_dtype(DType::Bool));
                self.push(Op::Select, vec![pred, t, f], None)
            }
            (7, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let to = self.ty(x).with_dtype(r.pick(&DType::ALL));
                self.push(Op::Convert, vec![x], Some(to))
            }
            (8, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                self.push(Op::StopGradient, vec![x], None)
            }
            (9, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                self.push(Op::Copy, vec![x], None)
            }
            (10, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let xt = self.ty(x);
                let rank = xt.rank() + r.below(3);
                let mut positions: Vec<usize> = (0..rank).collect();
                r.shuffle(&mut positions);
                let mut dims = positions[..xt.rank()].to_vec();
                dims.sort_unstable();
                let mut shape: Vec<usize> = (0..rank).map(|_| 1 + r.below(3)).collect();
                for (i, &d) in dims.iter().enumerate() {
                    shape[d] = xt.shape[i];
                }
                self.push(Op::Broadcast { dims }, vec![x], Some(xt.with_shape(shape)))
            }
            (11, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let xt = self.ty(x);
                let n = xt.num_elements();
                let mut reversed = xt.shape.clone();
                reversed.reverse();
                let shapes = [vec![n], vec![1, n], vec![n, 1], reversed];
                let shape = shapes[r.below(shapes.len())].clone();
                self.push(Op::Reshape, vec![x], Some(xt.with_shape(shape)))
            }
            (12, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let mut perm: Vec<usize> = (0..self.ty(x).rank()).collect();
                r.shuffle(&mut perm);
                self.push(Op::Transpose { perm }, vec![x], None)
            }
            (13, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let (mut start, mut limit) = (vec![], vec![]);
                for d in self.ty(x).shape {
                    let a = r.below(d + 1);
                    start.push(a);
                    limit.push(a + r.below(d - a + 1));
                }
                self.push(Op::Slice { start, limit }, vec![x], None)
            }
            (14, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let xt = self.ty(x);
                let sizes: Vec<usize> = xt.shape.iter().map(|&d| r.below(d + 1)).collect();
                let mut operands = vec![x];
                operands.extend(self.indices(r, xt.rank()));
                self.push(Op::DynamicSlice { sizes }, operands, None)
            }
            (15, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let xt = self.ty(x);
                let ut =
                    xt.with_shape(xt.shape.iter().map(|&d| r.below(d + 1)).collect::<Vec<_>>());
                let u = self.of_type(r, &ut);
                let mut operands = vec![x, u];
                operands.extend(self.indices(r, xt.rank()));
                self.push(Op::DynamicUpdateSlice, operands, None)
            }
            (16, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let xt = self.ty(x);
                let pad = self.of_type(r, &Type::scalar(xt.dtype));
                let low = (0..xt.rank()).map(|_| r.below(3)).collect();
                let high = (0..xt.rank()).map(|_| r.below(3)).collect();
                self.push(Op::Pad { low, high }, vec![x, pad], None)
            }
            (17, _) => {
                let x = self.operand(r, &DType::ALL, 1);
                let xt = self.ty(x);
                let dim = r.below(xt.rank());
                let mut operands = vec![x];
                for _ in 0..r.below(3) {
                    let mut shape = xt.shape.clone();
                    shape[dim] = r.below(4);
                    operands.push(self.of_type(r, &xt.with_shape(shape)));
                }
                self.push(Op::Concatenate { dim }, operands, None)
            }
            (18, _) => {
                let x = self.operand(r, &NUMERIC, 0);
                let mut dims: Vec<usize> = (0..self.ty(x).rank()).collect();
                r.shuffle(&mut dims);
                dims.truncate(r.below(dims.len() + 1));
                let op = r.pick(&ReduceOp::ALL);
                self.push(Op::Reduce { op, dims }, vec![x], None)
            }
            (19, _) => {
                let lhs = self.operand(r, &NUMERIC, 0);
                let lt = self.ty(lhs);
                let mut dd = DotDims::default();
                let mut lhs_dims: Vec<usize> = (0..lt.rank()).collect();
                r.shuffle(&mut lhs_dims);
                for d in lhs_dims {
                    match r.below(3) {
                        0 => dd.lhs_batch.push(d),
                        1 => dd.lhs_contract.push(d),
                        _ => {}
                    }
                }
                // Rhs positions: batch dims, then contracting, then free, scattered.
                let paired: Vec<usize> = dd
                    .lhs_batch
                    .iter()
                    .chain(&dd.lhs_contract)
                    .map(|&d| lt.shape[d])
                    .collect();
                let free = r.below(3);
                let mut positions: Vec<usize> = (0..paired.len() + free).collect();
                r.shuffle(&mut positions);
                let mut shape: Vec<usize> = (0..positions.len()).map(|_| 1 + r.below(3)).collect();
                for (k, &size) in paired.iter().enumerate() {
                    shape[positions[k]] = size;
                }
                let nb = dd.lhs_batch.len();
                dd.rhs_batch = positions[..nb].to_vec();
                dd.rhs_contract = positions[nb..paired.len()].to_vec();
                let rhs = self.of_type(r, &lt.with_shape(shape));
                self.push(Op::DotGeneral(dd), vec![lhs, rhs], None)
            }
            (20, _) => {
                let x = self.operand(r, &NUMERIC, 1);
                let op = Op::Cumsum {
                    dim: r.below(self.ty(x).rank()),
                    exclusive: r.chance(1, 2),
                    reverse: r.chance(1, 2),
                };
                self.push(op, vec![x], None)
            }
            (21, _) => {
                let x = self.operand(r, &NUMERIC, 1);
                let dim = r.below(self.ty(x).rank());
                self.push(Op::Argmax { dim }, vec![x], None)
            }
            (22 | 23, _) => {
                let x = self.operand(r, &NUMERIC, 1);
                let xt = self.ty(x);
                let axis = r.below(xt.rank());
                let batch_dims = r.below(axis + 1);
                let mut idx_shape = xt.shape[..batch_dims].to_vec();
                idx_shape.extend((0..r.below(3)).map(|_| r.below(4)));
                let idx = self.of_type(r, &Type::new(DType::I32, idx_shape));
                let gather = Op::Gather { axis, batch_dims };
                if kind == 22 {
                    self.push(gather, vec![x, idx], None)
                } else {
                    let it = self.ty(idx);
                    let ut = infer_type(&gather, &[&xt, &it], None, None).unwrap();
                    let upd = self.of_type(r, &ut);
                    self.push(Op::ScatterAdd { axis, batch_dims }, vec![x, idx, upd], None)
                }
            }
            (24, _) => {
                let t = rand_type(r, &FLOATS, 0);
                let mut operands = self.indices(r, 1);
                let global_shape = if r.chance(1, 2) {
                    operands.extend(self.indices(r, t.rank()));
                    t.shape.iter().map(|&d| d + r.below(3)).collect()
                } else {
                    t.shape.clone()
                };
                let op = Op::Rng {
                    dist: r.pick(&[RngDist::Uniform, RngDist::Normal]),
                    stream: if r.chance(1, 2) {
                        r.below(10) as u64
                    } else {
                        r.next()
                    },
                    global_shape,
                };
                self.push(op, operands, Some(t))
            }
            (25, _) => self.push(Op::PartitionId, vec![], None),
            (26, Some(m)) => {
                let x = self.operand(r, &NUMERIC, 0);
                let op = Op::all_reduce(r.pick(&ReduceOp::ALL), rand_axes(r, m));
                self.push(op, vec![x], None)
            }
            (27, Some(m)) => {
                let x = self.operand(r, &DType::ALL, 1);
                let dim = r.below(self.ty(x).rank());
                let axes = rand_axes(r, m);
                self.push(Op::all_gather(dim, axes), vec![x], None)
            }
            (28 | 29, Some(m)) => {
                // A dim that divides by the group size k; reductions need numbers.
                let axes = rand_axes(r, m);
                let k = m.size_of(&axes);
                let dtypes: &[DType] = if kind == 28 { &NUMERIC } else { &DType::ALL };
                let x = self.choose(
                    r,
                    |t| dtypes.contains(&t.dtype) && t.shape.iter().any(|&d| d.is_multiple_of(k)),
                    |r| {
                        let mut t = rand_type(r, dtypes, 1);
                        let d = r.below(t.rank());
                        t.shape[d] = k * (1 + r.below(2));
                        t
                    },
                );
                let xt = self.ty(x);
                let divisible: Vec<usize> = (0..xt.rank())
                    .filter(|&d| xt.shape[d].is_multiple_of(k))
                    .collect();
                let dim = r.pick(&divisible);
                let op = if kind == 28 {
                    Op::reduce_scatter(r.pick(&ReduceOp::ALL), dim, axes)
                } else {
                    Op::all_to_all(dim, r.below(xt.rank()), axes)
                };
                self.push(op, vec![x], None)
            }
            (30, Some(m)) => {
                let x = self.operand(r, &DType::ALL, 0);
                let axes = rand_axes(r, m);
                let k = m.size_of(&axes);
                let mut src: Vec<usize> = (0..k).collect();
                let mut dst: Vec<usize> = (0..k).collect();
                r.shuffle(&mut src);
                r.shuffle(&mut dst);
                let n = r.below(k + 1);
                let pairs = src.into_iter().zip(dst).take(n).collect();
                self.push(Op::collective_permute(axes, pairs), vec![x], None)
            }
            (31, _) => {
                // lhs [N, S.., Cin] of 1-2 spatial dims, kernel [K.., Cin, Cout].
                let k = 1 + r.below(2);
                let x = self.choose(
                    r,
                    |t| NUMERIC.contains(&t.dtype) && t.rank() == k + 2,
                    |r| rand_type(r, &NUMERIC, k + 2),
                );
                let k = self.ty(x).rank() - 2;
                let xt = self.ty(x);
                let mut kshape: Vec<usize> = (0..k).map(|_| 1 + r.below(3)).collect();
                kshape.push(xt.shape[k + 1]);
                kshape.push(r.below(4));
                let (mut pad_lo, mut pad_hi) = (Vec::new(), Vec::new());
                for (&n, &kk) in xt.shape[1..=k].iter().zip(&kshape) {
                    let (lo, mut hi) = (r.below(3), r.below(3));
                    while lo + n + hi + 1 < kk {
                        hi += 1;
                    }
                    pad_lo.push(lo);
                    pad_hi.push(hi);
                }
                let w = self.of_type(r, &xt.with_shape(kshape));
                self.push(Op::Conv { pad_lo, pad_hi }, vec![x, w], None)
            }
            (32, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                let mut dims: Vec<usize> = (0..self.ty(x).rank()).collect();
                r.shuffle(&mut dims);
                dims.truncate(r.below(dims.len() + 1));
                self.push(Op::Reverse { dims }, vec![x], None)
            }
            // Collectives without a mesh: a copy instead.
            (_, _) => {
                let x = self.operand(r, &DType::ALL, 0);
                self.push(Op::Copy, vec![x], None)
            }
        };
        if let Some(m) = &mesh {
            if r.chance(1, 3) {
                let rank = self.ty(v).rank();
                self.p.instrs[v.index()].sharding = Some(rand_sharding(r, m, rank));
            }
        }
    }
}

/// A valid program from `words`: the first picks the mesh and the outputs, each of the
/// others adds one instruction (plus any parameters it needs).
fn build(words: &[u64]) -> Program {
    let (first, rest) = words.split_first().unwrap_or((&0, &[]));
    let mut r = Rng(*first);
    let mut g = Gen {
        p: Program {
            mesh: rand_mesh(&mut r),
            ..Program::default()
        },
        unique: 0,
    };
    for &w in rest {
        g.step(&mut Rng(w >> 8), (w & 0xff) as usize % NUM_KINDS);
    }
    let n_outputs = if g.p.is_empty() { 0 } else { r.below(4) };
    for _ in 0..n_outputs {
        g.unique += 1;
        let name = rand_name(&mut r, g.unique);
        let v = ValueId(r.below(g.p.len()) as u32);
        g.p.outputs.push((name, v));
    }
    g.p
}

fn words() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(any::<u64>(), 1..40)
}

/// Things worth splicing into a program text: huge and edge numbers, unbalanced brackets,
/// string and comment markers, non-ASCII and invisible characters.
const SPLICES: [&str; 28] = [
    "999999999999999999999",
    "18446744073709551615",
    "1099511627776",
    "4294967296",
    "-1",
    "0",
    "1e999",
    "-inf",
    "nan",
    "%",
    "%0",
    "\"",
    "\\",
    "\\u{110000}",
    "@{",
    "(",
    "[",
    "]",
    "#",
    "=",
    ",",
    "mesh [a=2]",
    "f32[]",
    "\u{feff}",
    "é",
    "🙂",
    "\r",
    "| partial a",
];

/// Apply one random mutation per word to `text` (edits are on characters, so the result
/// stays valid UTF-8).
fn mutate(text: &str, words: &[u64]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for &w in words {
        let mut r = Rng(w);
        let n = chars.len();
        let at = r.below(n + 1);
        match r.below(9) {
            0 => {
                let end = (at + 1 + r.below(8)).min(n);
                chars.drain(at..end);
            }
            1 => {
                let c = char::from_u32(r.next() as u32 % 0x11_0000).unwrap_or('\u{fffd}');
                chars.insert(at, c);
            }
            2 if at < n => chars[at] = r.pick(&['"', '%', ']', '0', '-', '\n', 'x', '\u{0}', 'ß']),
            3 => chars.truncate(at),
            4 | 5 => {
                // Duplicate, or delete, a line.
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.split('\n').collect();
                let k = r.below(lines.len());
                if r.chance(1, 2) {
                    lines.insert(k, lines[k]);
                } else {
                    lines.remove(k);
                }
                chars = lines.join("\n").chars().collect();
            }
            6 => {
                // Swap two whitespace-separated tokens.
                let s: String = chars.iter().collect();
                let mut toks: Vec<&str> = s.split(' ').collect();
                let (i, j) = (r.below(toks.len()), r.below(toks.len()));
                toks.swap(i, j);
                chars = toks.join(" ").chars().collect();
            }
            7 => {
                let splice = r.pick(&SPLICES);
                chars.splice(at..at, splice.chars());
            }
            _ => {
                // Replace a run of digits with a huge or edge number.
                if let Some(start) = (at..n).find(|&i| chars[i].is_ascii_digit()) {
                    let end = (start..n)
                        .find(|&i| !chars[i].is_ascii_digit())
                        .unwrap_or(n);
                    let splice = r.pick(&SPLICES[..7]);
                    chars.splice(start..end, splice.chars());
                }
            }
        }
    }
    chars.into_iter().collect()
}

/// Whatever `parse` accepts is valid and prints to a fixed point.
fn check_accepted(src: &str) -> Result<(), TestCaseError> {
    if let Ok(p) = parse(src) {
        prop_assert!(
            verify(&p).is_ok(),
            "parse accepted an invalid program:\n{src}"
        );
        let text = print(&p);
        let again = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(print(&again), text);
    }
    Ok(())
}

proptest! {
    #[test]
    fn random_programs_round_trip(words in words()) {
        let p = build(&words);
        if let Err(e) = verify(&p) {
            return Err(TestCaseError::fail(format!("generator made an invalid program: {e}")));
        }
        let text = print(&p);
        let q = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&q, &p, "\n{}", text);
        prop_assert_eq!(print(&q), text);
    }

    #[test]
    fn mutated_programs_never_panic(
        words in prop::collection::vec(any::<u64>(), 1..24),
        edits in prop::collection::vec(any::<u64>(), 1..6),
    ) {
        let text = mutate(&print(&build(&words)), &edits);
        check_accepted(&text)?;
    }

    #[test]
    fn arbitrary_strings_never_panic(s in "\\PC{0,200}") {
        check_accepted(&s)?;
    }

    #[test]
    fn arbitrary_token_soup_never_panics(
        parts in prop::collection::vec(
            prop::sample::select(vec![
                "%0", "%x", " ", "=", "f32", "i32[]", "[", "]", "4", ",", "(", ")", "add",
                "parameter", "constant", "\"x\"", "@", "{", "}", "_", "|", "partial", "a",
                "mesh", "output", "dim", "axes", "\n", "#", "-inf", "1e-3", "1099511627776",
                "all_reduce", "op", "sum", "pairs", "devices",
            ]),
            0..60,
        ),
    ) {
        check_accepted(&parts.concat())?;
    }
}

/// The generator reaches every op kind (so the round-trip property covers every variant).
#[test]
fn generator_covers_every_op() {
    let mut seen = [false; NUM_KINDS];
    let mut r = Rng(42);
    for _ in 0..300 {
        let words: Vec<u64> = (0..40).map(|_| r.next()).collect();
        for ins in build(&words).instrs {
            seen[kind_of(&ins.op)] = true;
        }
    }
    let missing: Vec<usize> = (0..NUM_KINDS).filter(|&k| !seen[k]).collect();
    assert!(missing.is_empty(), "kinds never generated: {missing:?}");
}
