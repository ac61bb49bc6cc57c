//! Programs as deep as they are long, through the text format, the verifier and the
//! program walks, on a thread with a small stack: nothing may recurse once per instruction.

use ir::text::{parse, print, print_context};
use ir::{verify, Builder, DType, Type};

/// Far below the main thread's 8 MiB; a recursion per instruction overflows it within a few
/// thousand instructions.
const STACK: usize = 256 << 10;

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("a thread")
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// `%0` a parameter, then `n` ops each reading the one before (neg, exp, copy, add).
fn chain(n: usize) -> String {
    let mut s = String::from("mesh [x=2]\n%0 = f32[4] parameter(\"x\") @{x}\n");
    for i in 1..=n {
        let v = i - 1;
        let line = match i % 4 {
            1 => format!("%{i} = f32[4] neg(%{v})"),
            2 => format!("%{i} = f32[4] exp(%{v})"),
            3 => format!("%{i} = f32[4] copy(%{v})"),
            _ => format!("%{i} = f32[4] add(%{v}, %{v}) @{{x}}"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str(&format!("output \"y\" = %{n}\n"));
    s
}

#[test]
fn a_million_instruction_chain_parses_prints_and_verifies() {
    on_small_stack(|| {
        let n = 1_000_000;
        let text = chain(n);
        let p = parse(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.len(), n + 1);
        verify(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(print(&p), text, "the chain is already in canonical form");
        assert_eq!(
            print_context(&p, n, 1),
            format!(
                "   %{} = f32[4] copy(%{})\n>> %{n} = f32[4] add(%{}, %{}) @{{x}}\n",
                n - 1,
                n - 2,
                n - 1,
                n - 1
            )
        );
        let users = p.users();
        assert!(users[..n].iter().all(|u| !u.is_empty()));
        let mut pruned = p.clone();
        pruned.prune();
        assert_eq!(pruned, p);
    });
}

#[test]
fn a_splat_behind_a_million_copies_is_still_a_splat() {
    on_small_stack(|| {
        let b = Builder::new();
        let mut v = b.splat(2.5, Type::new(DType::F32, vec![3]));
        for _ in 0..1_000_000 {
            v = v.copy();
        }
        b.output("y", &v);
        let p = b.finish();
        let last = p.output("y").expect("declared");
        assert_eq!(p.splat_value(last), Some(2.5));
    });
}
