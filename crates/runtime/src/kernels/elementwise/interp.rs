//! The chunk interpreter: each node's plan for a range (evaluated, read in place, folded
//! into its user, or the in-place slot), then every node over each chunk in order, the
//! root into the output.

use super::arith::{
    bf, binary_f32, binary_f32_inplace, binary_f64, binary_i32, unary_f32, unary_f64, unary_i32,
    Splat32,
};
use super::lanes::{give_scratch, in_place, take_scratch, Lane, LaneMut, Sc, Store};
use super::leaves::{fill_splat, iota_chunk, load, load_broadcast};
use super::relu::{relu_code, relu_decode};
use super::select::{compare, compare_f32, convert, select, select_cmp};
use super::{Fused, Node, CHUNK};
use crate::tensor::Data;
use ir::{BinaryOp, DType, UnaryOp};

/// The value of node `j` when it is an f32 splat (its lane holds that value everywhere).
pub(super) fn splat_of(f: &Fused, j: usize) -> Option<Splat32> {
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

/// How a node is evaluated per chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Plan {
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
pub(super) fn plan(f: &Fused, inputs: &[&Data], inplace: Option<usize>) -> Vec<Plan> {
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

/// What every chunk of a range is evaluated with: the group, its inputs, each node's plan,
/// and the input held in the output (`inplace`, read only as [`Node::Input`]).
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub(super) f: &'a Fused,
    pub(super) inputs: &'a [&'a Data],
    pub(super) plan: &'a [Plan],
    pub(super) inplace: Option<usize>,
}

/// The chunk of `n` elements from element `start`.
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    pub(super) start: usize,
    pub(super) n: usize,
}

/// Evaluate one chunk of every node into its scratch `sc[j]`, except inputs read in place
/// (`Plan::Direct`) and the root when `root` is given (written there: the output itself).
/// Splats are pre-filled once per task (never the root here).
#[inline(always)]
pub(super) fn eval_chunk(
    cx: &Ctx,
    at: Chunk,
    sc: &mut [Sc],
    mut root: Option<LaneMut<'_>>,
    slot_vals: Option<&[f32]>,
) {
    let Ctx {
        f, inputs, plan, ..
    } = *cx;
    let Chunk { start, n } = at;
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
        eval_node(cx, (node, *dt), &get, o, at);
    }
}

/// One node (of dtype `dt`) over one chunk: operands through `get`, values into `o`.
#[inline(always)]
pub(super) fn eval_node<'a>(
    cx: &Ctx,
    (node, dt): (&Node, DType),
    get: &impl Fn(usize) -> Lane<'a>,
    o: LaneMut<'_>,
    at: Chunk,
) {
    let Ctx {
        f,
        inputs,
        plan,
        inplace,
    } = *cx;
    let Chunk { start, n } = at;
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

#[inline(always)]
pub(super) fn run_range_impl<T: Store>(
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
    let cx = Ctx {
        f,
        inputs,
        plan: &plan,
        inplace,
    };
    for c in (0..out.len()).step_by(CHUNK) {
        let n = CHUNK.min(out.len() - c);
        let at = Chunk {
            start: start + c,
            n,
        };
        let slot_vals = pre.map(|x| &x[c..c + n]);
        if let Some(j) = inplace_node.filter(|&j| plan[j] != Plan::Slot) {
            match slot_vals {
                Some(x) => f32::load(x, &mut sc[j]),
                None => T::load(&out[c..c + n], &mut sc[j]),
            }
        }
        let o = &mut out[c..c + n];
        if root_direct {
            eval_chunk(&cx, at, &mut sc, Some(T::direct(o)), slot_vals);
        } else {
            eval_chunk(&cx, at, &mut sc, None, None);
            T::store(&sc[root], o);
        }
    }
    give_scratch(sc);
}
