//! Unit tests of the dot kernels: long row sums, the non-zero scans, fetch spans, the
//! sparse paths with and without known supports, indicator reads and masked sums.

use super::plan::View;
use super::scan::{for_nonzero, sampled_dense, sparse_terms, Term};
use super::sums::{row_sum_certified, row_sum_in_order};
use super::support::{terms_from_support, SUPPORT_PAR_MIN};
use super::*;

use ir::DotDims;

/// A xorshift64 stream from `seed` (test data).
fn xorshift(mut st: u64) -> impl FnMut() -> u64 {
    move || {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        st
    }
}

/// Long rows' sums of products (the loss) come out bitwise as the in-order f64 chain
/// gives them: random rows of mixed signs and magnitudes, rows whose sum cancels to
/// zero or near a rounding boundary, where the lanes' sum differs from the chain's (the
/// certificate must refuse it), and non-finite terms.
#[test]
fn long_row_sums_equal_the_in_order_chain() {
    let mut state = 0x9e37_79b9u32;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let check = |x: &[f32], w: &[f32], what: &str| {
        let want = row_sum_in_order(x, w);
        let mut got = [0.0f32];
        masked_row_sums(x.len(), x, w, &mut got);
        assert!(
            got[0].to_bits() == want.to_bits() || (got[0].is_nan() && want.is_nan()),
            "{what}: {} against the chain's {want}",
            got[0]
        );
    };
    let mut settled = 0;
    for (case, n) in [1024usize, 1025, 4000, 65536, 70001].iter().enumerate() {
        for scale in [1.0f32, 1e-20, 1e20] {
            let x: Vec<f32> = (0..*n)
                .map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * scale)
                .collect();
            let w: Vec<f32> = (0..*n).map(|_| (next() % 3) as f32 * 0.5).collect();
            check(&x, &w, &format!("case {case} scale {scale}"));
            settled += usize::from(row_sum_certified(&x, &w).is_some());
            // The same terms and their negations: the sum cancels to (near) zero.
            let xx: Vec<f32> = x.iter().chain(x.iter()).copied().collect();
            let mut ww = w.clone();
            ww.extend(w.iter().map(|v| -v));
            check(&xx, &ww, &format!("case {case} scale {scale} cancelling"));
        }
    }
    // The certificate is a worst-case bound, so rows whose sum cancels deeply are left to
    // the chain; most random rows settle.
    assert!(
        settled >= 10,
        "the lanes settled only {settled} of 15 random rows"
    );
    // 2^60, then 1, then -2^60 in the same lane: the chain loses the 1 (f64 has 53
    // bits), a lane sum keeps it. The certificate must not take the lanes' 1.
    let mut x = vec![0.0f32; 2048];
    let w = vec![1.0f32; 2048];
    x[0] = 2f32.powi(60);
    x[1] = 1.0;
    x[16] = -(2f32.powi(60));
    assert_eq!(row_sum_in_order(&x, &w), 0.0);
    assert_eq!(row_sum_certified(&x, &w), None);
    check(&x, &w, "absorbed term");
    // Non-finite terms: the chain decides.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = vec![0.25f32; 2048];
        x[777] = bad;
        assert_eq!(row_sum_certified(&x, &w), None);
        check(&x, &w, &format!("{bad} term"));
    }
    // Zeros only: `+0`, as the chain from `+0` gives (`-0` terms included).
    let z: Vec<f32> = (0..2048)
        .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 })
        .collect();
    check(&z, &w, "zeros");
}

/// The bit-mask walk visits exactly the non-zeros (NaN included, `-0` not), in order,
/// across block boundaries and a short last block.
#[test]
fn for_nonzero_visits_every_non_zero_in_order() {
    for len in [0usize, 1, 15, 16, 17, 40, 128] {
        let x: Vec<f32> = (0..len)
            .map(|i| match i % 7 {
                0 => 1.5,
                3 => f32::NAN,
                5 => -0.0,
                _ => 0.0,
            })
            .collect();
        let mut seen = Vec::new();
        for_nonzero(&x, |t, v| seen.push((t, v.to_bits())));
        let want: Vec<(usize, u32)> = x
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0 || v.is_nan())
            .map(|(t, v)| (t, v.to_bits()))
            .collect();
        assert_eq!(seen, want, "len {len}");
    }
}

/// Short operands are judged by a whole count (a fifth non-zero is dense), long ones by
/// samples; a sparse short operand still gets its term lists.
#[test]
fn short_operands_are_told_dense_or_sparse() {
    let dense: Vec<f32> = (0..2048).map(|i| (i % 3) as f32).collect();
    let sparse: Vec<f32> = (0..2048).map(|i| f32::from(i % 50 == 0)).collect();
    assert!(sampled_dense(&dense));
    assert!(!sampled_dense(&sparse));
    let long: Vec<f32> = (0..1 << 17).map(|i| (i % 3) as f32).collect();
    assert!(sampled_dense(&long));
    let view = View::new(&[32, 64], &[], &[0], &[1]);
    let terms = sparse_terms(&sparse, &view, true).expect("a sparse operand");
    assert_eq!(terms[0].len(), sparse.iter().filter(|v| **v != 0.0).count());
    assert!(sparse_terms(&dense, &view, true).is_none());
}

/// The spans a dot running before a batched dot fetches for it: batch entry 0 of each
/// operand read in place, nothing for a side that is copied to another order first, and
/// the results are the same with and without them.
#[test]
fn first_entry_spans_are_entry_zero_of_in_place_operands() {
    let (b, m, k, n) = (4usize, 6usize, 8usize, 5usize);
    let l: Vec<f32> = (0..b * m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let r: Vec<f32> = (0..b * k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let dims = |lb: usize, rb: usize, rc: usize| DotDims {
        lhs_batch: vec![lb],
        rhs_batch: vec![rb],
        lhs_contract: vec![2],
        rhs_contract: vec![rc],
    };
    let p = DotPlan::new(&[b, m, k], &[b, k, n], &dims(0, 0, 1));
    let spans = p.first_entry_spans(&l, &r);
    assert_eq!(spans[0], (l.as_ptr() as usize, m * k));
    assert_eq!(spans[1], (r.as_ptr() as usize, k * n));
    // The rhs as [k, b, n] with the batch in the middle: entry 0 is k runs of n, b*n
    // apart, spread over (k-1)*b*n + n = 145 floats for 40 read (over twice as many):
    // not fetched. The lhs is unchanged; an empty operand gives no span.
    let q = DotPlan::new(&[b, m, k], &[k, b, n], &dims(0, 1, 0));
    assert!((k - 1) * b * n + n > 2 * k * n);
    let got = q.first_entry_spans(&l, &r);
    assert_eq!(got, [(l.as_ptr() as usize, m * k), (0, 0)]);
    assert_eq!(p.first_entry_spans(&l, &[])[1], (0, 0));
    // The values do not depend on the spans fetched.
    let mut with = Data::F32(vec![0.0; b * m * n]);
    let mut without = Data::F32(vec![0.0; b * m * n]);
    let (ld, rd) = (Data::F32(l.clone()), Data::F32(r.clone()));
    let (lsh, rsh) = ([b, m, k], [b, k, n]);
    let call = DotCall {
        tail: spans,
        ..DotCall::new(&p, Operand::new(&lsh, &ld), Operand::new(&rsh, &rd))
    };
    call.run(&mut with);
    dot(&p, &[b, m, k], &ld, &[b, k, n], &rd, &mut without);
    assert_eq!(with, without);
}

/// Both operands mostly zeros (an expert buffer with few tokens against a one-hot
/// mask): the side with fewer terms in all is walked, and the values are the dense
/// product's.
#[test]
fn when_both_sides_are_sparse_the_cheaper_walk_is_taken() {
    let (m, k, n) = (64usize, 1024usize, 256usize);
    let mut s = 12345u32;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    // lhs: 5 % non-zero; rhs: one non-zero per column (a one-hot).
    let mut l = vec![0.0f32; m * k];
    for x in l.iter_mut() {
        if next() % 20 == 0 {
            *x = (next() % 1000) as f32 / 500.0 - 1.0;
        }
    }
    let mut r = vec![0.0f32; k * n];
    for j in 0..n {
        r[(next() as usize % k) * n + j] = 1.0;
    }
    let dims = DotDims {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
    };
    let plan = DotPlan::new(&[m, k], &[k, n], &dims);
    let mut out = Data::F32(vec![0.0; m * n]);
    let path = dot(
        &plan,
        &[m, k],
        &Data::F32(l.clone()),
        &[k, n],
        &Data::F32(r.clone()),
        &mut out,
    );
    assert_eq!(path, DotPath::SparseRhs);
    let Data::F32(got) = out else { unreachable!() };
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| l[i * k + p] as f64 * r[p * n + j] as f64)
                .sum();
            assert_eq!(got[i * n + j] as f64, want, "({i}, {j})");
        }
    }
    // The same operands swapped (the transposed product): now the lhs is the cheap side.
    let plan = DotPlan::new(&[n, k], &[k, m], &dims);
    let rt: Vec<f32> = (0..n * k).map(|q| r[(q % k) * n + q / k]).collect();
    let lt: Vec<f32> = (0..k * m).map(|q| l[(q % m) * k + q / m]).collect();
    let mut out = Data::F32(vec![0.0; n * m]);
    let path = dot(
        &plan,
        &[n, k],
        &Data::F32(rt),
        &[k, m],
        &Data::F32(lt),
        &mut out,
    );
    assert_eq!(path, DotPath::SparseLhs);
}

/// A one-hot-like `[4, 8, 6, 4]` tensor (a few values per row of its last two dims,
/// `-0` and NaN among them), from a seed.
fn one_hot_like(seed: u64) -> Vec<f32> {
    let mut next = xorshift(seed | 1);
    let mut x = vec![0.0f32; 4 * 8 * 6 * 4];
    for row in 0..32 {
        for _ in 0..2 {
            let at = row * 24 + (next() % 24) as usize;
            x[at] = match next() % 16 {
                0 => -0.0,
                1 => f32::NAN,
                r => r as f32 * 0.37 - 2.0,
            };
        }
    }
    x
}

/// A support's terms equal the scan's, line by line, in every reading of the operand:
/// batch dim outermost or not, rows and columns in or out of memory order (steps whose
/// offsets do not increase take the sort), with the values scanned, read or all one.
#[test]
fn terms_from_a_support_are_the_scans() {
    let shape = [4usize, 8, 6, 4];
    // (batch, rows, cols) dims.
    let readings: [(&[usize], &[usize], &[usize]); 5] = [
        (&[0], &[1], &[2, 3]),
        (&[0], &[2, 3], &[1]),
        (&[2], &[0, 1], &[3]),
        (&[], &[3, 1], &[2, 0]),
        (&[1, 0], &[3], &[2]),
    ];
    // Each line's terms in step order; lines in increasing order.
    let by_line = |lists: Vec<Vec<Term<f32>>>| -> Vec<Vec<(u32, u32, u32)>> {
        lists
            .into_iter()
            .map(|l| {
                let mut l: Vec<(u32, u32, u32)> =
                    l.into_iter().map(|(q, k, v)| (q, k, v.to_bits())).collect();
                l.sort_by_key(|t| t.0);
                l
            })
            .collect()
    };
    for seed in 1..6 {
        let x = one_hot_like(seed);
        let sup = Support::of(&x).expect("a sparse tensor");
        assert_eq!(
            sup.len(),
            x.iter().filter(|v| **v != 0.0 || v.is_nan()).count()
        );
        let ones: Vec<f32> = x.iter().map(|&v| f32::from(u8::from(v != 0.0))).collect();
        for (batch, rows, cols) in readings {
            let view = View::new(&shape, batch, rows, cols);
            for lhs in [true, false] {
                let scan = by_line(sparse_terms(&x, &view, lhs).expect("sparse"));
                for vals in [Values::Scanned, Values::Read] {
                    let known = by_line(terms_from_support(&x, &view, &sup, vals, lhs));
                    assert_eq!(known, scan, "{batch:?} {rows:?} {cols:?} lhs {lhs}");
                }
                let scan = by_line(sparse_terms(&ones, &view, lhs).expect("sparse"));
                let known = by_line(terms_from_support(&ones, &view, &sup, Values::Ones, lhs));
                assert_eq!(known, scan, "ones: {batch:?} {rows:?} {cols:?} lhs {lhs}");
            }
        }
    }
    // A dense tensor has no support; a long one is located in parallel parts.
    assert!(Support::of(&vec![1.0f32; 8192]).is_none());
    let long: Vec<f32> = (0..1 << 17)
        .map(|i| f32::from(u8::from(i % 13 == 0)))
        .collect();
    let sup = Support::of(&long).expect("sparse");
    assert!(sup.len() >= SUPPORT_PAR_MIN);
    let view = View::new(&[32, 64, 64], &[0], &[1], &[2]);
    for lhs in [true, false] {
        let scan = by_line(sparse_terms(&long, &view, lhs).expect("sparse"));
        let known = by_line(terms_from_support(&long, &view, &sup, Values::Scanned, lhs));
        assert_eq!(known, scan, "long, lhs {lhs}");
    }
}

/// A product given its operands' supports gives the bits of one that scans them: the
/// MoE one-hot products (dispatch, combine, their gradients), both sides known.
#[test]
fn products_with_known_supports_give_the_scans_bits() {
    let (g, s, e, c, m) = (2usize, 64, 8, 4, 64);
    let mut next = xorshift(99u64);
    let mut comb = vec![0.0f32; g * s * e * c];
    for row in 0..g * s {
        for _ in 0..2 {
            comb[row * e * c + (next() % (e * c) as u64) as usize] = (next() % 1000) as f32 / 999.0;
        }
    }
    let mut dense = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let gsec = vec![g, s, e, c];
    let cases: Vec<(Vec<usize>, Vec<usize>, DotDims, bool)> = vec![
        // dispatch GSEC,GSM->GECM; combine GSEC,EGCM->GSM (sparse lhs)
        (
            gsec.clone(),
            vec![g, s, m],
            DotDims::new(vec![0], vec![0], vec![1], vec![1]),
            true,
        ),
        (
            gsec.clone(),
            vec![e, g, c, m],
            DotDims::new(vec![0], vec![1], vec![2, 3], vec![0, 2]),
            true,
        ),
        // their gradients (sparse rhs)
        (
            vec![g, e, c, m],
            gsec.clone(),
            DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3]),
            false,
        ),
        (
            vec![g, s, m],
            gsec.clone(),
            DotDims::new(vec![0], vec![0], vec![1], vec![1]),
            false,
        ),
    ];
    let sup = Support::of(&comb).expect("sparse");
    for (ls, rs, dims, lhs_sparse) in cases {
        let plan = DotPlan::new(&ls, &rs, &dims);
        let (l, r) = if lhs_sparse {
            (comb.clone(), dense(rs.iter().product()))
        } else {
            (dense(ls.iter().product()), comb.clone())
        };
        let n: usize = plan.b * plan.m * plan.n;
        let run = |known: [Known; 2]| {
            let mut out = Data::F32(vec![f32::NAN; n]);
            let (ld, rd) = (Data::F32(l.clone()), Data::F32(r.clone()));
            let call = DotCall {
                known,
                ..DotCall::new(&plan, Operand::new(&ls, &ld), Operand::new(&rs, &rd))
            };
            let path = call.run(&mut out);
            let Data::F32(o) = out else { unreachable!() };
            (path, o.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
        };
        let (want_path, want) = run(UNKNOWN);
        let k = Known::Sparse(&sup, Values::Scanned);
        let known = if lhs_sparse {
            [k, Known::Dense]
        } else {
            [Known::Dense, k]
        };
        let (path, got) = run(known);
        assert_ne!(want_path, DotPath::Dense, "{dims:?}");
        assert_eq!(path, want_path, "{dims:?}");
        assert!(got == want, "{dims:?}: other bits with the support known");
    }
}

/// A product reading an operand as an indicator gives the bits of the same product
/// given the 0/1 mask itself, on every path: the sparse walk of the indicator side
/// (support unknown, or known with its scan's values, which must not be used), the
/// walk of the other side (the indicator then read densely), and the dense GEMM (the
/// weights dense, or the support said dense). `-0` and NaN are among the weights.
#[test]
fn indicator_reads_give_the_masks_bits() {
    let (g, s, e, c, m) = (2usize, 64, 8, 4, 32);
    let mut next = xorshift(7u64);
    let mut weight = |next: &mut dyn FnMut() -> u64| match next() % 40 {
        0 => -0.0,
        1 => f32::NAN,
        v => v as f32 / 39.0 - 0.5,
    };
    let rows = g * s;
    let sparse = |next: &mut dyn FnMut() -> u64,
                  w: &mut dyn FnMut(&mut dyn FnMut() -> u64) -> f32| {
        let mut x = vec![0.0f32; rows * e * c];
        for row in 0..rows {
            for _ in 0..2 {
                let at = row * e * c + (next() % (e * c) as u64) as usize;
                x[at] = w(next);
            }
        }
        x
    };
    let comb = sparse(&mut next, &mut weight);
    let full: Vec<f32> = (0..rows * e * c).map(|_| weight(&mut next)).collect();
    // A dense operand with a few zero rows... and a sparse one (few tokens in the
    // expert buffer: the walk over it is the cheaper one).
    let dense: Vec<f32> = (0..g * e * c * m)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut few = vec![0.0f32; g * e * c * m];
    for v in few.iter_mut().step_by(97) {
        *v = 0.5;
    }
    let dims = DotDims::new(vec![0], vec![0], vec![1, 2], vec![2, 3]);
    // The dispatch gradient GECM,GSEC->GMS: the indicator on the rhs.
    let (ls, rs) = (vec![g, e, c, m], vec![g, s, e, c]);
    let mut plan = DotPlan::new(&ls, &rs, &dims);
    let given = plan.clone();
    plan.read_indicator(1);
    assert_eq!(plan.indicators(), [false, true]);
    let n = plan.b * plan.m * plan.n;
    let run = |plan: &DotPlan, l: &[f32], r: &[f32], known: [Known; 2]| {
        let mut out = Data::F32(vec![f32::NAN; n]);
        let (ld, rd) = (Data::F32(l.to_vec()), Data::F32(r.to_vec()));
        let call = DotCall {
            known,
            ..DotCall::new(plan, Operand::new(&ls, &ld), Operand::new(&rs, &rd))
        };
        let path = call.run(&mut out);
        let Data::F32(o) = out else { unreachable!() };
        (path, o.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
    };
    let indicator = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| if v != 0.0 { 1.0 } else { 0.0 })
            .collect()
    };
    let sup = Support::of(&comb).expect("sparse");
    // (The support known to the indicator read, and to the read of the mask itself.)
    let (scanned, ones) = (
        Known::Sparse(&sup, Values::Scanned),
        Known::Sparse(&sup, Values::Ones),
    );
    // (lhs, the indicator's `x`, what is known of the rhs, the path.)
    type Case<'a> = (&'a [f32], &'a [f32], [Known<'a>; 2], DotPath);
    let cases: [Case; 5] = [
        (&dense, &comb, [UNKNOWN[1]; 2], DotPath::SparseRhs),
        (&dense, &comb, [scanned, ones], DotPath::SparseRhs),
        (&few, &comb, [Known::Dense; 2], DotPath::SparseLhs),
        (&dense, &comb, [Known::Dense; 2], DotPath::Dense),
        (&dense, &full, [UNKNOWN[1]; 2], DotPath::Dense),
    ];
    for (i, (l, x, [known, mask_known], path)) in cases.into_iter().enumerate() {
        let (want_path, want) = run(&given, l, &indicator(x), [UNKNOWN[0], mask_known]);
        let (got_path, got) = run(&plan, l, x, [UNKNOWN[0], known]);
        assert_eq!(got_path, path, "case {i}");
        assert_eq!(want_path, path, "case {i}");
        assert!(got == want, "case {i}: other bits than the mask's");
    }
}

/// Masked dot sums that walk the masks' supports give the bits of the walk over the
/// masks (one support known, the other scanned; NaN and `-0` in a mask; rows without
/// non-zeros), and a support of the wrong length is not trusted.
#[test]
fn masked_sums_from_supports_give_the_scans_bits() {
    let (b, m, n, k) = (4usize, 64, 32, 48);
    let mut next = xorshift(3u64);
    let mut unit = move || (next() % 2_000_001) as f32 / 1_000_000.0 - 1.0;
    let l: Vec<f32> = (0..b * m * k).map(|_| unit()).collect();
    let r: Vec<f32> = (0..b * k * n).map(|_| unit()).collect();
    let mut masks = vec![vec![0.0f32; b * m * n]; 2];
    for (t, mask) in masks.iter_mut().enumerate() {
        for row in (0..b * m).filter(|row| row % 7 != t) {
            let at = row * n + ((unit() + 1.0) * 15.9) as usize;
            mask[at] = unit();
        }
    }
    masks[0][5 * n + 3] = f32::NAN;
    masks[1][9 * n + 1] = -0.0;
    let plan = DotPlan::new(
        &[b, m, k],
        &[b, k, n],
        &DotDims {
            lhs_batch: vec![0],
            rhs_batch: vec![0],
            lhs_contract: vec![2],
            rhs_contract: vec![1],
        },
    );
    let views: Vec<&[f32]> = masks.iter().map(Vec::as_slice).collect();
    let run = |sups: &[Option<&Support>]| {
        let mut outs = vec![vec![0.0f32; b * m]; 2];
        let mut sums: Vec<&mut [f32]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let (lsh, rsh) = ([b, m, k], [b, k, n]);
        let call = DotCall::new(
            &plan,
            Operand::new(&lsh, &l[..]),
            Operand::new(&rsh, &r[..]),
        );
        let c = call
            .run_masked_sums(&views, sups, &mut sums)
            .expect("applies");
        let bits: Vec<Vec<u32>> = outs
            .iter()
            .map(|o| o.iter().map(|v| v.to_bits()).collect())
            .collect();
        (c, bits)
    };
    let want = run(&[None, None]);
    let sup0 = Support::of(&masks[0]).expect("sparse");
    let sup1 = Support::of(&masks[1]).expect("sparse");
    assert_eq!(run(&[Some(&sup0), None]), want);
    assert_eq!(run(&[Some(&sup0), Some(&sup1)]), want);
    assert_ne!(
        want.1[0],
        run(&[Some(&sup1), None]).1[0],
        "the support is walked"
    );
    let short = Support::of(&masks[0][..b * m * n / 2]).expect("sparse");
    assert_eq!(run(&[Some(&short), None]), want);
}
