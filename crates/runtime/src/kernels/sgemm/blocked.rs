//! The blocked loop nest of one product (Goto/BLIS): `NC` columns of `B`, `KC` steps,
//! `MC` rows of `A`, then micro-tiles; per block, the row-sparse path or the dense tiles,
//! `A` and `B` read in place where packing would only copy them.

use super::fetch::Fetch;
use super::pack::{pack_a, pack_b, rows_finite};
use super::*;
use std::ops::Range;

/// The per-thread scratch of one call: packed `A`, packed `B`, and the row-sparse path's
/// partial sums (`live * min(n, NC)` floats when `ks` spans several `KC` blocks).
pub(super) struct Bufs<'a> {
    pub(super) pa: &'a mut [f32],
    pub(super) pb: &'a mut [f32],
    pub(super) tmp: &'a mut [f32],
}

/// The steps `ks` (rows of `B`) that take part, and where `A` has them: its columns `ks`,
/// or (`compact_a`, a row-major copy by [`transpose_lines`]) its columns `0..ks.len()`.
#[derive(Clone, Copy)]
pub(super) struct Steps<'a> {
    pub(super) ks: &'a [usize],
    pub(super) compact_a: bool,
}

/// One product's blocked loop, as [`blocked`] runs it: `n` columns of `C`, the live rows
/// `live` of `A` (and its all-zero rows `dead`), the steps, the operands, whether blocks
/// may take the row-sparse path (`sparse_a`) and whether the tiles are the wide ones.
#[derive(Clone, Copy)]
pub(super) struct Job<'a> {
    pub(super) n: usize,
    pub(super) steps: Steps<'a>,
    pub(super) live: &'a [usize],
    pub(super) dead: &'a [usize],
    pub(super) a: MatRef,
    pub(super) b: MatRef,
    pub(super) c: MatMut,
    pub(super) sparse_a: bool,
    /// The AVX-512 `6 x 64` tiles and sixteen-lane chains ([`GemmOptions::wide_tiles`]).
    pub(super) wide: bool,
}

/// The blocked loop nest over the live rows `live` and steps `ks` (see [`Sgemm`]); with
/// `sparse_a`, each block whose `A` is read in place and whose packed `B` is finite takes
/// the row-sparse path (the same values).
///
/// # Safety
/// As [`Sgemm::run`]; `live`, `dead` and `ks` index inside A's rows and columns; `sparse_a`
/// only with [`sparse::available`], `c.cs == 1` and no column table; `wide` only with
/// [`wide::available`].
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
pub(super) unsafe fn blocked(job: &Job, bufs: Bufs, fetch: &mut Fetch) {
    let Job {
        n,
        steps,
        live,
        dead,
        a,
        b,
        c,
        sparse_a,
        wide,
    } = *job;
    let Bufs { pa, pb, tmp } = bufs;
    let Steps { ks, compact_a } = steps;
    let kk = ks.len();
    let width = if wide { NR * wide::PANELS } else { NR };
    // Streamed stores only where each tile is written once: one block of steps (a later
    // block would read the streamed lines back from memory to add to them).
    let stream = c.stream && kk <= KC;
    // SAFETY: for the whole body, offsets stay inside the operands by the caller's contract.
    unsafe {
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..kk).step_by(KC) {
                let kc = KC.min(kk - pc);
                let kidx = &ks[pc..pc + kc];
                // A row-major A over consecutive steps is read in place, row by row (its
                // block stays in L2 like a packed one); otherwise it is packed. `a0`: the
                // block's first column of A.
                // Whether the block's steps are consecutive (no zero steps left out).
                let run = kidx[kc - 1] - kidx[0] == kc - 1;
                let direct = compact_a || (a.cs == 1 && run);
                let a0 = if compact_a { pc } else { kidx[0] };
                // The row-sparse path needs B finite (it leaves out `0 * b`); a non-finite
                // block is multiplied densely. B is read in place where its block is one
                // 128-column group of contiguous rows over consecutive steps (`Wo`, `dy`
                // and `x` in three of an expert's four row-sparse GEMMs): its packed copy
                // would be the same layout. The sixteen-lane chains read whole 128-float
                // rows `GROUP` apart, so on CPUs with the wide tiles (whatever the options
                // say) the rows must be exactly that: `nc` and the row stride 128.
                // Otherwise it is packed.
                let in_place_b = b.cs == 1
                    && run
                    && if wide::available() {
                        nc == sparse::GROUP && b.rs == sparse::GROUP
                    } else {
                        nc <= sparse::GROUP && nc.is_multiple_of(8)
                    };
                let sparse_b = if !(sparse_a && direct) {
                    None
                } else if in_place_b {
                    let b0 = b.ptr.add(jc * b.cs + kidx[0] * b.rs);
                    rows_finite(b0, b.rs, kc, nc).then_some((b0, b.rs))
                } else {
                    let block = MatRef {
                        ptr: b.ptr.add(jc * b.cs),
                        ..b
                    };
                    pack_b::<{ sparse::GROUP }>(kidx, nc, block, pb, true)
                        .then_some((pb.as_ptr(), sparse::GROUP))
                };
                if let Some((bp, bs)) = sparse_b {
                    // Dead rows are zeros already (B is finite).
                    let blk = sparse::Block {
                        rows: live,
                        kc,
                        nc,
                        a: |i| a.ptr.add(i * a.rs + a0),
                        b: bp,
                        bs,
                        c: |i| c.row(i).add(jc),
                        first: pc == 0,
                        wide,
                    };
                    sparse::block(blk, tmp, || fetch.next());
                    continue;
                }
                // Finiteness only matters when there are dead rows to multiply or not.
                let check = !dead.is_empty();
                // The wide tiles read a row-major `B` over consecutive steps in place
                // (whole 16-column panels, the block's rows spanning at most
                // `IN_PLACE_B_SPAN` floats) where no finiteness check is needed: see there.
                let b_rows = wide
                    && direct
                    && !check
                    && b.cs == 1
                    && kc * b.rs <= IN_PLACE_B_SPAN
                    && nc.is_multiple_of(NR)
                    && run;
                // Unchecked (no dead rows), `B` counts as finite, as `pack_b` says then.
                let block = MatRef {
                    ptr: b.ptr.add(jc * b.cs),
                    ..b
                };
                let finite = b_rows || pack_b::<NR>(kidx, nc, block, pb, check);
                // Dead rows (already zero) are multiplied only against a non-finite
                // block, accumulating, exactly as the dense product would.
                let sets: [(&[usize], bool); 2] =
                    [(live, pc == 0), (if finite { &[] } else { dead }, false)];
                for (rows, first) in sets {
                    for ic in (0..rows.len()).step_by(MC) {
                        let rblk = &rows[ic..rows.len().min(ic + MC)];
                        // The wide tiles read a column-major `A` (a transposed activation in a
                        // weight gradient) in place over consecutive steps and rows: each step
                        // of a tile is six contiguous floats, as in a packed panel, and the
                        // copy cost more than the reads it saves. One thread, hot, on a Zen 5
                        // core: `A^T` of `512 x 128 x 128` 205 -> 253 GFLOP/s, of
                        // `1024 x 256 x 256` 210 -> 243; the MoE step at 8 devices about the
                        // same (in-process A/B 1.001; there the steps of `x^T dh` skip the
                        // empty expert slots, so it still packs).
                        let a_cols = wide
                            && !direct
                            && a.rs == 1
                            && run
                            && rblk[rblk.len() - 1] - rblk[0] == rblk.len() - 1;
                        if !direct && !a_cols {
                            pack_a(rblk, kidx, a, pa);
                        }
                        for jr in (0..nc).step_by(width) {
                            let nr = width.min(nc - jr);
                            let (bp, ps, bs) = if b_rows {
                                (b.ptr.add(jc + jr + kidx[0] * b.rs), NR, b.rs)
                            } else {
                                let ps = panel_stride(NR, kc);
                                (pb[jr / NR * ps..].as_ptr(), ps, NR)
                            };
                            // Row tiles of `MR`; a wide tile reading `A` in place ends
                            // `MR + 1` or `MR + 2` rows as `4 + 3` or `4 + 4` instead of a
                            // one- or two-row tile, whose eight FMAs a step wait on its
                            // loads (the same chains, so the same bits). One thread, hot,
                            // paired with the FMA peak: 512^3 86.7 -> 87.4 % of the peak,
                            // `254 x 256 x 256` 85.5 -> 86.0 %.
                            let split = wide && (direct || a_cols);
                            for (t, rows) in row_tiles(rblk.len(), split).enumerate() {
                                let tile = &rblk[rows];
                                // The wide kernel spreads its share of the fetches over its
                                // steps; the AVX2 one takes them before the tile.
                                let pf = if wide {
                                    fetch.take()
                                } else {
                                    fetch.next();
                                    (0, 0)
                                };
                                // On the first column pass, `A` read in place is
                                // brought in a tile ahead: its rows are a few streams
                                // at once that the hardware prefetchers follow late
                                // when cold (the gating GEMM reads `x` from memory at
                                // 8-9 GB/s in the MoE step). The whole 8-device step
                                // 0.6-0.9 % faster on a Zen 5 core (in-process A/B;
                                // no gain on the Zen 3).
                                #[cfg(target_arch = "x86_64")]
                                if direct && jr == 0 {
                                    let next = row_tile(rblk.len(), split, t + 1).unwrap_or(0..0);
                                    for &i in &rblk[next] {
                                        let row = a.ptr.add(i * a.rs + a0);
                                        for l in (0..kc).step_by(16) {
                                            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                                            _mm_prefetch::<_MM_HINT_T0>(row.add(l).cast());
                                        }
                                    }
                                }
                                // (Rows past a partial tile are never read.)
                                let mut crow = [c.ptr; MR];
                                for (q, &i) in tile.iter().enumerate() {
                                    crow[q] = c.row(i).add((jc + jr) * c.cs);
                                }
                                let work = Tile {
                                    kc,
                                    b: bp,
                                    ps,
                                    bs,
                                    c: &crow,
                                    cs: c.cs,
                                    mr: tile.len(),
                                    nr,
                                    first,
                                    pf,
                                    stream,
                                };
                                #[cfg(target_arch = "x86_64")]
                                if direct {
                                    // Rows past a partial tile are not computed.
                                    let mut arow = [a.ptr.add(tile[0] * a.rs + a0); MR];
                                    for (q, &i) in tile.iter().enumerate() {
                                        arow[q] = a.ptr.add(i * a.rs + a0);
                                    }
                                    if wide {
                                        wide::tile_rows(&work, &arow);
                                    } else {
                                        avx2::tile_rows(&work, &arow);
                                    }
                                } else {
                                    let (ap, ast) = if a_cols {
                                        (a.ptr.add(tile[0] + kidx[0] * a.cs), a.cs)
                                    } else {
                                        (pa[t * MR * kc..].as_ptr(), MR)
                                    };
                                    if wide {
                                        wide::tile(&work, ap, ast);
                                    } else {
                                        avx2::tile(&work, ap);
                                    }
                                }
                                #[cfg(not(target_arch = "x86_64"))]
                                {
                                    let _ = (t, direct, &work);
                                    unreachable!("sgemm::available() is false off x86-64");
                                }
                            }
                        }
                    }
                }
            }
        }
        // Lines the tiles' runs left over at span ends (a few, if any).
        fetch.rest();
    }
}

/// The row ranges of a block's tiles over `rows` rows: `MR` each and a shorter last one,
/// or (`split_tail`, with a last tile of one or two rows after a full one) the last
/// `MR + 1` or `MR + 2` rows as two tiles, four rows and the rest.
pub(super) fn row_tiles(rows: usize, split_tail: bool) -> impl Iterator<Item = Range<usize>> {
    (0..).map_while(move |t| row_tile(rows, split_tail, t))
}

/// Tile `t` of [`row_tiles`], or `None` past the last.
pub(super) fn row_tile(rows: usize, split_tail: bool, t: usize) -> Option<Range<usize>> {
    let (full, rest) = (rows / MR, rows % MR);
    let split = split_tail && full >= 1 && (rest == 1 || rest == 2);
    let start = t * MR;
    if start >= rows {
        return None;
    }
    Some(if split && t + 1 == full {
        start..start + 4
    } else if split && t == full {
        start - MR + 4..rows
    } else {
        start..(start + MR).min(rows)
    })
}
