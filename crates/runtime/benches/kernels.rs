//! Criterion benches of the executor's key kernels: dense square GEMMs and the expert GEMMs
//! (one thread and the batched pool), our AVX2 GEMM called directly on one expert's shapes
//! (`raw_sgemm_*`) next to the `gemm` crate and the core's FMA peak, cold expert GEMMs with
//! and without the fetch-ahead (`expert_cold_*`), the one-hot dispatch einsum (sparse path), a
//! transpose of the expert buffer, and fused elementwise chains (a softmax-like chain and
//! the ReLU backward chain), and the `rng` op's Philox samples. Throughput is reported in
//! elements or FLOPs.
//!
//! Run: `cargo bench -p runtime --bench kernels` (add `-- gemm` to filter). Criterion is
//! built without plots (its plotting dependencies would only slow the build).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ir::{Builder, DType, DotDims, Op, Type};
use runtime::kernels::dot::{dot, DotPlan};
use runtime::kernels::layout::transpose;
use runtime::{Data, Executable, HostTensor, InProcess};
use std::collections::HashMap;
use std::hint::black_box;

/// Tensor buffers on cache-line boundaries, as in the `gshard` binary.
#[global_allocator]
static ALLOC: runtime::LineAligned = runtime::LineAligned;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

fn bench_gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10);
    // Expert GEMMs of the MoE layer, 8 experts of [G*C=256, M=256] x [M, H=1024] and back,
    // plus the backward weight-gradient shape (lhs transposed).
    let cases: [(&str, Vec<usize>, Vec<usize>, DotDims); 5] = [
        // Dense GEMM-bound shapes: the per-thread rate against the core's FMA peak.
        (
            "square_512",
            vec![512, 512],
            vec![512, 512],
            DotDims::new(vec![], vec![], vec![1], vec![0]),
        ),
        (
            "square_1024",
            vec![1024, 1024],
            vec![1024, 1024],
            DotDims::new(vec![], vec![], vec![1], vec![0]),
        ),
        (
            "up_8x256x256x1024",
            vec![8, 256, 256],
            vec![8, 256, 1024],
            DotDims::new(vec![0], vec![0], vec![2], vec![1]),
        ),
        (
            "down_8x256x1024x256",
            vec![8, 256, 1024],
            vec![8, 1024, 256],
            DotDims::new(vec![0], vec![0], vec![2], vec![1]),
        ),
        (
            "wgrad_8x256T256x1024",
            vec![8, 256, 256],
            vec![8, 256, 1024],
            DotDims::new(vec![0], vec![0], vec![1], vec![1]),
        ),
    ];
    for (name, ls, rs, dims) in cases {
        let plan = DotPlan::new(&ls, &rs, &dims);
        let l = Data::F32(data(ls.iter().product(), 1));
        let r = Data::F32(data(rs.iter().product(), 2));
        let mut out = Data::F32(vec![0.0; plan.b * plan.m * plan.n]);
        g.throughput(Throughput::Elements(plan.flops() as u64));
        // One thread: the per-device-thread rate (elements = FLOPs). The timing loop runs
        // inside the one-thread pool: entering it for every product would add a wake-up
        // of its thread to each (~3 % of a 512^3 product's samples).
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        g.bench_function(format!("{name}/1thread"), |b| {
            one.install(|| b.iter(|| dot(&plan, &ls, &l, &rs, &r, &mut out)))
        });
        g.bench_function(format!("{name}/pool"), |b| {
            b.iter(|| dot(&plan, &ls, &l, &rs, &r, &mut out))
        });
    }
    // The core's FMA peak today: the executor's probe, independent chains of 8-lane FMAs
    // (AVX2+FMA), `gshard bench`'s `core_fma_gflops`.
    if runtime::probe::fma_burst(1).is_some() {
        const ITERS: usize = 1 << 20;
        let flops = ITERS * runtime::probe::CHAINS * 8 * 2;
        g.throughput(Throughput::Elements(flops as u64));
        g.bench_function("fma_peak/1thread", |bch| {
            bch.iter(|| runtime::probe::fma_burst(std::hint::black_box(ITERS)))
        });
    }
    // The FMA peak of a core with 512-bit FMA units (Zen 5): sixteen-lane chains, where the
    // CPU has AVX-512F; the dense kernels' rates are judged against this there.
    if runtime::probe::fma_burst_wide(1).is_some() {
        const ITERS: usize = 1 << 20;
        let flops = ITERS * runtime::probe::CHAINS * 16 * 2;
        g.throughput(Throughput::Elements(flops as u64));
        g.bench_function("fma_peak_wide/1thread", |bch| {
            bch.iter(|| runtime::probe::fma_burst_wide(std::hint::black_box(ITERS)))
        });
    }
    // The gemm crate called directly (row-major 512^3, one thread): the ceiling the dot
    // kernel's square_512/1thread is judged against on the same machine and day.
    {
        let n = 512;
        let (a, bm) = (data(n * n, 1), data(n * n, 2));
        let mut c = vec![0.0f32; n * n];
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_function("raw_gemm_crate_512/1thread", |bch| {
            bch.iter(|| {
                // SAFETY: three row-major n x n buffers of exactly n*n elements; strides
                // (column 1, row n) stay inside them.
                unsafe {
                    gemm::gemm(
                        n,
                        n,
                        n,
                        c.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        1,
                        n as isize,
                        bm.as_ptr(),
                        1,
                        n as isize,
                        0.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            })
        });
    }
    // Our micro-kernel GEMM called directly on one expert's shapes (one thread):
    // up-projection, down-projection, and the weight gradient (A read transposed); names
    // are `m x n x k`. The `relu_` rows give the small expert's down-projection a ReLU
    // output (half of A zero) with the row-sparse path forbidden or allowed (AVX-512 only;
    // the same bits), the `reluT_` rows the same A read transposed (a weight gradient), the
    // `reluTT_` rows with the result stored transposed too; the `avx2tile_` rows use the
    // AVX2 6x16 tile where the CPU has the AVX-512 one.
    if runtime::kernels::sgemm::available() {
        use runtime::kernels::sgemm::{sparse_available, GemmOptions, MatMut, MatRef, Sgemm};
        for (name, m, n, k, t, sparse) in [
            ("raw_sgemm_256x1024x256", 256, 1024, 256, "", None),
            ("raw_sgemm_256x256x1024", 256, 256, 1024, "", None),
            ("raw_sgemm_T1024x256x256", 1024, 256, 256, "a", None),
            ("raw_sgemm_512x512x512", 512, 512, 512, "", None),
            // The smaller benchmark shape's expert (G*C=128 tokens, M=128, H=512).
            ("raw_sgemm_128x512x128", 128, 512, 128, "", None),
            // The same with B read transposed (the expert's ReLU-gradient GEMM, dY W2^T).
            ("rawBt_sgemm_128x512x128", 128, 512, 128, "b", None),
            // The same with the AVX2 6x16 tile instead of the AVX-512 6x64 one (same bits).
            ("avx2tile_sgemm_128x512x128", 128, 512, 128, "", None),
            ("avx2tile_sgemm_512x512x512", 512, 512, 512, "", None),
            ("raw_sgemm_128x128x512", 128, 128, 512, "", None),
            ("raw_sgemm_T512x128x128", 512, 128, 128, "a", None),
            (
                "relu_sgemm_128x128x512/dense",
                128,
                128,
                512,
                "",
                Some(false),
            ),
            (
                "relu_sgemm_128x128x512/row_sparse",
                128,
                128,
                512,
                "",
                Some(true),
            ),
            // The weight gradient `h^T dy` of the down-projection: a ReLU output read
            // transposed (copied row-major for the row-sparse path).
            (
                "reluT_sgemm_512x128x128/dense",
                512,
                128,
                128,
                "a",
                Some(false),
            ),
            (
                "reluT_sgemm_512x128x128/row_sparse",
                512,
                128,
                128,
                "a",
                Some(true),
            ),
            // The same written transposed (the up-projection's weight gradient `dh'^T x`
            // stored as `[M, H]`): computed row-major, then transposed.
            (
                "reluTT_sgemm_512x128x128/dense",
                512,
                128,
                128,
                "ac",
                Some(false),
            ),
            (
                "reluTT_sgemm_512x128x128/row_sparse",
                512,
                128,
                128,
                "ac",
                Some(true),
            ),
        ] {
            if sparse.is_some() && !sparse_available() {
                continue;
            }
            let a = data(m * k, 1);
            let a: Vec<f32> = match sparse {
                Some(_) => a.iter().map(|x| x.max(0.0)).collect(),
                None => a,
            };
            let bm = data(k * n, 2);
            let mut cm = vec![0.0f32; m * n];
            // Which operands are stored transposed: `a` (A column-major), `b` (B
            // column-major), `c` (C column-major).
            let (a_t, b_t, c_t) = (t.contains('a'), t.contains('b'), t.contains('c'));
            let ar = if a_t {
                MatRef {
                    ptr: a.as_ptr(),
                    rs: 1,
                    cs: m,
                }
            } else {
                MatRef {
                    ptr: a.as_ptr(),
                    rs: k,
                    cs: 1,
                }
            };
            g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
            let opts = GemmOptions {
                wide: !name.starts_with("avx2tile"),
                sparse_a: sparse.unwrap_or(true),
            };
            g.bench_function(format!("{name}/1thread"), |bch| {
                bch.iter(|| {
                    let br = if b_t {
                        MatRef {
                            ptr: bm.as_ptr(),
                            rs: 1,
                            cs: k,
                        }
                    } else {
                        MatRef {
                            ptr: bm.as_ptr(),
                            rs: n,
                            cs: 1,
                        }
                    };
                    let cw = if c_t {
                        MatMut::strided(cm.as_mut_ptr(), 1, m)
                    } else {
                        MatMut::strided(cm.as_mut_ptr(), n, 1)
                    };
                    let product = Sgemm {
                        opts,
                        ..Sgemm::new(m, n, k, ar, br, cw)
                    };
                    // SAFETY: AVX2 checked above; the strides address exactly the buffers.
                    unsafe { product.run() }
                });
            });
        }
    }
    // The one-hot dispatch einsum GSEC,GSM->GECM (sparse lhs path), G=16 S=128 E=32 C=8 M=256.
    let (gg, s, e, cc, m) = (16usize, 128, 32, 8, 256);
    let mut comb = vec![0.0f32; gg * s * e * cc];
    for t in 0..gg * s {
        comb[t * e * cc + (t * 7) % (e * cc)] = 0.7;
        comb[t * e * cc + (t * 13 + 5) % (e * cc)] = 0.3;
    }
    let ls = vec![gg, s, e, cc];
    let rs = vec![gg, s, m];
    let dims = DotDims::new(vec![0], vec![0], vec![1], vec![1]);
    let plan = DotPlan::new(&ls, &rs, &dims);
    let (l, r) = (Data::F32(comb), Data::F32(data(gg * s * m, 3)));
    let mut out = Data::F32(vec![0.0; plan.b * plan.m * plan.n]);
    g.throughput(Throughput::Elements(plan.flops() as u64));
    g.bench_function("dispatch_onehot_sparse", |b| {
        b.iter(|| dot(&plan, &ls, &l, &rs, &r, &mut out))
    });
    // Cold expert GEMMs: 128 sets of 128x512x128 operands and results (~74 MB, past the L3),
    // one after the other on one thread, each fetching the next set's operands and result
    // block while it computes (`ahead`) or not (`cold`): the fetch-ahead's effect, which the
    // hot benches above cannot show.
    #[cfg(target_arch = "x86_64")]
    if runtime::kernels::sgemm::available() {
        use runtime::kernels::sgemm::{MatMut, MatRef, Sgemm};
        let (m, n, k, sets) = (128usize, 512usize, 128usize, 128usize);
        let a: Vec<Vec<f32>> = (0..sets).map(|q| data(m * k, 10 + q as u32)).collect();
        let b: Vec<Vec<f32>> = (0..sets).map(|q| data(k * n, 500 + q as u32)).collect();
        let mut c: Vec<Vec<f32>> = (0..sets).map(|_| vec![0.0; m * n]).collect();
        g.throughput(Throughput::Elements((2 * m * n * k * sets) as u64));
        for (name, fetch) in [
            ("expert_cold_128x512x128/ahead", true),
            ("expert_cold_128x512x128/cold", false),
        ] {
            g.bench_function(name, |bch| {
                bch.iter(|| {
                    for q in 0..sets {
                        let nx = (q + 1) % sets;
                        let spans = [
                            (a[nx].as_ptr() as usize, m * k),
                            (b[nx].as_ptr() as usize, k * n),
                            (c[nx].as_ptr() as usize, m * n),
                        ];
                        let ar = MatRef {
                            ptr: a[q].as_ptr(),
                            rs: k,
                            cs: 1,
                        };
                        let br = MatRef {
                            ptr: b[q].as_ptr(),
                            rs: n,
                            cs: 1,
                        };
                        let cw = MatMut::strided(c[q].as_mut_ptr(), n, 1);
                        let product = Sgemm {
                            ahead: if fetch { &spans } else { &[] },
                            ..Sgemm::new(m, n, k, ar, br, cw)
                        };
                        // SAFETY: `available()` was checked; the strides address exactly the
                        // row-major buffers of set `q`; the spans are only fetched.
                        unsafe { product.run() }
                    }
                })
            });
        }
    }
    g.finish();
}

fn bench_transpose(c: &mut Criterion) {
    let mut g = c.benchmark_group("transpose");
    g.sample_size(10);
    // [G,E,C,M] -> [E,G,C,M] (row copies) and [E,M,H] -> [E,H,M] (tiled).
    let cases: [(&str, Vec<usize>, Vec<usize>); 2] = [
        ("GECM_to_EGCM", vec![64, 64, 4, 256], vec![1, 0, 2, 3]),
        ("EMH_to_EHM", vec![16, 256, 1024], vec![0, 2, 1]),
    ];
    for (name, shape, perm) in cases {
        let n: usize = shape.iter().product();
        let x = Data::F32(data(n, 4));
        let mut out = Data::F32(vec![0.0; n]);
        g.throughput(Throughput::Bytes((n * 8) as u64));
        g.bench_function(name, |b| b.iter(|| transpose(&x, &shape, &perm, &mut out)));
    }
    g.finish();
}

/// A program `f(x, y)` run by the executor; only its single fused step is timed in practice
/// (parameters are shared, not copied).
fn fused_case(
    build: impl Fn(&Builder, &ir::Value, &ir::Value) -> ir::Value,
    n: usize,
) -> (Executable, Vec<HashMap<String, std::sync::Arc<HostTensor>>>) {
    let ty = Type::new(DType::F32, vec![n / 1024, 1024]);
    let b = Builder::new();
    let x = b.param("x", ty.clone());
    let y = b.param("y", ty.clone());
    let out = build(&b, &x, &y);
    b.output("out", &out);
    let exe = Executable::new(&b.finish()).unwrap();
    let ins = vec![[
        (
            "x".to_string(),
            std::sync::Arc::new(HostTensor::from_f32(ty.shape.clone(), data(n, 5))),
        ),
        (
            "y".to_string(),
            std::sync::Arc::new(HostTensor::from_f32(ty.shape.clone(), data(n, 6))),
        ),
    ]
    .into_iter()
    .collect()];
    (exe, ins)
}

fn bench_fused(c: &mut Criterion) {
    let mut g = c.benchmark_group("fused");
    g.sample_size(10);
    let n = 1 << 23;
    g.throughput(Throughput::Elements(n as u64));
    // exp(x - m) / s with broadcast rows: the softmax body (max/sum reductions separate).
    let (exe, ins) = fused_case(
        |b, x, _| {
            let m = x.reduce_max(&[1]);
            let mb = b.emit(Op::Broadcast { dims: vec![0] }, &[&m], Some(x.ty()));
            let e = x.sub(&mb).exp();
            let s = e.sum(&[1]);
            let sb = b.emit(Op::Broadcast { dims: vec![0] }, &[&s], Some(x.ty()));
            e.div(&sb)
        },
        n,
    );
    let comm = InProcess::new(1);
    g.bench_function("softmax_rows_8M", |b| {
        b.iter(|| black_box(exe.run_shared(&comm, &ins, None).unwrap()))
    });
    // The ReLU backward chain of the MoE layer: select(eq(h, pre), select(eq(0, h), 0.5, 1), 0) * g.
    let (exe, ins) = fused_case(
        |b, x, y| {
            let h = x.max(0.0);
            let zero = b.splat(0.0, x.ty());
            let half = b.splat(0.5, x.ty());
            let one = b.splat(1.0, x.ty());
            let at0 = b.emit(Op::Compare(ir::CompareOp::Eq), &[&zero, &h], None);
            let d = b.emit(Op::Select, &[&at0, &half, &one], None);
            let pass = b.emit(Op::Compare(ir::CompareOp::Eq), &[x, &h], None);
            let d = b.emit(Op::Select, &[&pass, &d, &zero], None);
            y.mul(&d)
        },
        n,
    );
    g.bench_function("relu_backward_8M", |b| {
        b.iter(|| black_box(exe.run_shared(&comm, &ins, None).unwrap()))
    });
    g.finish();
}

/// The `rng` op (dropout masks, random routing): Philox samples of a `[1024, 1024]` block at
/// an offset inside a larger global shape, uniform f32 and normal f32, one thread.
fn bench_rng(c: &mut Criterion) {
    let mut g = c.benchmark_group("rng");
    g.sample_size(10);
    let n = 1usize << 20;
    g.throughput(Throughput::Elements(n as u64));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut out = Data::F32(vec![0.0; n]);
    for (name, dist) in [
        ("uniform_f32_1M/1thread", ir::RngDist::Uniform),
        ("normal_f32_1M/1thread", ir::RngDist::Normal),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                one.install(|| {
                    runtime::kernels::layout::random(
                        dist,
                        3,
                        &[4096, 2048],
                        7,
                        &[1024, 512],
                        &[1024, 1024],
                        &mut out,
                    )
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_gemm, bench_transpose, bench_fused, bench_rng);
criterion_main!(benches);
