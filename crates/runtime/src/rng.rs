//! The counter-based RNG behind the `rng` op: pure functions, shared by every executor.
//!
//! **Invariant: an element's value depends only on `(seed, stream, its row-major index in
//! the op's `global_shape`)`**, never on which device computes it or how the tensor is
//! sharded. A partitioned program therefore draws exactly the numbers the unpartitioned one
//! does (dropout, noisy and random routing included).
//!
//! Generator: Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy
//! as 1, 2, 3", SC 2011), multipliers `M0 = 0xD2511F53`, `M1 = 0xCD9E8D57`, Weyl key
//! increments `W0 = 0x9E3779B9`, `W1 = 0xBB67AE85`, 10 rounds.
//!
//! Mapping for element `i` (the row-major linear index in `global_shape` of the element's
//! local multi-index plus the op's offsets; no offsets = zeros):
//! - key     = `(seed as u32, stream as u32)` (the i32 seed's bits),
//! - counter = `(i as u32, (i >> 32) as u32, (stream >> 32) as u32, 0)`,
//! - `x = philox4x32_10(counter, key)`.
//!
//! Samples (computed in f64, then rounded to the result dtype):
//! - uniform: `u = (x0 >> 8) * 2^-24`, in `[0, 1)` and exact in f32 / f64. For bf16 the
//!   rounded value is clamped below 1: if rounding gives 1.0 the result is the largest bf16
//!   below 1 (`0.99609375`).
//! - normal (Box-Muller, one output per counter): `u1 = ((x0 >> 8) + 1) * 2^-24` in `(0, 1]`,
//!   `u2 = (x1 >> 8) * 2^-24`, `z = sqrt(-2 ln u1) * cos(2 pi u2)`.
//!
//! Coordinates outside `global_shape` (the padding of an unevenly sharded dim) still map to a
//! deterministic value: the linear index is computed with the global strides in wrapping i64
//! arithmetic. Such elements are masked by the partitioner and never observed.

use ir::{DType, RngDist};

/// Philox multiplier for lane 0.
pub const M0: u32 = 0xD251_1F53;
/// Philox multiplier for lane 2.
pub const M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0 (golden ratio).
pub const W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1 (sqrt(3) - 1).
pub const W1: u32 = 0xBB67_AE85;

/// The Philox-4x32 block function with 10 rounds.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// Words 0 and 1 of [`random_bits`] for the consecutive indices `first, first + 1, ...`
/// (wrapping): `x0[t]` and `x1[t]` (when given; `x1.len() == x0.len()`) are those of index
/// `first + t`. Bitwise the per-element function; on CPUs with AVX2, sixteen counters at a
/// time in vector registers (`vpmuludq` gives the 32 x 32 -> 64-bit products of the even
/// lanes, the odd lanes are shifted down for a second one).
pub fn bits_run(seed: i32, stream: u64, first: u64, x0: &mut [u32], mut x1: Option<&mut [u32]>) {
    if let Some(x1) = x1.as_deref() {
        assert_eq!(x1.len(), x0.len(), "one word 1 per word 0");
    }
    let key = [seed as u32, stream as u32];
    let c2 = (stream >> 32) as u32;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected; the slices bound every store.
        done = unsafe { avx2::bits_run(key, c2, first, x0, x1.as_deref_mut()) };
    }
    for t in done..x0.len() {
        let w = random_bits(seed, stream, first.wrapping_add(t as u64));
        x0[t] = w[0];
        if let Some(x1) = x1.as_deref_mut() {
            x1[t] = w[1];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{M0, M1, W0, W1};
    use std::arch::x86_64::*;

    /// Lanes of each low and high 32 bits of the eight 32 x 32-bit products `a * m`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn mul_hi_lo(a: __m256i, m: __m256i) -> (__m256i, __m256i) {
        let even = _mm256_mul_epu32(a, m);
        let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), m);
        let lo = _mm256_blend_epi32::<0xAA>(even, _mm256_slli_epi64::<32>(odd));
        let hi = _mm256_blend_epi32::<0xAA>(_mm256_srli_epi64::<32>(even), odd);
        (hi, lo)
    }

    /// Philox-4x32-10 on two sets of eight counters `(c0, c1, c2, 0)` (independent chains,
    /// for the multipliers' latency); returns words 0 and 1 of each.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn philox(c0: [__m256i; 2], c1: [__m256i; 2], c2: __m256i, key: [u32; 2]) -> [[__m256i; 2]; 2] {
        let (m0, m1) = (_mm256_set1_epi32(M0 as i32), _mm256_set1_epi32(M1 as i32));
        let mut c = [
            [c0[0], c1[0], c2, _mm256_setzero_si256()],
            [c0[1], c1[1], c2, _mm256_setzero_si256()],
        ];
        let mut k = key;
        for round in 0..10 {
            if round > 0 {
                k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
            }
            let (k0, k1) = (
                _mm256_set1_epi32(k[0] as i32),
                _mm256_set1_epi32(k[1] as i32),
            );
            for s in c.iter_mut() {
                let (hi0, lo0) = mul_hi_lo(s[0], m0);
                let (hi1, lo1) = mul_hi_lo(s[2], m1);
                *s = [
                    _mm256_xor_si256(_mm256_xor_si256(hi1, s[1]), k0),
                    lo1,
                    _mm256_xor_si256(_mm256_xor_si256(hi0, s[3]), k1),
                    lo0,
                ];
            }
        }
        [[c[0][0], c[1][0]], [c[0][1], c[1][1]]]
    }

    /// [`super::bits_run`] over whole blocks of sixteen; returns how many elements it wrote.
    ///
    /// # Safety
    /// The CPU has AVX2; `x1`, when given, is as long as `x0`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bits_run(
        key: [u32; 2],
        c2: u32,
        first: u64,
        x0: &mut [u32],
        mut x1: Option<&mut [u32]>,
    ) -> usize {
        let blocks = x0.len() / 16;
        let step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let c2v = _mm256_set1_epi32(c2 as i32);
        for b in 0..blocks {
            let base = first.wrapping_add((b * 16) as u64);
            let mut lo = [_mm256_setzero_si256(); 2];
            let mut hi = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let start = base.wrapping_add((h * 8) as u64);
                if (start as u32).checked_add(7).is_some() {
                    // No carry into word 1 inside these eight.
                    lo[h] = _mm256_add_epi32(_mm256_set1_epi32(start as u32 as i32), step);
                    hi[h] = _mm256_set1_epi32((start >> 32) as u32 as i32);
                } else {
                    let i: [u64; 8] = std::array::from_fn(|l| start.wrapping_add(l as u64));
                    let w0: [u32; 8] = i.map(|i| i as u32);
                    let w1: [u32; 8] = i.map(|i| (i >> 32) as u32);
                    // SAFETY: 8 readable u32 each.
                    unsafe {
                        lo[h] = _mm256_loadu_si256(w0.as_ptr().cast());
                        hi[h] = _mm256_loadu_si256(w1.as_ptr().cast());
                    }
                }
            }
            let [w0, w1] = philox(lo, hi, c2v, key);
            let at = b * 16;
            // SAFETY: `at + 16 <= x0.len()` (and `x1.len()`).
            unsafe {
                _mm256_storeu_si256(x0.as_mut_ptr().add(at).cast(), w0[0]);
                _mm256_storeu_si256(x0.as_mut_ptr().add(at + 8).cast(), w0[1]);
                if let Some(x1) = x1.as_deref_mut() {
                    _mm256_storeu_si256(x1.as_mut_ptr().add(at).cast(), w1[0]);
                    _mm256_storeu_si256(x1.as_mut_ptr().add(at + 8).cast(), w1[1]);
                }
            }
        }
        blocks * 16
    }
}

/// The sample of `dist` from words 0 and 1 of an element's bits, rounded to `dtype` (a
/// float dtype), as an f64: [`sample`] without the generator.
#[inline]
pub fn sample_from_words(dist: RngDist, dtype: DType, x0: u32, x1: u32) -> f64 {
    let bits = [x0, x1, 0, 0];
    match dist {
        RngDist::Uniform => {
            let u = crate::tensor::convert_value(uniform_from_bits(bits), dtype);
            if u >= 1.0 {
                // Only bf16 can round up to 1: use the largest bf16 below 1.
                half::bf16::from_bits(0x3F7F).to_f64()
            } else {
                u
            }
        }
        RngDist::Normal => crate::tensor::convert_value(normal_from_bits(bits), dtype),
    }
}

/// The four random words of element `index` of stream `stream` under `seed`.
pub fn random_bits(seed: i32, stream: u64, index: u64) -> [u32; 4] {
    let key = [seed as u32, stream as u32];
    let counter = [index as u32, (index >> 32) as u32, (stream >> 32) as u32, 0];
    philox4x32_10(counter, key)
}

/// Row-major linear index of `coords` in `global_shape` (wrapping for coordinates outside
/// the shape; see the module doc).
pub fn linear_index(global_shape: &[usize], coords: &[i64]) -> u64 {
    let strides = ir::strides(global_shape);
    index_by_strides(strides.iter().map(|&s| s as i64), coords.iter().copied())
}

/// [`linear_index`] with the global shape's row-major `strides` given (computed once by a
/// caller that indexes many coordinates).
pub fn index_by_strides(
    strides: impl IntoIterator<Item = i64>,
    coords: impl IntoIterator<Item = i64>,
) -> u64 {
    coords
        .into_iter()
        .zip(strides)
        .fold(0i64, |acc, (c, s)| acc.wrapping_add(c.wrapping_mul(s))) as u64
}

/// `2^-24`: a uniform sample is the top 24 bits of a word times this.
pub(crate) const TWO_POW_M24: f64 = 1.0 / 16_777_216.0;

/// The uniform sample of `bits` in `[0, 1)`, as an f64 (exact in f32).
pub fn uniform_from_bits(bits: [u32; 4]) -> f64 {
    (bits[0] >> 8) as f64 * TWO_POW_M24
}

/// The standard-normal sample of `bits`, in f64 (Box-Muller).
pub fn normal_from_bits(bits: [u32; 4]) -> f64 {
    let u1 = ((bits[0] >> 8) as f64 + 1.0) * TWO_POW_M24;
    let u2 = (bits[1] >> 8) as f64 * TWO_POW_M24;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Element `index` of an `rng` op with this `dist`, `seed` and `stream`, rounded to `dtype`
/// (a float dtype), returned as an f64.
pub fn sample(dist: RngDist, dtype: DType, seed: i32, stream: u64, index: u64) -> f64 {
    let bits = random_bits(seed, stream, index);
    sample_from_words(dist, dtype, bits[0], bits[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }

    #[test]
    fn philox_pi_known_answer() {
        // Random123's kat_vectors: counter and key from the digits of pi.
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn linear_index_row_major() {
        assert_eq!(linear_index(&[8, 6], &[2, 3]), 15);
        assert_eq!(linear_index(&[], &[]), 0);
        assert_eq!(linear_index(&[2, 3, 4], &[1, 2, 3]), 23);
    }

    #[test]
    fn bf16_uniform_never_reaches_one() {
        // (2^24 - 1) * 2^-24 rounds to 1.0 in bf16; it must be clamped.
        let bits = [u32::MAX, 0, 0, 0];
        assert!(uniform_from_bits(bits) < 1.0);
        let mut found = false;
        for i in 0..20000u64 {
            let u = sample(RngDist::Uniform, DType::BF16, 7, 0, i);
            assert!((0.0..1.0).contains(&u), "{u}");
            found |= u == half::bf16::from_bits(0x3F7F).to_f64();
        }
        assert!(
            found,
            "some samples should land on the largest bf16 below 1"
        );
    }
}
