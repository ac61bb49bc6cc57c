//! The path a product takes, as pure functions of its shape, layout, options and hardware
//! (no pointers): how its result is laid out ([`layout`]) and whether its `A` goes the
//! row-sparse way ([`a_path`]). Where the answer depends on the data (whether sampled rows
//! of `A` are sparse enough), the caller passes that test as a closure, asked last and
//! only when everything else allows the sparse path, as the kernel always asked it.

use super::{GemmOptions, MR, NR};

/// The most floats of a column-major `A` that are copied row-major for the row-sparse path
/// (4 MiB: a large expert's 1024 x 256 is 1 MiB), and of a transposed result computed
/// row-major first. Each is a per-thread scratch kept for reuse (outside the executor's
/// peak-memory figure, like the packing buffers).
pub(super) const ROWS_MAX: usize = 1 << 20;
/// The fewest columns of `C` for which a column-major `A` is copied row-major for the
/// row-sparse path: each copied element then saves at least 64 multiply-adds' share.
pub(super) const COPIED_MIN_N: usize = 64;
/// The fewest steps for which a row-sparse product stored transposed goes through a
/// row-major result, with the AVX2 tiles (the transpose costs about what 64 steps save at
/// half density; measured on a Zen 3 core on 512 x 128 results: 162 -> 143 us at 128
/// steps, 123 -> 182 us summed over 32 experts of 16 steps).
pub(super) const TRANSPOSED_MIN_K: usize = 128;
/// [`TRANSPOSED_MIN_K`] where the AVX-512 tiles run. A Zen 5 core's full-width FMAs run
/// the dense product at twice the AVX2 rate, while the copy of `A` and the transposed store
/// stay memory passes: at 128 steps (the small MoE layer's `dh'^T x`, 512 x 128 results)
/// the dense kernel made the whole 8-device step 1.5 % faster (in-process A/B, paired
/// medians of 99 steps, twice), though the row-sparse path still won hot.
pub(super) const TRANSPOSED_MIN_K_WIDE: usize = 256;
/// The fewest multiply-adds for the row-sparse path (finding the non-zeros must pay).
const SPARSE_MIN_MADDS: usize = 1 << 18;

/// What the route of a product depends on: its shape, strides and table, the options, and
/// the CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Facts {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    /// `A`'s row and column strides.
    pub(super) a: (usize, usize),
    /// `C`'s row and column strides.
    pub(super) c: (usize, usize),
    /// Which of `C`'s dims is at its own offsets, if one is ([`super::Table`]).
    pub(super) c_table: Option<TableOf>,
    pub(super) opts: GemmOptions,
    /// This CPU runs the row-sparse chains ([`super::sparse::available`]).
    pub(super) sparse_hw: bool,
    /// This CPU has the AVX-512 tiles ([`super::wide::available`]: the hardware, not
    /// [`GemmOptions::wide`], so that both tiles take the same path).
    pub(super) wide_hw: bool,
}

/// The dim of a result that a [`super::Table`] lays out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TableOf {
    Rows,
    Cols,
}

/// How a product's result is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// As it is laid out.
    Direct,
    /// As `C^T = B^T A^T` (a result written transposed, or through a column table): its
    /// rows are then contiguous or at their own offsets, so the micro-kernel stores whole
    /// vectors (the same products, in the same order).
    Swapped,
    /// Row-major into scratch on the row-sparse path, then stored transposed by register
    /// transposes: a mostly-zero column-major `A` with a transposed result (the gradient of
    /// an expert's up-projection weights, `dh'^T x`, written as `[M, H]`), which swapping
    /// would make the sparse operand `B`.
    ThroughRowMajor,
}

impl Facts {
    /// The fewest steps for the row-sparse path with a transposed result on this CPU.
    pub(super) fn transposed_min_k(&self) -> usize {
        if self.wide_hw {
            TRANSPOSED_MIN_K_WIDE
        } else {
            TRANSPOSED_MIN_K
        }
    }

    /// Whether the result is written transposed (unit row stride, no row table).
    fn transposed(&self) -> bool {
        self.c_table != Some(TableOf::Rows) && self.c.1 != 1 && self.c.0 == 1
    }
}

/// The layout a product is computed in. `sparse_cols()` says whether sampled columns of a
/// column-major `A` are sparse enough for the row-sparse path; it is asked only for a
/// product that could go [`Layout::ThroughRowMajor`] otherwise.
pub(super) fn layout(f: &Facts, sparse_cols: impl FnOnce() -> bool) -> Layout {
    let (m, n, k) = (f.m, f.n, f.k);
    let transposed = f.transposed();
    // The store costs a pass over the result, which the products' savings cover when each
    // result element sums at least `transposed_min_k` of them.
    if transposed
        && f.c_table.is_none()
        && f.opts.sparse_a
        && f.a.0 == 1
        && f.a.1 != 1
        && m >= MR
        && n >= COPIED_MIN_N
        && k >= f.transposed_min_k()
        && m * n * k >= SPARSE_MIN_MADDS
        && m * k <= ROWS_MAX
        && m * n <= ROWS_MAX
        && f.sparse_hw
        && sparse_cols()
    {
        return Layout::ThroughRowMajor;
    }
    if f.c_table == Some(TableOf::Cols) || transposed {
        return Layout::Swapped;
    }
    Layout::Direct
}

/// What the path of a product's `A` depends on once its rows and steps are known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Taking {
    /// Rows of `A` that take part (the others are all zeros).
    pub(super) live: usize,
    /// Steps that take part.
    pub(super) steps: usize,
    /// Whether those steps are consecutive (none left out in the middle).
    pub(super) steps_run: bool,
}

/// How a product's `A` is multiplied ([`super::sparse`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum APath {
    /// Dense micro-tiles.
    Dense,
    /// The row-sparse chains, reading a row-major `A` in place.
    RowSparse,
    /// The row-sparse chains on a row-major copy of a column-major `A` (its steps side by
    /// side): a ReLU output read transposed (`h^T dy`).
    RowSparseCopied,
}

/// The path of `A` in a product computed [`Layout::Direct`]: `sparse_rows()` and
/// `sparse_cols()` say whether sampled rows of a row-major `A` (columns of a column-major
/// one) are sparse enough, each asked only when everything else allows its path.
pub(super) fn a_path(
    f: &Facts,
    t: &Taking,
    sparse_rows: impl FnOnce() -> bool,
    sparse_cols: impl FnOnce() -> bool,
) -> APath {
    let (m, n) = (f.m, f.n);
    let c_plain = f.c.1 == 1 && f.c_table != Some(TableOf::Cols);
    let rows = f.opts.sparse_a
        && f.a.1 == 1
        && c_plain
        && t.live >= MR
        && n >= NR
        && t.live * n * t.steps >= SPARSE_MIN_MADDS
        && t.steps_run
        && f.sparse_hw
        && sparse_rows();
    if rows {
        return APath::RowSparse;
    }
    // Its rows are all live (zero rows are only looked for in a row-major `A`); its density
    // is sampled down its columns.
    let cols = f.opts.sparse_a
        && f.a.0 == 1
        && f.a.1 != 1
        && c_plain
        && t.live == m
        && m >= MR
        && n >= COPIED_MIN_N
        && m * n * t.steps >= SPARSE_MIN_MADDS
        && m * t.steps <= ROWS_MAX
        && f.sparse_hw
        && sparse_cols();
    if cols {
        APath::RowSparseCopied
    } else {
        APath::Dense
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 512 x 128 x 256 product, row-major everywhere, every option and capability on.
    fn facts() -> Facts {
        Facts {
            m: 512,
            n: 128,
            k: 256,
            a: (256, 1),
            c: (128, 1),
            c_table: None,
            opts: GemmOptions::default(),
            sparse_hw: true,
            wide_hw: true,
        }
    }

    /// A closure answering `yes`, counting how often it is asked.
    fn asked(n: &std::cell::Cell<usize>, yes: bool) -> impl FnOnce() -> bool + '_ {
        move || {
            n.set(n.get() + 1);
            yes
        }
    }

    #[test]
    fn results_are_computed_as_laid_out_or_swapped() {
        let q = std::cell::Cell::new(0);
        let f = facts();
        assert_eq!(layout(&f, asked(&q, true)), Layout::Direct);
        // A row table: as laid out; a column table: swapped.
        let rows = Facts {
            c_table: Some(TableOf::Rows),
            c: (0, 1),
            ..f
        };
        assert_eq!(layout(&rows, asked(&q, true)), Layout::Direct);
        let cols = Facts {
            c_table: Some(TableOf::Cols),
            c: (128, 0),
            ..f
        };
        assert_eq!(layout(&cols, asked(&q, true)), Layout::Swapped);
        // Transposed with a row-major `A`: swapped, the sparse test never asked.
        let t = Facts { c: (1, 512), ..f };
        assert_eq!(layout(&t, asked(&q, true)), Layout::Swapped);
        assert_eq!(q.get(), 0, "the data were sampled for a row-major A");
    }

    #[test]
    fn a_sparse_column_major_a_with_a_transposed_result_goes_through_row_major() {
        let q = std::cell::Cell::new(0);
        let f = Facts {
            a: (1, 512),
            c: (1, 512),
            ..facts()
        };
        assert_eq!(layout(&f, asked(&q, true)), Layout::ThroughRowMajor);
        assert_eq!(layout(&f, asked(&q, false)), Layout::Swapped);
        assert_eq!(q.get(), 2);
        // Each condition alone keeps it swapped (and the data unsampled).
        let no = [
            Facts {
                opts: GemmOptions {
                    sparse_a: false,
                    ..f.opts
                },
                ..f
            },
            Facts {
                sparse_hw: false,
                ..f
            },
            Facts { m: MR - 1, ..f },
            Facts {
                n: COPIED_MIN_N - 1,
                ..f
            },
            Facts {
                k: TRANSPOSED_MIN_K_WIDE - 1,
                ..f
            },
            Facts { m: 4097, ..f },
            Facts { n: 8193, ..f },
        ];
        for (i, g) in no.iter().enumerate() {
            assert_eq!(layout(g, asked(&q, true)), Layout::Swapped, "case {i}");
        }
        assert_eq!(q.get(), 2, "sampled where the path was ruled out");
        // The step threshold follows the hardware's tiles, not the options.
        let narrow = Facts {
            k: TRANSPOSED_MIN_K,
            wide_hw: false,
            ..f
        };
        assert_eq!(layout(&narrow, asked(&q, true)), Layout::ThroughRowMajor);
        let wide_off = Facts {
            k: TRANSPOSED_MIN_K,
            opts: GemmOptions {
                wide: false,
                ..f.opts
            },
            ..f
        };
        assert_eq!(layout(&wide_off, asked(&q, true)), Layout::Swapped);
        // Too few multiply-adds in all.
        let small = Facts {
            m: 8,
            n: 64,
            k: 256,
            ..f
        };
        assert_eq!(layout(&small, asked(&q, true)), Layout::Swapped);
    }

    #[test]
    fn a_row_major_a_goes_row_sparse_where_sparse_and_large_enough() {
        let f = facts();
        let all = Taking {
            live: 512,
            steps: 256,
            steps_run: true,
        };
        let (r, c) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        assert_eq!(
            a_path(&f, &all, asked(&r, true), asked(&c, true)),
            APath::RowSparse
        );
        assert_eq!(
            a_path(&f, &all, asked(&r, false), asked(&c, true)),
            APath::Dense
        );
        assert_eq!(
            (r.get(), c.get()),
            (2, 0),
            "a row-major A's columns sampled"
        );
        let no = [
            Taking {
                steps_run: false,
                ..all
            },
            Taking {
                live: MR - 1,
                ..all
            },
            Taking { steps: 3, ..all },
        ];
        for (i, t) in no.iter().enumerate() {
            assert_eq!(
                a_path(&f, t, asked(&r, true), asked(&c, true)),
                APath::Dense,
                "case {i}"
            );
        }
        let off = Facts {
            opts: GemmOptions {
                sparse_a: false,
                ..f.opts
            },
            ..f
        };
        let narrow = Facts { n: NR - 1, ..f };
        let strided_c = Facts { c: (256, 2), ..f };
        let col_table = Facts {
            c_table: Some(TableOf::Cols),
            ..f
        };
        for (i, g) in [off, narrow, strided_c, col_table].iter().enumerate() {
            assert_eq!(
                a_path(g, &all, asked(&r, true), asked(&c, true)),
                APath::Dense,
                "facts {i}"
            );
        }
        assert_eq!(
            (r.get(), c.get()),
            (2, 0),
            "sampled where the path was ruled out"
        );
        // A row table: still row-sparse (the chains store rows at their offsets).
        let row_table = Facts {
            c_table: Some(TableOf::Rows),
            ..f
        };
        assert_eq!(
            a_path(&row_table, &all, asked(&r, true), asked(&c, true)),
            APath::RowSparse
        );
    }

    #[test]
    fn a_column_major_a_is_copied_for_the_row_sparse_path() {
        let f = Facts {
            a: (1, 512),
            ..facts()
        };
        let all = Taking {
            live: 512,
            steps: 200,
            steps_run: false,
        };
        let (r, c) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        assert_eq!(
            a_path(&f, &all, asked(&r, true), asked(&c, true)),
            APath::RowSparseCopied
        );
        assert_eq!(
            a_path(&f, &all, asked(&r, true), asked(&c, false)),
            APath::Dense
        );
        assert_eq!(
            (r.get(), c.get()),
            (0, 2),
            "a column-major A's rows sampled"
        );
        let no = [
            Facts {
                n: COPIED_MIN_N - 1,
                ..f
            },
            Facts { m: 8192, ..f },
            Facts {
                sparse_hw: false,
                ..f
            },
            Facts { a: (1, 1), ..f },
        ];
        for (i, g) in no.iter().enumerate() {
            assert_eq!(
                a_path(g, &all, asked(&r, true), asked(&c, true)),
                APath::Dense,
                "case {i}"
            );
        }
        // Zero rows found (not all live): the copy is not made.
        let some_dead = Taking { live: 500, ..all };
        assert_eq!(
            a_path(&f, &some_dead, asked(&r, true), asked(&c, true)),
            APath::Dense
        );
        assert_eq!((r.get(), c.get()), (0, 2));
    }
}
