//! Temporary: one-hot einsum timing.
use ir::DotDims;
use runtime::kernels::dot::{dot, DotPlan};
use runtime::tensor::Data;
use std::time::Instant;
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}
fn onehot(g: usize, s: usize, e: usize, c: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; g * s * e * c];
    let mut z = 3u32;
    for gs in 0..g * s {
        for _ in 0..2 {
            z = z.wrapping_mul(1103515245).wrapping_add(12345);
            let ee = (z >> 8) as usize % e;
            let cc = (z >> 20) as usize % c;
            if (z >> 4) % 4 != 0 {
                v[gs * e * c + ee * c + cc] = 0.7;
            }
        }
    }
    v
}
fn main() {
    let (g, s, e, c, m) = (128usize, 128usize, 128usize, 2usize, 256usize);
    let cases = [
        (
            "combine %147",
            vec![g, s, e, c],
            vec![e, g, c, m],
            DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![1],
                lhs_contract: vec![2, 3],
                rhs_contract: vec![0, 2],
            },
            true,
        ),
        (
            "dispatch %141",
            vec![g, s, e, c],
            vec![g, s, m],
            DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![1],
                rhs_contract: vec![1],
            },
            true,
        ),
        (
            "dispatch-grad %176",
            vec![e, g, c, m],
            vec![g, s, e, c],
            DotDims {
                lhs_batch: vec![1],
                rhs_batch: vec![0],
                lhs_contract: vec![0, 2],
                rhs_contract: vec![2, 3],
            },
            false,
        ),
    ];
    for (name, ls, rs, dd, lhs_sparse) in cases {
        let plan = DotPlan::new(&ls, &rs, &dd);
        let (lv, rv) = if lhs_sparse {
            (onehot(g, s, e, c), data(rs.iter().product(), 2))
        } else {
            (data(ls.iter().product(), 1), onehot(g, s, e, c))
        };
        let (l, r) = (Data::F32(lv), Data::F32(rv));
        let mut out = Data::F32(vec![0.0; plan.b * plan.m * plan.n]);
        let mut best = f64::MAX;
        let mut path = None;
        for _ in 0..10 {
            let t0 = Instant::now();
            path = Some(dot(&plan, &ls, &l, &rs, &r, &mut out));
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{name}: {:.2} ms {:?} copies {:?}",
            best * 1e3,
            path.unwrap(),
            plan.copies()
        );
    }
}
