//! Fetching the memory of the next product (its operands, an epilogue's input) into
//! cache while this one computes, a few lines per micro-tile, within a budget.

/// `(address, floats)`: `floats` f32 values from byte address `address`, to fetch into
/// cache (a prefetch never faults, so they need not be readable); no floats is nothing.
pub type Span = (usize, usize);

/// Cache lines of some spans of memory, fetched a few at a time (see [`super::Sgemm::ahead`]).
pub(super) struct Fetch {
    /// Remaining spans as `(next line, end)` byte addresses, the current one last.
    pub(super) spans: Vec<(usize, usize)>,
    /// Lines per call of [`Fetch::next`] or [`Fetch::take`].
    pub(super) quota: usize,
    /// Lines of past [`Fetch::take`] calls not yet handed out (a run stops where its span
    /// ends; the next call makes up for it).
    pub(super) owed: usize,
}

/// The most bytes a product fetches ahead ([`super::Sgemm::ahead`]) (over it, nothing is fetched):
/// well under a 1 MiB L2, room for the next small expert's operands (64 + 256 KiB) and its
/// epilogue's input (256 KiB). 640 KiB against 512 (which left the epilogue's input out):
/// the small MoE layer at 8 devices 22.09-22.97 against 22.14-23.48 ms (minima, six runs
/// alternating).
pub const FETCH_BUDGET: usize = 640 << 10;

/// Whether a product fetches `spans` ahead (their cache lines fit [`FETCH_BUDGET`]).
pub fn fetch_fits(spans: &[Span]) -> bool {
    Fetch::lines(&Fetch::line_spans(spans)) * Fetch::LINE <= FETCH_BUDGET
}

impl Fetch {
    pub(super) const LINE: usize = 64;

    /// `(first line, end)` byte addresses of the non-empty `spans`, the last span first.
    pub(super) fn line_spans(spans: &[Span]) -> Vec<(usize, usize)> {
        spans
            .iter()
            .rev()
            .filter(|s| s.1 > 0)
            .map(|&(p, len)| {
                let start = p & !(Self::LINE - 1);
                (start, p + len * 4)
            })
            .collect()
    }

    /// Cache lines of spans from [`Fetch::line_spans`].
    pub(super) fn lines(spans: &[(usize, usize)]) -> usize {
        spans.iter().map(|s| (s.1 - s.0).div_ceil(Self::LINE)).sum()
    }

    /// Fetch `spans` over `calls` calls of [`Fetch::next`] (or [`Fetch::take`]).
    pub(super) fn new(spans: &[Span], calls: usize) -> Fetch {
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
    pub(super) fn take(&mut self) -> (usize, usize) {
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
    pub(super) fn rest(&mut self) {
        self.quota = usize::MAX;
        self.next();
    }

    /// Fetch the next few lines.
    #[inline]
    pub(super) fn next(&mut self) {
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
