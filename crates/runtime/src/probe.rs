//! Probes of the calling core's speed, for benchmarks on shared machines.
//!
//! On a VM whose cores the host shares with other tenants, a core can slow for a second or more
//! in two ways (measured on this project's 2-core development VMs): its FMA rate drops by about
//! 30 % while its caches keep their speed, or its loads from the caches slow while an FMA loop
//! in registers keeps its rate. GEMM-bound steps slow in both. `gshard bench` runs both probes
//! around its timed steps and reports the lower figure of each, so either kind of spell shows
//! next to the step times.
//!
//! - [`fma_gflops`]: [`CHAINS`] independent chains of eight-lane (AVX2-width) FMAs in
//!   registers: at least the FMA latency times the issue width of current x86 cores, so the
//!   chains never wait on each other, with no memory traffic. Its rate is the core's
//!   eight-lane FMA issue rate and nothing else (a core with two 512-bit FMA units reaches
//!   twice it with AVX-512).
//! - [`gemm_gflops`]: the executor's own GEMM micro-kernel ([`crate::kernels::sgemm`]) on
//!   one fixed product whose operands, result and packed panels stay in a 512 KiB L2
//!   ([`GEMM_SHAPE`]): the rate of the kernel the expert GEMMs run, with its loads from L1
//!   and L2, so a spell that slows the caches shows there.
//! - [`clock_ghz`]: the core clock, from a chain of dependent integer adds (one a cycle), so
//!   a peak can be read in flops per cycle against the core's FMA units.
//! - [`gemm_against_peak`]: a dense product through the executor's `dot` on one thread,
//!   timed in bursts that alternate with bursts of the FMA chains ([`fma_burst_wide`] where
//!   the CPU has AVX-512F, else [`fma_burst`]): each pair's GEMM rate over its own peak, so
//!   the share of the peak is read at one clock and one tenancy, not across a host's
//!   drifts (the probe's rate moves by several per cent from minute to minute here).

/// Independent FMA chains of the probe.
pub const CHAINS: usize = 10;

/// One step of every chain: `x <- x * STEP.0 + STEP.1`, which draws `x` slowly towards 1
/// (no overflow, no subnormals, over any number of steps).
const STEP: (f32, f32) = (0.999_9, 1e-4);

/// Where chain `i` starts: `2 + i`, away from the step's fixed point. The chains once started
/// at `i` and were written with their values in plain sight: `1.0` is a fixed point of the step
/// in f32 (`1 * 0.9999 + 1e-4` rounds to 1), so the compiler folded chain 1 into a constant and
/// the loop ran nine chains where the flop count said ten. Both probes read 10/9 of the core's
/// true FMA rate, and every share of the peak quoted against them was 9/10 of the true one. The
/// bursts now also hide the start values and the step from the compiler (`black_box`).
fn chain_start(i: usize) -> f32 {
    2.0 + i as f32
}

/// Steps of the chains in one timed burst (each step is [`CHAINS`] FMAs of 8 lanes x 2 flops).
const BURST: usize = 20_000;

/// The calling core's eight-lane FMA rate in GFLOP/s, measured for about `seconds`; `None`
/// on a CPU without AVX2 and FMA.
pub fn fma_gflops(seconds: f64) -> Option<f64> {
    fma_burst(0)?; // None without AVX2 and FMA
    let mut sink = 0.0f32;
    let (bursts, secs) = repeat_for(seconds, || {
        sink += fma_burst(std::hint::black_box(BURST)).unwrap_or(0.0);
    });
    std::hint::black_box(sink);
    let flops = (bursts * BURST * CHAINS * 8 * 2) as f64;
    Some(flops / secs / 1e9)
}

/// Calls `once` until about `seconds` have passed (at least once): the number of calls and
/// the seconds they took.
fn repeat_for(seconds: f64, mut once: impl FnMut()) -> (usize, f64) {
    let t = std::time::Instant::now();
    let mut calls = 0usize;
    while calls == 0 || t.elapsed().as_secs_f64() < seconds {
        once();
        calls += 1;
    }
    (calls, t.elapsed().as_secs_f64())
}

/// Dependent integer adds per step of [`add_chain`].
const ADDS: usize = 10;

/// Steps of [`add_chain`] in one timed clock burst (`ADDS` cycles each).
const CLOCK_BURST: usize = 20_000;

/// `steps * ADDS` integer adds, each reading the one before: one add a cycle on every x86
/// core (an ALU add's latency is one cycle), so the time they take is the core's clock.
/// `None` off x86-64.
pub fn add_chain(steps: usize) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut x = std::hint::black_box(1u64);
        for _ in 0..steps {
            // SAFETY: register arithmetic on `x` only (the flags are clobbered, which
            // `asm!` assumes without `preserves_flags`).
            unsafe {
                std::arch::asm!(
                    "add {x}, {x}", "add {x}, {x}", "add {x}, {x}", "add {x}, {x}",
                    "add {x}, {x}", "add {x}, {x}", "add {x}, {x}", "add {x}, {x}",
                    "add {x}, {x}", "add {x}, {x}",
                    x = inout(reg) x,
                    options(nomem, nostack),
                );
            }
        }
        Some(x)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = steps;
        None
    }
}

/// The calling core's clock in GHz, from [`add_chain`] run for about `seconds`; `None`
/// off x86-64. An FMA rate over it is the flops the core issues per cycle: 64 on a core
/// with two 512-bit FMA units, 32 with two 256-bit ones (or 512-bit FMAs split in two).
pub fn clock_ghz(seconds: f64) -> Option<f64> {
    add_chain(0)?;
    let (bursts, secs) = repeat_for(seconds, || {
        std::hint::black_box(add_chain(std::hint::black_box(CLOCK_BURST)));
    });
    Some((bursts * CLOCK_BURST * ADDS) as f64 / secs / 1e9)
}

/// `steps` steps of the [`CHAINS`] FMA chains (`steps * CHAINS * 16` flops); returns the
/// sum of the chains, whose start values and step the compiler cannot see, so no chain is
/// elided or folded (see [`chain_start`]). `None` on a CPU without AVX2 and FMA.
pub fn fma_burst(steps: usize) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected.
        return Some(unsafe { avx2::burst(steps) });
    }
    let _ = steps;
    None
}

/// [`fma_burst`] on sixteen-lane (AVX-512) registers, `steps * CHAINS * 32` flops: the FMA
/// peak of a core whose FMA units are 512 bits wide (Zen 5; twice [`fma_burst`]'s rate
/// there, the same on cores that split a 512-bit FMA in two). For the kernel benchmarks'
/// peak figure; `None` on a CPU without AVX-512F.
pub fn fma_burst_wide(steps: usize) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected.
        return Some(unsafe { avx512::burst(steps) });
    }
    let _ = steps;
    None
}

/// `len` values in `[-0.5, 0.5)` for a GEMM probe's operand: irregular, with no zero rows
/// (the kernel would skip them) and nothing that overflows.
fn operand(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5 + 1e-4)
        .collect()
}

/// `(m, n, k)` of the GEMM probe: `A` 64 KiB, `B` and `C` 128 KiB each, `B` packed 128 KiB
/// (448 KiB in all, inside a 512 KiB L2), 8.4 MFLOP per product.
pub const GEMM_SHAPE: (usize, usize, usize) = (128, 256, 128);

/// The calling core's rate on the GEMM micro-kernel in GFLOP/s: products of
/// [`GEMM_SHAPE`] on operands in cache, repeated for about `seconds` after one untimed
/// product that brings them in; `None` where the kernel does not run (no AVX2 and FMA).
pub fn gemm_gflops(seconds: f64) -> Option<f64> {
    use crate::kernels::sgemm::{available, sgemm, MatMut, MatRef};
    if !available() {
        return None;
    }
    let (m, n, k) = GEMM_SHAPE;
    // Values in [-0.5, 0.5): no zero rows (the kernel would skip them), nothing that
    // overflows.
    let (a, b) = (operand(m * k, 1), operand(k * n, 2));
    let mut c = vec![0.0f32; m * n];
    let mut product = || {
        // SAFETY: `available()` holds; `a` is `m x k`, `b` `k x n` and `c` `m x n`, row-major
        // and owned here, so every strided element is inside its allocation and no other
        // thread touches `c`.
        unsafe {
            sgemm(
                m,
                n,
                k,
                MatRef::strided(a.as_ptr(), k, 1),
                MatRef::strided(b.as_ptr(), n, 1),
                MatMut::strided(c.as_mut_ptr(), n, 1),
            )
        }
    };
    product();
    let (products, secs) = repeat_for(seconds, &mut product);
    std::hint::black_box(&c);
    Some((products * 2 * m * n * k) as f64 / secs / 1e9)
}

/// A dense product's rate against the FMA peak, measured in alternating bursts
/// ([`gemm_against_peak`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PairedGemm {
    /// Medians over the pairs: the FMA chains' rate and the product's, GFLOP/s.
    pub peak_gflops: f64,
    pub gemm_gflops: f64,
    /// The median, lower and upper quartiles of the pairs' `gemm / peak`.
    pub share: f64,
    pub share_q1: f64,
    pub share_q3: f64,
    pub pairs: usize,
    /// Whether the peak is the sixteen-lane one ([`fma_burst_wide`]).
    pub wide: bool,
    /// The median clock ([`clock_ghz`], a short burst before each pair's peak) and the
    /// median of the pairs' peak over that clock, in flops per cycle: the peak checked
    /// against the core's FMA units (64 for two 512-bit units). `None` off x86-64.
    pub clock_ghz: Option<f64>,
    pub peak_flops_per_cycle: Option<f64>,
    /// The largest difference between the product and an f64 sum, over sampled entries of
    /// `C` (a check that the timed call computed the product).
    pub sampled_error: f64,
}

/// `C = A B` for an `m x k` `A` (stored `k x m` when `a_transposed`: a weight gradient's
/// `x^T dy`) and a `k x n` `B`, through the executor's [`crate::kernels::dot::dot`] on a
/// one-thread pool, timed in `pairs` pairs of bursts of about `burst_seconds` each: the FMA
/// chains (sixteen lanes where the CPU has AVX-512F, which is the peak of a core with
/// 512-bit FMA units; eight elsewhere), then the product, repeated. `None` on a CPU without
/// AVX2 and FMA, or for an empty shape. Operands are in `[-0.5, 0.5)` without zeros (the
/// kernel would skip zero rows) and stay in cache between products, as in the criterion
/// benches: the figure is the kernel's, not the memory's.
pub fn gemm_against_peak(
    m: usize,
    n: usize,
    k: usize,
    a_transposed: bool,
    pairs: usize,
    burst_seconds: f64,
) -> Option<PairedGemm> {
    use crate::kernels::dot::{dot, DotPlan};
    use crate::tensor::Data;
    fma_burst(0)?;
    if m == 0 || n == 0 || k == 0 || pairs == 0 {
        return None;
    }
    let wide = fma_burst_wide(0).is_some();
    let lanes = if wide { 16 } else { 8 };
    let peak_burst = || {
        let steps = std::hint::black_box(BURST);
        if wide {
            fma_burst_wide(steps)
        } else {
            fma_burst(steps)
        }
    };
    let (ls, contract) = if a_transposed {
        (vec![k, m], 0)
    } else {
        (vec![m, k], 1)
    };
    let rs = vec![k, n];
    let plan = DotPlan::new(
        &ls,
        &rs,
        &ir::DotDims::new(vec![], vec![], vec![contract], vec![0]),
    );
    let (a, b) = (Data::F32(operand(m * k, 1)), Data::F32(operand(k * n, 2)));
    let mut c = Data::F32(vec![0.0; m * n]);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .ok()?;
    let (mut peaks, mut rates, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    let (mut clocks, mut per_cycle) = (Vec::new(), Vec::new());
    one.install(|| {
        dot(&plan, &ls, &a, &rs, &b, &mut c);
        for _ in 0..pairs {
            let clock = clock_ghz(burst_seconds / 5.0);
            let (bursts, secs) = repeat_for(burst_seconds, || {
                std::hint::black_box(peak_burst());
            });
            let peak = (bursts * BURST * CHAINS * lanes * 2) as f64 / secs / 1e9;
            let (products, secs) = repeat_for(burst_seconds, || {
                dot(&plan, &ls, &a, &rs, &b, &mut c);
            });
            let rate = (products * 2 * m * n * k) as f64 / secs / 1e9;
            if let Some(g) = clock {
                clocks.push(g);
                per_cycle.push(peak / g);
            }
            peaks.push(peak);
            rates.push(rate);
            shares.push(rate / peak);
        }
    });
    let (Data::F32(a), Data::F32(b), Data::F32(c)) = (&a, &b, &c) else {
        unreachable!("f32 operands")
    };
    let a_at = |i: usize, p: usize| {
        if a_transposed {
            a[p * m + i]
        } else {
            a[i * k + p]
        }
    };
    let sampled_error = (0..16)
        .map(|s| {
            let (i, j) = ((s * 7 + 3) % m, (s * 13 + 5) % n);
            let want: f64 = (0..k)
                .map(|p| a_at(i, p) as f64 * b[p * n + j] as f64)
                .sum();
            (c[i * n + j] as f64 - want).abs()
        })
        .fold(0.0, f64::max);
    let at = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    Some(PairedGemm {
        peak_gflops: at(&mut peaks, 0.5),
        gemm_gflops: at(&mut rates, 0.5),
        share: at(&mut shares, 0.5),
        share_q1: at(&mut shares, 0.25),
        share_q3: at(&mut shares, 0.75),
        pairs,
        wide,
        clock_ghz: (!clocks.is_empty()).then(|| at(&mut clocks, 0.5)),
        peak_flops_per_cycle: (!per_cycle.is_empty()).then(|| at(&mut per_cycle, 0.5)),
        sampled_error,
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{chain_start, CHAINS, STEP};
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// See [`super::fma_burst`].
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn burst(n: usize) -> f32 {
        // Through `black_box`: the compiler may not know the chains' values (see
        // [`super::chain_start`]).
        let (m, c) = black_box((_mm256_set1_ps(STEP.0), _mm256_set1_ps(STEP.1)));
        let mut acc: [__m256; CHAINS] =
            black_box(std::array::from_fn(|i| _mm256_set1_ps(chain_start(i))));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, c);
            }
        }
        let acc = black_box(acc);
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        _mm256_cvtss_f32(s)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{chain_start, CHAINS, STEP};
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// See [`super::fma_burst_wide`].
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn burst(n: usize) -> f32 {
        // Through `black_box`: the compiler may not know the chains' values (see
        // [`super::chain_start`]).
        let (m, c) = black_box((_mm512_set1_ps(STEP.0), _mm512_set1_ps(STEP.1)));
        let mut acc: [__m512; CHAINS] =
            black_box(std::array::from_fn(|i| _mm512_set1_ps(chain_start(i))));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        let acc = black_box(acc);
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
        _mm512_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    /// Whether the CPU has AVX2 and FMA, detected here rather than asked of the code the
    /// probes themselves ask.
    fn has_avx2_fma() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Where the CPU has AVX2 and FMA the probe reports a positive, finite rate of at least
    /// one eight-lane FMA every ten cycles of a 1 GHz core (any working core is far above
    /// it, even shared), and `None` only where it has not.
    #[test]
    fn the_probe_reports_a_plausible_rate_where_the_cpu_has_fma() {
        let got = super::fma_gflops(0.02);
        assert_eq!(got.is_some(), has_avx2_fma());
        if let Some(g) = got {
            assert!(g > 1.6 && g.is_finite(), "{g} GFLOP/s");
        }
    }

    /// The sixteen-lane burst runs exactly where the CPU has AVX-512F, and gives the
    /// eight-lane burst's value for the same steps (the same FMA chains, lane 0 summed).
    #[test]
    fn the_wide_burst_runs_where_the_cpu_has_avx512() {
        #[cfg(target_arch = "x86_64")]
        let wide = std::is_x86_feature_detected!("avx512f");
        #[cfg(not(target_arch = "x86_64"))]
        let wide = false;
        let got = super::fma_burst_wide(100);
        assert_eq!(got.is_some(), wide);
        if let (Some(w), Some(n)) = (got, super::fma_burst(100)) {
            assert_eq!(w.to_bits(), n.to_bits(), "{w} against {n}");
        }
    }

    /// No chain starts at a fixed point of the step (a chain that never moves can be folded
    /// into a constant, leaving the loop a chain short of the flops it counts), no two
    /// chains start alike, and the burst's value is the scalar model's: every chain
    /// stepped `n` times with the same FMA rounding, lane 0 summed in chain order.
    #[test]
    fn every_chain_moves_and_the_burst_sums_all_of_them() {
        use super::{chain_start, CHAINS, STEP};
        let starts: Vec<f32> = (0..CHAINS).map(chain_start).collect();
        for (i, &x) in starts.iter().enumerate() {
            assert_ne!(
                x.mul_add(STEP.0, STEP.1).to_bits(),
                x.to_bits(),
                "chain {i}"
            );
            assert!(
                !starts[..i].contains(&x),
                "chain {i} starts like an earlier one"
            );
        }
        let n = 300;
        let want = starts.iter().fold(0.0f32, |s, &x0| {
            s + (0..n).fold(x0, |x, _| x.mul_add(STEP.0, STEP.1))
        });
        if let Some(got) = super::fma_burst(n) {
            assert_eq!(got.to_bits(), want.to_bits(), "{got} against {want}");
        }
    }

    /// The add chain doubles its value once per add (wrapping), so its result shows that
    /// every add ran: `2^(10 steps)` mod `2^64`.
    #[test]
    fn the_add_chain_runs_every_add() {
        if let Some(x) = super::add_chain(3) {
            assert_eq!(x, 1 << 30);
            assert_eq!(super::add_chain(7), Some(0), "2^70 wraps to 0");
        }
        assert_eq!(super::add_chain(0).is_some(), cfg!(target_arch = "x86_64"));
        if let Some(g) = super::clock_ghz(0.005) {
            assert!(g > 0.0 && g.is_finite(), "{g} GHz");
        }
    }

    /// The paired measurement runs exactly where the kernel does, reports the product's
    /// share of the peak between the quartiles, and multiplies correctly on both layouts
    /// of `A` (its sampled entries against f64 sums).
    #[test]
    fn the_paired_gemm_measurement_reports_a_share_of_the_peak() {
        for t in [false, true] {
            let got = super::gemm_against_peak(13, 40, 21, t, 3, 0.002);
            assert_eq!(got.is_some(), has_avx2_fma());
            let Some(g) = got else { continue };
            assert_eq!(g.pairs, 3);
            assert!(g.peak_gflops > 1.6 && g.peak_gflops.is_finite(), "{g:?}");
            assert!(g.gemm_gflops > 0.0 && g.gemm_gflops.is_finite(), "{g:?}");
            assert!(g.share_q1 <= g.share && g.share <= g.share_q3, "{g:?}");
            // A core never multiplies faster than its FMA units (a margin for a burst
            // that caught a slow spell of the peak's).
            assert!(g.share > 0.0 && g.share < 2.0, "{g:?}");
            assert!(g.sampled_error < 1e-4, "{g:?}");
            // The clock and the flops per cycle come together, on x86-64 only, positive
            // and finite.
            assert_eq!(g.clock_ghz.is_some(), cfg!(target_arch = "x86_64"), "{g:?}");
            assert_eq!(g.clock_ghz.is_some(), g.peak_flops_per_cycle.is_some());
            for v in [g.clock_ghz, g.peak_flops_per_cycle].into_iter().flatten() {
                assert!(v > 0.0 && v.is_finite(), "{g:?}");
            }
        }
        assert_eq!(super::gemm_against_peak(0, 4, 4, false, 3, 0.001), None);
        assert_eq!(super::gemm_against_peak(4, 4, 4, false, 0, 0.001), None);
    }

    /// The GEMM probe reports a positive, finite rate exactly where the micro-kernel runs
    /// (a tenth of the FMA probe's floor: the kernel's share of the FMA peak is far above a
    /// tenth even on a shared core), and `None` where it does not.
    #[test]
    fn the_gemm_probe_reports_a_plausible_rate_where_the_kernel_runs() {
        let got = super::gemm_gflops(0.02);
        // The kernel runs where the CPU has AVX2 and FMA.
        assert_eq!(got.is_some(), has_avx2_fma());
        if let Some(g) = got {
            assert!(g > 0.16 && g.is_finite(), "{g} GFLOP/s");
        }
    }
}
