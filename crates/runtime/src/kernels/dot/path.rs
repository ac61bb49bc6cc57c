//! The path a float dot takes, as pure functions (no pointers, no data): which side, if
//! any, a sparse walk takes and what the operands need first ([`choose_path`]), and which
//! GEMM kernel multiplies a dense batch entry ([`gemm_route`]). What depends on the data
//! (how many non-zeros a side has, whether the other side is finite) comes in as counts
//! and as a closure asked only where its answer decides, as the kernel always asked it.

use super::plan::DotPath;

/// What the path of a float dot depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathFacts {
    /// The batch matrices' rows and columns.
    pub m: usize,
    pub n: usize,
    /// Each side's count of terms, where the side was listed as sparse (`None`: not listed:
    /// dense, not worth listing, or given by its support alone and not known sparse).
    pub terms: [Option<usize>; 2],
    /// Each side read as its indicator (`convert(x != 0)`: finite whatever `x` holds).
    pub indicator: [bool; 2],
    /// Each side given by its support alone (its buffer released).
    pub absent: [bool; 2],
}

/// A float dot's path and what it does to its operands first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathChoice {
    pub path: DotPath,
    /// Each side rebuilt from its support: given by the support alone and read densely.
    pub rebuild: [bool; 2],
    /// Each side multiplied as its 0/1 copy: read as its indicator, and read densely.
    pub indicator_copy: [bool; 2],
}

/// Which sides, read as indicators (`indicator`), a dot that took `path` multiplies as a
/// 0/1 copy: every path but the sparse walk over that side reads it densely.
pub fn indicator_copies(indicator: [bool; 2], path: DotPath) -> [bool; 2] {
    let [l, r] = indicator;
    [
        l && path != DotPath::SparseLhs,
        r && path != DotPath::SparseRhs,
    ]
}

/// The path of a float dot with a non-empty result and steps. A listed side is walked
/// sparsely when the other side is finite (the walk leaves out `0 * x` terms, which a
/// non-finite `x` would make NaN) or read as an indicator. With both sides listed, the one
/// with fewer terms per line of the result goes first (each term costs a pass over a line
/// of the other operand: 4.4 ms against 0.14 ms on a training step's dispatch gradient when
/// the emptier expert buffer was walked), then the other; otherwise the dense GEMMs.
/// `finite(side)` (0: lhs, 1: rhs) says whether that side's values are all finite: asked
/// only where its answer decides, at most once per side.
pub fn choose_path(f: &PathFacts, mut finite: impl FnMut(usize) -> bool) -> PathChoice {
    let [ln, rn] = f.terms;
    let rhs_first = match (ln, rn) {
        (Some(a), Some(b)) => (b as f64) * (f.m as f64) < (a as f64) * (f.n as f64),
        (None, Some(_)) => true,
        _ => false,
    };
    let ind = f.indicator;
    let mut takes = |p: DotPath| match p {
        DotPath::SparseLhs => ln.is_some() && (ind[1] || finite(1)),
        _ => rn.is_some() && (ind[0] || finite(0)),
    };
    let order = if rhs_first {
        [DotPath::SparseRhs, DotPath::SparseLhs]
    } else {
        [DotPath::SparseLhs, DotPath::SparseRhs]
    };
    let path = order
        .into_iter()
        .find(|&p| takes(p))
        .unwrap_or(DotPath::Dense);
    PathChoice {
        path,
        rebuild: [
            f.absent[0] && path != DotPath::SparseLhs,
            f.absent[1] && path != DotPath::SparseRhs,
        ],
        indicator_copy: indicator_copies(ind, path),
    }
}

/// How the GEMM of a dense batch entry runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmRoute {
    /// On the f32 micro-kernel ([`crate::kernels::sgemm`]); otherwise on the `gemm` crate.
    pub micro: bool,
    /// Into a row-major scratch tile, then placed through the result's offset tables: both
    /// of them, or one where the `gemm` crate runs (only the micro-kernel writes through a
    /// table).
    pub via_tile: bool,
    /// With the micro-kernel's AVX-512 tiles (else its AVX2 ones).
    pub wide: bool,
}

/// The route of a dense GEMM: `f32` elements, this CPU running the micro-kernel
/// (`micro_hw`), its wide tiles allowed and present (`wide_tiles`), and which of the
/// result's rows and columns are at their own offsets (`tables`).
pub fn gemm_route(f32: bool, micro_hw: bool, wide_tiles: bool, tables: [bool; 2]) -> GemmRoute {
    let micro = f32 && micro_hw;
    let one_table = micro && !(tables[0] && tables[1]);
    let via_tile = (tables[0] || tables[1]) && !one_table;
    GemmRoute {
        micro,
        via_tile,
        wide: micro && wide_tiles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn facts(terms: [Option<usize>; 2]) -> PathFacts {
        PathFacts {
            m: 64,
            n: 256,
            terms,
            indicator: [false; 2],
            absent: [false; 2],
        }
    }

    /// `choose_path` with `finite` answering per side, and the sides it asked about.
    fn run(f: &PathFacts, fin: [bool; 2]) -> (PathChoice, Vec<usize>) {
        let asked = RefCell::new(Vec::new());
        let c = choose_path(f, |side| {
            asked.borrow_mut().push(side);
            fin[side]
        });
        (c, asked.into_inner())
    }

    #[test]
    fn a_listed_side_is_walked_when_the_other_side_is_finite() {
        let (c, asked) = run(&facts([None, None]), [true; 2]);
        assert_eq!(c.path, DotPath::Dense);
        assert!(asked.is_empty(), "finiteness asked with nothing listed");
        let (c, asked) = run(&facts([Some(10), None]), [true; 2]);
        assert_eq!((c.path, asked), (DotPath::SparseLhs, vec![1]));
        let (c, asked) = run(&facts([Some(10), None]), [true, false]);
        assert_eq!((c.path, asked), (DotPath::Dense, vec![1]));
        let (c, asked) = run(&facts([None, Some(10)]), [true; 2]);
        assert_eq!((c.path, asked), (DotPath::SparseRhs, vec![0]));
        let (c, asked) = run(&facts([None, Some(10)]), [false, true]);
        assert_eq!((c.path, asked), (DotPath::Dense, vec![0]));
    }

    /// Both listed: fewer terms per result line first (`rhs * m < lhs * n` takes the rhs),
    /// the other when the first's other side is not finite.
    #[test]
    fn with_both_sides_listed_the_cheaper_walk_goes_first() {
        // 64 x 256: the rhs first when rhs_terms * 64 < lhs_terms * 256.
        let (c, asked) = run(&facts([Some(100), Some(399)]), [true; 2]);
        assert_eq!((c.path, asked), (DotPath::SparseRhs, vec![0]));
        let (c, asked) = run(&facts([Some(100), Some(400)]), [true; 2]);
        assert_eq!((c.path, asked), (DotPath::SparseLhs, vec![1]));
        let (c, asked) = run(&facts([Some(100), Some(10)]), [false, true]);
        assert_eq!((c.path, asked), (DotPath::SparseLhs, vec![0, 1]));
        let (c, asked) = run(&facts([Some(100), Some(1000)]), [true, false]);
        assert_eq!((c.path, asked), (DotPath::SparseRhs, vec![1, 0]));
        let (c, asked) = run(&facts([Some(1), Some(1)]), [false; 2]);
        assert_eq!((c.path, asked), (DotPath::Dense, vec![0, 1]));
    }

    /// An indicator side is finite without asking; it is copied as 0/1 wherever it is read
    /// densely, and an operand given by its support is rebuilt wherever it is read densely.
    #[test]
    fn indicators_and_absent_operands_follow_the_path() {
        let f = PathFacts {
            indicator: [false, true],
            ..facts([Some(10), None])
        };
        let (c, asked) = run(&f, [false; 2]);
        assert_eq!(c.path, DotPath::SparseLhs);
        assert!(asked.is_empty(), "an indicator's finiteness was asked");
        assert_eq!(c.indicator_copy, [false, true]);
        let f = PathFacts {
            indicator: [false, true],
            absent: [false, true],
            ..facts([None, Some(10)])
        };
        let (c, _) = run(&f, [true; 2]);
        assert_eq!(c.path, DotPath::SparseRhs);
        assert_eq!((c.indicator_copy, c.rebuild), ([false; 2], [false; 2]));
        let (c, _) = run(&f, [false; 2]);
        assert_eq!(c.path, DotPath::Dense);
        assert_eq!(
            (c.indicator_copy, c.rebuild),
            ([false, true], [false, true])
        );
        let f = PathFacts {
            absent: [true, true],
            ..facts([Some(3), Some(1000)])
        };
        let (c, _) = run(&f, [true; 2]);
        assert_eq!(c.path, DotPath::SparseLhs);
        assert_eq!(c.rebuild, [false, true]);
        for path in [DotPath::Dense, DotPath::Int, DotPath::Empty] {
            assert_eq!(indicator_copies([true, true], path), [true, true]);
        }
    }

    #[test]
    fn dense_gemms_run_on_the_micro_kernel_through_at_most_one_table() {
        let r = |f32, hw, tables| gemm_route(f32, hw, true, tables);
        let direct = GemmRoute {
            micro: true,
            via_tile: false,
            wide: true,
        };
        for tables in [[false, false], [true, false], [false, true]] {
            assert_eq!(r(true, true, tables), direct, "{tables:?}");
        }
        assert_eq!(
            r(true, true, [true, true]),
            GemmRoute {
                via_tile: true,
                ..direct
            }
        );
        // The `gemm` crate (f64, or no AVX2 and FMA) writes no table.
        let krate = GemmRoute {
            micro: false,
            via_tile: false,
            wide: false,
        };
        for (f32, hw) in [(false, true), (true, false), (false, false)] {
            assert_eq!(r(f32, hw, [false, false]), krate);
            for tables in [[true, false], [false, true], [true, true]] {
                let want = GemmRoute {
                    via_tile: true,
                    ..krate
                };
                assert_eq!(r(f32, hw, tables), want, "{f32} {hw} {tables:?}");
            }
        }
        assert!(!gemm_route(true, true, false, [false; 2]).wide);
    }
}
