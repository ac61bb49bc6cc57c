//! Opt-in compression of f32 payloads on the wire: bf16 (round to nearest even), widened
//! back to f32 on arrival. Half the bytes, at a stated cost in accuracy:
//!
//! - all-to-all (MoE dispatch and combine): each element arrives with a relative error of
//!   at most 2^-8 (bf16 keeps 8 significant bits), exactly 0 for values bf16 holds;
//! - all-reduce (gradient sums): the k operands are rounded to bf16, summed in rank order
//!   in f64 and rounded to f32 (as uncompressed), and the sum is rounded to bf16 for the
//!   all-gather, so every element of the result is within [`ALL_REDUCE_BOUND`] · Σ|x_i| of
//!   the exact sum (x_i: the operands' elements), and every rank holds the same result.
//!
//! Values outside bf16's range keep f32's: bf16 has f32's exponent range, so nothing
//! overflows; NaN stays NaN.

use half::bf16;

/// The relative error bound of a compressed all-to-all: bf16's unit roundoff.
pub const ALL_TO_ALL_BOUND: f64 = 1.0 / 256.0;

/// The bound of a compressed all-reduce, relative to Σ|x_i|: two bf16 roundings (the
/// operands, then the sum, which is at most (1 + 2^-8) Σ|x_i| after the first) and one f32
/// rounding, 2^-8 + 2^-8 (1 + 2^-8) + 2^-24 (1 + 2^-8)^2, rounded up.
pub const ALL_REDUCE_BOUND: f64 = 2.0 / 256.0 + 1.0 / 65536.0 + 1.0 / 8_388_608.0;

/// Which collective kinds send f32 payloads as bf16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compress {
    pub all_to_all: bool,
    pub all_reduce: bool,
}

/// f32 values (little-endian bytes) as bf16 bytes, half as many.
pub fn narrow(f32_bytes: &[u8]) -> Vec<u8> {
    f32_bytes
        .chunks_exact(4)
        .flat_map(|c| {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            bf16::from_f32(x).to_bits().to_le_bytes()
        })
        .collect()
}

/// bf16 bytes back to f32 bytes (exact).
pub fn widen(bf16_bytes: &[u8]) -> Vec<u8> {
    bf16_bytes
        .chunks_exact(2)
        .flat_map(|c| {
            bf16::from_bits(u16::from_le_bytes([c[0], c[1]]))
                .to_f32()
                .to_le_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn values(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Deterministic values over many magnitudes and both signs.
    fn sample(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                let e = ((s >> 3) % 40) as i32 - 20;
                ((u - 0.5) * 2f64.powi(e)) as f32
            })
            .collect()
    }

    #[test]
    fn half_the_bytes_within_the_all_to_all_bound() {
        let x = sample(10_000, 1);
        let wire = narrow(&bytes(&x));
        assert_eq!(wire.len(), 2 * x.len());
        let y = values(&widen(&wire));
        let worst = x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).abs() / (*a as f64).abs().max(f64::MIN_POSITIVE))
            .fold(0.0, f64::max);
        assert!(worst <= ALL_TO_ALL_BOUND, "{worst}");
        // The bound is tight: some element needs most of it.
        assert!(worst > ALL_TO_ALL_BOUND / 2.0, "{worst}");
        // bf16 values, infinities and NaN pass unchanged.
        let exact = [
            1.5f32,
            -0.0,
            f32::INFINITY,
            2.0f32.powi(127),
            -2.0f32.powi(-130),
        ];
        assert_eq!(values(&widen(&narrow(&bytes(&exact)))), exact);
        assert!(values(&widen(&narrow(&bytes(&[f32::NAN]))))[0].is_nan());
    }

    #[test]
    fn a_compressed_sum_stays_within_the_all_reduce_bound() {
        let k = 8;
        let ops: Vec<Vec<f32>> = (0..k).map(|r| sample(5_000, 10 + r as u64)).collect();
        let rounded: Vec<Vec<f32>> = ops
            .iter()
            .map(|o| values(&widen(&narrow(&bytes(o)))))
            .collect();
        let mut worst: f64 = 0.0;
        for i in 0..ops[0].len() {
            let exact: f64 = ops.iter().map(|o| o[i] as f64).sum();
            let scale: f64 = ops.iter().map(|o| (o[i] as f64).abs()).sum();
            let sum = rounded.iter().map(|o| o[i] as f64).sum::<f64>() as f32;
            let got = values(&widen(&narrow(&bytes(&[sum]))))[0] as f64;
            worst = worst.max((got - exact).abs() / scale);
        }
        assert!(worst <= ALL_REDUCE_BOUND, "{worst}");
        assert!(worst > ALL_TO_ALL_BOUND / 4.0, "{worst}");
    }
}
