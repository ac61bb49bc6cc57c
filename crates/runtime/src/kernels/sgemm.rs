//! f32 GEMM for x86-64 with AVX2 and FMA: `C = A · B` on strided operands.
//!
//! The classic Goto/BLIS structure: `B` is packed in `KC x NC` blocks into column panels of
//! [`NR`] (one panel stays in L1 while a block of `A` streams past it), `A` in `MC x KC`
//! blocks into row panels of [`MR`] (the block stays in L2), and a `6 x 16` register
//! micro-kernel keeps twelve 8-lane accumulators, so each `k` step costs two loads of `B`,
//! six broadcasts of `A` and twelve FMAs. On CPUs with AVX-512 the same packed panels are
//! read four at a time by a `6 x 64` tile of sixteen-lane accumulators ([`wide`]: fewer
//! instructions per FMA, the same bits; [`set_wide`] turns it off, for comparisons).
//! The AVX-512 tiles skip the packing where it would only copy what they stream from L2
//! anyway: a row-major `B` whose block spans at most 1 MiB (`IN_PLACE_B_SPAN`) and needs no
//! finiteness check, and a column-major `A` over consecutive steps and rows (each step of
//! a tile is then six contiguous floats, as in a packed panel).
//! Packing reads any row/column strides, so a
//! transposed operand costs nothing extra; the result is written through its own strides
//! (a transposed result is free too, computed as `B^T A^T`, except on the row-sparse path
//! below, which stores it by register transposes).
//!
//! Numerics: every output element is the f32 sum of its `k` products in increasing `k`
//! (FMA-rounded), one `KC` block after the other; the order never depends on the thread
//! split or the position of the tile, so a split GEMM is bitwise equal to an unsplit one.
//!
//! **Row-sparse `A`** ([`sparse`]): a row-major `A` of which a sample of rows is at most
//! 60 % non-zero (a ReLU output, or a gradient masked by one: two of an MoE expert's six
//! GEMMs) is multiplied by its non-zeros only, each one a broadcast against a packed row of
//! `B` into sixteen-lane accumulators (AVX-512) or eight-lane ones (AVX2, two passes per
//! 128-column group); a `B` already laid out as one group (row-major with 128 columns, or
//! at most 128 for the eight-lane chains) is read in place. A column-major `A` is first
//! copied row-major (the ReLU output read transposed in the down-projection's weight
//! gradient `h^T dy`, and the masked gradient in the up-projection's `dh'^T x`, whose
//! result is stored transposed: it is computed row-major, then stored by register
//! transposes, where the product has enough steps to pay for the copies: 128 with the AVX2
//! tiles, 256 with the AVX-512 ones; four of the six, or three). The
//! sums keep the dense kernel's order, so the bits are the same (but for the sign of a zero
//! sum after an underflow, as with the zero rows [`sgemm`] skips; [`set_sparse_a`] turns
//! the path off, for comparisons).
//!
//! Why not only the `gemm` crate: its dense rates are this kernel's (with its AVX-512 build,
//! `x86-v4`; its AVX2 build reached 79 % of the FMA peak on the MoE expert shapes), but it
//! cannot skip an expert buffer's zero rows, multiply a ReLU output by its non-zeros, fetch
//! the next expert's operands or write through an output offset table (a fused transpose);
//! it stays the fallback for f64 and for CPUs without AVX2 (figures in `benches/kernels.rs`
//! and docs/performance.md).

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// `f::<n>(args)` for a run-time `n` among the listed constants, `f::<1>` for any other: one
/// instance of a const-generic kernel per tile height (the AVX2 tile) or accumulator count
/// (the sparse chains).
#[cfg(target_arch = "x86_64")]
macro_rules! by_count {
    ($n:expr, [$($k:literal),*], $f:ident $args:tt) => {
        match $n {
            $($k => $f::<$k> $args,)*
            _ => $f::<1> $args,
        }
    };
}

mod sparse;
mod wide;

/// Rows of the micro-kernel tile.
pub const MR: usize = 6;
/// Columns of the micro-kernel tile (two 8-lane vectors).
pub const NR: usize = 16;
/// Depth of one packed block. Each block's sums are added to C's, so a deeper block reads
/// and writes every C tile fewer times; the `6 x 64` AVX-512 tile streams its 128 KiB strip
/// of `B` from L2 at either depth. On a Zen 5 core, 512 steps against 256: 512^3 252 -> 257
/// GFLOP/s, `128 x 128 x 512` 234 -> 239 (one thread, hot). The AVX2 tile's panel (32 KiB)
/// then fills a Zen 3's L1 (its rate on the Zen 5, 128-130, did not move; the depth is
/// the same for both tiles so that they give the same bits).
const KC: usize = 512;
/// Rows of `A` packed at once (`MC x KC` = 288 KiB, inside a 512 KiB or 1 MiB L2; one block
/// holds the 128 rows of a small expert GEMM, whose `B` block is then streamed from L2 once,
/// not twice: 61 -> 75 GFLOP/s on 32 experts of 128x512x128, on a Zen 3).
const MC: usize = 144;
/// Columns of `B` packed at once (`KC x NC` = 2 MiB, in L3).
const NC: usize = 1024;
/// Floats between one packed `NR`-wide panel of `B` and the next beyond the panel itself
/// (one cache line). Unpadded, panels of 128 or 256 steps lie 8 or 16 KiB apart, so a row
/// of a row-major `B` is packed into lines that all map to one L1 set: the copy thrashed
/// that set and took a fifth of a `128 x 512 x 128` product's time on Zen 5 (hot). With a
/// line between them, the panels' lines of one step fall in consecutive sets.
const PANEL_PAD: usize = NR;

/// The widest span (floats, steps times row stride) of a block of a row-major `B` that the
/// AVX-512 tiles read in place rather than packed. Each tile streams its strip of `B` from
/// L2 either way (a strip of 512 steps is 128 KiB), so the copy buys nothing while the
/// strip, read in place, still fits L2's sets: its rows lie one stride apart, and a span
/// over L2's 1 MiB maps them onto too few sets (1024^3, rows 4 KiB apart over 512 steps,
/// loses ~4 %: 245 -> 236 GFLOP/s). One thread, hot, on a Zen 5 core: `128 x 512 x 128`
/// 240 -> 250, `128 x 128 x 512` 239 -> 252, `256 x 1024 x 256` 244 -> 249, 512^3 the same.
/// A `B` with rows to check for finiteness (an `A` with all-zero rows, which are skipped)
/// is packed, as the copy checks them: read in place after a checking pass, the cold
/// weights of the MoE step's up-projections made the step ~1 % slower (in-process A/B);
/// without the check the step is unchanged.
const IN_PLACE_B_SPAN: usize = 1 << 18;

/// Floats from one packed `W`-wide panel of `B` to the next, for a block of `kc` steps:
/// the `NR`-wide panels of the micro-kernels are padded ([`PANEL_PAD`]); the row-sparse
/// path's [`sparse::GROUP`]-wide ones are not (a step's columns are one run already).
const fn panel_stride(width: usize, kc: usize) -> usize {
    width * kc + if width == NR { PANEL_PAD } else { 0 }
}
/// Below this many multiply-adds (`m n k`) a GEMM neither looks for zero rows nor fetches
/// the next GEMM's operands (attention's per-head products: the scans and prefetches took
/// half of their time). The values are the same either way.
const TINY: usize = 1 << 16;

/// Whether this CPU runs the kernel (AVX2 and FMA); callers fall back to the `gemm` crate.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A read-only strided matrix: element `(i, j)` at `ptr + i*rs + j*cs`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

impl MatRef {
    /// Element `(i, j)` at `ptr + i*rs + j*cs` (the counterpart of [`MatMut::strided`]).
    pub fn strided(ptr: *const f32, rs: usize, cs: usize) -> MatRef {
        MatRef { ptr, rs, cs }
    }
}

/// A writable strided matrix: element `(i, j)` at `ptr + i*rs + j*cs`, or, with a table,
/// at `ptr + rows[i] + j*cs` (`rows` non-null: `m` offsets) or `ptr + i*rs + cols[j]`
/// (`cols` non-null: `n` offsets); at most one of the two tables. A table writes a result
/// whose row (column) dims do not merge into one stride (a fused output transpose) in
/// place, whole micro-tile rows at a time.
#[derive(Clone, Copy, Debug)]
pub struct MatMut {
    pub ptr: *mut f32,
    pub rs: usize,
    pub cs: usize,
    pub rows: *const usize,
    pub cols: *const usize,
    /// Written with non-temporal stores where the micro-kernel can (whole aligned lines of
    /// a tile written once: products of at most one `KC` block of steps): a result nothing
    /// reads soon (a step's gradient output), whose lines would otherwise each be read from
    /// memory before being overwritten.
    pub stream: bool,
}

impl MatMut {
    /// Plain strides, no table.
    pub fn strided(ptr: *mut f32, rs: usize, cs: usize) -> MatMut {
        MatMut {
            ptr,
            rs,
            cs,
            rows: std::ptr::null(),
            cols: std::ptr::null(),
            stream: false,
        }
    }

    /// Start of row `i` (no column table).
    ///
    /// # Safety
    /// `i` is inside the matrix (and its table).
    #[inline]
    unsafe fn row(&self, i: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe {
            if self.rows.is_null() {
                self.ptr.add(i * self.rs)
            } else {
                self.ptr.add(*self.rows.add(i))
            }
        }
    }
}

/// A 64-byte aligned scratch buffer of f32, grown on demand and reused per thread.
#[derive(Default)]
struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    /// An aligned slice of at least `n` elements.
    fn get(&mut self, n: usize) -> &mut [f32] {
        if self.buf.len() < n + 16 {
            self.buf = vec![0.0; n + 16];
        }
        let off = self.buf.as_ptr().align_offset(64).min(15);
        &mut self.buf[off..off + n]
    }
}

thread_local! {
    /// Packed `A`, packed `B`, and the row-sparse path's partial sums.
    static PACK: RefCell<(Scratch, Scratch, Scratch)> = RefCell::new(Default::default());
    /// A column-major `A` copied row-major for the row-sparse path ([`transpose_lines`]).
    static ROWS: RefCell<Scratch> = RefCell::new(Default::default());
    /// The row-major result of a row-sparse product that is stored transposed.
    static RESULT: RefCell<Scratch> = RefCell::new(Default::default());
}

/// The most floats of a column-major `A` that are copied row-major for the row-sparse path
/// (4 MiB: a large expert's 1024 x 256 is 1 MiB), and of a transposed result computed
/// row-major first. Each is a per-thread scratch kept for reuse (outside the executor's
/// peak-memory figure, like the packing buffers).
const ROWS_MAX: usize = 1 << 20;
/// The fewest columns of `C` for which a column-major `A` is copied row-major for the
/// row-sparse path: each copied element then saves at least 64 multiply-adds' share.
const COPIED_MIN_N: usize = 64;
/// The fewest steps for which a row-sparse product stored transposed goes through a
/// row-major result, with the AVX2 tiles (the transpose costs about what 64 steps save at
/// half density; measured on a Zen 3 core on 512 x 128 results: 162 -> 143 us at 128
/// steps, 123 -> 182 us summed over 32 experts of 16 steps).
const TRANSPOSED_MIN_K: usize = 128;
/// [`TRANSPOSED_MIN_K`] where the AVX-512 tiles run. A Zen 5 core's full-width FMAs run
/// the dense product at twice the AVX2 rate, while the copy of `A` and the transposed store
/// stay memory passes: at 128 steps (the small MoE layer's `dh'^T x`, 512 x 128 results)
/// the dense kernel made the whole 8-device step 1.5 % faster (in-process A/B, paired
/// medians of 99 steps, twice), though the row-sparse path still won hot.
const TRANSPOSED_MIN_K_WIDE: usize = 256;

/// The fewest steps for the row-sparse path with a transposed result on this CPU (by
/// hardware, not [`set_wide`], so that both tiles take the same path).
fn transposed_min_k() -> usize {
    if wide::available() {
        TRANSPOSED_MIN_K_WIDE
    } else {
        TRANSPOSED_MIN_K
    }
}

/// Whether the dense micro-kernel may use the AVX-512 tile ([`wide`]); on by default. Both
/// tiles give the same bits (tests check that); this exists to compare them.
static WIDE: AtomicBool = AtomicBool::new(true);

/// Allow (`true`, the default) or forbid the AVX-512 `6 x 64` tile of the dense kernel.
pub fn set_wide(on: bool) {
    WIDE.store(on, Ordering::Relaxed);
}

/// Whether dense tiles are `6 x 64` on AVX-512 registers (else `6 x 16` on AVX2 ones).
fn wide_tiles() -> bool {
    WIDE.load(Ordering::Relaxed) && wide::available()
}

/// Columns of one dense tile: [`NR`], or [`wide::PANELS`] panels of it (the unit in which
/// `dot` splits a product's columns over threads).
pub fn tile_width() -> usize {
    if wide_tiles() {
        NR * wide::PANELS
    } else {
        NR
    }
}

/// Whether a row-major `A` that is mostly zeros (a ReLU output or its masked gradient) may
/// take the row-sparse path ([`sparse`]); on by default. Both paths give the same bits, so
/// this only exists to compare them (tests, benches).
static SPARSE_A: AtomicBool = AtomicBool::new(true);

/// Allow (`true`, the default) or forbid the row-sparse path for mostly-zero `A` operands.
/// The values do not depend on it (tests check that bit for bit); benches compare speeds.
pub fn set_sparse_a(on: bool) {
    SPARSE_A.store(on, Ordering::Relaxed);
}

/// Blocks the calling thread has multiplied on the row-sparse path so far (`0` where the
/// CPU has no AVX2): tests use it to see that the path ran.
pub fn sparse_blocks_run_here() -> usize {
    sparse::THREAD_BLOCKS.with(|b| b.get())
}

/// Bit `t` set for each non-zero (NaN included; `-0` is zero) of the `run.len() <= 64`
/// floats of `run`, by AVX-512 or AVX2 compares (the one-hot products' scans of their
/// masks); `None` where the CPU lacks AVX2 (the caller folds the values itself).
#[inline]
pub fn nonzero_bits64(run: &[f32]) -> Option<u64> {
    assert!(run.len() <= 64, "at most 64 floats");
    #[cfg(target_arch = "x86_64")]
    if sparse::available() {
        // SAFETY: AVX2 is present; `run.len() <= 64` floats are readable.
        return Some(unsafe { sparse::nonzero_bits(run.as_ptr(), run.len()) });
    }
    None
}

/// Whether this CPU can take the row-sparse path (AVX2 and FMA, with BMI1; AVX-512F for the
/// sixteen-lane chains).
pub fn sparse_available() -> bool {
    available() && sparse::available()
}

/// `C[i, j] = sum_k A[i, k] * B[k, j]` for an `m x k` `A`, `k x n` `B` and `m x n` `C`
/// (`k == 0` writes zeros).
///
/// **Zero skipping** (exact, but for the sign of an underflowed zero): a row of `A` that is all zeros yields a row of zeros in `C`
/// when the `B` it meets is finite, and a row of `B` that is all zeros adds nothing when the
/// column of `A` it meets is finite; such rows are found by a scan that stops at the first
/// non-zero (free on dense data) and left out of the packed blocks (in GEMMs of at least
/// `TINY` multiply-adds; a tiny one is multiplied in full). This is the expert
/// buffer of an MoE layer: slots no token was dispatched to are zero rows in every expert
/// GEMM, forward and backward. The finiteness conditions keep the result bitwise equal to
/// the dense product (`0 * inf` is NaN there, so a non-finite block is multiplied in full),
/// and the skipped terms are exact zeros, which never change an f32 sum that starts at +0,
/// except the sign of a sum that is `-0` (only after a product underflowed to `-0`, below
/// 2^-150 in magnitude), which a skipped `+0` term would have made `+0`.
///
/// # Safety
/// The caller guarantees that [`available`] is true, that every element the strides
/// address (`(m-1)*rs + (k-1)*cs` past `a.ptr`, and likewise for `b` and `c`; through its
/// table for a `c` with one: `m` row or `n` column offsets) is inside a live allocation,
/// that `c` addresses `m * n` distinct elements, and that no other thread accesses `c`'s
/// elements during the call.
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: MatMut) {
    // SAFETY: the caller's contract; no spans to fetch.
    unsafe { sgemm_ahead(m, n, k, a, b, c, &[]) }
}

/// [`sgemm`], fetching the memory of `ahead` (`(start, floats)` spans: the next GEMM's
/// operands, the input of an epilogue that runs right after this GEMM) into cache a few
/// lines per micro-tile, so the next GEMM finds them there instead of waiting on memory
/// while it packs (up to [`FETCH_BUDGET`] bytes in all). A batch of expert GEMMs is bound by the
/// memory bandwidth otherwise: each expert's weights are read once per use.
///
/// # Safety
/// As [`sgemm`]. The spans need not be readable (a prefetch never faults).
pub unsafe fn sgemm_ahead(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: MatMut,
    ahead: &[(*const f32, usize)],
) {
    // SAFETY: the caller's contract.
    unsafe { sgemm_impl(m, n, k, a, b, c, ahead, SPARSE_A.load(Ordering::Relaxed)) }
}

/// [`sgemm_ahead`], the row-sparse path allowed or not (`allow_sparse`).
///
/// # Safety
/// As [`sgemm_ahead`].
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_impl(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: MatMut,
    ahead: &[(*const f32, usize)],
    allow_sparse: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    debug_assert!(c.rows.is_null() || c.cols.is_null(), "one table at most");
    let transposed = c.rows.is_null() && c.cs != 1 && c.rs == 1;
    // A column-major `A` that is mostly zeros and a result stored transposed (the gradient
    // of an expert's up-projection weights, `dh'^T x`, written as `[M, H]`): swapping the
    // operands below would make the sparse one `B`. The product is computed row-major on
    // the row-sparse path instead, then stored transposed by 8x8 register transposes.
    // The store costs a pass over the result, which the products' savings cover when
    // each result element sums at least [`transposed_min_k`] of them.
    // SAFETY: the caller's contract (`worth` reads `m` floats of sampled columns of A).
    if transposed
        && c.cols.is_null()
        && allow_sparse
        && a.rs == 1
        && a.cs != 1
        && m >= MR
        && n >= COPIED_MIN_N
        && k >= transposed_min_k()
        && m * n * k >= 1 << 18
        && m * k <= ROWS_MAX
        && m * n <= ROWS_MAX
        && sparse::available()
        && unsafe { sparse::worth(sample_steps(k, &mut [0; 8]), m, |p| a.ptr.add(p * a.cs)) }
    {
        return RESULT.with(|cell| {
            let mut buf = cell.borrow_mut();
            let tmp = buf.get(m * n);
            // SAFETY: the caller's contract for `a` and `b`; `tmp` holds the `m x n` result.
            unsafe {
                sgemm_impl(
                    m,
                    n,
                    k,
                    a,
                    b,
                    MatMut::strided(tmp.as_mut_ptr(), n, 1),
                    ahead,
                    true,
                );
                let s = tmp.as_ptr();
                transpose_lines(m, n, |i| s.add(i * n), |j| c.ptr.add(j * c.cs));
            }
        });
    }
    if !c.cols.is_null() || transposed {
        // A result written transposed, or with a column table: compute `C^T = B^T A^T`,
        // whose rows are contiguous (or at their own offsets), so the micro-kernel stores
        // whole vectors (the same products, in the same order).
        let t = |x: MatRef| MatRef {
            ptr: x.ptr,
            rs: x.cs,
            cs: x.rs,
        };
        let ct = MatMut {
            ptr: c.ptr,
            rs: c.cs,
            cs: c.rs,
            rows: c.cols,
            cols: std::ptr::null(),
            stream: c.stream,
        };
        // SAFETY: the same elements, addressed with swapped strides.
        return unsafe { sgemm_impl(n, m, k, t(b), t(a), ct, ahead, allow_sparse) };
    }
    // SAFETY (whole body): every offset below is `i*rs + j*cs` with `i`, `j` inside the
    // operand's shape, which the caller's contract makes addressable.
    unsafe {
        // Rows of A that take part, and those that are all zeros. Zeros are only looked for
        // along contiguous runs (rows of a row-major A, rows of a row-major B, columns of a
        // column-major A), where a scan that stops at the first non-zero costs a few loads;
        // a strided scan would miss the cache once per element.
        // A tiny GEMM (an attention head's scores, say) skips nothing and fetches nothing
        // ahead: its operands are in cache, and the scans cost as much as the products.
        let tiny = m * n * k < TINY;
        let (mut live, mut dead) = (Vec::with_capacity(m), Vec::new());
        for i in 0..m {
            let row = a.ptr.add(i * a.rs);
            if !tiny && a.cs == 1 && all_zero(row, k) {
                dead.push(i);
            } else {
                live.push(i);
            }
        }
        // Steps `k` that take part: a zero row of B is left out when the column of A it
        // meets is finite (over the live rows; dead rows are zeros), and a column of A that
        // is zero over the live rows when the row of B it meets is finite. Both tests are
        // exact per step, so the rule is the same for `A B` and for `B^T A^T`: the steps,
        // and with them the `KC` blocks whose sums are added, are the same whichever way a
        // product is computed (the row-sparse path computes a transposed result as `A B`,
        // the dense one as `B^T A^T`; a coarser "all of A finite" test for a row-major A
        // once kept a step on one side that the other left out, moving the block
        // boundaries and the rounding).
        let mut ks = Vec::with_capacity(k);
        for p in 0..k {
            let brow = b.ptr.add(p * b.rs);
            let acol = a.ptr.add(p * a.cs);
            let b_zero = || b.cs == 1 && all_zero(brow, n);
            let b_finite = || (0..n).all(|j| (*brow.add(j * b.cs)).is_finite());
            let a_zero = || a.rs == 1 && live.iter().all(|&i| *acol.add(i) == 0.0);
            let a_finite = || live.iter().all(|&i| (*acol.add(i * a.rs)).is_finite());
            let skip = !tiny && ((b_zero() && a_finite()) || (a_zero() && b_finite()));
            if !skip {
                ks.push(p);
            }
        }
        for &i in &dead {
            for j in 0..n {
                *c.row(i).add(j * c.cs) = 0.0;
            }
        }
        if ks.is_empty() {
            for &i in &live {
                for j in 0..n {
                    *c.row(i).add(j * c.cs) = 0.0;
                }
            }
            return;
        }
        // A row-major A whose rows are mostly zeros (a ReLU output, its masked gradient)
        // is multiplied by its non-zeros only, where the GEMM is large enough to pay for
        // finding the non-zeros (see `sparse`).
        let sparse_a = allow_sparse
            && a.cs == 1
            && c.cs == 1
            && c.cols.is_null()
            && live.len() >= MR
            && n >= NR
            && live.len() * n * ks.len() >= 1 << 18
            && ks[ks.len() - 1] - ks[0] == ks.len() - 1
            && sparse::available()
            && sparse::worth(&live, ks.len(), |i| a.ptr.add(i * a.rs + ks[0]));
        // A column-major A that is mostly zeros (a ReLU output read transposed: the gradient
        // of an expert's down-projection weights, `h^T dy`) is copied row-major, its steps
        // `ks` side by side, and takes the same path. Its rows are all live (zero rows are
        // only looked for in a row-major A); its density is sampled down its columns.
        let sparse_cols = !sparse_a
            && allow_sparse
            && a.rs == 1
            && a.cs != 1
            && c.cs == 1
            && c.cols.is_null()
            && live.len() == m
            && m >= MR
            && n >= COPIED_MIN_N
            && m * n * ks.len() >= 1 << 18
            && m * ks.len() <= ROWS_MAX
            && sparse::available()
            && sparse::worth(&ks, m, |p| a.ptr.add(p * a.cs));
        // The blocked loop on `a` (a row-major copy of it with `compact_a`), the row-sparse
        // path taken or not.
        let run = |a: MatRef, sparse_a: bool, compact_a: bool| {
            PACK.with(|cell| {
                let mut bufs = cell.borrow_mut();
                let (sa, sb, st) = &mut *bufs;
                let pa = sa.get(MC.div_ceil(MR) * MR * KC);
                let pb = sb.get(NC.div_ceil(NR) * panel_stride(NR, KC));
                let tmp = if sparse_a && ks.len() > KC {
                    st.get(live.len() * n.min(NC))
                } else {
                    st.get(0)
                };
                // A few lines of the spans ahead per micro-tile (or sparse row and slice),
                // spread over the whole call.
                let tiles = if sparse_a {
                    n.div_ceil(sparse::GROUP) * live.len() * ks.len().div_ceil(sparse::SLICE)
                } else {
                    n.div_ceil(tile_width()) * live.len().div_ceil(MR) * ks.len().div_ceil(KC)
                };
                let mut fetch = Fetch::new(if tiny { &[] } else { ahead }, tiles);
                let bufs = Bufs { pa, pb, tmp };
                let steps = Steps { ks: &ks, compact_a };
                blocked(n, steps, &live, &dead, a, b, c, bufs, sparse_a, &mut fetch);
            })
        };
        if sparse_cols {
            ROWS.with(|cell| {
                let mut rows = cell.borrow_mut();
                let kk = ks.len();
                let at = rows.get(m * kk).as_mut_ptr();
                transpose_lines(kk, m, |t| a.ptr.add(ks[t] * a.cs), |i| at.add(i * kk));
                let copy = MatRef {
                    ptr: at,
                    rs: kk,
                    cs: 1,
                };
                run(copy, true, true);
            });
        } else {
            run(a, sparse_a, false);
        }
        // Non-temporal stores are weakly ordered: fenced before anything else (another
        // thread, after the batch's join) reads the result.
        #[cfg(target_arch = "x86_64")]
        if c.stream {
            std::arch::x86_64::_mm_sfence();
        }
    }
}

/// The per-thread scratch of one call: packed `A`, packed `B`, and the row-sparse path's
/// partial sums (`live * min(n, NC)` floats when `ks` spans several `KC` blocks).
struct Bufs<'a> {
    pa: &'a mut [f32],
    pb: &'a mut [f32],
    tmp: &'a mut [f32],
}

/// The steps `ks` (rows of `B`) that take part, and where `A` has them: its columns `ks`,
/// or (`compact_a`, a row-major copy by [`transpose_lines`]) its columns `0..ks.len()`.
#[derive(Clone, Copy)]
struct Steps<'a> {
    ks: &'a [usize],
    compact_a: bool,
}

/// The blocked loop nest over the live rows `live` and steps `ks` (see [`sgemm`]); with
/// `sparse_a`, each block whose `A` is read in place and whose packed `B` is finite takes
/// the row-sparse path (the same values).
///
/// # Safety
/// As [`sgemm`]; `live`, `dead` and `ks` index inside A's rows and columns; `sparse_a`
/// only with [`sparse::available`], `c.cs == 1` and no column table.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn blocked(
    n: usize,
    steps: Steps,
    live: &[usize],
    dead: &[usize],
    a: MatRef,
    b: MatRef,
    c: MatMut,
    bufs: Bufs,
    sparse_a: bool,
    fetch: &mut Fetch,
) {
    let Bufs { pa, pb, tmp } = bufs;
    let Steps { ks, compact_a } = steps;
    let kk = ks.len();
    let width = tile_width();
    let wide = width > NR;
    // Streamed stores only where each tile is written once: one block of steps (a later
    // block would read the streamed lines back from memory to add to them).
    let stream = c.stream && kk <= KC;
    // SAFETY (whole body): offsets stay inside the operands by the caller's contract.
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
                // rows `GROUP` apart, so on CPUs with the wide tiles (whatever `set_wide`
                // says) the rows must be exactly that: `nc` and the row stride 128.
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
                    pack_b::<{ sparse::GROUP }>(
                        kidx,
                        nc,
                        b.ptr.add(jc * b.cs),
                        b.rs,
                        b.cs,
                        pb,
                        true,
                    )
                    .then_some((pb.as_ptr(), sparse::GROUP))
                };
                if let Some((bp, bs)) = sparse_b {
                    // Dead rows are zeros already (B is finite).
                    sparse::block(
                        live,
                        kc,
                        nc,
                        |i| a.ptr.add(i * a.rs + a0),
                        bp,
                        bs,
                        |i| c.row(i).add(jc),
                        pc == 0,
                        tmp,
                        || fetch.next(),
                    );
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
                let finite =
                    b_rows || pack_b::<NR>(kidx, nc, b.ptr.add(jc * b.cs), b.rs, b.cs, pb, check);
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
                            pack_a(rblk, kidx, a.ptr, a.rs, a.cs, pa);
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
                                let mut crow = [std::ptr::null_mut(); MR];
                                for (q, &i) in tile.iter().enumerate() {
                                    crow[q] = c.row(i).add((jc + jr) * c.cs);
                                }
                                let mr = tile.len();
                                #[cfg(target_arch = "x86_64")]
                                if direct {
                                    // Rows past a partial tile are not computed.
                                    let mut arow = [a.ptr.add(tile[0] * a.rs + a0); MR];
                                    for (q, &i) in tile.iter().enumerate() {
                                        arow[q] = a.ptr.add(i * a.rs + a0);
                                    }
                                    if wide {
                                        wide::tile_rows(
                                            kc, &arow, bp, ps, bs, &crow, c.cs, mr, nr, first, pf,
                                            stream,
                                        );
                                    } else {
                                        avx2::tile_rows(kc, &arow, bp, &crow, c.cs, mr, nr, first);
                                    }
                                } else {
                                    let (ap, ast) = if a_cols {
                                        (a.ptr.add(tile[0] + kidx[0] * a.cs), a.cs)
                                    } else {
                                        (pa[t * MR * kc..].as_ptr(), MR)
                                    };
                                    if wide {
                                        wide::tile(
                                            kc, ap, ast, bp, ps, bs, &crow, c.cs, mr, nr, first,
                                            pf, stream,
                                        );
                                    } else {
                                        avx2::tile(kc, ap, bp, &crow, c.cs, mr, nr, first);
                                    }
                                }
                                #[cfg(not(target_arch = "x86_64"))]
                                {
                                    let _ = (t, mr, nr, first, direct, &crow, bp);
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
fn row_tiles(rows: usize, split_tail: bool) -> impl Iterator<Item = Range<usize>> {
    (0..).map_while(move |t| row_tile(rows, split_tail, t))
}

/// Tile `t` of [`row_tiles`], or `None` past the last.
fn row_tile(rows: usize, split_tail: bool, t: usize) -> Option<Range<usize>> {
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

/// Whether the `rows x cols` floats at `b` (row `r` at `b + r * rs`, `cols` a multiple of 8)
/// are all finite: `x * 0` is NaN exactly for a non-finite `x`, folded with `or` (a
/// one-cycle chain), as [`pack_b`] checks the values it copies.
///
/// # Safety
/// The floats are readable; AVX2 (the caller's target).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn rows_finite(b: *const f32, rs: usize, rows: usize, cols: usize) -> bool {
    debug_assert!(cols.is_multiple_of(8));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; each load reads 8 of a row's `cols` floats.
    unsafe {
        use std::arch::x86_64::*;
        let zero = _mm256_setzero_ps();
        let mut nan = zero;
        for r in 0..rows {
            let row = b.add(r * rs);
            for j in (0..cols).step_by(8) {
                nan = _mm256_or_ps(nan, _mm256_mul_ps(_mm256_loadu_ps(row.add(j)), zero));
            }
        }
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    (0..rows).all(|r| {
        // SAFETY: the caller's contract.
        let row = unsafe { std::slice::from_raw_parts(b.add(r * rs), cols) };
        row.iter().all(|x| x.is_finite())
    })
}

/// Cache lines of some spans of memory, fetched a few at a time (see [`sgemm_ahead`]).
struct Fetch {
    /// Remaining spans as `(next line, end)` byte addresses, the current one last.
    spans: Vec<(usize, usize)>,
    /// Lines per call of [`Fetch::next`] or [`Fetch::take`].
    quota: usize,
    /// Lines of past [`Fetch::take`] calls not yet handed out (a run stops where its span
    /// ends; the next call makes up for it).
    owed: usize,
}

/// The most bytes [`sgemm_ahead`] fetches during one call (over it, nothing is fetched):
/// well under a 1 MiB L2, room for the next small expert's operands (64 + 256 KiB) and its
/// epilogue's input (256 KiB). 640 KiB against 512 (which left the epilogue's input out):
/// the small MoE layer at 8 devices 22.09-22.97 against 22.14-23.48 ms (minima, six runs
/// alternating).
pub const FETCH_BUDGET: usize = 640 << 10;

/// Whether [`sgemm_ahead`] fetches `spans` (their cache lines fit [`FETCH_BUDGET`]).
pub fn fetch_fits(spans: &[(*const f32, usize)]) -> bool {
    Fetch::lines(&Fetch::line_spans(spans)) * Fetch::LINE <= FETCH_BUDGET
}

impl Fetch {
    const LINE: usize = 64;

    /// `(first line, end)` byte addresses of the non-empty `spans`, the last span first.
    fn line_spans(spans: &[(*const f32, usize)]) -> Vec<(usize, usize)> {
        spans
            .iter()
            .rev()
            .filter(|s| s.1 > 0)
            .map(|&(p, len)| {
                let start = p as usize & !(Self::LINE - 1);
                (start, p as usize + len * 4)
            })
            .collect()
    }

    /// Cache lines of spans from [`Fetch::line_spans`].
    fn lines(spans: &[(usize, usize)]) -> usize {
        spans.iter().map(|s| (s.1 - s.0).div_ceil(Self::LINE)).sum()
    }

    /// Fetch `spans` over `calls` calls of [`Fetch::next`] (or [`Fetch::take`]).
    fn new(spans: &[(*const f32, usize)], calls: usize) -> Fetch {
        let spans = Self::line_spans(spans);
        let lines = Self::lines(&spans);
        // Larger operands would push the running GEMM's own blocks out of L2 (measured:
        // 256x256x1024 experts lose 6 % when 512 KiB + 1 MiB are fetched ahead); the
        // hardware prefetchers keep up with those, whose GEMMs are long per byte.
        if lines * Self::LINE > FETCH_BUDGET {
            return Fetch {
                spans: Vec::new(),
                quota: 0,
                owed: 0,
            };
        }
        Fetch {
            spans,
            quota: lines.div_ceil(calls.max(1)),
            owed: 0,
        }
    }

    /// The next few lines as one contiguous run `(address, lines)`, for the caller to fetch
    /// (spread over its loop).
    #[inline]
    fn take(&mut self) -> (usize, usize) {
        let Some(cur) = self.spans.last_mut() else {
            return (0, 0);
        };
        self.owed += self.quota;
        let left = (cur.1 - cur.0).div_ceil(Self::LINE);
        let n = self.owed.min(left);
        self.owed -= n;
        let at = cur.0;
        cur.0 += n * Self::LINE;
        if cur.0 >= cur.1 {
            self.spans.pop();
        }
        (at, n)
    }

    /// Fetch every line not handed out yet (what [`Fetch::take`] runs left over where spans
    /// ended mid-run).
    fn rest(&mut self) {
        self.quota = usize::MAX;
        self.next();
    }

    /// Fetch the next few lines.
    #[inline]
    fn next(&mut self) {
        let mut left = self.quota;
        while left > 0 {
            let Some(cur) = self.spans.last_mut() else {
                return;
            };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(cur.0 as *const i8);
            }
            cur.0 += Self::LINE;
            if cur.0 >= cur.1 {
                self.spans.pop();
            }
            left -= 1;
        }
    }
}

/// Whether the `n` contiguous floats at `p` are all zero (`-0.0` included): the first
/// element, then blocks of 64 tested without branches (vectorised), stopping at the first
/// block with a non-zero.
///
/// # Safety
/// `n` floats at `p` are readable.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn all_zero(p: *const f32, n: usize) -> bool {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    // Dense data answers at its first element.
    if s.first().is_some_and(|&x| x != 0.0) {
        return false;
    }
    s.chunks(64)
        .all(|c| c.iter().fold(true, |f, &x| f & (x == 0.0)))
}

/// Transpose between two sets of lines: `dst(j)[i] = src(i)[j]` for `i < lines`,
/// `j < len` (the `lines` source lines `len` floats long become `len` destination lines
/// `lines` floats long). Sixteen source lines by eight floats per pair of register
/// transposes, so each destination line gets sixteen floats (a whole cache line where it
/// is aligned) per store pair. Copies a column-major `A` row-major for the row-sparse path
/// and stores that path's row-major result into a column-major `C`.
///
/// # Safety
/// AVX2; `len` floats readable at each `src(i)`, `lines` writable at each `dst(j)`, the
/// destination lines disjoint.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn transpose_lines(
    lines: usize,
    len: usize,
    src: impl Fn(usize) -> *const f32,
    dst: impl Fn(usize) -> *mut f32,
) {
    let (l16, n8) = (lines / 16 * 16, len / 8 * 8);
    // SAFETY (whole body): reads are `src(i) + j`, writes `dst(j) + i`, `i < lines`,
    // `j < len`.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        for i0 in (0..l16).step_by(16) {
            let from: [*const f32; 16] = std::array::from_fn(|r| src(i0 + r));
            for j0 in (0..n8).step_by(8) {
                let load = |h: usize| {
                    avx2::transpose8(std::array::from_fn(|r| {
                        std::arch::x86_64::_mm256_loadu_ps(from[h + r].add(j0))
                    }))
                };
                let (lo, hi) = (load(0), load(8));
                for q in 0..8 {
                    let d = dst(j0 + q).add(i0);
                    std::arch::x86_64::_mm256_storeu_ps(d, lo[q]);
                    std::arch::x86_64::_mm256_storeu_ps(d.add(8), hi[q]);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let (l16, n8) = (0, 0);
        for i in 0..lines {
            let from = src(i);
            for j in (if i < l16 { n8 } else { 0 })..len {
                *dst(j).add(i) = *from.add(j);
            }
        }
    }
}

/// Up to eight evenly spaced steps of `k` (the columns whose density [`sparse::worth`]
/// samples), in `buf`.
fn sample_steps(k: usize, buf: &mut [usize; 8]) -> &[usize] {
    let picks = k.min(8);
    for (t, x) in buf.iter_mut().take(picks).enumerate() {
        *x = t * k / picks;
    }
    &buf[..picks]
}

/// Pack rows `rows` and steps `kidx` of A into row panels of `MR`: panel `p`, step `k`,
/// row `i` at `dst[p*MR*kc + k*MR + i]`, rows past the end zero.
///
/// # Safety
/// Every `a[i*rs + k*cs]` for `i` in `rows`, `k` in `kidx` is readable.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn pack_a(
    rows: &[usize],
    kidx: &[usize],
    a: *const f32,
    rs: usize,
    cs: usize,
    dst: &mut [f32],
) {
    let kc = kidx.len();
    // A run of consecutive steps (the common case) is addressed without the index list.
    let run = kidx[kc - 1] - kidx[0] == kc - 1;
    let k0 = kidx[0];
    for (p, tile) in rows.chunks(MR).enumerate() {
        let panel = &mut dst[p * MR * kc..(p + 1) * MR * kc];
        if tile.len() < MR {
            panel.fill(0.0);
        }
        let out = panel.as_mut_ptr();
        let mut src = [std::ptr::null::<f32>(); MR];
        for (q, &i) in tile.iter().enumerate() {
            // SAFETY: row `i` is in `rows`.
            src[q] = unsafe { a.add(i * rs) };
        }
        let nq = tile.len();
        // SAFETY: `kk < kc` and `q < nq <= MR` keep the writes inside `panel`; every read is
        // an element `(i, k)` with `i` in `rows`, `k` in `kidx`.
        unsafe {
            if nq == MR && rs == 1 && tile[MR - 1] - tile[0] == MR - 1 {
                // A column-major A (a transposed activation in a weight gradient): the
                // tile's rows are one contiguous run per step, moved whole (24 bytes), not
                // as six scalar loads; also when steps are left out (the zero rows of an
                // expert buffer as `B`).
                let s0 = src[0];
                if run {
                    for kk in 0..kc {
                        let from = s0.add((k0 + kk) * cs);
                        std::ptr::copy_nonoverlapping(from, out.add(kk * MR), MR);
                    }
                } else {
                    for (kk, &k) in kidx.iter().enumerate() {
                        std::ptr::copy_nonoverlapping(s0.add(k * cs), out.add(kk * MR), MR);
                    }
                }
            } else if run && nq == MR {
                for kk in 0..kc {
                    let off = (k0 + kk) * cs;
                    let o = out.add(kk * MR);
                    for (q, sq) in src.iter().enumerate() {
                        *o.add(q) = *sq.add(off);
                    }
                }
            } else {
                for (kk, &k) in kidx.iter().enumerate() {
                    let o = out.add(kk * MR);
                    for (q, sq) in src.iter().enumerate().take(nq) {
                        *o.add(q) = *sq.add(k * cs);
                    }
                }
            }
        }
    }
}

/// Pack steps `kidx` of an `? x nc` block of B into column panels `W` wide (a multiple of
/// `NR`; a constant, so the offsets below are shifts): panel `p`, step `k`, column `j` at
/// `dst[p*panel_stride(W, kc) + k*W + j]`, columns
/// past `nc` zero. The micro-kernel reads `NR`-wide panels; the row-sparse path
/// ([`sparse`]) reads [`sparse::GROUP`]-wide ones, so that a slice of steps of one group is
/// one compact block in L1 (with `NR`-wide panels a step's columns lie 16 KiB apart, all in
/// one L1 set). Returns whether every packed element is finite (with `check`; `true`
/// unchecked otherwise).
///
/// # Safety
/// Every `b[k*rs + j*cs]` for `k` in `kidx`, `j < nc` is readable; `dst` holds
/// `nc.div_ceil(W) * panel_stride(W, kidx.len())` floats, 32-byte aligned.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn pack_b<const W: usize>(
    kidx: &[usize],
    nc: usize,
    b: *const f32,
    rs: usize,
    cs: usize,
    dst: &mut [f32],
    check: bool,
) -> bool {
    debug_assert!(W.is_multiple_of(NR));
    let width = W;
    let kc = kidx.len();
    let ps = panel_stride(width, kc);
    // Where an `NR`-wide chunk of columns from `j` starts at step `kk`.
    let at = |j: usize, kk: usize| (j / width) * ps + kk * width + j % width;
    if !nc.is_multiple_of(width) {
        let p = nc / width;
        dst[p * ps..p * ps + width * kc].fill(0.0);
    }
    // `x * 0 == 0` exactly when `x` is finite; folded with `&` so it vectorises.
    let mut finite = true;
    if cs == 1 {
        // Rows contiguous: read each row once, in order (a panel-by-panel walk would jump a
        // whole row ahead per element, across pages, where no prefetcher follows).
        #[cfg(target_arch = "x86_64")]
        {
            // One pass per row: each whole chunk moved as two vectors, its finiteness
            // folded in from the same registers (`x * 0` is NaN exactly for a non-finite
            // `x`, `±0` otherwise, and a NaN's bits survive an `or` with others: a
            // one-cycle chain, where an add chain made the check cost as much as the
            // copy); the remainder as below.
            use std::arch::x86_64::*;
            let whole = nc / NR * NR;
            // SAFETY: AVX2 (this function's target); reads stay inside row `k`'s `nc`
            // floats, writes inside its chunks of `dst`.
            unsafe {
                let zero = _mm256_setzero_ps();
                let mut nan = zero;
                for (kk, &k) in kidx.iter().enumerate() {
                    let row = b.add(k * rs);
                    for j in (0..whole).step_by(NR) {
                        let v0 = _mm256_loadu_ps(row.add(j));
                        let v1 = _mm256_loadu_ps(row.add(j + 8));
                        let d = dst.as_mut_ptr().add(at(j, kk));
                        _mm256_storeu_ps(d, v0);
                        _mm256_storeu_ps(d.add(8), v1);
                        if check {
                            nan = _mm256_or_ps(nan, _mm256_mul_ps(v0, zero));
                            nan = _mm256_or_ps(nan, _mm256_mul_ps(v1, zero));
                        }
                    }
                    if whole < nc {
                        let part = std::slice::from_raw_parts(row.add(whole), nc - whole);
                        if check {
                            finite &= part.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
                        }
                        let at = at(whole, kk);
                        dst[at..at + part.len()].copy_from_slice(part);
                    }
                }
                finite &= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0;
            }
            return finite;
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (kk, &k) in kidx.iter().enumerate() {
            // SAFETY: `nc` contiguous elements of row `k`.
            let src = unsafe { std::slice::from_raw_parts(b.add(k * rs), nc) };
            if check {
                finite &= src.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
            }
            for (q, part) in src.chunks(NR).enumerate() {
                let at = at(q * NR, kk);
                match <&[f32; NR]>::try_from(part) {
                    // A whole chunk: a fixed-size move (inlined; no memcpy call per 64 B).
                    Ok(whole) => {
                        let d: &mut [f32; NR] = (&mut dst[at..at + NR]).try_into().expect("NR");
                        *d = *whole;
                    }
                    Err(_) => dst[at..at + part.len()].copy_from_slice(part),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        return finite;
    }
    for j0 in (0..nc).step_by(NR) {
        let cols = NR.min(nc - j0);
        // Columns strided (a transposed B): sixteen column streams, one step at a time.
        let mut src = [std::ptr::null::<f32>(); NR];
        for (j, s) in src.iter_mut().enumerate().take(cols) {
            // SAFETY: column `j0 + j < nc`.
            *s = unsafe { b.add((j0 + j) * cs) };
        }
        #[cfg(target_arch = "x86_64")]
        if rs == 1 && cols == NR && kidx[kc - 1] - kidx[0] == kc - 1 {
            // Contiguous columns over consecutive steps: 8 x 8 register transposes.
            let k0 = kidx[0];
            let from = src.map(|p| p.wrapping_add(k0));
            // SAFETY: each column holds `kc` readable floats from step `k0`; the chunk's
            // `kc` rows of `NR` floats, `width` apart from `at(j0, 0)`, are inside `dst`.
            finite &= unsafe {
                avx2::pack_columns(kc, &from, dst[at(j0, 0)..].as_mut_ptr(), width, check)
            };
            continue;
        }
        for (kk, &k) in kidx.iter().enumerate() {
            let o = at(j0, kk);
            let o = &mut dst[o..o + cols];
            for (x, s) in o.iter_mut().zip(&src) {
                // SAFETY: element `(k, j)` with `k` in `kidx`, `j < nc`.
                *x = unsafe { *s.add(k * rs) };
            }
            if check {
                finite &= o.iter().fold(true, |f, &x| f & (x * 0.0 == 0.0));
            }
        }
    }
    finite
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// The accumulators of an `R`-row tile: two 8-lane vectors per row.
    type Acc<const R: usize> = [[__m256; 2]; R];

    /// Start fetching the C tile's lines: its stores come after `kc` steps.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn prefetch_c(c: &[*mut f32], cs: usize) {
        if cs == 1 {
            for &p in c {
                // Prefetches never fault; these are the tile row's first and last lines.
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(NR - 1) as *const i8);
            }
        }
    }

    /// Write (`first`) or add the accumulators to the left `nr` columns of the `R` C rows.
    ///
    /// # Safety
    /// As [`kernel`] for `c`.
    /// Always inlined into its (AVX2) kernel, so the accumulators stay in registers.
    #[inline(always)]
    unsafe fn store<const R: usize>(
        acc: &Acc<R>,
        c: &[*mut f32; MR],
        cs: usize,
        nr: usize,
        first: bool,
    ) {
        // SAFETY: the caller's contract bounds every element written.
        unsafe {
            if nr == NR && cs == 1 {
                for (row, &p) in acc.iter().zip(c) {
                    if first {
                        _mm256_storeu_ps(p, row[0]);
                        _mm256_storeu_ps(p.add(8), row[1]);
                    } else {
                        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), row[0]));
                        let q = p.add(8);
                        _mm256_storeu_ps(q, _mm256_add_ps(_mm256_loadu_ps(q), row[1]));
                    }
                }
                return;
            }
            let mut tile = [0.0f32; NR];
            for (row, &p) in acc.iter().zip(c) {
                _mm256_storeu_ps(tile.as_mut_ptr(), row[0]);
                _mm256_storeu_ps(tile.as_mut_ptr().add(8), row[1]);
                for (j, &v) in tile.iter().enumerate().take(nr) {
                    let q = p.add(j * cs);
                    *q = if first { v } else { *q + v };
                }
            }
        }
    }

    /// The `R x NR` micro-kernel: `C[tile] (=|+=) Apanel · Bpanel` over `kc` packed steps
    /// (A panel rows `MR` apart per step, of which the first `R` are used), writing the
    /// left `nr` columns of rows `c[..R]`, columns `cs` apart (`first`: overwrite, else
    /// accumulate).
    ///
    /// # Safety
    /// AVX2 and FMA are available; `a` holds `kc * MR` and `b` `kc * NR` readable floats
    /// (`b` 32-byte aligned); the `R x nr` elements `c[i] + j*cs` are writable and touched
    /// by no other thread.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel<const R: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: &[*mut f32; MR],
        cs: usize,
        nr: usize,
        first: bool,
    ) {
        // SAFETY: the caller's contract bounds every pointer offset below.
        unsafe {
            prefetch_c(&c[..R], cs);
            let mut acc: Acc<R> = [[_mm256_setzero_ps(); 2]; R];
            let (mut ap, mut bp) = (a, b);
            for _ in 0..kc {
                let b0 = _mm256_load_ps(bp);
                let b1 = _mm256_load_ps(bp.add(8));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm256_broadcast_ss(&*ap.add(i));
                    row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                }
                ap = ap.add(MR);
                bp = bp.add(NR);
            }
            store::<R>(&acc, c, cs, nr, first);
        }
    }

    /// [`kernel`] reading A in place: row `i` of the tile is `kc` contiguous floats at
    /// `a[i]`.
    ///
    /// # Safety
    /// As [`kernel`], with `kc` floats readable at each `a[i]`, `i < R`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel_rows<const R: usize>(
        kc: usize,
        a: &[*const f32; MR],
        b: *const f32,
        c: &[*mut f32; MR],
        cs: usize,
        nr: usize,
        first: bool,
    ) {
        // SAFETY: the caller's contract bounds every pointer offset below.
        unsafe {
            prefetch_c(&c[..R], cs);
            let rows: [*const f32; R] = std::array::from_fn(|i| a[i]);
            let mut acc: Acc<R> = [[_mm256_setzero_ps(); 2]; R];
            let mut bp = b;
            for p in 0..kc {
                let b0 = _mm256_load_ps(bp);
                let b1 = _mm256_load_ps(bp.add(8));
                for (row, ar) in acc.iter_mut().zip(rows) {
                    let ai = _mm256_broadcast_ss(&*ar.add(p));
                    row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
                }
                bp = bp.add(NR);
            }
            store::<R>(&acc, c, cs, nr, first);
        }
    }

    /// One `mr x nr` tile from a packed A panel: [`kernel`] with exactly `mr` rows
    /// (a partial tile computes only its own rows).
    ///
    /// # Safety
    /// As [`kernel`] with `R = mr` (`1 <= mr <= MR`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: &[*mut f32; MR],
        cs: usize,
        mr: usize,
        nr: usize,
        first: bool,
    ) {
        // SAFETY: the caller's contract, with `R == mr`.
        unsafe { by_count!(mr, [6, 5, 4, 3, 2], kernel(kc, a, b, c, cs, nr, first)) }
    }

    /// One `mr x nr` tile reading A in place: [`kernel_rows`] with exactly `mr` rows.
    ///
    /// # Safety
    /// As [`kernel_rows`] with `R = mr` (`1 <= mr <= MR`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_rows(
        kc: usize,
        a: &[*const f32; MR],
        b: *const f32,
        c: &[*mut f32; MR],
        cs: usize,
        mr: usize,
        nr: usize,
        first: bool,
    ) {
        // SAFETY: the caller's contract, with `R == mr`.
        unsafe { by_count!(mr, [6, 5, 4, 3, 2], kernel_rows(kc, a, b, c, cs, nr, first)) }
    }

    /// Transpose eight rows of eight floats (row `i` of the result is column `i`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    /// Pack `kc` steps of sixteen contiguous columns (`col[j]` holds `kc` floats) into a B
    /// panel (`dst[k*NR + j]`); returns whether every value is finite (with `check`;
    /// `true` unchecked otherwise).
    ///
    /// # Safety
    /// `kc` floats readable at each `col[j]`; `NR` floats writable at `dst + k * ld` for
    /// every `k < kc` (32-byte aligned when `kc >= 8`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pack_columns(
        kc: usize,
        col: &[*const f32; NR],
        dst: *mut f32,
        ld: usize,
        check: bool,
    ) -> bool {
        // `x * 0` is NaN exactly for a non-finite `x`, `±0` otherwise, and a NaN's bits
        // survive an `or` with others.
        let mut nan = _mm256_setzero_ps();
        let zero = _mm256_setzero_ps();
        let mut kk = 0;
        // SAFETY: every read is `col[j] + kk + t` with `kk + t < kc`, every write is
        // `dst + k * ld + j` with `k < kc`, `j < NR`.
        unsafe {
            while kk + 8 <= kc {
                for half in 0..2 {
                    let rows: [__m256; 8] =
                        std::array::from_fn(|j| _mm256_loadu_ps(col[half * 8 + j].add(kk)));
                    if check {
                        for &r in &rows {
                            nan = _mm256_or_ps(nan, _mm256_mul_ps(r, zero));
                        }
                    }
                    for (t, v) in transpose8(rows).into_iter().enumerate() {
                        _mm256_store_ps(dst.add((kk + t) * ld + half * 8), v);
                    }
                }
                kk += 8;
            }
            let mut finite = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(nan, nan)) == 0;
            for k in kk..kc {
                for (j, c) in col.iter().enumerate() {
                    let x = *c.add(k);
                    finite &= x * 0.0 == 0.0;
                    *dst.add(k * ld + j) = x;
                }
            }
            finite
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (layout, got) in all_layouts(m, n, k, a, b).iter().enumerate() {
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
            (x[3..].as_ptr(), 997),
            (x[2000..].as_ptr(), 37),
            (x[5001..].as_ptr(), 4000),
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
    fn all_layouts(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<Vec<f32>> {
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
                unsafe { sgemm(m, n, k, ar, br, cm) };
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
                let tiles: Vec<Range<usize>> = super::row_tiles(rows, split).collect();
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
                set_wide(false);
                let narrow = all_layouts(m, n, k, a, b);
                set_wide(true);
                let wide = all_layouts(m, n, k, a, b);
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
            let strided = || {
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
                unsafe { sgemm(m, n, k, ar, br, cm) };
                c
            };
            set_wide(false);
            let narrow = strided();
            set_wide(true);
            let wide = strided();
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
        let run = |sparse: bool| {
            let mut c = vec![f32::NAN; m * n];
            let before = sparse::THREAD_BLOCKS.with(|b| b.get());
            // SAFETY: AVX2 checked by the caller; the strides address exactly the vectors.
            unsafe { sgemm_impl(m, n, k, a, b, out(c.as_mut_ptr()), &[], sparse) };
            (c, sparse::THREAD_BLOCKS.with(|b| b.get()) - before)
        };
        let (dense, none) = run(false);
        let (sparse, blocks) = run(true);
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
            set_wide(false);
            let (narrow, narrow_blocks) = run(true);
            set_wide(true);
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
            rows: if table {
                rows.as_ptr()
            } else {
                std::ptr::null()
            },
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
                    rows: rows.as_ptr(),
                    ..MatMut::strided(ptr, n, 1)
                });
                assert_eq!(blocks > 0, finite || k > KC, "{m}x{n}x{k} with a row table");
                // The result stored transposed: computed row-major, then transposed (with
                // enough steps for this CPU; otherwise densely, as `B^T A^T`).
                let (t, blocks) =
                    on_both_paths((m, n, k), ar, br, |ptr| MatMut::strided(ptr, 1, m));
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
}
