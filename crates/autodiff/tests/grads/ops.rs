//! One finite-difference property test per differentiable op (or op family), over random
//! shapes, attributes and values.

use crate::Case;
use ir::{DType, DotDims, Op, Type};
use proptest::prelude::*;
use proptest::sample::subsequence;
use runtime::HostTensor;
use testkit::cases;
use testkit::strategies::{distinct_f64_tensor, f64_tensor, shape, shape_of_rank};

const CASES: u32 = 32;

/// A random-shaped tensor (rank <= 3, dims <= 4) with values in `[lo, hi)`.
fn tensor(lo: f64, hi: f64) -> impl Strategy<Value = HostTensor> {
    shape(3, 4).prop_flat_map(move |s| f64_tensor(s, lo, hi))
}

/// Two tensors of one random shape.
fn pair(lo: f64, hi: f64) -> impl Strategy<Value = (HostTensor, HostTensor)> {
    shape(3, 4).prop_flat_map(move |s| (f64_tensor(s.clone(), lo, hi), f64_tensor(s, lo, hi)))
}

/// Values with magnitude in `[0.3, 3)` and random signs.
fn nonzero(s: Vec<usize>) -> impl Strategy<Value = HostTensor> {
    let n: usize = s.iter().product();
    (
        f64_tensor(s, 0.3, 3.0),
        proptest::collection::vec(any::<bool>(), n),
    )
        .prop_map(|(t, neg)| {
            let v = t
                .to_f64_vec()
                .iter()
                .zip(neg)
                .map(|(&x, n)| if n { -x } else { x })
                .collect();
            HostTensor::from_f64(t.shape().to_vec(), v)
        })
}

/// A random-rank shape (1..=3) with a random dim of it.
fn shape_and_dim() -> impl Strategy<Value = (Vec<usize>, usize)> {
    (1usize..=3)
        .prop_flat_map(|r| (shape_of_rank(r, 4), 0..r))
        .prop_map(|(s, d)| (s, d))
}

fn scalar_i32(v: i32) -> HostTensor {
    HostTensor::scalar_i32(v)
}

macro_rules! unary_tests {
    ($($name:ident: $lo:expr, $hi:expr, $f:expr;)*) => {
        proptest! {
            #![proptest_config(cases(CASES))]
            $(
                #[test]
                fn $name(t in tensor($lo, $hi)) {
                    let mut c = Case::new();
                    let x = c.diff("x", &t);
                    c.check(&$f(&x));
                }
            )*
        }
    };
}

unary_tests! {
    neg: -3.0, 3.0, |x: &ir::Value| x.neg();
    exp: -2.0, 2.0, |x: &ir::Value| x.exp();
    log: 0.2, 3.0, |x: &ir::Value| x.log();
    log1p: -0.5, 2.0, |x: &ir::Value| x.log1p();
    sqrt: 0.2, 3.0, |x: &ir::Value| x.sqrt();
    rsqrt: 0.2, 3.0, |x: &ir::Value| x.rsqrt();
    tanh: -2.0, 2.0, |x: &ir::Value| x.tanh();
    logistic: -3.0, 3.0, |x: &ir::Value| x.logistic();
    erf: -2.0, 2.0, |x: &ir::Value| x.erf();
    sin: -3.0, 3.0, |x: &ir::Value| x.sin();
    cos: -3.0, 3.0, |x: &ir::Value| x.cos();
    // Piecewise constant: zero gradient away from the jumps.
    floor: 1.2, 1.8, |x: &ir::Value| x.floor().mul(x);
    copy: -3.0, 3.0, |x: &ir::Value| x.copy();
}

macro_rules! binary_tests {
    ($($name:ident: $lo:expr, $hi:expr, $f:expr;)*) => {
        proptest! {
            #![proptest_config(cases(CASES))]
            $(
                #[test]
                fn $name((a, b) in pair($lo, $hi)) {
                    let mut c = Case::new();
                    let x = c.diff("x", &a);
                    let y = c.diff("y", &b);
                    c.check(&$f(&x, &y));
                }
            )*
        }
    };
}

binary_tests! {
    add: -3.0, 3.0, |x: &ir::Value, y| x.add(y);
    sub: -3.0, 3.0, |x: &ir::Value, y| x.sub(y);
    mul: -3.0, 3.0, |x: &ir::Value, y| x.mul(y);
    pow: 0.2, 3.0, |x: &ir::Value, y: &ir::Value| x.pow(&y.sub(1.5));
}

proptest! {
    #![proptest_config(cases(CASES))]

    #[test]
    fn abs_and_sign(t in shape(3, 4).prop_flat_map(nonzero)) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.abs().add(&x.sign().mul(&x)));
    }

    #[test]
    fn div((a, b) in shape(3, 4).prop_flat_map(|s| (f64_tensor(s.clone(), -3.0, 3.0), nonzero(s)))) {
        let mut c = Case::new();
        let x = c.diff("x", &a);
        let y = c.diff("y", &b);
        c.check(&x.div(&y));
    }

    /// `x = y * (k + f)` with `f` in (0.1, 0.9) keeps `x / y` away from the jumps of rem.
    #[test]
    fn rem((y, k, f) in shape(3, 4).prop_flat_map(|s| {
        let n: usize = s.iter().product();
        (nonzero(s), proptest::collection::vec(-2i32..=2, n), proptest::collection::vec(0.1..0.9, n))
    })) {
        let yv = y.to_f64_vec();
        let xv: Vec<f64> = (0..yv.len()).map(|i| yv[i] * (k[i] as f64 + f[i])).collect();
        let mut c = Case::new();
        let x = c.diff("x", &HostTensor::from_f64(y.shape().to_vec(), xv));
        let y = c.diff("y", &y);
        c.check(&x.rem(&y));
    }

    /// Operands drawn from one set of distinct values, so they never tie.
    #[test]
    fn max_min(t in shape(3, 4).prop_flat_map(|s| {
        let mut s2 = s.clone();
        s2.insert(0, 2);
        distinct_f64_tensor(s2, -3.0, 3.0).prop_map(move |t| (s.clone(), t))
    })) {
        let (s, t) = t;
        let v = t.to_f64_vec();
        let n = v.len() / 2;
        let mut c = Case::new();
        let x = c.diff("x", &HostTensor::from_f64(s.clone(), v[..n].to_vec()));
        let y = c.diff("y", &HostTensor::from_f64(s, v[n..].to_vec()));
        c.check(&x.max(&y).add(&x.min(&y).mul(&x)));
    }

    #[test]
    fn select((a, b) in pair(-3.0, 3.0), seed in any::<u64>()) {
        let pred: Vec<bool> = testkit::fixed_values(a.num_elements(), seed).iter().map(|&v| v > 0.0).collect();
        let mut c = Case::new();
        let p = c.fixed("p", &HostTensor::from_bool(a.shape().to_vec(), pred));
        let x = c.diff("x", &a);
        let y = c.diff("y", &b);
        c.check(&p.select(&x, &y));
    }

    /// f32 -> f64 -> bf16 -> f64 round trip, times an int->float cast (which has no gradient).
    #[test]
    fn convert(t in tensor(-3.0, 3.0)) {
        let ints: Vec<i32> = (0..t.num_elements() as i32).map(|i| i % 3 - 1).collect();
        let mut c = Case::new();
        let x = c.diff_typed("x", t.ty.with_dtype(DType::F32), &t);
        let k = c.fixed("k", &HostTensor::from_i32(t.shape().to_vec(), ints));
        let y = x.convert(DType::F64).convert(DType::BF16).convert(DType::F64);
        c.check(&y.mul(&k.convert(DType::F64)).add(&y));
    }

    #[test]
    fn broadcast((t, shape, dims) in shape(2, 3).prop_flat_map(|s| {
        let r = s.len();
        (0usize..=2).prop_flat_map(move |extra| {
            let s = s.clone();
            (f64_tensor(s.clone(), -2.0, 2.0), subsequence((0..r + extra).collect::<Vec<_>>(), r), proptest::collection::vec(1usize..=3, r + extra))
                .prop_map(move |(t, dims, mut shape)| {
                    for (i, &d) in dims.iter().enumerate() {
                        shape[d] = s[i];
                    }
                    (t, shape, dims)
                })
        })
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.broadcast_in_dim(&shape, &dims));
    }

    #[test]
    fn reshape(t in tensor(-2.0, 2.0), flat in any::<bool>()) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let mut to: Vec<usize> = t.shape().iter().rev().copied().collect();
        if flat {
            to = vec![t.num_elements()];
        }
        c.check(&x.reshape(&to));
    }

    #[test]
    fn transpose((t, perm) in shape(4, 3).prop_flat_map(|s| {
        let r = s.len();
        (f64_tensor(s, -2.0, 2.0), Just((0..r).collect::<Vec<_>>()).prop_shuffle())
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.transpose(&perm));
    }

    #[test]
    fn slice((t, lims) in shape(3, 5).prop_flat_map(|s| {
        let bounds: Vec<_> = s.iter().map(|&n| (0..n).prop_flat_map(move |a| (Just(a), a + 1..=n))).collect();
        (f64_tensor(s, -2.0, 2.0), bounds)
    })) {
        let (start, limit): (Vec<usize>, Vec<usize>) = lims.into_iter().unzip();
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.slice(&start, &limit));
    }

    /// The padding value is a differentiated operand too.
    #[test]
    fn pad((t, lo, hi) in shape(3, 3).prop_flat_map(|s| {
        let r = s.len();
        (f64_tensor(s, -2.0, 2.0), proptest::collection::vec(0usize..=2, r), proptest::collection::vec(0usize..=2, r))
    }), v in -2.0..2.0f64) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let pv = c.diff("v", &HostTensor::scalar_f64(v));
        let y = c.b.emit(Op::Pad { low: lo, high: hi }, &[&x, &pv], None);
        c.check(&y);
    }

    /// Starts range past the end, so clamping is exercised.
    #[test]
    fn dynamic_slice((t, sizes, starts) in shape_of_rank_1_3().prop_flat_map(|s| {
        let sizes: Vec<_> = s.iter().map(|&n| 1..=n).collect();
        let starts: Vec<_> = s.iter().map(|&n| -1i32..=n as i32 + 1).collect();
        (f64_tensor(s, -2.0, 2.0), sizes, starts)
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let st: Vec<ir::Value> = starts.iter().enumerate().map(|(i, &v)| c.fixed(&format!("s{i}"), &scalar_i32(v))).collect();
        let st: Vec<&ir::Value> = st.iter().collect();
        c.check(&x.dynamic_slice(&st, &sizes));
    }

    #[test]
    fn dynamic_update_slice((t, u, starts) in shape_of_rank_1_3().prop_flat_map(|s| {
        let sizes: Vec<_> = s.iter().map(|&n| 1..=n).collect();
        let starts: Vec<_> = s.iter().map(|&n| -1i32..=n as i32 + 1).collect();
        (Just(s), sizes, starts).prop_flat_map(|(s, sizes, starts)| {
            (f64_tensor(s, -2.0, 2.0), f64_tensor(sizes, -2.0, 2.0), Just(starts))
        })
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let up = c.diff("u", &u);
        let st: Vec<ir::Value> = starts.iter().enumerate().map(|(i, &v)| c.fixed(&format!("s{i}"), &scalar_i32(v))).collect();
        let st: Vec<&ir::Value> = st.iter().collect();
        c.check(&x.dynamic_update_slice(&up, &st));
    }

    #[test]
    fn concatenate((parts, dim) in shape_and_dim().prop_flat_map(|(s, d)| {
        let parts: Vec<_> = (0..3).map(|_| {
            let s = s.clone();
            (1usize..=3).prop_flat_map(move |len| {
                let mut s = s.clone();
                s[d] = len;
                f64_tensor(s, -2.0, 2.0)
            })
        }).collect();
        (parts, Just(d))
    })) {
        let mut c = Case::new();
        let xs: Vec<ir::Value> = parts.iter().enumerate().map(|(i, t)| c.diff(&format!("x{i}"), t)).collect();
        let xs: Vec<&ir::Value> = xs.iter().collect();
        let y = c.b.concat(&xs, dim);
        c.check(&y);
    }

    #[test]
    fn reduce_sum((t, dims) in shape(3, 4).prop_flat_map(|s| {
        let r = s.len();
        (f64_tensor(s, -2.0, 2.0), (0..=r).prop_flat_map(move |k| subsequence((0..r).collect::<Vec<_>>(), k)))
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.sum(&dims));
    }

    /// Distinct values, so the max and min are unique.
    #[test]
    fn reduce_max_min((t, dims) in shape(3, 4).prop_flat_map(|s| {
        let r = s.len();
        (distinct_f64_tensor(s, -2.0, 2.0), (0..=r).prop_flat_map(move |k| subsequence((0..r).collect::<Vec<_>>(), k)))
    })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let y = x.reduce_max(&dims).add(&x.reduce_min(&dims).mul(3.0));
        c.check(&y);
    }

    /// Batch, contracting and free dims of random counts, interleaved in random orders.
    #[test]
    fn dot_general((l, r, dims) in dot_case()) {
        let mut c = Case::new();
        let x = c.diff("x", &l);
        let y = c.diff("y", &r);
        c.check(&x.dot_general(&y, dims));
    }

    /// 1-2 spatial dims, kernels up to 3 wide, paddings 0-3 per side (beyond `K - 1` too, so
    /// output rows that only see padding exist).
    #[test]
    fn conv((x, w, lo, hi) in conv_case()) {
        let mut c = Case::new();
        let xv = c.diff("x", &x);
        let wv = c.diff("w", &w);
        c.check(&xv.conv(&wv, &lo, &hi));
    }

    #[test]
    fn reverse((t, dims) in shape(3, 4).prop_flat_map(|s| {
        let r = s.len();
        (f64_tensor(s, -2.0, 2.0), Just((0..r).collect::<Vec<_>>()).prop_shuffle(), 0..=r)
    }).prop_map(|(t, mut dims, n)| { dims.truncate(n); (t, dims) })) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.reverse(&dims));
    }

    #[test]
    fn cumsum(((t, dim), exclusive, reverse) in (shape_and_dim().prop_flat_map(|(s, d)| (f64_tensor(s, -2.0, 2.0), Just(d))), any::<bool>(), any::<bool>())) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        c.check(&x.cumsum(dim, exclusive, reverse));
    }

    /// Indices include out-of-range ones (gather gives 0, scatter drops them) and repeats.
    #[test]
    fn gather((t, idx, axis, bd) in gather_case()) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let i = c.fixed("i", &idx);
        c.check(&x.gather(&i, axis, bd));
    }

    #[test]
    fn scatter_add(((t, idx, axis, bd), seed) in (gather_case(), any::<u64>())) {
        let mut c = Case::new();
        let x = c.diff("x", &t);
        let i = c.fixed("i", &idx);
        let upd_ty = ir::infer_type(&Op::Gather { axis, batch_dims: bd }, &[&t.ty, &idx.ty], None, None).unwrap();
        let u = HostTensor::from_f64(upd_ty.shape.clone(), testkit::fixed_values(upd_ty.num_elements(), seed));
        let u = c.diff("u", &u);
        c.check(&x.scatter_add(&i, &u, axis, bd));
    }
}

fn shape_of_rank_1_3() -> impl Strategy<Value = Vec<usize>> {
    (1usize..=3).prop_flat_map(|r| shape_of_rank(r, 4))
}

/// `(lhs, rhs, dims)`: logical dims `[batch, contract, free]` of each side, permuted.
fn dot_case() -> impl Strategy<Value = (HostTensor, HostTensor, DotDims)> {
    let sizes = || proptest::collection::vec(1usize..=3, 0..=2);
    (sizes(), sizes(), sizes(), sizes())
        .prop_flat_map(|(b, k, lf, rf)| {
            let nl = b.len() + k.len() + lf.len();
            let nr = b.len() + k.len() + rf.len();
            (
                Just((b, k, lf, rf)),
                Just((0..nl).collect::<Vec<usize>>()).prop_shuffle(),
                Just((0..nr).collect::<Vec<usize>>()).prop_shuffle(),
            )
        })
        .prop_flat_map(|((b, k, lf, rf), lp, rp)| {
            // Position p of an operand holds logical dim perm[p].
            let side = |free: &[usize], perm: &[usize]| {
                let logical: Vec<usize> = b.iter().chain(&k).chain(free).copied().collect();
                let shape: Vec<usize> = perm.iter().map(|&l| logical[l]).collect();
                let pos = |l: usize| perm.iter().position(|&x| x == l).unwrap();
                let batch: Vec<usize> = (0..b.len()).map(pos).collect();
                let contract: Vec<usize> = (b.len()..b.len() + k.len()).map(pos).collect();
                (shape, batch, contract)
            };
            let (ls, lb, lc) = side(&lf, &lp);
            let (rs, rb, rc) = side(&rf, &rp);
            let dims = DotDims {
                lhs_batch: lb,
                rhs_batch: rb,
                lhs_contract: lc,
                rhs_contract: rc,
            };
            (
                f64_tensor(ls, -2.0, 2.0),
                f64_tensor(rs, -2.0, 2.0),
                Just(dims),
            )
        })
}

/// `(x, idx, axis, batch_dims)` with `idx` of shape `x[..batch_dims] ++ extra` and values in
/// `-1..=x.shape[axis]` (so some are out of range).
fn gather_case() -> impl Strategy<Value = (HostTensor, HostTensor, usize, usize)> {
    (1usize..=3)
        .prop_flat_map(|r| (shape_of_rank(r, 3), 0..r))
        .prop_flat_map(|(s, axis)| (Just(s), Just(axis), 0..=axis, shape(2, 3)))
        .prop_flat_map(|(s, axis, bd, extra)| {
            let mut is = s[..bd].to_vec();
            is.extend(extra);
            let n: usize = is.iter().product();
            let hi = s[axis] as i32;
            (
                f64_tensor(s, -2.0, 2.0),
                proptest::collection::vec(-1..=hi, n)
                    .prop_map(move |v| HostTensor::from_i32(is.clone(), v)),
                Just(axis),
                Just(bd),
            )
        })
}

/// At a two-way tie the central difference sees the average of the one-sided slopes, 1/2
/// each, which is exactly the balanced rule.
#[test]
fn max_min_ties_split_evenly() {
    let mut c = Case::new();
    let t = HostTensor::from_f64([4], vec![1.0, -2.0, 0.5, 3.0]);
    let x = c.diff("x", &t);
    let y = c.diff("y", &t);
    c.check(&x.max(&y).add(&x.min(&y).mul(2.0)));
}

/// A two-way tie for the maximum: each tied element gets half (FD agrees).
#[test]
fn reduce_max_tie_splits_evenly() {
    let mut c = Case::new();
    let x = c.diff(
        "x",
        &HostTensor::from_f64([2, 3], vec![1.0, 3.0, 3.0, 2.0, -1.0, 2.0]),
    );
    c.check(&x.reduce_max(&[1]));
}

/// `pow` at `x == 0` (with `y > 1`): dy is taken as 0 instead of NaN.
#[test]
fn pow_at_zero_base() {
    let mut c = Case::new();
    let x = c.diff("x", &HostTensor::from_f64([3], vec![0.0, 1.5, 0.0]));
    let y = c.diff("y", &HostTensor::from_f64([3], vec![2.0, 0.5, 3.0]));
    c.check(&x.pow(&y));
}

/// bf16 and f32 programs: `check_grads` widens them to f64 and verifies the narrow gradient
/// program too.
#[test]
fn narrow_dtypes_check_in_f64() {
    let mut c = Case::new();
    let t = HostTensor::from_f64([2, 3], vec![0.5, -1.0, 2.0, 0.25, 1.5, -0.75]);
    let x = c.diff_typed("x", Type::new(DType::BF16, [2, 3]), &t);
    let w = c.diff_typed(
        "w",
        Type::new(DType::F32, [3, 2]),
        &HostTensor::from_f64([3, 2], t.to_f64_vec()),
    );
    let y = x.convert(DType::F32).matmul(&w).tanh();
    c.check(&y);
}

/// A fixed dot-general with two batch dims (in different orders on each side), two
/// contracting dims (paired out of order) and free dims interleaved between them.
#[test]
fn dot_general_batch_multi_contract_permuted() {
    // lhs [c1=2, b0=2, f=3, b1=1, c0=3]; rhs [b1=1, c0=3, g=2, b0=2, c1=2]
    let lhs = HostTensor::from_f64([2, 2, 3, 1, 3], testkit::fixed_values(36, 1));
    let rhs = HostTensor::from_f64([1, 3, 2, 2, 2], testkit::fixed_values(24, 2));
    let dims = DotDims {
        lhs_batch: vec![1, 3],
        rhs_batch: vec![3, 0],
        lhs_contract: vec![4, 0],
        rhs_contract: vec![1, 4],
    };
    let mut c = Case::new();
    let x = c.diff("x", &lhs);
    let y = c.diff("y", &rhs);
    let z = x.dot_general(&y, dims);
    assert_eq!(z.shape(), [2, 1, 3, 2]);
    c.check(&z);
}

/// `(x, w, pad_lo, pad_hi)` of a valid convolution: x `[N, S.., Cin]`, w `[K.., Cin, Cout]`.
fn conv_case() -> impl Strategy<Value = (HostTensor, HostTensor, Vec<usize>, Vec<usize>)> {
    (1usize..=2)
        .prop_flat_map(|k| {
            (
                1usize..=2,
                proptest::collection::vec((1usize..=5, 1usize..=3, 0usize..=3, 0usize..=3), k),
                1usize..=3,
                1usize..=3,
            )
        })
        .prop_flat_map(|(n, sp, cin, cout)| {
            let mut xs = vec![n];
            let mut ws = Vec::new();
            let (mut lo, mut hi) = (Vec::new(), Vec::new());
            for &(s, k, l, h) in &sp {
                xs.push(s);
                ws.push(k);
                lo.push(l);
                // At least one output row: l + s + h + 1 >= k.
                hi.push(h.max((k + 1).saturating_sub(l + s + 1)));
            }
            xs.push(cin);
            ws.extend([cin, cout]);
            (
                f64_tensor(xs, -2.0, 2.0),
                f64_tensor(ws, -2.0, 2.0),
                Just(lo),
                Just(hi),
            )
        })
}

/// `max`/`min` against a splat constant (a ReLU, a clip) take their weight from the operand
/// alone: at a tie with the constant the slope is 1/2 (FD agrees).
#[test]
fn max_min_against_a_constant_split_ties_evenly() {
    let mut c = Case::new();
    let t = HostTensor::from_f64([6], vec![0.0, -1.0, 2.0, 1.5, -0.5, 1.0]);
    let x = c.diff("x", &t);
    c.check(&x.max(0.0).add(&x.min(1.5).mul(2.0)));
}

/// The constant-operand form gives exactly the general rule's values (with the constant as a
/// parameter), ties, signed zeros and NaN included.
#[test]
fn max_min_against_a_constant_equal_the_general_rule() {
    use ir::Builder;
    let xs = vec![0.0, -0.0, -1.0, 2.0, f64::NAN, 1.5, 1e-300];
    let ty = Type::new(DType::F64, vec![xs.len()]);
    let program = |splat: bool| {
        let b = Builder::new();
        let x = b.param("x", ty.clone());
        let (zero, clip) = if splat {
            (b.splat(0.0, ty.clone()), b.splat(1.5, ty.clone()))
        } else {
            (b.param("zero", ty.clone()), b.param("clip", ty.clone()))
        };
        let y = x.max(&zero).add(&x.min(&clip).mul(2.0));
        b.output("loss", &y.sum_all());
        autodiff::grad(&b.finish(), "loss", &["x"]).unwrap()
    };
    let mut ins: std::collections::HashMap<String, HostTensor> = [
        (
            "x".to_string(),
            HostTensor::from_f64([xs.len()], xs.clone()),
        ),
        (
            "zero".to_string(),
            HostTensor::from_f64([xs.len()], vec![0.0; xs.len()]),
        ),
        (
            "clip".to_string(),
            HostTensor::from_f64([xs.len()], vec![1.5; xs.len()]),
        ),
    ]
    .into_iter()
    .collect();
    // The constant form is taken (a `gt` of the operand; the general rule compares with
    // the result).
    let gt = |p: &ir::Program| {
        p.instrs
            .iter()
            .any(|i| i.op == Op::Compare(ir::CompareOp::Gt))
    };
    assert!(gt(&program(true)) && !gt(&program(false)));
    let general = runtime::run(&program(false), &ins).unwrap()["grad_x"].to_f64_vec();
    ins.remove("zero");
    ins.remove("clip");
    let special = runtime::run(&program(true), &ins).unwrap()["grad_x"].to_f64_vec();
    for (i, (a, b)) in special.iter().zip(&general).enumerate() {
        assert!(
            (a.is_nan() && b.is_nan()) || a == b,
            "x = {}: {a} vs {b}",
            xs[i]
        );
    }
    assert_eq!(
        special[0],
        0.5 + 2.0,
        "the ReLU's tie at 0 (plus the min's 2)"
    );
}
