//! f32 `exp`: one rule, [`exp_scalar`], that the reference interpreter applies element by
//! element and that [`exp_f32`] evaluates on sixteen (AVX-512F) or eight (AVX2) f32 lanes
//! with the same operations in the same order, so both give the same bits on every input.
//!
//! The rule, all in f32 with fused multiply-adds:
//! - clamp `x` to `[-104, 89]` (NaN stays NaN): below, `exp` rounds to 0; above, to +inf;
//! - `k = round_ties_even(x log2 e)`, `r = x - k c1 - k c2` (Cody and Waite: `c1 = 355/512`
//!   has 9 significant bits, so `k c1` is exact for `|k| < 2^15`; `c2 = ln 2 - c1`), so
//!   `|r| <= ln 2 / 2` (a little more from the rounding of `x log2 e`);
//! - `e^r = 1 + r + r^2 p(r)` with `p` the degree-5 minimax polynomial of Cephes' `expf`
//!   (S. Moshier), in Horner form;
//! - times `2^k` as `2^(k - h) 2^h`, `h = floor(k/2)`: both factors are normal f32 for `k` in
//!   `[-150, 128]`, the first product is exact and the second rounds once, so subnormal
//!   results are correctly scaled and overflow gives +inf.
//!
//! Its error against the exact value is within 2 ulp over the whole range (tested against
//! f64's `exp`); it is gshard's f32 `exp` in every mode (bf16 and f64 `exp` are f64's,
//! rounded). The previous rule, f64's `exp` rounded to f32, evaluated an f64 polynomial of
//! degree 11 on half as many lanes: an attention softmax's `(sub, exp)` group took 2.1 ns
//! an element, 0.7 with this one (`op_times`, one Zen 5 core, 393k elements).

/// The clamp bounds: `exp(-104)` rounds to 0 and `exp(89)` overflows.
const LO: f32 = -104.0;
const HI: f32 = 89.0;
/// `log2(e)`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2 = C1 + C2`, `C1 = 355/512` exact in 9 bits.
const C1: f32 = 355.0 / 512.0;
const C2: f32 = (std::f64::consts::LN_2 - 355.0 / 512.0) as f32;
/// `p(r)` in Horner order (the `r^5` coefficient first): `e^r ~ 1 + r + r^2 p(r)`.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// gshard's f32 `exp` of one element (the rule in the module doc).
#[inline]
pub fn exp_scalar(x: f32) -> f32 {
    let x = if x.is_nan() { x } else { x.clamp(LO, HI) };
    let k = (x * LOG2E).round_ties_even();
    let r = (-k).mul_add(C1, x);
    let r = (-k).mul_add(C2, r);
    let mut p = P[0];
    for &c in &P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // `k` is an integer in [-150, 129] (NaN: the product below is NaN whatever the scale).
    let ki = k as i32;
    let h = ki >> 1;
    y * pow2(ki - h) * pow2(h)
}

/// `2^e` for `e` in `[-126, 127]` (other values only where the result is NaN anyway).
#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits((e.wrapping_add(127) as u32) << 23)
}

/// `o[i] = exp_scalar(x[i])`, vectorised when the CPU has AVX2 and FMA (sixteen lanes per
/// instruction where it has AVX-512F, eight otherwise).
pub fn exp_f32(x: &[f32], o: &mut [f32]) {
    debug_assert_eq!(x.len(), o.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F, AVX2 and FMA were detected.
        unsafe { avx512::exp_f32(x, o) };
        return;
    }
    exp_f32_avx2(x, o);
}

/// [`exp_f32`] without the AVX-512 path (tests compare the two).
fn exp_f32_avx2(x: &[f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 and FMA were detected.
        unsafe { avx2::exp_f32(x, o) };
        return;
    }
    for (o, &x) in o.iter_mut().zip(x) {
        *o = exp_scalar(x);
    }
}

/// Whether this CPU has AVX2 and FMA (detected once).
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    })
}

/// Whether this CPU has AVX-512F as well as AVX2 and FMA (detected once).
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| avx2() && std::is_x86_feature_detected!("avx512f"))
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{exp_scalar, C1, C2, HI, LO, LOG2E, P};
    use std::arch::x86_64::*;

    /// [`exp_scalar`] on sixteen lanes. `max(LO, x)` and `min(HI, .)` return their second
    /// operand when it is NaN, so NaN passes the clamp as in the scalar rule.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(_mm512_set1_ps(HI), _mm512_max_ps(_mm512_set1_ps(LO), x));
        // Round to nearest even, exceptions suppressed (imm 0x08).
        let k = _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)));
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(C1), x);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(C2), r);
        let mut p = _mm512_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        let ki = _mm512_cvtps_epi32(k);
        let h = _mm512_srai_epi32::<1>(ki);
        let bias = _mm512_set1_epi32(127);
        let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_sub_epi32(ki, h),
            bias,
        )));
        let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(h, bias)));
        _mm512_mul_ps(_mm512_mul_ps(y, s1), s2)
    }

    /// [`super::exp_f32`] on AVX-512F: 64 elements per step (four independent vectors, so
    /// one's latency hides behind the others' work), sixteen at a time for what is left,
    /// the scalar rule for the rest.
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA are available; `o` is at least as long as `x`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn exp_f32(x: &[f32], o: &mut [f32]) {
        let n = x.len().min(o.len());
        let (xp, op) = (x.as_ptr(), o.as_mut_ptr());
        let mut i = 0;
        while i + 64 <= n {
            // SAFETY: `i + 64 <= n` bounds the loads and the stores.
            unsafe {
                let v = [0, 16, 32, 48].map(|j| _mm512_loadu_ps(xp.add(i + j)));
                let y = v.map(|v| exp16(v));
                for (j, y) in y.into_iter().enumerate() {
                    _mm512_storeu_ps(op.add(i + 16 * j), y);
                }
            }
            i += 64;
        }
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n` bounds the load and the store.
            unsafe { _mm512_storeu_ps(op.add(i), exp16(_mm512_loadu_ps(xp.add(i)))) };
            i += 16;
        }
        for j in i..n {
            o[j] = exp_scalar(x[j]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{exp_scalar, C1, C2, HI, LO, LOG2E, P};
    use std::arch::x86_64::*;

    /// [`exp_scalar`] on eight lanes (NaN passes the clamp as in the AVX-512 build).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(_mm256_set1_ps(HI), _mm256_max_ps(_mm256_set1_ps(LO), x));
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(C1), x);
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(C2), r);
        let mut p = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let ki = _mm256_cvtps_epi32(k);
        let h = _mm256_srai_epi32::<1>(ki);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_sub_epi32(ki, h),
            bias,
        )));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(h, bias)));
        _mm256_mul_ps(_mm256_mul_ps(y, s1), s2)
    }

    /// [`super::exp_f32`] on AVX2: 32 elements per step (four independent vectors), eight
    /// at a time for what is left, the scalar rule for the rest.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `o` is at least as long as `x`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_f32(x: &[f32], o: &mut [f32]) {
        let n = x.len().min(o.len());
        let (xp, op) = (x.as_ptr(), o.as_mut_ptr());
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` bounds the loads and the stores.
            unsafe {
                let v = [0, 8, 16, 24].map(|j| _mm256_loadu_ps(xp.add(i + j)));
                let y = v.map(|v| exp8(v));
                for (j, y) in y.into_iter().enumerate() {
                    _mm256_storeu_ps(op.add(i + 8 * j), y);
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` bounds the load and the store.
            unsafe { _mm256_storeu_ps(op.add(i), exp8(_mm256_loadu_ps(xp.add(i)))) };
            i += 8;
        }
        for j in i..n {
            o[j] = exp_scalar(x[j]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both vector builds (the AVX-512 one where the CPU has it, and the AVX2 one) against
    /// the scalar rule, bit for bit.
    fn check(xs: &[f32]) {
        type Exp = fn(&[f32], &mut [f32]);
        let paths: [(&str, Exp); 2] = [("dispatch", exp_f32), ("avx2", exp_f32_avx2)];
        for (name, f) in paths {
            let mut got = vec![0.0f32; xs.len()];
            f(xs, &mut got);
            for (&x, &g) in xs.iter().zip(&got) {
                let w = exp_scalar(x);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{name}: exp({x:e}) = {g:e}, scalar rule {w:e}"
                );
            }
        }
    }

    /// Every 251st f32 bit pattern from -110 to 110 (both signs).
    fn sweep() -> Vec<f32> {
        let pos: Vec<f32> = (0..110.0f32.to_bits())
            .step_by(251)
            .map(f32::from_bits)
            .collect();
        let neg: Vec<f32> = pos.iter().map(|x| -x).collect();
        [pos, neg].concat()
    }

    const SPECIALS: [f32; 25] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        1e-40,
        -104.0,
        -104.00001,
        -103.99999,
        -103.97208,
        -103.97209,
        -87.33654,
        -87.33655,
        -100.0,
        88.72283,
        88.72284,
        89.0,
        89.00001,
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        std::f32::consts::LN_2 / 2.0,
        -std::f32::consts::LN_2 / 2.0,
    ];

    #[test]
    fn every_build_gives_the_scalar_rules_bits() {
        check(&sweep());
        check(&SPECIALS);
        // Runs that are not multiples of the vector widths (tails).
        for start in 0..17 {
            check(&SPECIALS[start..]);
        }
    }

    /// Distance in f32 steps between two finite non-negative values.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn within_two_ulp_of_the_exact_value_and_right_at_the_specials() {
        let mut worst = 0;
        for x in sweep() {
            let exact = (x as f64).exp() as f32;
            let got = exp_scalar(x);
            let d = ulps(got, exact);
            assert!(
                d <= 2,
                "exp({x:e}) = {got:e}, exact {exact:e}: {d} ulp apart"
            );
            worst = worst.max(d);
        }
        assert!(
            worst >= 1,
            "the sweep never left the correctly rounded value"
        );
        assert!(exp_scalar(f32::NAN).is_nan());
        assert_eq!(exp_scalar(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_scalar(89.0), f32::INFINITY);
        assert_eq!(exp_scalar(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp_scalar(-104.0).to_bits(), 0);
        assert_eq!(exp_scalar(0.0), 1.0);
        assert_eq!(exp_scalar(-0.0), 1.0);
        assert!(ulps(exp_scalar(1.0), std::f32::consts::E) <= 1);
        // Subnormal results: scaled, not flushed to zero.
        let s = exp_scalar(-100.0);
        assert!(s > 0.0 && s < f32::MIN_POSITIVE);
        assert!(ulps(s, (-100f64).exp() as f32) <= 1);
    }
}
