//! Probes of the calling core's speed, for benchmarks on shared machines.
//!
//! On a VM whose cores the host shares with other tenants, a core can slow for a second or
//! more in two ways (`docs/performance.md`, tenth, thirteenth and fourteenth sections):
//! its FMA rate drops by about 30 % while its caches keep their speed, or its loads from
//! the caches slow while an FMA loop in registers keeps its rate. GEMM-bound steps slow in
//! both. `gshard bench` runs both probes around its timed steps and reports the lower
//! figure of each, so either kind of spell shows next to the step times.
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

/// Independent FMA chains of the probe.
pub const CHAINS: usize = 10;

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

/// `steps` steps of the [`CHAINS`] FMA chains (`steps * CHAINS * 16` flops); returns a
/// value that depends on every lane, so nothing is elided. `None` on a CPU without AVX2 and
/// FMA.
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
    let fill = |len: usize, seed: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5 + 1e-4)
            .collect()
    };
    let (a, b) = (fill(m * k, 1), fill(k * n, 2));
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// See [`super::fma_burst`].
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn burst(n: usize) -> f32 {
        let (m, c) = (_mm256_set1_ps(0.999_9), _mm256_set1_ps(1e-4));
        let mut acc: [__m256; CHAINS] = std::array::from_fn(|i| _mm256_set1_ps(i as f32));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, c);
            }
        }
        let acc = std::hint::black_box(acc);
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        _mm256_cvtss_f32(s)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// See [`super::fma_burst_wide`].
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn burst(n: usize) -> f32 {
        let (m, c) = (_mm512_set1_ps(0.999_9), _mm512_set1_ps(1e-4));
        let mut acc: [__m512; CHAINS] = std::array::from_fn(|i| _mm512_set1_ps(i as f32));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, m, c);
            }
        }
        let acc = std::hint::black_box(acc);
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
