//! A probe of the calling core's FMA throughput, for benchmarks on shared machines.
//!
//! On a VM whose cores the host shares with other tenants, a core's FMA rate can drop by a
//! third for seconds at a time while its caches and memory keep their speed. Measured on
//! the Zen 3 VM of `docs/performance.md` (a C probe on one core, 5 s): FMA chains at
//! 30.5-34.8 GFLOP/s, then 21.8-24.6 for 1.5 s, while an L2-resident stream stayed at
//! 30.5-32.8 GB/s and a DRAM stream at 10.6-15.1. GEMM-bound steps slow with the FMA rate,
//! so `gshard bench` runs this probe around its timed steps and reports the lower figure:
//! a slow step can then be told from a slow spell of the host.
//!
//! The probe is ten independent chains of eight-lane FMAs in registers (more than the
//! latency times the issue width, so the chains never wait on each other), with no memory
//! traffic: its rate is the core's FMA issue rate and nothing else.

use std::time::Instant;

/// FMAs per chain in one timed burst (10 chains x 8 lanes x 2 flops each).
const BURST: usize = 20_000;

/// The calling core's eight-lane FMA rate in GFLOP/s, measured for about `seconds`; `None`
/// on a CPU without AVX2 and FMA.
pub fn fma_gflops(seconds: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        let t = Instant::now();
        let mut bursts = 0usize;
        let mut sink = 0.0f32;
        while bursts == 0 || t.elapsed().as_secs_f64() < seconds {
            // SAFETY: AVX2 and FMA were detected.
            sink += unsafe { avx2::burst(std::hint::black_box(BURST)) };
            bursts += 1;
        }
        std::hint::black_box(sink);
        let flops = (bursts * BURST * 10 * 8 * 2) as f64;
        return Some(flops / t.elapsed().as_secs_f64() / 1e9);
    }
    let _ = seconds;
    None
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `n` steps of ten independent FMA chains; returns a lane of their sum (so the chains
    /// are not optimised away).
    ///
    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn burst(n: usize) -> f32 {
        let (m, c) = (_mm256_set1_ps(0.999_9), _mm256_set1_ps(1e-4));
        let mut acc: [__m256; 10] = std::array::from_fn(|i| _mm256_set1_ps(i as f32));
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, m, c);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        _mm256_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    /// Where the CPU has AVX2 and FMA the probe reports a rate of at least one eight-lane
    /// FMA every few cycles of a 1 GHz core (any working core is far above that), and
    /// `None` only where it has not.
    #[test]
    fn the_probe_reports_a_plausible_rate_where_the_cpu_has_fma() {
        let got = super::fma_gflops(0.002);
        #[cfg(target_arch = "x86_64")]
        let has = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let has = false;
        assert_eq!(got.is_some(), has);
        if let Some(g) = got {
            assert!(g > 4.0 && g.is_finite(), "{g} GFLOP/s");
        }
    }
}
