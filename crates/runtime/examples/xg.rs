//! Temporary: expert GEMM timing in situ, normal pages vs THP (alternating).
use ir::DotDims;
use runtime::kernels::dot::{dot, DotPlan};
use runtime::tensor::Data;
use std::time::Instant;
extern "C" {
    fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32;
}
fn alloc(n: usize, huge: bool) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n + (1 << 19));
    if huge {
        let p = v.as_mut_ptr() as usize;
        let len = (n + (1 << 19)) * 4;
        let a = (p + (1 << 21) - 1) & !((1 << 21) - 1);
        let end = (p + len) & !((1 << 21) - 1);
        unsafe {
            madvise(a as *mut u8, end - a, 14);
        }
    }
    v.resize(n, 0.0);
    v
}
fn fill(v: &mut [f32], seed: u32) {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    for x in v.iter_mut() {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        *x = (s % 2000) as f32 / 1000.0 - 1.0;
    }
}
struct Case {
    ls: Vec<usize>,
    rs: Vec<usize>,
    plan: DotPlan,
    l: Data,
    r: Data,
    out: Data,
    flops: f64,
}
fn case(e: usize, kind: &str, fill_frac: f64, huge: bool) -> Case {
    let (t, m, h) = (256usize, 256usize, 1024usize);
    let mut z = 7u32;
    let mut dead = vec![false; e * t];
    for d in dead.iter_mut() {
        z = z.wrapping_mul(1103515245).wrapping_add(12345);
        *d = ((z >> 8) % 1000) as f64 / 1000.0 >= fill_frac;
    }
    let zero_rows = |v: &mut Vec<f32>, w: usize| {
        for (r, &d) in dead.iter().enumerate() {
            if d {
                v[r * w..(r + 1) * w].fill(0.0);
            }
        }
    };
    let (ls, rs, dims) = match kind {
        "up" => (
            vec![e, t, m],
            vec![e, m, h],
            DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
        ),
        "down" => (
            vec![e, t, h],
            vec![e, h, m],
            DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
        ),
        _ => (
            vec![e, t, m],
            vec![e, t, h],
            DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![1],
                rhs_contract: vec![1],
            },
        ),
    };
    let mut l = alloc(ls.iter().product(), huge);
    fill(&mut l, 1);
    let mut r = alloc(rs.iter().product(), huge);
    fill(&mut r, 2);
    zero_rows(&mut l, ls[2]);
    if kind == "wgrad" {
        zero_rows(&mut r, h);
    }
    let plan = DotPlan::new(&ls, &rs, &dims);
    let flops = plan.flops() * fill_frac;
    let out = Data::F32(alloc(plan.b * plan.m * plan.n, huge));
    Case {
        ls,
        rs,
        plan,
        l: Data::F32(l),
        r: Data::F32(r),
        out,
        flops,
    }
}
fn main() {
    let fill_frac: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(0.72);
    let reps: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(8);
    for kind in ["up", "down", "wgrad"] {
        let mut cs = [
            case(128, kind, fill_frac, false),
            case(128, kind, fill_frac, true),
        ];
        let mut ts = [vec![], vec![]];
        for _ in 0..reps {
            for (i, c) in cs.iter_mut().enumerate() {
                let t0 = Instant::now();
                dot(&c.plan, &c.ls, &c.l, &c.rs, &c.r, &mut c.out);
                ts[i].push(t0.elapsed().as_secs_f64());
            }
        }
        let th = rayon::current_num_threads() as f64;
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (a, b) = (med(&mut ts[0]), med(&mut ts[1]));
        println!("{kind:6} fill {fill_frac}: 4K pages {:.1} GFLOP/s/thread ({:.1} ms), THP {:.1} ({:.1} ms)", cs[0].flops / a / 1e9 / th, a * 1e3, cs[1].flops / b / 1e9 / th, b * 1e3);
    }
    for l in std::fs::read_to_string("/proc/self/smaps_rollup")
        .unwrap()
        .lines()
    {
        if l.contains("AnonHuge") {
            println!("{l}");
        }
    }
}
