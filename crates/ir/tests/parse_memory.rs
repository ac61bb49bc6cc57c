//! The parser's memory on long lines: a counting global allocator measures the peak of
//! bytes its thread holds while one line of many megabytes parses (or fails), which must
//! stay within a small multiple of the line; absurd ranks and lists fail as soon as they
//! pass the limit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting per thread the bytes allocated there and not yet freed,
/// and the most of them since a reset (a parse runs on one thread; the tests run in
/// parallel on others).
struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    // `try_with`: never fails for these (const, no destructor), and must not panic here.
    let _ = HELD.try_with(|h| {
        h.set(h.get() + n);
        let _ = PEAK.try_with(|p| p.set(p.get().max(h.get())));
    });
}

// SAFETY: every call forwards to `System` with the caller's arguments; the counters are
// thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            add(l.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            add(l.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) };
        add(-(l.size() as isize));
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // A moving realloc holds both blocks for a moment: count the new one first.
        add(n as isize);
        // SAFETY: the caller's contract, forwarded.
        let q = unsafe { System.realloc(p, l, n) };
        if q.is_null() {
            add(-(n as isize));
        } else {
            add(-(l.size() as isize));
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The input is this many bytes (plus a short prefix and suffix).
const LINE: usize = 16 << 20;

/// The most bytes a parse may hold at once, per byte of its input.
const PER_BYTE: f64 = 8.0;

/// Parse `src`; returns the result and the peak of bytes held beyond those held before, per
/// byte of `src`.
fn measure(src: &str) -> (Result<ir::Program, ir::ParseError>, f64) {
    let before = HELD.with(Cell::get);
    PEAK.with(|p| p.set(before));
    let r = ir::text::parse(src);
    let peak = PEAK.with(Cell::get) - before;
    let per_byte = peak.max(0) as f64 / src.len() as f64;
    eprintln!(
        "{per_byte:.3} bytes per input byte: `{}...`",
        src.get(..40).unwrap_or(src)
    );
    (r, per_byte)
}

/// `prefix`, then `item` repeated to [`LINE`] bytes, then `suffix`.
fn long_line(prefix: &str, item: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + LINE + suffix.len());
    s.push_str(prefix);
    while s.len() < prefix.len() + LINE {
        s.push_str(item);
    }
    s.push_str(suffix);
    s
}

fn check_err(src: &str, line: usize, col: usize, msg: &str, most: f64) {
    let (r, per_byte) = measure(src);
    let e = r.expect_err("a parse error");
    assert_eq!((e.line, e.col, e.msg.as_str()), (line, col, msg));
    assert!(
        per_byte <= most,
        "{per_byte:.2} bytes per input byte for `{}...`",
        &src[..40]
    );
}

#[test]
fn a_type_of_millions_of_dims_fails_at_the_65th_holding_almost_nothing() {
    let src = long_line("%x = f32[", "1,", "1] parameter(\"x\")");
    check_err(
        &src,
        1,
        10 + 64 * 2,
        "type has too many dims (at most 64)",
        0.01,
    );
}

#[test]
fn a_sharding_of_millions_of_dims_fails_at_the_65th() {
    let src = long_line("mesh [x=2]\n%x = f32[4] parameter(\"x\") @{", "_, ", "_}");
    check_err(
        &src,
        2,
        "%x = f32[4] parameter(\"x\") @{".len() + 1 + 64 * 3,
        "the sharding has more than 64 dims (a type has at most 64; give one entry per dim)",
        0.01,
    );
}

#[test]
fn an_attribute_list_of_millions_fails_at_the_65th() {
    let src = long_line(
        "%x = f32[4] parameter(\"x\")\n%y = f32[4] transpose(%x) perm=[",
        "0, ",
        "0]",
    );
    check_err(
        &src,
        2,
        "%y = f32[4] transpose(%x) perm=[".len() + 1 + 64 * 3,
        "the `perm` list has more than 64 entries (a type has at most 64 dims)",
        0.01,
    );
}

#[test]
fn a_mesh_of_millions_of_axes_fails_at_the_65th() {
    let mut src = String::from("mesh [");
    let mut col = 0;
    for k in 0.. {
        if k == 64 {
            col = src.len() + 1;
        }
        src.push_str(&format!("a{k}=1, "));
        if src.len() > LINE {
            break;
        }
    }
    src.push_str("z=1]");
    check_err(
        &src,
        1,
        col,
        "the mesh has too many axes (at most 64)",
        0.01,
    );
}

#[test]
fn a_dense_constant_of_millions_of_values_parses_within_a_small_multiple() {
    for item in ["0,", "1.5, ", "-2e-3, "] {
        let n = LINE / item.len();
        let mut src = format!("%c = f32[{}] constant([", n + 1);
        for _ in 0..n {
            src.push_str(item);
        }
        src.push_str("0])\noutput \"c\" = %c");
        let (r, per_byte) = measure(&src);
        let p = r.unwrap_or_else(|e| panic!("{e}"));
        let ir::Op::Constant {
            value: ir::Literal::Dense(v),
        } = &p.instrs[0].op
        else {
            panic!("a dense constant")
        };
        assert_eq!(v.len(), n + 1);
        assert!(
            per_byte <= PER_BYTE,
            "{per_byte:.2} bytes per input byte for `{item}`"
        );
    }
}

#[test]
fn a_dense_constant_with_too_many_values_fails_holding_few() {
    let src = long_line("%c = f32[4] constant([", "0, ", "0])");
    let values = src.matches('0').count();
    check_err(
        &src,
        1,
        22,
        &format!("dense constant has {values} values but f32[4] has 4 elements"),
        0.01,
    );
}

#[test]
fn long_names_strings_numbers_and_comments_stay_within_a_small_multiple() {
    let cases = [
        long_line("%x = f32[] parameter(\"", "ab\\n", "\")\noutput \"y\" = %x"),
        long_line("%", "x", " = f32[] parameter(\"x\")"),
        long_line("%x = f32[", "1", "] parameter(\"x\")"),
        long_line("# ", "comment ", ""),
        long_line("", " \t", "%x = f32[] parameter(\"x\")"),
        long_line(
            "%x = f32[4] parameter(\"x\")\n%y = f32[4] add(%x",
            ", %x",
            ")",
        ),
        long_line("%x = f32[] parameter(\"x\") ", "é", ""),
    ];
    for src in &cases {
        let (_, per_byte) = measure(src);
        assert!(
            per_byte <= PER_BYTE,
            "{per_byte:.2} bytes per input byte for `{}...`",
            &src[..30]
        );
    }
}

#[test]
fn a_mesh_of_a_million_device_ids_parses_within_a_small_multiple() {
    let n = 1 << 20;
    let ids: Vec<String> = (0..n).rev().map(|k: u32| k.to_string()).collect();
    let src = format!("mesh [x={n}] devices=[{}]", ids.join(","));
    let (r, per_byte) = measure(&src);
    let p = r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.mesh.expect("declared").num_devices(), n as usize);
    assert!(per_byte <= PER_BYTE, "{per_byte:.2} bytes per input byte");
    // One id too many: counted, not kept.
    let src = format!("mesh [x={n}] devices=[{},0]", ids.join(","));
    let col = "mesh [x=1048576] devices=[".len();
    let msg = format!(
        "mesh needs {n} device ids (the product of its axis sizes), got {}",
        n + 1
    );
    check_err(&src, 1, col, &msg, PER_BYTE);
}

#[test]
fn a_long_pairs_list_stays_within_a_small_multiple() {
    let src = long_line(
        "mesh [x=2]\n%x = f32[4] parameter(\"x\")\n%y = f32[4] collective_permute(%x) axes=[x] pairs=[",
        "(0,1),",
        "(1,0)]",
    );
    let (r, per_byte) = measure(&src);
    assert!(r.is_err());
    assert!(per_byte <= PER_BYTE, "{per_byte:.2} bytes per input byte");
}

/// Tokens are lexed as the parser goes, but a lexical error anywhere on a line is still
/// the error that line reports (as when lines were tokenized whole first).
#[test]
fn a_lexical_error_late_on_a_line_comes_before_a_parse_error_early_on_it() {
    let e = ir::text::parse("%x = f32[4 frob(\"x\") $").unwrap_err();
    assert_eq!((e.line, e.col), (1, 22));
    assert_eq!(e.msg, "unexpected character `$`");
    let e = ir::text::parse("%x = f32[4 frob(\"x\\q\")").unwrap_err();
    assert_eq!((e.line, e.col), (1, 19));
    let e = ir::text::parse("%x = f32[4 frob(\"x\")").unwrap_err();
    assert_eq!((e.line, e.col), (1, 12));
    assert_eq!(e.msg, "expected `,` or `]` in the shape, found `frob`");
}
