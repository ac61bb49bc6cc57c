//! Expert capacity `C` (slots per expert per group) as pure functions of static sizes (GShard's
//! paper, praxis/lingvo and Mesh TensorFlow: the formulas differ between codebases).

/// The exact rational value of a finite, non-negative f64 as `(numerator, 2^k denominator)`.
fn as_fraction(x: f64) -> (u128, u32) {
    assert!(
        x.is_finite() && x >= 0.0,
        "capacity factor must be finite and >= 0, got {x}"
    );
    if x == 0.0 {
        return (0, 0);
    }
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let mant = if exp == 0 {
        (bits & ((1 << 52) - 1)) << 1
    } else {
        (bits & ((1 << 52) - 1)) | (1 << 52)
    };
    let e = exp.max(1) - 1075; // x = mant * 2^e
    if e >= 0 {
        ((mant as u128) << e.min(60), 0)
    } else {
        let shift = (-e) as u32;
        if shift > 120 {
            // Tiny factors: anything this small gives the floor of 1 anyway.
            (1, 120)
        } else {
            (mant as u128, shift)
        }
    }
}

/// GShard paper: `C = ceil(2 * S * cf / E)`, at least 1, in exact rational arithmetic
/// (each group gets `2S/E` slots per expert for top-2 routing, times the capacity factor).
pub fn gshard(s: usize, e: usize, cf: f64) -> usize {
    let (num, k) = as_fraction(cf);
    let n = 2 * s as u128 * num; // value = n / (2^k * e)
    let d = (e as u128) << k;
    (n.div_ceil(d) as usize).max(1)
}

/// The reference code (Praxis `top2_gating_on_logits` as called by its MoE layer, which
/// doubles the factor for top-2; Lingvo's rule is the same): `auto = floor(S * 2cf / E)`; if
/// the explicit `c0` (default 1) is below `auto`, `C = auto` rounded up to a multiple of 4,
/// else `C = c0`.
pub fn praxis(s: usize, e: usize, cf: f64, c0: Option<usize>) -> usize {
    let auto = (s as f64 * (2.0 * cf) / e as f64) as usize;
    let c = c0.unwrap_or(1);
    if c < auto {
        auto.div_ceil(4) * 4
    } else {
        c
    }
}

/// Mesh-TF: `C = max(min(S, floor(S * cf / E)), min_capacity)` (no top-2 doubling).
pub fn mesh_tf(s: usize, e: usize, cf: f64, min_capacity: usize) -> usize {
    ((s as f64 * cf / e as f64) as usize)
        .min(s)
        .max(min_capacity)
}

/// The static dropless capacity: `C = S`, the largest load any expert can get in a group
/// of S tokens from a token-choice router whose picks per token are distinct experts
/// (Switch top-1, top-2, noisy top-k), so no token is ever dropped. Buffers grow to
/// `E * S * M` per group (instead of `E * C * M`) and the expert FFNs run on all of them;
/// the shapes stay static, so one compiled program serves every batch. For expert choice
/// `C = S` means every expert takes every token (a dense mixture).
pub fn dropless_capacity(group_size: usize) -> usize {
    group_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_follow_spec_9_1() {
        // S=1000, E=64, cf=1.25 -> S*cf/E = 19.53: MTF 19.
        assert_eq!(mesh_tf(1000, 64, 1.25, 4), 19);
        // S=1024, E=512, cf=2 -> 4.
        assert_eq!(mesh_tf(1024, 512, 2.0, 4), 4);
        // The testdata configurations (README of testdata/moe-top2).
        assert_eq!(gshard(8, 4, 1.0), 4);
        assert_eq!(gshard(8, 4, 2.0), 8);
        assert_eq!(gshard(64, 8, 2.0), 32);
        assert_eq!(praxis(8, 4, 1.0, None), 4);
        assert_eq!(praxis(64, 8, 2.0, None), 32);
        // Exact rounding up: 2*10*1.1/4 = 5.5 -> 6; and 0.1 is not exactly 1/10 in binary.
        assert_eq!(gshard(10, 4, 1.1), 6);
        assert_eq!(
            gshard(10, 2, 0.1),
            2,
            "2*10*0.1000000000000000055/2 is just above 1"
        );
        assert_eq!(gshard(1, 64, 0.5), 1, "floored at 1");
        // The explicit C wins when it is at least the automatic one.
        assert_eq!(praxis(8, 4, 1.0, Some(7)), 7);
        // Small factors: Praxis rounds up to 4 only when auto replaced C.
        assert_eq!(praxis(20, 8, 1.0, None), 8);
    }
}
