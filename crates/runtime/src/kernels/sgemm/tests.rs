//! Unit tests of the f32 GEMM: the scans and the fetcher, every layout against a naive
//! product, zero skipping, the wide tiles and the row-sparse path against the dense
//! kernel bit for bit.

use super::blocked::row_tiles;
use super::fetch::Fetch;
use super::route::{TRANSPOSED_MIN_K, TRANSPOSED_MIN_K_WIDE};
use super::*;
use std::ops::Range;

/// The fewest steps for the row-sparse path with a transposed result on this CPU.
fn transposed_min_k() -> usize {
    if wide::available() {
        TRANSPOSED_MIN_K_WIDE
    } else {
        TRANSPOSED_MIN_K
    }
}

/// The AVX2 tiles and eight-lane chains, where the CPU has the AVX-512 ones too.
const NARROW: GemmOptions = GemmOptions {
    wide: false,
    sparse_a: true,
};

/// The vectorised scan marks exactly the values that are not `±0` (NaN and infinities
/// included), at every length up to 64 and every alignment.
#[test]
fn nonzero_bits64_matches_the_scalar_rule() {
    let specials = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        f32::NAN,
        f32::INFINITY,
        f32::MIN_POSITIVE,
        1e-45,
    ];
    let pool: Vec<f32> = (0..200)
        .map(|i| specials[(i * 7 + i / 3) % specials.len()])
        .collect();
    for off in 0..8 {
        for len in 0..=64 {
            let run = &pool[off..off + len];
            let want = run
                .iter()
                .enumerate()
                .fold(0u64, |b, (t, &x)| b | (u64::from(!(x == 0.0)) << t));
            match nonzero_bits64(run) {
                Some(got) => assert_eq!(got, want, "offset {off}, length {len}"),
                None => assert!(!sparse::available(), "AVX2 present but not used"),
            }
        }
    }
}

/// The dense product in f64 (NaN where a `0 * inf` or a NaN meets the sum).
fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                s += a[i * k + p] as f64 * b[p * n + j] as f64;
            }
            c[i * n + j] = s as f32;
        }
    }
    c
}

fn close(got: f32, want: f32) -> bool {
    (got.is_nan() && want.is_nan())
        || got == want
        || (got - want).abs() <= 1e-4 * (1.0 + want.abs())
}

/// Every layout (A, B, C each plain or transposed) against the naive product.
fn check(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) {
    let want = naive(m, n, k, a, b);
    for (layout, got) in all_layouts((m, n, k), a, b, GemmOptions::default())
        .iter()
        .enumerate()
    {
        for i in 0..m {
            for j in 0..n {
                let (g, w) = (got[i * n + j], want[i * n + j]);
                assert!(
                    close(g, w),
                    "{m}x{n}x{k} layout {layout} ({i},{j}): {g} vs {w}"
                );
            }
        }
    }
}

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7 + seed) % 13) as f32 - 6.0) / 4.0)
        .collect()
}

#[test]
fn fetch_runs_cover_every_line_of_the_spans_within_the_calls() {
    // Unaligned spans of several sizes, fetched over more or fewer calls than lines.
    // Apart in one buffer, so that no two spans share a line.
    let x = vec![0.0f32; 10_000];
    let spans = [
        (x[3..].as_ptr() as usize, 997),
        (x[2000..].as_ptr() as usize, 37),
        (x[5001..].as_ptr() as usize, 4000),
    ];
    let want: std::collections::BTreeSet<usize> = Fetch::line_spans(&spans)
        .iter()
        .flat_map(|&(s, e)| (s..e).step_by(Fetch::LINE))
        .collect();
    for calls in [1, 3, 7, 64, 1000] {
        let mut f = Fetch::new(&spans, calls);
        let mut got = std::collections::BTreeSet::new();
        for _ in 0..calls {
            let (at, n) = f.take();
            for q in 0..n {
                assert!(got.insert(at + q * Fetch::LINE), "line fetched twice");
            }
        }
        // What is left for `rest`: at most a call's share per span end.
        let left: usize = f
            .spans
            .iter()
            .map(|s| (s.1 - s.0).div_ceil(Fetch::LINE))
            .sum();
        assert!(
            left <= spans.len() * f.quota,
            "{calls} calls leave {left} lines"
        );
        while let (at, n @ 1..) = f.take() {
            for q in 0..n {
                assert!(got.insert(at + q * Fetch::LINE), "line fetched twice");
            }
        }
        assert_eq!(got, want, "{calls} calls");
    }
}

#[test]
fn matches_naive_on_edges_and_strides() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA");
        return;
    }
    for &(m, n, k) in &[
        (1, 1, 1),
        (7, 17, 3),
        (13, 33, 300),
        (100, 1030, 257),
        (6, 16, 512),
        // Partial tiles of every height (m % MR = 2, 3, 4, 5).
        (8, 20, 9),
        (9, 16, 33),
        (4, 48, 17),
        (11, 31, 70),
    ] {
        check(m, n, k, &values(m * k, 1), &values(k * n, 2));
    }
}

/// `C = A B` for every layout (A, B, C each plain or transposed), as `C`'s row-major
/// values per layout.
fn all_layouts(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    opts: GemmOptions,
) -> Vec<Vec<f32>> {
    let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
    let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    (0..8)
        .map(|layout| {
            let (ta, tb, tc) = (layout & 1 != 0, layout & 2 != 0, layout & 4 != 0);
            let (ap, ars, acs) = if ta { (&at[..], 1, m) } else { (a, k, 1) };
            let (bp, brs, bcs) = if tb { (&bt[..], 1, k) } else { (b, n, 1) };
            let ar = MatRef {
                ptr: ap.as_ptr(),
                rs: ars,
                cs: acs,
            };
            let br = MatRef {
                ptr: bp.as_ptr(),
                rs: brs,
                cs: bcs,
            };
            let mut c = vec![f32::NAN; m * n];
            let cm = if tc {
                MatMut::strided(c.as_mut_ptr(), 1, m)
            } else {
                MatMut::strided(c.as_mut_ptr(), n, 1)
            };
            // SAFETY: AVX2 checked by the caller; the strides address exactly the vectors.
            unsafe {
                Sgemm {
                    opts,
                    ..Sgemm::new(m, n, k, ar, br, cm)
                }
                .run()
            };
            if tc {
                (0..m * n).map(|x| c[(x % n) * m + x / n]).collect()
            } else {
                c
            }
        })
        .collect()
}

/// The row tiles cover the rows once, in order, at most `MR` each; split, a last tile of
/// one or two rows after a full one becomes two tiles of four and three or four rows,
/// and nothing else changes.
#[test]
fn row_tiles_cover_the_rows_and_split_only_a_short_tail() {
    for rows in 0..40 {
        for split in [false, true] {
            let tiles: Vec<Range<usize>> = row_tiles(rows, split).collect();
            let flat: Vec<usize> = tiles.iter().cloned().flatten().collect();
            assert_eq!(
                flat,
                (0..rows).collect::<Vec<_>>(),
                "{rows} rows, split {split}"
            );
            assert!(tiles.iter().all(|t| !t.is_empty() && t.len() <= MR));
            assert_eq!(tiles.len(), rows.div_ceil(MR));
            let lens: Vec<usize> = tiles.iter().map(|t| t.len()).collect();
            let plain: Vec<usize> = (0..rows).step_by(MR).map(|s| MR.min(rows - s)).collect();
            let want = match rows % MR {
                1 | 2 if split && rows > MR => {
                    let mut w = plain[..plain.len() - 2].to_vec();
                    w.extend([4, MR + rows % MR - 4]);
                    w
                }
                _ => plain,
            };
            assert_eq!(lens, want, "{rows} rows, split {split}");
        }
    }
}

#[test]
fn wide_tiles_give_the_avx2_tiles_bits() {
    if !available() || !wide::available() {
        eprintln!("skipped: no AVX-512F");
        return;
    }
    // Irregular values, so that any change of the summation order shows in the bits;
    // partial tiles in both directions, several `KC` blocks, zero rows (skipped) and a
    // non-finite value (the dead rows multiplied after all); first without zeros, where
    // the wide tiles read a row-major `B` in place (`IN_PLACE_B_SPAN`).
    let vals = |len: usize, seed: u64| -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    for &(m, n, k) in &[
        (128, 512, 128),
        (13, 47, 300),
        (100, 1030, 257),
        (6, 48, 512),
        (7, 97, 9),
        (1, 33, 600),
        (20, 80, 700),
        (9, 496, 64),
        (20, 1104, 200),
    ] {
        let mut a = vals(m * k, 1);
        let mut b = vals(k * n, 2);
        let runs = |a: &[f32], b: &[f32]| {
            let narrow = all_layouts((m, n, k), a, b, NARROW);
            let wide = all_layouts((m, n, k), a, b, GemmOptions::default());
            for (layout, (x, y)) in narrow.iter().zip(&wide).enumerate() {
                let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{m}x{n}x{k} layout {layout}: the tiles' bits differ");
            }
        };
        runs(&a, &b);
        for i in (0..m).step_by(5) {
            a[i * k..(i + 1) * k].fill(0.0);
        }
        for p in (0..k).step_by(7) {
            b[p * n..(p + 1) * n].fill(0.0);
        }
        runs(&a, &b);
        b[(k - 1) * n + n / 2] = f32::INFINITY;
        runs(&a, &b);
        // A result with both strides above one (every other element of every other
        // row): the tiles' element-by-element store.
        let strided = |opts: GemmOptions| {
            let mut c = vec![f32::NAN; 4 * m * n];
            let cm = MatMut::strided(c.as_mut_ptr(), 4 * n, 2);
            let (ar, br) = (
                MatRef {
                    ptr: a.as_ptr(),
                    rs: k,
                    cs: 1,
                },
                MatRef {
                    ptr: b.as_ptr(),
                    rs: n,
                    cs: 1,
                },
            );
            // SAFETY: AVX2 checked above; row `m-1`, column `n-1` is inside `c`.
            unsafe {
                Sgemm {
                    opts,
                    ..Sgemm::new(m, n, k, ar, br, cm)
                }
                .run()
            };
            c
        };
        let narrow = strided(NARROW);
        let wide = strided(GemmOptions::default());
        let same = narrow
            .iter()
            .zip(&wide)
            .all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{m}x{n}x{k} strided result: the tiles' bits differ");
        assert!(wide[1].is_nan() && wide[2 * n..4 * n].iter().all(|x| x.is_nan()));
    }
}

#[test]
fn zero_rows_are_skipped_exactly_and_non_finite_values_still_propagate() {
    if !available() {
        eprintln!("skipped: no AVX2/FMA");
        return;
    }
    let (m, n, k) = (40, 37, 300);
    let mut a = values(m * k, 3);
    let mut b = values(k * n, 4);
    // Zero rows of A (dead expert slots), zero rows of B, zero columns of A.
    for i in (0..m).step_by(3) {
        a[i * k..(i + 1) * k].fill(0.0);
    }
    for p in (0..k).step_by(4) {
        b[p * n..(p + 1) * n].fill(0.0);
    }
    for p in (1..k).step_by(5) {
        for i in 0..m {
            a[i * k + p] = 0.0;
        }
    }
    check(m, n, k, &a, &b);
    // All zeros, and `k` entirely skipped.
    check(m, n, k, &vec![0.0; m * k], &b);
    check(m, n, k, &a, &vec![0.0; k * n]);
    // An inf in B meets zero rows of A: NaN there, as in the dense product; one in a
    // later `KC` block too.
    let mut b2 = b.clone();
    b2[5 * n + 7] = f32::INFINITY;
    b2[280 * n + 9] = f32::NAN;
    check(m, n, k, &a, &b2);
    // An inf in A meets a zero row of B (step 0 is a zero row above).
    let mut a2 = a.clone();
    a2[2 * k] = f32::NEG_INFINITY;
    check(m, n, k, &a2, &b);
    // A NaN in a zero column of A meets a finite row of B.
    let mut a3 = a.clone();
    a3[4 * k + 1] = f32::NAN;
    check(m, n, k, &a3, &b);
}

/// `C = A B` on both paths (the row-sparse one forbidden, then allowed) into an `m * n`
/// buffer addressed by `out(ptr)`: asserts the two buffers are equal bit for bit, and
/// returns the row-sparse path's buffer and how many blocks it multiplied.
fn on_both_paths(
    (m, n, k): (usize, usize, usize),
    a: MatRef,
    b: MatRef,
    out: impl Fn(*mut f32) -> MatMut,
) -> (Vec<f32>, usize) {
    let run = |opts: GemmOptions| {
        let mut c = vec![f32::NAN; m * n];
        let before = sparse::THREAD_BLOCKS.with(|b| b.get());
        let g = Sgemm {
            opts,
            ..Sgemm::new(m, n, k, a, b, out(c.as_mut_ptr()))
        };
        // SAFETY: AVX2 checked by the caller; the strides address exactly the vectors.
        unsafe { g.run() };
        (c, sparse::THREAD_BLOCKS.with(|b| b.get()) - before)
    };
    let dense_only = GemmOptions {
        sparse_a: false,
        ..GemmOptions::default()
    };
    let (dense, none) = run(dense_only);
    let (sparse, blocks) = run(GemmOptions::default());
    assert_eq!(none, 0);
    let same = |d: &[f32], s: &[f32], what: &str| {
        for (x, (d, s)) in d.iter().zip(s).enumerate() {
            assert!(
                d.to_bits() == s.to_bits() || (d.is_nan() && s.is_nan()),
                "{m}x{n}x{k} element {x}: dense {d} {what} {s}"
            );
        }
    };
    same(&dense, &sparse, "sparse");
    if wide::available() {
        // The eight-lane chain too (the one CPUs without AVX-512 run).
        let (narrow, narrow_blocks) = run(NARROW);
        assert_eq!(narrow_blocks, blocks);
        same(&dense, &narrow, "eight-lane sparse");
    }
    (sparse, blocks)
}

/// [`on_both_paths`] with `A` row-major, `B` given row-major and laid out as `b_cols`
/// says (column-major: packed by 8x8 transposes), `C` row-major or at its rows' own
/// offsets (`table`); the row-sparse result also against the naive product. Returns how
/// many blocks took the row-sparse path.
fn sparse_vs_dense(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    b_cols: bool,
    table: bool,
) -> usize {
    let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
    let (ptr, rs, cs) = if b_cols {
        (bt.as_ptr(), 1, k)
    } else {
        (b.as_ptr(), n, 1)
    };
    let br = MatRef { ptr, rs, cs };
    let ar = MatRef {
        ptr: a.as_ptr(),
        rs: k,
        cs: 1,
    };
    // C rows at their own offsets (reversed), as a fused output transpose.
    let rows: Vec<usize> = (0..m).map(|i| (m - 1 - i) * n).collect();
    let out = |ptr: *mut f32| MatMut {
        table: table.then_some(Table::Rows(rows.as_ptr())),
        ..MatMut::strided(ptr, n, 1)
    };
    let (sparse, blocks) = on_both_paths((m, n, k), ar, br, out);
    if !table {
        let want = naive(m, n, k, a, b);
        for (x, (&g, &w)) in sparse.iter().zip(&want).enumerate() {
            assert!(close(g, w), "{m}x{n}x{k} element {x}: {g} vs {w}");
        }
    }
    blocks
}

/// Values of which about 4 in 7 are zero, the rest `max(x, 0)`-like (a ReLU output).
fn relu(len: usize, seed: usize) -> Vec<f32> {
    values(len, seed)
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if (i * 2654435761) % 7 < 3 {
                x.max(0.0) + 0.125
            } else {
                0.0
            }
        })
        .collect()
}

/// The row-sparse path gives the dense kernel's bits: ReLU-like `A`, `k` over one and
/// several `KC` blocks, `n` under, at and over a 128-column group and over `NC`, not a
/// multiple of 16, dead rows, a NaN and an inf in `A`, non-finite `B` blocks (multiplied
/// densely) first or last, leading zero rows of `B` (steps left out), `B` row- and
/// column-major, `C` with a row table.
#[test]
fn row_sparse_path_is_bitwise_the_dense_product() {
    if !sparse_available() {
        eprintln!("skipped: no AVX2 and FMA (the row-sparse path is not used here)");
        return;
    }
    for &(m, n, k) in &[
        (64, 128, 512),
        (70, 33, 700),
        (40, 200, 129),
        (13, 300, 600),
        (128, 16, 256),
        (20, 1100, 300),
    ] {
        let mut a = relu(m * k, 5);
        let b: Vec<f32> = values(k * n, 6).iter().map(|x| x * 0.37 + 0.01).collect();
        for i in (0..m).step_by(5) {
            a[i * k..(i + 1) * k].fill(0.0);
        }
        a[k + 3] = f32::NAN;
        a[3 * k + k - 1] = f32::INFINITY;
        let (mut b_last, mut b_first, mut b_lead) = (b.clone(), b.clone(), b.clone());
        b_last[(k - 1) * n + n / 2] = f32::INFINITY;
        b_first[5 * n + n - 1] = f32::NAN;
        // Zero rows 0 and 1 of B: those steps are left out (A's columns there are finite).
        b_lead[..2 * n].fill(0.0);
        for b_cols in [false, true] {
            for table in [false, true] {
                let shape = (m, n, k);
                let blocks = sparse_vs_dense(shape, &a, &b, b_cols, table);
                assert!(blocks > 0, "{shape:?}: the row-sparse path did not run");
                let blocks = sparse_vs_dense(shape, &a, &b_lead, b_cols, table);
                assert!(
                    blocks > 0,
                    "{shape:?}: not run after leading zero rows of B"
                );
                // One non-finite block goes dense; with two or more (over `KC` steps,
                // or over `NC` columns: the inf and the NaN lie in one column block
                // each), the others do not.
                let several = k > KC || n > NC;
                let blocks = sparse_vs_dense(shape, &a, &b_last, b_cols, table);
                assert_eq!(blocks > 0, several, "{shape:?}: inf in the last block");
                let blocks = sparse_vs_dense(shape, &a, &b_first, b_cols, table);
                assert_eq!(blocks > 0, several, "{shape:?}: NaN in the first block");
            }
        }
    }
}

/// A column-major `A` that is mostly zeros (`h^T dy`) is copied row-major and takes the
/// row-sparse path with the dense kernel's bits: `m` and `k` not multiples of 8 and `k`
/// over `KC`, zero rows of `B` in the middle (steps left out, so the copy's columns
/// are `ks` side by side), a NaN and an inf in `A`, a non-finite `B` block, `C` written
/// straight, through a row table or transposed (not with few steps); a dense
/// column-major `A` stays on the dense path.
#[test]
fn row_sparse_path_takes_a_column_major_a() {
    if !sparse_available() {
        eprintln!("skipped: no AVX2 and FMA (the row-sparse path is not used here)");
        return;
    }
    for &(m, n, k) in &[(512, 128, 128), (70, 130, 300), (13, 70, 1000)] {
        // A^T (k x m) row-major, ReLU-like: A column-major.
        let mut at = relu(k * m, 11);
        at[3 * m + 1] = f32::NAN;
        at[(k - 2) * m + m - 1] = f32::INFINITY;
        let a: Vec<f32> = (0..m * k).map(|x| at[(x % k) * m + x / k]).collect();
        let mut b: Vec<f32> = values(k * n, 12).iter().map(|x| x * 0.5 - 0.1).collect();
        for p in [1, k / 3, k / 3 + 1, k - 1] {
            b[p * n..(p + 1) * n].fill(0.0);
        }
        let mut b_inf = b.clone();
        b_inf[(k / 2) * n + 3] = f32::INFINITY;
        let ar = MatRef {
            ptr: at.as_ptr(),
            rs: 1,
            cs: m,
        };
        let rows: Vec<usize> = (0..m).map(|i| (m - 1 - i) * n).collect();
        for (bv, finite) in [(&b, true), (&b_inf, false)] {
            let br = MatRef {
                ptr: bv.as_ptr(),
                rs: n,
                cs: 1,
            };
            let (sparse, blocks) =
                on_both_paths((m, n, k), ar, br, |ptr| MatMut::strided(ptr, n, 1));
            // One non-finite block goes dense; with two or more, the others do not.
            assert_eq!(blocks > 0, finite || k > KC, "{m}x{n}x{k} finite {finite}");
            let want = naive(m, n, k, &a, bv);
            for (x, (&g, &w)) in sparse.iter().zip(&want).enumerate() {
                assert!(close(g, w), "{m}x{n}x{k} element {x}: {g} vs {w}");
            }
            let (_, blocks) = on_both_paths((m, n, k), ar, br, |ptr| MatMut {
                table: Some(Table::Rows(rows.as_ptr())),
                ..MatMut::strided(ptr, n, 1)
            });
            assert_eq!(blocks > 0, finite || k > KC, "{m}x{n}x{k} with a row table");
            // The result stored transposed: computed row-major, then transposed (with
            // enough steps for this CPU; otherwise densely, as `B^T A^T`).
            let (t, blocks) = on_both_paths((m, n, k), ar, br, |ptr| MatMut::strided(ptr, 1, m));
            assert_eq!(
                blocks > 0,
                (finite || k > KC) && k >= transposed_min_k(),
                "{m}x{n}x{k} stored transposed"
            );
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(t[j * m + i].to_bits(), sparse[i * n + j].to_bits());
                }
            }
        }
    }
    // Cases the dense kernel keeps: blocks on the row-sparse path for a column-major
    // `A^T` = `at` (`k x m`) times a dense `B`, the result stored transposed or not.
    let dense_blocks = |(m, n, k): (usize, usize, usize), at: &[f32], transposed: bool| {
        let b = values(k * n, 16);
        let ar = MatRef {
            ptr: at.as_ptr(),
            rs: 1,
            cs: m,
        };
        let br = MatRef {
            ptr: b.as_ptr(),
            rs: n,
            cs: 1,
        };
        on_both_paths((m, n, k), ar, br, |ptr| {
            if transposed {
                MatMut::strided(ptr, 1, m)
            } else {
                MatMut::strided(ptr, n, 1)
            }
        })
        .1
    };
    // Few steps and the result stored transposed: the transpose would cost more than
    // the row-sparse product saves; the dense kernel runs (on the swapped operands).
    let blocks = dense_blocks((512, 128, 16), &relu(16 * 512, 15), true);
    assert_eq!(
        blocks, 0,
        "a 16-step product stored transposed went row-sparse"
    );
    // A dense column-major A: the copy is not made, the dense kernel runs.
    let blocks = dense_blocks((64, 64, 128), &values(128 * 64, 13), false);
    assert_eq!(blocks, 0, "a dense A took the row-sparse path");
}

/// A result written transposed (`C` column-major) is computed as `C^T = B^T A^T`: a
/// column-major `B` that is mostly zeros becomes the row-sparse left operand there.
#[test]
fn row_sparse_path_serves_a_transposed_result() {
    if !sparse_available() {
        eprintln!("skipped: no AVX2 and FMA (the row-sparse path is not used here)");
        return;
    }
    let (m, n, k) = (96, 130, 300);
    let a = values(m * k, 7);
    // B^T (n x k) row-major, ReLU-like: B column-major.
    let bt = relu(n * k, 8);
    let b: Vec<f32> = (0..k * n).map(|x| bt[(x % n) * k + x / n]).collect();
    let ar = MatRef {
        ptr: a.as_ptr(),
        rs: k,
        cs: 1,
    };
    let br = MatRef {
        ptr: bt.as_ptr(),
        rs: 1,
        cs: k,
    };
    let (sparse, blocks) = on_both_paths((m, n, k), ar, br, |ptr| MatMut::strided(ptr, 1, m));
    assert!(blocks > 0, "the row-sparse path did not run");
    let want = naive(m, n, k, &a, &b);
    for i in 0..m {
        for j in 0..n {
            let s = sparse[j * m + i];
            assert!(
                close(s, want[i * n + j]),
                "({i},{j}): {s} vs {}",
                want[i * n + j]
            );
        }
    }
}
