//! The random program generator of `prop_oracle`: the op kinds, the choices read from the
//! program and sharding bytes, and `Gen`, which builds a program one op at a time.

use super::*;

/// Deterministic choices from a byte string (0 = simplest; past the end = 0).
pub struct Choices {
    pub bytes: Vec<u8>,
    pub at: usize,
}

impl Choices {
    pub fn new(bytes: &[u8]) -> Choices {
        Choices {
            bytes: bytes.to_vec(),
            at: 0,
        }
    }

    pub fn byte(&mut self) -> usize {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b as usize
    }

    /// A number in `0..n` (`n >= 1`).
    pub fn below(&mut self, n: usize) -> usize {
        self.byte() % n.max(1)
    }

    pub fn flip(&mut self) -> bool {
        self.below(2) == 1
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }

    /// A random permutation of `0..n` (identity when all choices are zero).
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = i - self.below(i + 1);
            p.swap(i, j);
        }
        p
    }
}

/// Every op of the unpartitioned op set, as generated here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Parameter,
    ConstSplat,
    ConstDense,
    Iota,
    Unary,
    Binary,
    Compare,
    Select,
    Convert,
    StopGradient,
    Copy,
    Broadcast,
    Reshape,
    Transpose,
    Slice,
    DynamicSlice,
    DynamicUpdateSlice,
    Pad,
    Concatenate,
    Reduce,
    DotGeneral,
    Conv,
    Reverse,
    Cumsum,
    Argmax,
    Gather,
    ScatterAdd,
    Rng,
}

pub const ALL_KINDS: [Kind; 28] = [
    Kind::Parameter,
    Kind::ConstSplat,
    Kind::ConstDense,
    Kind::Iota,
    Kind::Unary,
    Kind::Binary,
    Kind::Compare,
    Kind::Select,
    Kind::Convert,
    Kind::StopGradient,
    Kind::Copy,
    Kind::Broadcast,
    Kind::Reshape,
    Kind::Transpose,
    Kind::Slice,
    Kind::DynamicSlice,
    Kind::DynamicUpdateSlice,
    Kind::Pad,
    Kind::Concatenate,
    Kind::Reduce,
    Kind::DotGeneral,
    Kind::Conv,
    Kind::Reverse,
    Kind::Cumsum,
    Kind::Argmax,
    Kind::Gather,
    Kind::ScatterAdd,
    Kind::Rng,
];

/// Kinds whose result stays a float when the operand is one (the differentiable chains).
pub const FLOAT_KINDS: [Kind; 24] = [
    Kind::ConstSplat,
    Kind::ConstDense,
    Kind::Iota,
    Kind::Unary,
    Kind::Binary,
    Kind::Select,
    Kind::StopGradient,
    Kind::Copy,
    Kind::Broadcast,
    Kind::Reshape,
    Kind::Transpose,
    Kind::Slice,
    Kind::DynamicSlice,
    Kind::DynamicUpdateSlice,
    Kind::Pad,
    Kind::Concatenate,
    Kind::Reduce,
    Kind::DotGeneral,
    Kind::Conv,
    Kind::Reverse,
    Kind::Cumsum,
    Kind::Gather,
    Kind::ScatterAdd,
    Kind::Rng,
];

/// Dim sizes: mostly small, many that do not divide 2, 4 or 8, a few above 8 (so 8-way
/// splits also get partly filled shards), and an empty dim.
pub const DIMS: [usize; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 0];
/// Fresh parameters have at most this many elements.
pub const MAX_PARAM_ELEMS: usize = 512;

/// Builds one random program on one mesh, with its inputs.
pub struct Gen {
    pub b: Builder,
    pub mesh: Mesh,
    pub c: Choices,
    pub s: Choices,
    pub seed: u64,
    pub inputs: HashMap<String, HostTensor>,
    /// Float parameters (the `wrt` of the gradient property).
    pub float_params: Vec<String>,
    /// Only f64 values (gradient chains).
    pub float_only: bool,
    /// Earlier values of a chain, for operands with several users.
    pub pool: Vec<Value>,
}

impl Gen {
    pub fn new(mesh: &Mesh, prog: &[u8], shard: &[u8], seed: u64) -> Gen {
        Gen {
            b: Builder::with_mesh(mesh.clone()),
            mesh: mesh.clone(),
            c: Choices::new(prog),
            s: Choices::new(shard),
            seed,
            inputs: HashMap::new(),
            float_params: Vec::new(),
            float_only: false,
            pool: Vec::new(),
        }
    }

    // ---- shardings ----

    /// A random sharding of a rank-`rank` value on this mesh, or `None` (leave it to
    /// propagation): a random subset of the mesh axes per dim, several axes on one dim in
    /// random order. Always reads `PER_ANNOTATION` sharding bytes.
    pub fn decode(&mut self, rank: usize) -> Option<Sharding> {
        let bytes: [usize; PER_ANNOTATION] = std::array::from_fn(|_| self.s.byte());
        let (mode, order, picks) = (bytes[0], bytes[1], [bytes[2], bytes[3]]);
        if mode % 3 == 0 {
            return None;
        }
        let mut axes: Vec<String> = self.mesh.axes.iter().map(|a| a.name.clone()).collect();
        if order % 2 == 1 {
            axes.reverse();
        }
        let mut dims: Vec<Vec<String>> = vec![Vec::new(); rank];
        for (a, p) in axes.into_iter().zip(picks) {
            let k = p % (rank + 1);
            if k > 0 {
                dims[k - 1].push(a);
            }
        }
        Some(Sharding {
            dims,
            partial: Vec::new(),
        })
    }

    /// An annotation point: maybe annotate `v` (with `sharding::mesh_split`).
    pub fn shard(&mut self, v: &Value) -> Value {
        let Some(s) = self.decode(v.rank()) else {
            return v.clone();
        };
        let dims: Vec<Vec<&str>> = s
            .dims
            .iter()
            .map(|d| d.iter().map(|a| a.as_str()).collect())
            .collect();
        let refs: Vec<&[&str]> = dims.iter().map(|d| d.as_slice()).collect();
        sharding::mesh_split(v, &refs).expect("valid random sharding")
    }

    /// Give every still unannotated instruction of `p` a random sharding (or none), as if
    /// the user had annotated everything: the partitioner then sees arbitrary layouts on
    /// both sides of every op, not only the ones propagation would choose.
    pub fn shard_everything(&mut self, p: &mut Program) {
        for i in 0..p.instrs.len() {
            if p.instrs[i].sharding.is_none() {
                p.instrs[i].sharding = self.decode(p.instrs[i].ty.rank());
            }
        }
    }

    // ---- shapes, dtypes, parameters ----

    pub fn dim(&mut self) -> usize {
        self.c.pick(&DIMS)
    }

    pub fn shape(&mut self, min_rank: usize, max_rank: usize) -> Vec<usize> {
        let r = min_rank + self.c.below(max_rank - min_rank + 1);
        let s: Vec<usize> = (0..r).map(|_| self.dim()).collect();
        capped(s)
    }

    pub fn dtype(&mut self) -> DType {
        if self.float_only {
            return DType::F64;
        }
        self.c
            .pick(&[DType::F64, DType::I32, DType::F64, DType::Bool])
    }

    pub fn numeric_dtype(&mut self) -> DType {
        if self.float_only {
            return DType::F64;
        }
        self.c.pick(&[DType::F64, DType::I32])
    }

    pub fn next_seed(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.seed
    }

    /// Random values of a dtype: f64 in [-2, 2), i32 in [-5, 5], bools.
    pub fn values(&mut self, dtype: DType, n: usize) -> Vec<f64> {
        let s = self.next_seed();
        let v = fixed_values(n, s);
        match dtype {
            DType::I32 => v.iter().map(|x| (x * 5.0).round()).collect(),
            DType::Bool => v.iter().map(|x| (*x > 0.0) as u8 as f64).collect(),
            DType::F32 | DType::F64 | DType::BF16 => v.iter().map(|x| x * 2.0).collect(),
        }
    }

    /// A new parameter with the given values, at an annotation point.
    pub fn param_with(&mut self, ty: Type, values: &[f64]) -> Value {
        let name = format!("p{}", self.inputs.len());
        if ty.dtype.is_float() {
            self.float_params.push(name.clone());
        }
        self.inputs.insert(
            name.clone(),
            HostTensor::from_f64_values(ty.clone(), values),
        );
        let p = self.b.param(&name, ty);
        self.shard(&p)
    }

    pub fn param(&mut self, ty: Type) -> Value {
        let vals = self.values(ty.dtype, ty.num_elements());
        self.param_with(ty, &vals)
    }

    /// The shape of gather / scatter indices into `x` along `axis` with `b` batch dims: the
    /// batch dims, then 0-2 index dims, kept small enough that the gathered value (`x`
    /// with `axis` replaced by the index dims) has at most `MAX_PARAM_ELEMS` elements.
    pub fn index_shape(&mut self, x: &[usize], axis: usize, b: usize) -> Vec<usize> {
        let rest: usize = (0..x.len()).filter(|&d| d != axis).map(|d| x[d]).product();
        let mut extra: Vec<usize> = (0..self.c.below(3)).map(|_| self.dim()).collect();
        while rest * extra.iter().product::<usize>() > MAX_PARAM_ELEMS {
            let Some(d) = (0..extra.len())
                .filter(|&d| extra[d] > 1)
                .max_by_key(|&d| extra[d])
            else {
                break;
            };
            extra[d] = extra[d].div_ceil(2);
        }
        let mut shape = x[..b].to_vec();
        shape.extend(extra);
        shape
    }

    /// i32 indices in `[-1, n]` (both ends out of range).
    pub fn index_param(&mut self, shape: Vec<usize>, n: usize) -> Value {
        let s = self.next_seed();
        let vals: Vec<f64> = fixed_values(shape.iter().product(), s)
            .iter()
            .map(|x| ((x + 1.0) / 2.0 * (n as f64 + 2.0)).floor() - 1.0)
            .collect();
        self.param_with(Type::new(DType::I32, shape), &vals)
    }

    /// An i32 scalar start for dimension size `n` and window `size`: usually in range,
    /// sometimes below 0 or past `n - size` (the op clamps).
    pub fn start_param(&mut self, n: usize, size: usize) -> Value {
        let v = self.c.below(n - size + 3) as f64 - 1.0;
        self.param_with(Type::scalar(DType::I32), &[v])
    }

    /// A second operand of `x`'s type: a new parameter, an earlier chain value of that type
    /// (a value with several users), or `x` itself.
    pub fn partner(&mut self, x: &Value) -> Value {
        match self.c.below(4) {
            3 => x.clone(),
            2 => {
                let same: Vec<Value> = self
                    .pool
                    .iter()
                    .filter(|v| v.ty() == x.ty())
                    .cloned()
                    .collect();
                if same.is_empty() {
                    self.param(x.ty())
                } else {
                    self.c.pick(&same)
                }
            }
            _ => self.param(x.ty()),
        }
    }

    pub fn emit(&self, op: Op, operands: &[&Value], declared: Option<Type>) -> Value {
        self.b.emit(op, operands, declared)
    }

    // ---- adapting an operand ----

    pub fn to_dtype(&self, x: &Value, d: DType) -> Value {
        if x.dtype() == d {
            x.clone()
        } else {
            self.emit(Op::Convert, &[x], Some(x.ty().with_dtype(d)))
        }
    }

    /// `x` as a numeric value (bools become f64).
    pub fn numeric(&self, x: &Value) -> Value {
        if x.dtype() == DType::Bool {
            self.to_dtype(x, DType::F64)
        } else {
            x.clone()
        }
    }

    pub fn at_least_rank1(&self, x: &Value) -> Value {
        if x.rank() == 0 {
            self.emit(Op::Reshape, &[x], Some(x.ty().with_shape([1])))
        } else {
            x.clone()
        }
    }

    /// Halve the largest dim (by a slice) until `x` is small.
    pub fn small(&self, x: &Value) -> Value {
        let mut x = x.clone();
        while x.ty().num_elements() > MAX_ELEMS {
            let s = x.shape();
            let d = (0..s.len()).max_by_key(|&d| s[d]).unwrap();
            x = x.slice_dim(d, 0, s[d].div_ceil(2));
        }
        x
    }

    /// The operand of a generated op: `x` when chaining, else a new parameter of a random
    /// dtype and shape; of rank `min_rank` or more.
    pub fn operand(&mut self, x: Option<&Value>, min_rank: usize) -> Value {
        match x {
            Some(x) if min_rank > 0 => self.at_least_rank1(x),
            Some(x) => x.clone(),
            None => {
                let shape = self.shape(min_rank, 3);
                let d = self.dtype();
                self.param(Type::new(d, shape))
            }
        }
    }

    /// Combine a freshly made source value with the chain value `x` (if any).
    pub fn with_chain(&self, src: Value, x: Option<&Value>) -> Value {
        match x {
            None => src,
            Some(x) => {
                let src = self.to_dtype(&src, self.numeric(x).dtype());
                let x = self.numeric(x);
                self.emit(Op::Binary(BinaryOp::Add), &[&x, &src], None)
            }
        }
    }

    // ---- one op ----

    /// Emit one op of `kind` (on `x` when chaining, else on new parameters).
    pub fn op(&mut self, kind: Kind, x: Option<&Value>) -> Value {
        match kind {
            Kind::Parameter => {
                let p = self.operand(x, 0);
                let p = self.shard(&p);
                // A parameter used by an op that wants another layout.
                self.emit(Op::Copy, &[&p], None)
            }
            Kind::ConstSplat => {
                let ty = match x {
                    Some(x) => x.ty(),
                    None => {
                        let (d, s) = (self.dtype(), self.shape(0, 3));
                        Type::new(d, s)
                    }
                };
                let v = self.values(ty.dtype, 1)[0];
                let c = self.b.splat(v, ty);
                let c = self.shard(&c);
                self.with_chain(c, x)
            }
            Kind::ConstDense => {
                let ty = match x {
                    Some(x) => x.ty(),
                    None => {
                        let (d, s) = (self.dtype(), self.shape(0, 3));
                        Type::new(d, s)
                    }
                };
                let v = self.values(ty.dtype, ty.num_elements());
                let c = self.b.constant(v, ty);
                let c = self.shard(&c);
                self.with_chain(c, x)
            }
            Kind::Iota => {
                let shape = match x {
                    Some(x) => self.at_least_rank1(x).shape(),
                    None => self.shape(1, 3),
                };
                let d = self.numeric_dtype();
                let dim = self.c.below(shape.len());
                let i = self.b.iota(Type::new(d, shape), dim);
                let i = self.shard(&i);
                let x = x.map(|x| self.at_least_rank1(x));
                self.with_chain(i, x.as_ref())
            }
            Kind::Unary => {
                let x = self.operand(x, 0);
                let ops: Vec<UnaryOp> = match x.dtype() {
                    DType::Bool => vec![UnaryOp::Not],
                    DType::I32 => vec![UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Not],
                    DType::F32 | DType::F64 | DType::BF16 => UnaryOp::ALL
                        .into_iter()
                        .filter(|u| *u != UnaryOp::Not)
                        .collect(),
                };
                let u = self.c.pick(&ops);
                self.emit(Op::Unary(u), &[&x], None)
            }
            Kind::Binary => {
                let x = self.operand(x, 0);
                let y = self.partner(&x);
                let ops: Vec<BinaryOp> = match x.dtype() {
                    DType::Bool => vec![BinaryOp::And, BinaryOp::Or],
                    DType::I32 => BinaryOp::ALL
                        .into_iter()
                        .filter(|b| *b != BinaryOp::Pow)
                        .collect(),
                    DType::F32 | DType::F64 | DType::BF16 => BinaryOp::ALL
                        .into_iter()
                        .filter(|b| !matches!(b, BinaryOp::And | BinaryOp::Or))
                        .collect(),
                };
                let op = self.c.pick(&ops);
                let (l, r) = if self.c.flip() { (y, x) } else { (x, y) };
                self.emit(Op::Binary(op), &[&l, &r], None)
            }
            Kind::Compare => {
                let x = self.operand(x, 0);
                let y = self.partner(&x);
                let op = self.c.pick(&CompareOp::ALL);
                self.emit(Op::Compare(op), &[&x, &y], None)
            }
            Kind::Select => {
                let x = self.operand(x, 0);
                let (pred, t) = if x.dtype() == DType::Bool && !self.float_only {
                    let t = self.param(x.ty().with_dtype(DType::F64));
                    (x, t)
                } else {
                    let pred = self.param(x.ty().with_dtype(DType::Bool));
                    (pred, x)
                };
                let f = self.partner(&t);
                let (t, f) = if self.c.flip() { (f, t) } else { (t, f) };
                self.emit(Op::Select, &[&pred, &t, &f], None)
            }
            Kind::Convert => {
                let x = self.operand(x, 0);
                let to: Vec<DType> = [DType::F64, DType::I32, DType::Bool]
                    .into_iter()
                    .filter(|d| *d != x.dtype())
                    .collect();
                let d = self.c.pick(&to);
                self.emit(Op::Convert, &[&x], Some(x.ty().with_dtype(d)))
            }
            Kind::StopGradient => {
                let x = self.operand(x, 0);
                self.emit(Op::StopGradient, &[&x], None)
            }
            Kind::Copy => {
                let x = self.operand(x, 0);
                self.emit(Op::Copy, &[&x], None)
            }
            Kind::Broadcast => {
                let x = self.operand(x, 0);
                let mut shape = x.shape();
                let mut from: Vec<Option<usize>> = (0..shape.len()).map(Some).collect();
                for _ in 0..self.c.below(3) {
                    let at = self.c.below(shape.len() + 1);
                    let n = self.dim();
                    shape.insert(at, n);
                    from.insert(at, None);
                }
                let dims: Vec<usize> = (0..from.len()).filter(|&i| from[i].is_some()).collect();
                let x = self.emit(
                    Op::Broadcast { dims },
                    &[&x],
                    Some(x.ty().with_shape(shape)),
                );
                self.small(&x)
            }
            Kind::Reshape => {
                let x = self.operand(x, 0);
                let mut atoms = Vec::new();
                for n in x.shape() {
                    atoms.extend(factors(n));
                }
                let mut shape: Vec<usize> = Vec::new();
                for a in atoms {
                    match shape.last_mut() {
                        Some(l) if self.c.flip() => *l *= a,
                        _ => shape.push(a),
                    }
                }
                if self.c.below(3) == 2 {
                    let at = self.c.below(shape.len() + 1);
                    shape.insert(at, 1);
                }
                self.emit(Op::Reshape, &[&x], Some(x.ty().with_shape(shape)))
            }
            Kind::Transpose => {
                let x = self.operand(x, 0);
                let perm = self.c.perm(x.rank());
                self.emit(Op::Transpose { perm }, &[&x], None)
            }
            Kind::Slice => {
                let x = self.operand(x, 0);
                let (mut start, mut limit) = (Vec::new(), Vec::new());
                for n in x.shape() {
                    let s = self.c.below(n);
                    let l = n - self.c.below(n - s);
                    start.push(s);
                    limit.push(l);
                }
                self.emit(Op::Slice { start, limit }, &[&x], None)
            }
            Kind::DynamicSlice => {
                let x = self.operand(x, 0);
                let shape = x.shape();
                let sizes: Vec<usize> = shape.iter().map(|&n| n - self.c.below(n)).collect();
                let starts: Vec<Value> = (0..shape.len())
                    .map(|d| self.start_param(shape[d], sizes[d]))
                    .collect();
                let mut ops = vec![&x];
                ops.extend(starts.iter());
                self.emit(Op::DynamicSlice { sizes }, &ops, None)
            }
            Kind::DynamicUpdateSlice => {
                let x = self.operand(x, 0);
                let shape = x.shape();
                let sizes: Vec<usize> = shape.iter().map(|&n| n - self.c.below(n)).collect();
                let u = self.param(x.ty().with_shape(sizes.clone()));
                let starts: Vec<Value> = (0..shape.len())
                    .map(|d| self.start_param(shape[d], sizes[d]))
                    .collect();
                let mut ops = vec![&x, &u];
                ops.extend(starts.iter());
                self.emit(Op::DynamicUpdateSlice, &ops, None)
            }
            Kind::Pad => {
                let x = self.operand(x, 0);
                let r = x.rank();
                let low: Vec<usize> = (0..r).map(|_| self.c.below(3)).collect();
                let high: Vec<usize> = (0..r).map(|_| self.c.below(3)).collect();
                let v = self.values(x.dtype(), 1)[0];
                let v = self.b.scalar(v, x.dtype());
                let y = self.emit(Op::Pad { low, high }, &[&x, &v], None);
                self.small(&y)
            }
            Kind::Concatenate => {
                let x = self.operand(x, 1);
                let dim = self.c.below(x.rank());
                let mut parts = vec![x.clone()];
                for _ in 0..self.c.below(3) {
                    let mut s = x.shape();
                    s[dim] = self.dim();
                    let p = self.param(x.ty().with_shape(s));
                    let at = self.c.below(parts.len() + 1);
                    parts.insert(at, p);
                }
                let refs: Vec<&Value> = parts.iter().collect();
                let y = self.emit(Op::Concatenate { dim }, &refs, None);
                self.small(&y)
            }
            Kind::Reduce => {
                let x = self.operand(x, 0);
                let x = self.numeric(&x);
                let op = self.c.pick(&ReduceOp::ALL);
                let order = self.c.perm(x.rank());
                let dims: Vec<usize> = order.into_iter().filter(|_| !self.c.flip()).collect();
                self.emit(Op::Reduce { op, dims }, &[&x], None)
            }
            Kind::DotGeneral => self.dot(x),
            Kind::Conv => self.conv(x),
            Kind::Reverse => {
                let x = self.operand(x, 0);
                let order = self.c.perm(x.rank());
                let dims: Vec<usize> = order.into_iter().filter(|_| !self.c.flip()).collect();
                self.emit(Op::Reverse { dims }, &[&x], None)
            }
            Kind::Cumsum => {
                let x = self.operand(x, 1);
                let x = self.numeric(&x);
                let dim = self.c.below(x.rank());
                let (exclusive, reverse) = (self.c.flip(), self.c.flip());
                self.emit(
                    Op::Cumsum {
                        dim,
                        exclusive,
                        reverse,
                    },
                    &[&x],
                    None,
                )
            }
            Kind::Argmax => {
                let x = self.operand(x, 1);
                let x = self.numeric(&x);
                let dim = self.c.below(x.rank());
                self.emit(Op::Argmax { dim }, &[&x], None)
            }
            Kind::Gather => {
                let x = self.operand(x, 1);
                let axis = self.c.below(x.rank());
                let b = self.c.below(axis + 1);
                let ishape = self.index_shape(&x.shape(), axis, b);
                let idx = self.index_param(ishape, x.shape()[axis]);
                let y = self.emit(
                    Op::Gather {
                        axis,
                        batch_dims: b,
                    },
                    &[&x, &idx],
                    None,
                );
                self.small(&y)
            }
            Kind::ScatterAdd => {
                let base = self.operand(x, 1);
                let base = self.numeric(&base);
                let axis = self.c.below(base.rank());
                let b = self.c.below(axis + 1);
                let ishape = self.index_shape(&base.shape(), axis, b);
                let n = base.shape()[axis];
                let idx = self.index_param(ishape.clone(), n);
                let mut ushape = base.shape()[..axis].to_vec();
                ushape.extend_from_slice(&ishape[b..]);
                ushape.extend_from_slice(&base.shape()[axis + 1..]);
                let upd = self.param(base.ty().with_shape(ushape));
                self.emit(
                    Op::ScatterAdd {
                        axis,
                        batch_dims: b,
                    },
                    &[&base, &idx, &upd],
                    None,
                )
            }
            Kind::Rng => {
                let shape = match x {
                    Some(x) => x.shape(),
                    None => self.shape(0, 3),
                };
                let seed = self.c.byte() as f64;
                let seed = self.param_with(Type::scalar(DType::I32), &[seed]);
                let dist = self.c.pick(&[RngDist::Uniform, RngDist::Normal]);
                let r = self.b.rng(dist, &seed, Type::new(DType::F64, shape));
                let r = self.shard(&r);
                self.with_chain(r, x)
            }
        }
    }

    /// A convolution. When chaining, `x` (made rank >= 3 by adding unit dims) is the lhs
    /// `[N, S.., Cin]`; else a new lhs with 1-2 spatial dims, often long enough that a split
    /// spatial dim exchanges halos. Kernels are 1-4 wide, paddings 0-3 per side.
    pub fn conv(&mut self, x: Option<&Value>) -> Value {
        let lhs = match x {
            Some(x) => {
                let x = self.numeric(x);
                let mut shape = x.shape();
                while shape.len() < 3 {
                    if shape.len() == 1 {
                        shape.insert(0, 1);
                    } else {
                        shape.push(1);
                    }
                }
                self.emit(Op::Reshape, &[&x], Some(x.ty().with_shape(shape)))
            }
            None => {
                let d = self.numeric_dtype();
                let k = 1 + self.c.below(2);
                let mut shape = vec![1 + self.c.below(2)];
                for _ in 0..k {
                    shape.push(self.c.pick(&[16, 8, 13, 5, 1, 0, 9]));
                }
                shape.push(1 + self.c.below(3));
                self.param(Type::new(d, capped(shape)))
            }
        };
        let xs = lhs.shape();
        let k = xs.len() - 2;
        let mut ks: Vec<usize> = (0..k).map(|_| 1 + self.c.below(4)).collect();
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for i in 0..k {
            let l = self.c.below(4);
            lo.push(l);
            hi.push(
                self.c
                    .below(4)
                    .max((ks[i] + 1).saturating_sub(l + xs[1 + i] + 1)),
            );
        }
        ks.push(xs[k + 1]);
        ks.push(1 + self.c.below(3));
        let w = self.param(lhs.ty().with_shape(capped_kernel(ks)));
        let y = self.emit(
            Op::Conv {
                pad_lo: lo,
                pad_hi: hi,
            },
            &[&lhs, &w],
            None,
        );
        self.small(&y)
    }

    /// A dot-general with random batch / contracting / free dims. When chaining, `x` is the
    /// lhs and each of its dims gets a random role.
    pub fn dot(&mut self, x: Option<&Value>) -> Value {
        // role of each lhs dim: 0 batch, 1 contracting, 2 free
        let (lhs, roles) = match x {
            Some(x) => {
                let x = self.numeric(x);
                let roles: Vec<usize> = (0..x.rank()).map(|_| self.c.below(3)).collect();
                (x, roles)
            }
            None => {
                let d = self.numeric_dtype();
                let counts = [self.c.below(3), self.c.below(3), self.c.below(3)];
                let mut roles = Vec::new();
                for (role, &n) in counts.iter().enumerate() {
                    roles.extend(std::iter::repeat_n(role, n));
                }
                let order = self.c.perm(roles.len());
                let roles: Vec<usize> = order.iter().map(|&i| roles[i]).collect();
                let shape: Vec<usize> = roles.iter().map(|_| self.dim()).collect();
                (self.param(Type::new(d, capped(shape))), roles)
            }
        };
        let ls = lhs.shape();
        let lhs_batch: Vec<usize> = (0..ls.len()).filter(|&d| roles[d] == 0).collect();
        let lhs_contract: Vec<usize> = (0..ls.len()).filter(|&d| roles[d] == 1).collect();
        // rhs dims: the batch dims, the contracting dims and 0-2 free dims, in random order.
        let mut rsizes: Vec<(usize, usize)> = Vec::new(); // (role, size)
        rsizes.extend(lhs_batch.iter().map(|&d| (0, ls[d])));
        rsizes.extend(lhs_contract.iter().map(|&d| (1, ls[d])));
        for _ in 0..self.c.below(3) {
            let n = self.dim();
            rsizes.push((2, n));
        }
        let order = self.c.perm(rsizes.len());
        let rshape: Vec<usize> = order.iter().map(|&i| rsizes[i].1).collect();
        // Only the free dims may shrink (batch and contracting sizes are the lhs's).
        let mut rshape = rshape;
        while rshape.iter().product::<usize>() > MAX_PARAM_ELEMS {
            let Some(d) = (0..rshape.len())
                .filter(|&d| rsizes[order[d]].0 == 2 && rshape[d] > 1)
                .max_by_key(|&d| rshape[d])
            else {
                break;
            };
            rshape[d] = rshape[d].div_ceil(2);
        }
        // rhs position of the k-th batch / contracting entry of rsizes
        let pos = |i: usize| order.iter().position(|&o| o == i).unwrap();
        let rhs_batch: Vec<usize> = (0..lhs_batch.len()).map(pos).collect();
        let rhs_contract: Vec<usize> = (0..lhs_contract.len())
            .map(|k| pos(lhs_batch.len() + k))
            .collect();
        let rhs = self.param(lhs.ty().with_shape(rshape));
        let dd = DotDims {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        };
        let (l, r, dd) = if self.c.flip() {
            let swapped = DotDims {
                lhs_batch: dd.rhs_batch,
                rhs_batch: dd.lhs_batch,
                lhs_contract: dd.rhs_contract,
                rhs_contract: dd.lhs_contract,
            };
            (rhs, lhs, swapped)
        } else {
            (lhs, rhs, dd)
        };
        let y = self.emit(Op::DotGeneral(dd), &[&l, &r], None);
        self.small(&y)
    }
}

/// `shape` with its largest dims halved until it has at most `MAX_PARAM_ELEMS` elements.
pub fn capped(mut shape: Vec<usize>) -> Vec<usize> {
    while shape.iter().product::<usize>() > MAX_PARAM_ELEMS {
        let d = (0..shape.len()).max_by_key(|&d| shape[d]).unwrap();
        shape[d] = shape[d].div_ceil(2);
    }
    shape
}

/// A kernel shape `[K.., Cin, Cout]` with its output features halved until it has at most
/// `MAX_PARAM_ELEMS` elements (the window and input features must stay).
pub fn capped_kernel(mut shape: Vec<usize>) -> Vec<usize> {
    let last = shape.len() - 1;
    while shape.iter().product::<usize>() > MAX_PARAM_ELEMS && shape[last] > 1 {
        shape[last] = shape[last].div_ceil(2);
    }
    shape
}

/// Prime factors of `n` in increasing order (empty for 1, `[0]` for 0).
pub fn factors(mut n: usize) -> Vec<usize> {
    if n == 0 {
        return vec![0];
    }
    let mut out = Vec::new();
    let mut p = 2;
    while n > 1 {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    out
}
