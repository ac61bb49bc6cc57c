//! Opt-in compression of f32 payloads on the wire, per collective kind and mesh axis
//! ([`Compress`], from `--compress all-to-all:fp8@expert,all-reduce`):
//!
//! - **bf16** (round to nearest even, widened back on arrival), for all-to-alls and
//!   all-reduces: half the bytes. An all-to-all element arrives within a relative
//!   [`ALL_TO_ALL_BOUND`] = 2^-8 (bf16 keeps 8 significant bits), exactly for values bf16
//!   holds. An all-reduce rounds the k operands to bf16, sums them in rank order in f64,
//!   rounds to f32 (as uncompressed) and the sum to bf16 for the all-gather: every element is
//!   within [`ALL_REDUCE_BOUND`] · Σ|x_i| of the exact sum, the same on every rank. bf16 has
//!   f32's exponent range, so nothing overflows; NaN stays NaN.
//! - **fp8** (OCP e4m3: 4 exponent bits, 3 mantissa bits, largest 448, no infinities), for
//!   all-to-alls only, with one f32 scale per block of [`FP8_BLOCK`] elements: the block is
//!   divided by `s = amax / 448` (amax: its largest finite magnitude) and each quotient
//!   rounded to nearest even e4m3. About a quarter of the bytes (4 + 128 bytes per 512).
//!   Each element arrives within `FP8_RELATIVE · |x| + FP8_OF_AMAX · amax` of `x`: 3
//!   mantissa bits give 2^-4 relative on the normal range, the subnormal step 2^-9 of e4m3
//!   bounds the rest by 2^-10 · s, and the two f32 operations (divide, multiply back) add
//!   2^-23 relative. Non-finite elements (±inf, NaN) arrive as NaN. Gradient sums keep
//!   bf16: 3 bits would cost them more than the bytes save.
//!
//! Blocks never straddle the pieces of an all-to-all (one per destination): each piece is
//! encoded alone, so the receiver decodes it without its neighbours.

use half::bf16;
use std::fmt;

/// The relative error bound of a bf16 all-to-all: bf16's unit roundoff.
pub const ALL_TO_ALL_BOUND: f64 = 1.0 / 256.0;

/// The bound of a bf16 all-reduce, relative to Σ|x_i|: two bf16 roundings (the operands,
/// then the sum, which is at most (1 + 2^-8) Σ|x_i| after the first) and one f32 rounding,
/// 2^-8 + 2^-8 (1 + 2^-8) + 2^-24 (1 + 2^-8)^2, rounded up.
pub const ALL_REDUCE_BOUND: f64 = 2.0 / 256.0 + 1.0 / 65536.0 + 1.0 / 8_388_608.0;

/// Elements per fp8 scale.
pub const FP8_BLOCK: usize = 128;

/// fp8's error bound relative to the element: e4m3's unit roundoff 2^-4 and two f32
/// roundings.
pub const FP8_RELATIVE: f64 = 1.0 / 16.0 + 1.0 / 8_388_608.0;

/// fp8's error bound relative to the block's largest magnitude: half of e4m3's subnormal
/// step, 2^-10, times the scale amax / 448 (rounded up).
pub const FP8_OF_AMAX: f64 = 1.0 / 1024.0 / 447.0;

/// The largest finite e4m3 value.
const E4M3_MAX: f32 = 448.0;

/// How an f32 payload travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Bf16,
    Fp8,
}

/// A collective kind that compression applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    AllToAll,
    AllReduce,
}

/// Compress `kind`'s f32 payloads with `codec`, on collectives over `axis` (any when `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub kind: Kind,
    pub codec: Codec,
    pub axis: Option<String>,
}

/// Which collectives send their f32 payloads compressed: the first [`Rule`] that applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compress {
    pub rules: Vec<Rule>,
}

impl Compress {
    /// Parse `--compress` items: `KIND[:CODEC][@AXIS]`, KIND `all-to-all` or `all-reduce`,
    /// CODEC `bf16` (default) or `fp8` (all-to-all only).
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Compress, String> {
        let mut rules = Vec::new();
        for item in items {
            let item = item.as_ref().trim();
            let (rest, axis) = match item.split_once('@') {
                Some((r, a)) if !a.is_empty() => (r, Some(a.to_string())),
                Some(_) => {
                    return Err(format!(
                        "--compress {item}: `@` needs a mesh axis after it, e.g. all-to-all@expert"
                    ))
                }
                None => (item, None),
            };
            let (kind, codec) = rest.split_once(':').unwrap_or((rest, "bf16"));
            let kind = match kind {
                "all-to-all" => Kind::AllToAll,
                "all-reduce" => Kind::AllReduce,
                _ => return Err(format!(
                    "--compress {item}: `{kind}` is not a compressible collective; use all-to-all or all-reduce (e.g. all-to-all:fp8@expert)"
                )),
            };
            let codec = match codec {
                "bf16" => Codec::Bf16,
                "fp8" => Codec::Fp8,
                _ => {
                    return Err(format!(
                        "--compress {item}: codec `{codec}` is unknown; use bf16 or fp8"
                    ))
                }
            };
            if (kind, codec) == (Kind::AllReduce, Codec::Fp8) {
                return Err(format!(
                    "--compress {item}: fp8 applies to all-to-alls only (gradient sums keep bf16); use all-reduce or all-to-all:fp8"
                ));
            }
            rules.push(Rule { kind, codec, axis });
        }
        Ok(Compress { rules })
    }

    /// The codec of a `kind` collective over `axes`, if one applies.
    pub fn codec(&self, kind: Kind, axes: &[String]) -> Option<Codec> {
        self.rules
            .iter()
            .find(|r| r.kind == kind && r.axis.as_ref().is_none_or(|a| axes.contains(a)))
            .map(|r| r.codec)
    }

    /// An error naming a rule's axis that `mesh_axes` lacks.
    pub fn check_axes<S: AsRef<str>>(&self, mesh_axes: &[S]) -> Result<(), String> {
        for r in &self.rules {
            if let Some(a) = &r.axis {
                if !mesh_axes.iter().any(|m| m.as_ref() == a) {
                    let names: Vec<&str> = mesh_axes.iter().map(|m| m.as_ref()).collect();
                    return Err(format!(
                        "--compress {r}: the mesh has no axis `{a}`; use one of {}",
                        names.join(", ")
                    ));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            Kind::AllToAll => "all-to-all",
            Kind::AllReduce => "all-reduce",
        })?;
        if self.codec == Codec::Fp8 {
            f.write_str(":fp8")?;
        }
        if let Some(a) = &self.axis {
            write!(f, "@{a}")?;
        }
        Ok(())
    }
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

/// Wire bytes of a piece of `n` f32 elements under `codec`.
pub fn wire_len(codec: Codec, n: usize) -> usize {
    match codec {
        Codec::Bf16 => 2 * n,
        Codec::Fp8 => n + 4 * n.div_ceil(FP8_BLOCK),
    }
}

/// `f32_bytes` cut into `pieces` equal pieces, each encoded alone, back to back.
pub fn encode(codec: Codec, f32_bytes: &[u8], pieces: usize) -> Vec<u8> {
    match codec {
        Codec::Bf16 => narrow(f32_bytes),
        Codec::Fp8 => {
            let n = f32_bytes.len() / 4 / pieces.max(1);
            let mut out = Vec::with_capacity(wire_len(codec, n) * pieces);
            for p in f32_bytes.chunks_exact(4 * n.max(1)).take(pieces) {
                fp8_encode_piece(p, &mut out);
            }
            out
        }
    }
}

/// The inverse of [`encode`]: `pieces` pieces of `n` f32 elements each, as f32 bytes.
pub fn decode(codec: Codec, wire: &[u8], pieces: usize, n: usize) -> Vec<u8> {
    match codec {
        Codec::Bf16 => widen(wire),
        Codec::Fp8 => {
            let w = wire_len(codec, n);
            let mut out = Vec::with_capacity(4 * n * pieces);
            for p in 0..pieces {
                fp8_decode_piece(&wire[p * w..(p + 1) * w], n, &mut out);
            }
            out
        }
    }
}

/// One piece: its scales (f32, one per block), then its codes (one byte per element).
fn fp8_encode_piece(f32_bytes: &[u8], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { fp8_encode_piece_avx2(f32_bytes, out) };
    }
    fp8_encode_blocks(f32_bytes, out)
}

/// [`fp8_encode_blocks`] compiled for AVX2: 8 lanes instead of SSE2's 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fp8_encode_piece_avx2(f32_bytes: &[u8], out: &mut Vec<u8>) {
    fp8_encode_blocks(f32_bytes, out)
}

/// The encoder's body, without a branch per element so the compiler vectorizes the blocks
/// (the same bits on every instruction set).
#[inline(always)]
fn fp8_encode_blocks(f32_bytes: &[u8], out: &mut Vec<u8>) {
    let n = f32_bytes.len() / 4;
    let blocks = n.div_ceil(FP8_BLOCK);
    let at = out.len();
    out.resize(at + 4 * blocks + n, 0);
    let (scales, codes) = out[at..].split_at_mut(4 * blocks);
    let mut x = [0f32; FP8_BLOCK];
    for ((b, s), c) in f32_bytes
        .chunks(4 * FP8_BLOCK)
        .zip(scales.chunks_exact_mut(4))
        .zip(codes.chunks_mut(FP8_BLOCK))
    {
        let x = &mut x[..c.len()];
        for (v, w) in x.iter_mut().zip(b.chunks_exact(4)) {
            *v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
        let amax = x
            .iter()
            .fold(0f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
        let scale = amax / E4M3_MAX;
        s.copy_from_slice(&scale.to_le_bytes());
        for (c, &v) in c.iter_mut().zip(x.iter()) {
            let code = e4m3_from(if scale == 0.0 { 0.0 } else { v / scale });
            *c = if v.is_finite() { code } else { E4M3_NAN };
        }
    }
}

fn fp8_decode_piece(wire: &[u8], n: usize, out: &mut Vec<u8>) {
    let blocks = n.div_ceil(FP8_BLOCK);
    let (scales, codes) = wire.split_at(4 * blocks);
    let table = e4m3_table();
    let at = out.len();
    out.resize(at + 4 * n, 0);
    for ((b, s), o) in codes[..n]
        .chunks(FP8_BLOCK)
        .zip(scales.chunks_exact(4))
        .zip(out[at..].chunks_mut(4 * FP8_BLOCK))
    {
        let s = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        for (&c, o) in b.iter().zip(o.chunks_exact_mut(4)) {
            o.copy_from_slice(&(table[c as usize] * s).to_le_bytes());
        }
    }
}

/// Every e4m3 code's value, computed once.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| e4m3_to(c as u8)))
}

/// e4m3's NaN (S.1111.111).
const E4M3_NAN: u8 = 0x7f;

/// The e4m3 code nearest `y` (ties to even), saturating at ±448; `y` finite. Both
/// roundings are bit arithmetic and the result a select, with no branch.
#[inline(always)]
fn e4m3_from(y: f32) -> u8 {
    let sign = ((y.to_bits() >> 24) & 0x80) as u8;
    let a = y.abs().min(E4M3_MAX);
    // Below the smallest normal, 2^-6: subnormals m · 2^-9 (m = 0..8; m = 8 is the smallest
    // normal's code, 0x08). Adding 2^23 to a * 2^9 < 2^3 rounds it to an integer (ties to
    // even, the default rounding), which then sits in the low mantissa bits.
    let sub = ((a * 512.0 + 8_388_608.0).to_bits() - 0x4b00_0000) as u8;
    // Round f32's 23 mantissa bits to 3, ties to even; a carry moves into the exponent,
    // which is then rebiased from 127 to 7 (a <= 448, e4m3's largest, rounds to at most
    // 448). Wrapping: for a subnormal `a` this value is unused.
    let b = a.to_bits();
    let r = ((b + 0x7_ffff + ((b >> 20) & 1)) >> 20).wrapping_sub((127 - 7) << 3) as u8;
    sign | if a < 0.015625 { sub } else { r }
}

/// The value of e4m3 code `c`.
fn e4m3_to(c: u8) -> f32 {
    let (e, m) = (((c >> 3) & 0xf) as i32, (c & 7) as f32);
    let v = if c & 0x7f == E4M3_NAN {
        f32::NAN
    } else if e == 0 {
        m * 2f32.powi(-9)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if c & 0x80 != 0 {
        -v
    } else {
        v
    }
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

    #[test]
    fn every_e4m3_code_decodes_and_encodes_back() {
        for c in 0u8..=255 {
            let v = e4m3_to(c);
            if c & 0x7f == E4M3_NAN {
                assert!(v.is_nan());
                continue;
            }
            assert_eq!(e4m3_from(v), c, "code {c:#04x} = {v}");
        }
        assert_eq!(e4m3_to(0x7e), 448.0);
        assert_eq!(e4m3_to(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e4m3_rounds_to_the_nearest_code() {
        let codes: Vec<f32> = (0u8..=255)
            .filter(|c| c & 0x7f != E4M3_NAN)
            .map(e4m3_to)
            .collect();
        for (i, y) in sample(20_000, 7).into_iter().enumerate() {
            let y = (y * 64.0).clamp(-448.0, 448.0) * if i % 3 == 0 { 1e-3 } else { 1.0 };
            let got = e4m3_to(e4m3_from(y));
            let best = codes
                .iter()
                .map(|&v| (v - y).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((got - y).abs(), best, "{y}: got {got}");
        }
    }

    #[test]
    fn fp8_quarters_the_bytes_within_its_bound() {
        // Pieces of 300 elements: blocks of 128, 128 and 44, none across a piece's end.
        let (pieces, n) = (4, 300);
        let x = sample(pieces * n, 3);
        let wire = encode(Codec::Fp8, &bytes(&x), pieces);
        assert_eq!(wire.len(), pieces * wire_len(Codec::Fp8, n));
        assert_eq!(wire_len(Codec::Fp8, 512), 512 + 16);
        let y = values(&decode(Codec::Fp8, &wire, pieces, n));
        let mut worst_rel: f64 = 0.0;
        for (p, (xs, ys)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
            // Each piece decodes alone, as the receiver of that piece does.
            let alone = values(&decode(
                Codec::Fp8,
                &encode(Codec::Fp8, &bytes(xs), 1),
                1,
                n,
            ));
            assert_eq!(alone, ys, "piece {p}");
            for (xb, yb) in xs.chunks(FP8_BLOCK).zip(ys.chunks(FP8_BLOCK)) {
                let amax = xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
                for (&a, &b) in xb.iter().zip(yb) {
                    let (a, b) = (a as f64, b as f64);
                    let err = (a - b).abs();
                    assert!(
                        err <= FP8_RELATIVE * a.abs() + FP8_OF_AMAX * amax,
                        "{a} -> {b}"
                    );
                    if a.abs() > amax / 16.0 {
                        worst_rel = worst_rel.max(err / a.abs());
                    }
                }
            }
        }
        // The bound is tight: some element needs most of its relative part.
        assert!(worst_rel > FP8_RELATIVE / 2.0, "{worst_rel}");
        // Zeros, a zero block, and non-finite elements (NaN on arrival).
        let odd = [0.0f32, -0.0, 1.0, f32::INFINITY, f32::NAN, -3.0];
        let back = values(&decode(
            Codec::Fp8,
            &encode(Codec::Fp8, &bytes(&odd), 1),
            1,
            6,
        ));
        assert_eq!(back[0].to_bits(), 0f32.to_bits());
        assert_eq!(back[1].to_bits(), (-0f32).to_bits());
        // 1.0 is 149.3 scaled (amax 3 -> 448): e4m3's nearest is 144, 0.964 back.
        assert!((back[2] - 1.0).abs() as f64 <= FP8_RELATIVE + 3.0 * FP8_OF_AMAX);
        assert!(back[3].is_nan() && back[4].is_nan());
        assert!((back[5] + 3.0).abs() < 1e-6, "{}", back[5]);
        let zeros = values(&decode(
            Codec::Fp8,
            &encode(Codec::Fp8, &bytes(&[0.0; 5]), 1),
            1,
            5,
        ));
        assert_eq!(zeros, [0.0; 5]);
    }

    #[test]
    fn every_instruction_set_encodes_the_same_bytes() {
        let mut x = sample(1000, 5);
        x[7] = f32::NAN;
        x[300] = f32::NEG_INFINITY;
        x[500..640].fill(0.0);
        x[900] = 1e-12;
        let mut generic = Vec::new();
        fp8_encode_blocks(&bytes(&x), &mut generic);
        assert_eq!(encode(Codec::Fp8, &bytes(&x), 1), generic);
    }

    #[test]
    fn compress_items_parse_or_say_what_to_write() {
        let c = Compress::parse(&["all-to-all:fp8@expert", "all-reduce"]).unwrap();
        let ax = |a: &str| vec![a.to_string()];
        assert_eq!(c.codec(Kind::AllToAll, &ax("expert")), Some(Codec::Fp8));
        assert_eq!(c.codec(Kind::AllToAll, &ax("data")), None);
        assert_eq!(c.codec(Kind::AllReduce, &ax("data")), Some(Codec::Bf16));
        assert!(c.check_axes(&["data", "expert"]).is_ok());
        let e = c.check_axes(&["data", "model"]).unwrap_err();
        assert!(
            e.contains("no axis `expert`") && e.contains("data, model"),
            "{e}"
        );
        assert_eq!(c.rules[0].to_string(), "all-to-all:fp8@expert");
        for (bad, says) in [
            ("all-reduce:fp8", "all-to-alls only"),
            ("all-gather", "use all-to-all or all-reduce"),
            ("all-to-all:int4", "use bf16 or fp8"),
            ("all-to-all@", "needs a mesh axis"),
        ] {
            let e = Compress::parse(&[bad]).unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }
}
