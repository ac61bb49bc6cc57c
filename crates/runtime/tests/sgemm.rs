//! Property test of the AVX2 micro-kernel GEMM (`runtime::kernels::sgemm`) against a naive
//! f64 product: random shapes (crossing the 6x16 tile and the 256-step block), every layout
//! of A, B and C, all-zero rows of A and of B, all-zero columns of A, and the occasional
//! inf or NaN meeting those zeros. The zero skipping must be invisible: the result equals
//! the dense product to f32 accumulation tolerance, with NaN exactly where the dense product
//! has one. Half the cases make A about half zeros (a ReLU output) and large enough for the
//! row-sparse path (AVX-512), whose result must also be the dense path's, bit for bit.
//! Skips with a notice on CPUs without AVX2/FMA.

use proptest::prelude::*;
use runtime::kernels::sgemm::{available, GemmOptions, MatMut, MatRef, Sgemm, Table};

mod common;
use common::cases;

/// xorshift driven by the proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn value(&mut self) -> f32 {
        (self.below(2001) as f32 - 1000.0) / 250.0
    }
}

/// `x[i * cols + j]` stored with strides `(rs, cs)`: plain or transposed.
fn store(x: &[f32], rows: usize, cols: usize, transposed: bool) -> (Vec<f32>, usize, usize) {
    if !transposed {
        return (x.to_vec(), cols, 1);
    }
    let mut t = vec![0.0; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    (t, 1, rows)
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn sgemm_equals_the_dense_product(seed in 1u64..) {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2/FMA (the gemm crate runs f32 dots here)");
            return Ok(());
        }
        let mut rng = Rng(seed);
        // Half the cases: A about half zeros, sizes past the row-sparse path's threshold.
        let relu = rng.below(2) == 0;
        let (m, n) = if relu {
            (6 + rng.below(90), 16 + rng.below(200))
        } else {
            (1 + rng.below(40), 1 + rng.below(40))
        };
        let kmax = if relu || rng.below(3) == 0 { 600 } else { 60 };
        let k = 1 + rng.below(kmax);
        let mut a: Vec<f32> = (0..m * k)
            .map(|_| if relu && rng.below(2) == 0 { 0.0 } else { rng.value() })
            .collect();
        let mut b: Vec<f32> = (0..k * n).map(|_| rng.value()).collect();
        for i in 0..m {
            if rng.below(3) == 0 {
                a[i * k..(i + 1) * k].fill(0.0);
            }
        }
        for p in 0..k {
            if rng.below(3) == 0 {
                b[p * n..(p + 1) * n].fill(0.0);
            }
            if rng.below(4) == 0 {
                for i in 0..m {
                    a[i * k + p] = if rng.below(2) == 0 { 0.0 } else { -0.0 };
                }
            }
        }
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        if rng.below(3) == 0 {
            let at = rng.below(m * k);
            a[at] = specials[rng.below(3)];
        }
        if rng.below(3) == 0 {
            let at = rng.below(k * n);
            b[at] = specials[rng.below(3)];
        }
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum();
                want[i * n + j] = s as f32;
            }
        }
        let (ta, tb, tc) = (rng.below(2) == 1, rng.below(2) == 1, rng.below(4));
        let (sa, ars, acs) = store(&a, m, k, ta);
        let (sb, brs, bcs) = store(&b, k, n, tb);
        let mut c = vec![f32::NAN; m * n];
        // C row-major, transposed, or with its rows (columns) at their own offsets: a
        // shuffled order, the other dim at one stride.
        let shuffled = |len: usize, rng: &mut Rng| {
            let mut v: Vec<usize> = (0..len).collect();
            for i in (1..len).rev() {
                v.swap(i, rng.below(i + 1));
            }
            v
        };
        let (crs, ccs) = if tc == 1 { (1, m) } else { (n, 1) };
        let rows: Option<Vec<usize>> = (tc == 2).then(|| shuffled(m, &mut rng).iter().map(|&r| r * n).collect());
        let cols: Option<Vec<usize>> = (tc == 3).then(|| shuffled(n, &mut rng));
        let at = |i: usize, j: usize| {
            rows.as_ref().map_or(i * crs, |t| t[i]) + cols.as_ref().map_or(j * ccs, |t| t[j])
        };
        let table = match (&rows, &cols) {
            (Some(t), _) => Some(Table::Rows(t.as_ptr())),
            (None, Some(t)) => Some(Table::Cols(t.as_ptr())),
            (None, None) => None,
        };
        let cm = MatMut {
            table,
            // Half the cases stream the result (non-temporal stores where the tiles can):
            // the same bits.
            stream: rng.below(2) == 0,
            ..MatMut::strided(c.as_mut_ptr(), crs, ccs)
        };
        // Half the cases fetch "the next GEMM's operands" (here a and b again, and a span
        // past the end, which a prefetch may name) while they compute: results unchanged.
        let ahead = [(sa.as_ptr() as usize, sa.len()), (sb.as_ptr() as usize, sb.len()), (sb.as_ptr().wrapping_add(sb.len()) as usize, 4096)];
        let ahead: &[(usize, usize)] = if rng.below(2) == 0 { &ahead } else { &[] };
        let (ar, br) = (MatRef { ptr: sa.as_ptr(), rs: ars, cs: acs }, MatRef { ptr: sb.as_ptr(), rs: brs, cs: bcs });
        // SAFETY: AVX2/FMA checked above; each buffer holds exactly the elements its
        // strides address, and nothing else touches `c`.
        unsafe { Sgemm { ahead, ..Sgemm::new(m, n, k, ar, br, cm) }.run() };
        // The dense path on the same operands (the row-sparse one forbidden): the same bits.
        let mut c_dense = vec![f32::NAN; m * n];
        let cd = MatMut { ptr: c_dense.as_mut_ptr(), ..cm };
        let opts = GemmOptions { sparse_a: false, ..GemmOptions::default() };
        // SAFETY: as above, into a buffer of the same size.
        unsafe { Sgemm { ahead, opts, ..Sgemm::new(m, n, k, ar, br, cd) }.run() };
        for (x, (d, g)) in c_dense.iter().zip(&c).enumerate() {
            prop_assert!(
                d.to_bits() == g.to_bits() || (d.is_nan() && g.is_nan()),
                "{m}x{n}x{k} layout ({ta},{tb},{tc}) element {x}: dense {d} vs {g}"
            );
        }
        for i in 0..m {
            for j in 0..n {
                let got = c[at(i, j)];
                let w = want[i * n + j];
                let scale: f64 = (0..k).map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs()).sum();
                let ok = if w.is_nan() {
                    got.is_nan()
                } else if w.is_infinite() {
                    got == w
                } else {
                    (got as f64 - w as f64).abs() <= 1e-5 * scale + 1e-30
                };
                prop_assert!(ok, "{m}x{n}x{k} layout ({ta},{tb},{tc}) at ({i},{j}): {got} vs {w}");
            }
        }
    }
}

/// `m x n x k` of the row-major `a` and `b` into a 64-byte aligned result of `len` floats
/// (every other one NaN) whose element `(i, j)` is at `i * rs + j * cs`, its stores
/// streamed or not; the whole result buffer.
fn product_into_aligned(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    (rs, cs): (usize, usize),
    len: usize,
    stream: bool,
) -> Vec<f32> {
    let ar = MatRef {
        ptr: a.as_ptr(),
        rs: k,
        cs: 1,
    };
    let br = MatRef {
        ptr: b.as_ptr(),
        rs: n,
        cs: 1,
    };
    let mut buf = vec![f32::NAN; len + 16];
    let off = buf.as_ptr().align_offset(64);
    let c = &mut buf[off..off + len];
    let cm = MatMut {
        stream,
        ..MatMut::strided(c.as_mut_ptr(), rs, cs)
    };
    // SAFETY: the callers check AVX2/FMA; `c` holds every element the strides address.
    unsafe { Sgemm::new(m, n, k, ar, br, cm).run() };
    c.to_vec()
}

/// Results streamed to memory (non-temporal stores, taken by the AVX-512 tiles where each
/// tile row is whole aligned lines) are the bits of ordinary stores: row-major and
/// transposed results, widths that leave partial tiles (stored ordinarily), row counts
/// that leave short tiles, `A` dense and half zeros.
#[test]
fn streamed_results_are_the_same_bits() {
    if !available() {
        eprintln!("skipped: this CPU has no AVX2/FMA (the gemm crate runs f32 dots here)");
        return;
    }
    let mut rng = Rng(0x5eed);
    for (m, n, k, transposed, relu) in [
        (128, 512, 128, false, false),
        (128, 96, 64, false, true),
        (50, 144, 200, false, false),
        (128, 512, 128, true, false),
        (96, 128, 300, true, true),
        (7, 40, 33, false, false),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|_| {
                if relu && rng.below(2) == 0 {
                    0.0
                } else {
                    rng.value()
                }
            })
            .collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.value()).collect();
        // Rows of a multiple of 16 floats stay aligned.
        let strides = if transposed { (1, m) } else { (n, 1) };
        let run = |stream| product_into_aligned((m, n, k), &a, &b, strides, m * n, stream);
        let (plain, streamed) = (run(false), run(true));
        assert!(plain.iter().all(|x| x.is_finite()), "{m}x{n}x{k}");
        let same = plain
            .iter()
            .zip(&streamed)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{m}x{n}x{k} transposed {transposed}");
    }
}

/// Streamed tiles write whole lines only where a tile's row is full width: results whose
/// rows are line-aligned (a padded row stride) but whose width leaves partial tiles keep
/// the padding after each row untouched, and give the bits of ordinary stores.
#[test]
fn streamed_tiles_never_write_past_a_row() {
    if !available() {
        eprintln!("skipped: this CPU has no AVX2/FMA (the gemm crate runs f32 dots here)");
        return;
    }
    let mut rng = Rng(0xfeed);
    for (m, n, k) in [
        (13usize, 40usize, 64usize),
        (20, 100, 128),
        (7, 130, 33),
        (30, 16, 200),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.value()).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.value()).collect();
        // Rows `rs` floats apart, each starting on a line; the padding must stay NaN.
        let rs = n.div_ceil(16) * 16 + 16;
        let run = |stream| product_into_aligned((m, n, k), &a, &b, (rs, 1), m * rs, stream);
        let (plain, streamed) = (run(false), run(true));
        for i in 0..m {
            let row = &streamed[i * rs..(i + 1) * rs];
            assert!(
                row[n..].iter().all(|x| x.is_nan()),
                "{m}x{n}x{k}: row {i}'s padding written"
            );
            let same = row[..n]
                .iter()
                .zip(&plain[i * rs..i * rs + n])
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{m}x{n}x{k} row {i}");
        }
    }
}
