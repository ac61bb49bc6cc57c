//! f32 GEMM for x86-64 with AVX2 and FMA: `C = A · B` on strided operands.
//!
//! The classic Goto/BLIS structure: `B` is packed in `KC x NC` blocks into column panels of
//! [`NR`] (one panel stays in L1 while a block of `A` streams past it), `A` in `MC x KC`
//! blocks into row panels of [`MR`] (the block stays in L2), and a `6 x 16` register
//! micro-kernel keeps twelve 8-lane accumulators, so each `k` step costs two loads of `B`,
//! six broadcasts of `A` and twelve FMAs. On CPUs with AVX-512 the same packed panels are
//! read four at a time by a `6 x 64` tile of sixteen-lane accumulators ([`wide`]: fewer
//! instructions per FMA, the same bits; [`GemmOptions::wide`] turns it off, for comparisons).
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
//! sum after an underflow, as with the zero rows [`sgemm`] skips; [`GemmOptions::sparse_a`]
//! turns the path off, for comparisons).
//!
//! The path a product takes is chosen by the pure functions of [`route`] (tested on their
//! own); [`Sgemm`] is one call, its options ([`GemmOptions`]) included.
//!
//! Why not only the `gemm` crate: its dense rates are this kernel's (with its AVX-512 build,
//! `x86-v4`; its AVX2 build reached 79 % of the FMA peak on the MoE expert shapes), but it
//! cannot skip an expert buffer's zero rows, multiply a ReLU output by its non-zeros, fetch
//! the next expert's operands or write through an output offset table (a fused transpose);
//! it stays the fallback for f64 and for CPUs without AVX2 (figures in `benches/kernels.rs`
//! and docs/performance.md).
//!
//! Files by concern: `route` (the pure path choice), `driver` (one product: its layout,
//! zero rows and steps, and path), `blocked` (the loop nest over packed blocks), `pack`
//! (packing and copies), `fetch` (fetching the next product's memory), `avx2` and [`wide`]
//! (the dense micro-kernels), [`sparse`] (the row-sparse chains).

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

#[cfg(target_arch = "x86_64")]
mod avx2;
mod blocked;
mod driver;
mod fetch;
mod pack;
mod route;
mod sparse;
#[cfg(test)]
mod tests;
mod wide;

use driver::product;
pub use fetch::{fetch_fits, Span, FETCH_BUDGET};

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
pub(crate) const KC: usize = 512;

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

/// The offsets of a result's rows or columns whose dims do not merge into one stride (a
/// fused output transpose): `m` row offsets, or `n` column offsets, read through the
/// pointer ([`MatMut::table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// Row `i` at `ptr + rows[i]`.
    Rows(*const usize),
    /// Column `j` at `ptr + cols[j]`.
    Cols(*const usize),
}

/// A writable strided matrix: element `(i, j)` at `ptr + i*rs + j*cs`, or, with a table,
/// at `ptr + rows[i] + j*cs` or `ptr + i*rs + cols[j]` ([`Table`]). A table writes a result
/// whose row (column) dims do not merge into one stride (a fused output transpose) in
/// place, whole micro-tile rows at a time.
#[derive(Clone, Copy, Debug)]
pub struct MatMut {
    pub ptr: *mut f32,
    pub rs: usize,
    pub cs: usize,
    /// The rows or the columns at their own offsets, if either is.
    pub table: Option<Table>,
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
            table: None,
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
            match self.table {
                Some(Table::Rows(rows)) => self.ptr.add(*rows.add(i)),
                _ => self.ptr.add(i * self.rs),
            }
        }
    }

    /// The column table, if the columns are at their own offsets.
    fn cols(&self) -> Option<*const usize> {
        match self.table {
            Some(Table::Cols(cols)) => Some(cols),
            _ => None,
        }
    }
}

/// Which kernels a product may use. Every choice gives the same bits (tests check that), so
/// the options only exist to compare the kernels (tests, benches); the default, which the
/// executor runs, allows both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmOptions {
    /// The dense kernel's AVX-512 `6 x 64` tiles ([`wide`]) and the row-sparse path's
    /// sixteen-lane chains, where the CPU has AVX-512F (else the AVX2 `6 x 16` tiles and the
    /// eight-lane chains).
    pub wide: bool,
    /// The row-sparse path for mostly-zero `A` operands ([`sparse`]).
    pub sparse_a: bool,
}

impl Default for GemmOptions {
    /// Wide tiles where the hardware has them, the row-sparse path on.
    fn default() -> Self {
        GemmOptions {
            wide: true,
            sparse_a: true,
        }
    }
}

impl GemmOptions {
    /// Whether dense tiles are `6 x 64` on AVX-512 registers (else `6 x 16` on AVX2 ones).
    pub fn wide_tiles(self) -> bool {
        self.wide && wide::available()
    }

    /// Columns of one dense tile: [`NR`], or [`wide::PANELS`] panels of it (the unit in
    /// which `dot` splits a product's columns over threads).
    pub fn tile_width(self) -> usize {
        if self.wide_tiles() {
            NR * wide::PANELS
        } else {
            NR
        }
    }
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

/// One f32 product `C = A · B` of an `m x k` `A` and a `k x n` `B` into an `m x n` `C`
/// (`k == 0` writes zeros), with what it fetches meanwhile and the kernels it may use
/// ([`Sgemm::new`]: nothing, and the default ones).
///
/// **Zero skipping** (exact, but for the sign of an underflowed zero): a row of `A` that is
/// all zeros yields a row of zeros in `C` when the `B` it meets is finite, and a row of `B`
/// that is all zeros adds nothing when the column of `A` it meets is finite; such rows are
/// found by a scan that stops at the first non-zero (free on dense data) and left out of
/// the packed blocks (in GEMMs of at least `TINY` multiply-adds; a tiny one is multiplied in
/// full). This is the expert buffer of an MoE layer: slots no token was dispatched to are
/// zero rows in every expert GEMM, forward and backward. The finiteness conditions keep the
/// result bitwise equal to the dense product (`0 * inf` is NaN there, so a non-finite block
/// is multiplied in full), and the skipped terms are exact zeros, which never change an f32
/// sum that starts at +0, except the sign of a sum that is `-0` (only after a product
/// underflowed to `-0`, below 2^-150 in magnitude), which a skipped `+0` term would have
/// made `+0`.
#[derive(Clone, Copy, Debug)]
pub struct Sgemm<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: MatRef,
    pub b: MatRef,
    pub c: MatMut,
    /// Memory fetched into cache a few lines per micro-tile while the product computes (the
    /// next GEMM's operands, the input of an epilogue that runs right after this GEMM), so
    /// the next GEMM finds it there instead of waiting on memory while it packs (up to
    /// [`FETCH_BUDGET`] bytes in all; over it, nothing is fetched). A batch of expert GEMMs
    /// is bound by the memory bandwidth otherwise: each expert's weights are read once per
    /// use. The spans need not be readable (a prefetch never faults).
    pub ahead: &'a [Span],
    pub opts: GemmOptions,
}

impl Sgemm<'static> {
    /// The product of `a` and `b` into `c`: nothing fetched ahead, the default kernels.
    pub fn new(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: MatMut) -> Self {
        Sgemm {
            m,
            n,
            k,
            a,
            b,
            c,
            ahead: &[],
            opts: GemmOptions::default(),
        }
    }
}

impl Sgemm<'_> {
    /// Compute the product.
    ///
    /// # Safety
    /// The caller guarantees that [`available`] is true, that every element the strides
    /// address (`(m-1)*rs + (k-1)*cs` past `a.ptr`, and likewise for `b` and `c`; through
    /// its table for a `c` with one: `m` row or `n` column offsets) is inside a live
    /// allocation, that `c` addresses `m * n` distinct elements, and that no other thread
    /// accesses `c`'s elements during the call.
    pub unsafe fn run(&self) {
        // SAFETY: the caller's contract.
        unsafe { product(self) }
    }
}

/// [`Sgemm::new`]`(m, n, k, a, b, c).run()`: the product with nothing fetched ahead and the
/// default kernels.
///
/// # Safety
/// As [`Sgemm::run`].
pub unsafe fn sgemm(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: MatMut) {
    // SAFETY: the caller's contract.
    unsafe { Sgemm::new(m, n, k, a, b, c).run() }
}

/// One micro-tile's work: the `mr x nr` block of `C` whose rows start at `c[..mr]` (columns
/// `cs` apart) gets the product of `kc` steps of the tile's rows of `A` (given to the
/// kernel beside this) and of `B`'s panels, written (`first`) or added.
#[derive(Clone, Copy)]
struct Tile<'a> {
    kc: usize,
    /// `B` panel `q`'s step `p` at `b + q * ps + p * bs` (packed: `bs = NR`; a row-major
    /// `B` read in place: `ps = NR`, `bs` its row stride). The AVX2 tile reads one packed
    /// panel at `b`.
    b: *const f32,
    ps: usize,
    bs: usize,
    c: &'a [*mut f32; MR],
    cs: usize,
    mr: usize,
    nr: usize,
    first: bool,
    /// `(address, lines)`: cache lines the wide tile fetches during its steps (`fetch::Fetch`).
    pf: (usize, usize),
    /// Non-temporal stores for a whole, line-aligned first tile (the wide tile; the caller
    /// fences them).
    stream: bool,
}
