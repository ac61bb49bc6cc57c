//! A global allocator that puts large allocations (tensor buffers) on 64-byte boundaries,
//! and fallible allocation for tensor buffers ([`try_zeroed_vec`], [`try_collect`],
//! [`check_room`]): a buffer the machine cannot hold is an [`AllocError`], which the callers
//! turn into an error naming the tensor, instead of the process aborting.
//!
//! The system allocator aligns large blocks to 16 bytes, so the rows of a tensor buffer
//! start mid cache line and every 64-byte vector load or store of the AVX-512 kernels spans
//! two lines. Binaries that run the executor install [`LineAligned`]:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: runtime::LineAligned = runtime::LineAligned;
//! ```
//!
//! Measured on the small MoE layer (8 devices, 1 thread, per-op profiles, three alternating
//! pairs): the expert GEMMs 3617-3699 -> 3527-3543 us per device, every op 4865-4939 ->
//! 4757-4805 us. Results are bit for bit the same (alignment changes no arithmetic). Only
//! blocks of 64 KiB and more: with every block from 4 KiB aligned, the backward gating GEMMs
//! ran ~80 us per device slower in situ (their small scratch blocks then come from
//! `posix_memalign`), and every op took 4761-4776 us against 4711-4728.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;

/// Allocations of at least this many bytes are 64-byte aligned.
pub const LINE_ALIGNED_MIN: usize = 64 << 10;

/// The system allocator, with allocations of at least [`LINE_ALIGNED_MIN`] bytes aligned
/// to 64 bytes (a cache line).
pub struct LineAligned;

/// The layout actually requested from the system allocator for `l`: the same for the
/// allocation and its release, as [`GlobalAlloc`] requires.
fn widened(l: Layout) -> Layout {
    if l.size() >= LINE_ALIGNED_MIN && l.align() < 64 {
        Layout::from_size_align(l.size(), 64).unwrap_or(l)
    } else {
        l
    }
}

// SAFETY: every call forwards to `System` with the widened layout of the caller's layout,
// which is a valid layout (same size, a larger power-of-two alignment), and a block is
// always released with the widened layout it was allocated with (`widened` depends on the
// size and alignment only, which the caller passes back unchanged).
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (non-zero size), carried to the widened layout.
        unsafe { System.alloc(widened(l)) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(widened(l)) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` was allocated by this allocator with layout `l`, so with `widened(l)`.
        unsafe { System.dealloc(p, widened(l)) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let old = widened(l);
        let Ok(new) = Layout::from_size_align(n, l.align()).map(widened) else {
            return std::ptr::null_mut();
        };
        if new.align() == old.align() {
            // SAFETY: `p` was allocated with `old`; `System` keeps its alignment.
            return unsafe { System.realloc(p, old, n) };
        }
        // Crossing the size threshold changes the alignment: move the block.
        // SAFETY: `new` has a non-zero size (`n > 0` by the caller's contract); both blocks
        // hold at least `min(l.size(), n)` bytes; `p` is released with its own layout.
        unsafe {
            let q = System.alloc(new);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(n));
                System.dealloc(p, old);
            }
            q
        }
    }
}

/// An allocation of `bytes` bytes that failed: the system refused it, or it is larger than
/// the machine's memory and swap together (which no overcommit setting makes usable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError {
    pub bytes: usize,
}

/// `b` bytes for a message: `512 B`, `1.5 KiB`, ..., `4.0 TiB`.
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The machine's memory plus swap in bytes (Linux: `MemTotal + SwapTotal` of
/// `/proc/meminfo`, read once); `None` where that is not known.
fn memory_limit() -> Option<usize> {
    static LIMIT: OnceLock<Option<usize>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = |key: &str| -> Option<usize> {
            let line = info.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        let total = kib("MemTotal:")?.checked_add(kib("SwapTotal:").unwrap_or(0))?;
        total.checked_mul(1024)
    })
}

/// Refuse up front an allocation larger than the machine's memory and swap: with the
/// kernel's overcommit set to "always", it would succeed and the process be killed when it
/// writes the pages.
fn within_memory(bytes: usize) -> Result<(), AllocError> {
    match memory_limit() {
        Some(limit) if bytes > limit => Err(AllocError { bytes }),
        _ => Ok(()),
    }
}

/// `n` zeroed elements, or an error when they cannot be allocated. The same request as
/// `vec![zero; n]` (zeroed memory from the allocator, whose fresh pages the kernel zeroes on
/// first touch), but failing instead of aborting.
pub fn try_zeroed_vec<T: bytemuck::Zeroable>(n: usize) -> Result<Vec<T>, AllocError> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    within_memory(bytes)?;
    let layout = Layout::array::<T>(n).map_err(|_| AllocError { bytes })?;
    // SAFETY: `layout` has a non-zero size (checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(AllocError { bytes });
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n` elements of `T`
    // (so its size is `n * size_of::<T>()` and its alignment `T`'s), and holds `n` zeroed
    // elements, each a valid `T` (`Zeroable`).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// The `n` items of `items` in a vector whose room is reserved once, or an error when it
/// cannot be (`items` may yield fewer; more grow the vector as usual).
pub fn try_collect<T>(n: usize, items: impl Iterator<Item = T>) -> Result<Vec<T>, AllocError> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    within_memory(bytes)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| AllocError { bytes })?;
    v.extend(items);
    Ok(v)
}

/// Whether `bytes` can be allocated now (allocated and freed at once; a large block is only
/// mapped, not touched): for results built by code that allocates infallibly, checked
/// before it runs.
pub fn check_room(bytes: usize) -> Result<(), AllocError> {
    within_memory(bytes)?;
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(bytes).map_err(|_| AllocError { bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks are line aligned, small ones keep their own alignment, and contents
    /// survive reallocations across the threshold in both directions.
    #[test]
    fn large_blocks_are_line_aligned_and_realloc_keeps_contents() {
        let a = LineAligned;
        // SAFETY: every block is allocated with a non-zero size, written only within its
        // layout, reallocated and freed with the layout it was last given, exactly once.
        unsafe {
            let l = Layout::from_size_align(LINE_ALIGNED_MIN, 4).unwrap();
            let p = a.alloc(l);
            assert!(!p.is_null());
            assert_eq!(p as usize % 64, 0);
            for i in 0..l.size() {
                *p.add(i) = (i % 251) as u8;
            }
            // Down across the threshold, then up again.
            let q = a.realloc(p, l, 100);
            assert!(!q.is_null());
            assert!((0..100).all(|i| *q.add(i) == (i % 251) as u8));
            let small = Layout::from_size_align(100, 4).unwrap();
            let r = a.realloc(q, small, 3 * LINE_ALIGNED_MIN);
            assert!(!r.is_null());
            assert_eq!(r as usize % 64, 0);
            assert!((0..100).all(|i| *r.add(i) == (i % 251) as u8));
            // Growing above the threshold keeps the alignment.
            let big = Layout::from_size_align(3 * LINE_ALIGNED_MIN, 4).unwrap();
            let s = a.realloc(r, big, 5 * LINE_ALIGNED_MIN);
            assert_eq!(s as usize % 64, 0);
            assert!((0..100).all(|i| *s.add(i) == (i % 251) as u8));
            a.dealloc(s, Layout::from_size_align(5 * LINE_ALIGNED_MIN, 4).unwrap());
            let t = a.alloc_zeroed(big);
            assert_eq!(t as usize % 64, 0);
            assert!((0..big.size()).all(|i| *t.add(i) == 0));
            a.dealloc(t, big);
        }
    }

    #[test]
    fn human_bytes_read_as_messages_say_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(4 << 40), "4.0 TiB");
    }

    /// Zeroed vectors are zero and as long as asked; an impossible size is an error (larger
    /// than any machine's memory: refused before the allocator is asked), not an abort.
    #[test]
    fn fallible_allocations_fail_as_errors() {
        let v: Vec<f32> = try_zeroed_vec(1000).unwrap();
        assert_eq!(v.len(), 1000);
        assert!(v.iter().all(|&x| x == 0.0));
        let b: Vec<bool> = try_zeroed_vec(3).unwrap();
        assert_eq!(b, [false; 3]);
        assert!(try_zeroed_vec::<u8>(0).unwrap().is_empty());
        let huge = 1usize << 60;
        assert_eq!(
            try_zeroed_vec::<f64>(huge),
            Err(AllocError { bytes: huge * 8 })
        );
        assert_eq!(check_room(huge), Err(AllocError { bytes: huge }));
        assert_eq!(
            try_collect(huge, std::iter::empty::<u32>()),
            Err(AllocError { bytes: huge * 4 })
        );
        assert_eq!(try_collect(3, [1, 2, 3].into_iter()).unwrap(), [1, 2, 3]);
        check_room(1 << 20).unwrap();
    }
}
