//! Row sums of masked products from a computed dense product, as the separate multiply
//! and reduce compute them: every term in order, or, for long rows, a lane sum whose
//! rounding is proven to give the same bits.

use crate::kernels::with_avx2;
use rayon::prelude::*;

/// The sums of [`super::DotCall::run_masked_sums`] from a computed dense product `prod`
/// (the untransposed result): every term, in order, as the separate multiply and reduce compute them (long
/// rows by [`row_sum_certified`] where that settles the result).
pub fn masked_row_sums(n: usize, prod: &[f32], mask: &[f32], sums: &mut [f32]) {
    assert_eq!(prod.len(), mask.len());
    assert_eq!(prod.len(), sums.len() * n);
    if n == 0 {
        sums.fill(0.0);
        return;
    }
    sums.par_iter_mut()
        .zip(prod.par_chunks(n).zip(mask.par_chunks(n)))
        .for_each(|(s, (x, w))| {
            *s = if n >= CERTIFIED_MIN {
                row_sum_certified(x, w)
            } else {
                None
            }
            .unwrap_or_else(|| row_sum_in_order(x, w));
        });
}

/// The fewest terms for which a row's sum of products is first tried in lanes
/// ([`row_sum_certified`]): an in-order f64 chain costs an add's latency per term (the
/// MoE layer's loss, 64K terms: 35 us hot on a Zen 5 core), the lanes a fraction of that.
pub(super) const CERTIFIED_MIN: usize = 1024;

/// `sum_j (x[j] * w[j]) as f64` in increasing `j` from `+0`, rounded once to f32: the
/// reference's sum of an f32 product.
pub(super) fn row_sum_in_order(x: &[f32], w: &[f32]) -> f32 {
    x.iter()
        .zip(w)
        .fold(0.0f64, |acc, (&x, &w)| acc + (x * w) as f64) as f32
}

/// [`row_sum_in_order`]'s result, when it can be proven from a sum in sixteen f64 lanes;
/// `None` otherwise (a non-finite term, or a sum too close to a rounding boundary of f32).
///
/// The terms `t_j` (the f32 products, exact in f64) are summed in lanes, and `sum |t_j|`
/// beside them. A sum of `n` f64 terms evaluated along a tree of height `h` lands within
/// `gamma(h) sum |t_j|` of the exact sum (`u = 2^-53`, `gamma(h) = h u / (1 - h u)`;
/// Higham, *Accuracy and Stability of Numerical Algorithms*, 4.2), so the in-order chain
/// (height `n - 1`) lies within the sum of the two sums' bounds of the lanes' sum (the
/// interval below). Rounding to f32 is monotonic: when both ends of that interval
/// round to the same f32 (the same bits, so `-0` and `+0` differ), the chain rounds to it
/// too. Otherwise the caller runs the chain.
pub(super) fn row_sum_certified(x: &[f32], w: &[f32]) -> Option<f32> {
    with_avx2(
        #[inline(always)]
        || {
            const L: usize = 16;
            let (mut sum, mut abs) = ([0.0f64; L], [0.0f64; L]);
            let (xc, wc) = (x.chunks_exact(L), w.chunks_exact(L));
            let (xr, wr) = (xc.remainder(), wc.remainder());
            for (a, b) in xc.zip(wc) {
                for q in 0..L {
                    let t = (a[q] * b[q]) as f64;
                    sum[q] += t;
                    abs[q] += t.abs();
                }
            }
            for (q, (&a, &b)) in xr.iter().zip(wr).enumerate() {
                let t = (a * b) as f64;
                sum[q] += t;
                abs[q] += t.abs();
            }
            let s: f64 = sum.iter().sum();
            let a: f64 = abs.iter().sum();
            // Finite f32 products cannot overflow an f64 sum, so `a` is finite exactly when
            // every term is.
            if !a.is_finite() {
                return None;
            }
            let u = f64::EPSILON / 2.0;
            // The chain's error is at most `gamma(n - 1) A`, the lanes' (each lane's run of
            // at most `n / 16 + 1` terms, then the sixteen lanes) `gamma(h) A` with
            // `h = n / 16 + 17`, where `A = sum |t_j|` and `gamma(k) = k u / (1 - k u)`,
            // under `1.01 k u` here (`n` far below 2^40). `a` is `A` summed the lanes' way,
            // so `A <= a (1 + 2 h u)`. Then slack for the two additions below.
            let (n, h) = (x.len() as f64, (x.len() / L + L + 1) as f64);
            let e = 1.01 * (n + h) * u * a * (1.0 + 2.0 * h * u) + 4.0 * u * s.abs();
            let (lo, hi) = ((s - e) as f32, (s + e) as f32);
            (lo.to_bits() == hi.to_bits()).then_some(lo)
        },
    )
}
