//! A probe of the calling core's FMA throughput, for benchmarks on shared machines.
//!
//! On a VM whose cores the host shares with other tenants, a core's FMA rate can drop by
//! about 30 % for a second or more while its caches and memory keep their speed (one such
//! spell on the Zen 3 VM of `docs/performance.md`, thirteenth section); GEMM-bound steps
//! slow with it. `gshard bench` runs this probe around its timed steps and reports the lower
//! figure, so spells of that kind show next to the step times. Spells that slow the caches
//! or the memory instead (the tenth section's) leave the probe's rate unchanged.
//!
//! The probe is [`CHAINS`] independent chains of eight-lane (AVX2-width) FMAs in registers:
//! at least the FMA latency times the issue width of current x86 cores, so the chains never
//! wait on each other, with no memory traffic. Its rate is the core's eight-lane FMA issue
//! rate and nothing else (a core with two 512-bit FMA units reaches twice it with AVX-512).

/// Independent FMA chains of the probe.
pub const CHAINS: usize = 10;

/// Steps of the chains in one timed burst (each step is [`CHAINS`] FMAs of 8 lanes x 2 flops).
const BURST: usize = 20_000;

/// The calling core's eight-lane FMA rate in GFLOP/s, measured for about `seconds`; `None`
/// on a CPU without AVX2 and FMA.
pub fn fma_gflops(seconds: f64) -> Option<f64> {
    let t = std::time::Instant::now();
    let mut bursts = 0usize;
    let mut sink = 0.0f32;
    while bursts == 0 || t.elapsed().as_secs_f64() < seconds {
        sink += fma_burst(std::hint::black_box(BURST))?;
        bursts += 1;
    }
    std::hint::black_box(sink);
    let flops = (bursts * BURST * CHAINS * 8 * 2) as f64;
    Some(flops / t.elapsed().as_secs_f64() / 1e9)
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

#[cfg(test)]
mod tests {
    /// Where the CPU has AVX2 and FMA the probe reports a positive, finite rate of at least
    /// one eight-lane FMA every ten cycles of a 1 GHz core (any working core is far above
    /// it, even shared), and `None` only where it has not.
    #[test]
    fn the_probe_reports_a_plausible_rate_where_the_cpu_has_fma() {
        let got = super::fma_gflops(0.02);
        #[cfg(target_arch = "x86_64")]
        let has = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let has = false;
        assert_eq!(got.is_some(), has);
        if let Some(g) = got {
            assert!(g > 1.6 && g.is_finite(), "{g} GFLOP/s");
        }
    }
}
