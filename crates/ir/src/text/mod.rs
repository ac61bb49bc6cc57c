//! Text format of programs: an HLO-like printer and a parser that never panics.
//!
//! One declaration per line; `#` starts a comment that runs to the end of the line, and
//! blank lines are ignored:
//!
//! ```text
//! mesh [data=2, expert=4]                          # optional, before any instruction
//! %x = f32[4,8] parameter("x") @{data, _}
//! %w = f32[8,16] parameter("w")
//! %y = f32[4,16] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0]
//! %z = f32[4,16] constant(0.0)
//! %r = f32[4,16] max(%y, %z)
//! %s = f32[] reduce(%r) op=sum dims=[0, 1]
//! output "loss" = %s
//! ```
//!
//! * `mesh` is exactly [`Mesh`](crate::Mesh)'s `Display`, e.g.
//!   `mesh [a=2, b=2] devices=[3,1,0,2]`.
//! * An instruction is `%name = TYPE OP(ARGS) KEY=VALUE... @SHARDING "SCOPE"`. The type is
//!   `dtype[dims]` (`f32[4,8]`, scalar `f32[]`); the op is [`Op::name`](crate::Op::name);
//!   the arguments are values, except for `parameter("name")` and `constant(1.5)` /
//!   `constant([1.0, 2.0])`. Attributes follow as `key=value` (`dims=[0, 1]`, `op=sum`,
//!   `axes=[data, expert]`, `pairs=[(0,1), (1,0)]`, `exclusive=true`); dot-general omits its
//!   empty dim lists. The optional sharding is exactly [`Sharding`](crate::Sharding)'s
//!   `Display`.
//! * An instruction may end with its scope, metadata that does not change what it computes:
//!   the path as a string, then `grad` for the backward pass
//!   (`%y = f32[4] add(%a, %b) @{data} "encoder/layer0/attn" grad`), then the checkpoint
//!   region the model code placed it in, if any: `checkpoint` when the region is the path
//!   itself, `checkpoint="encoder/layer0/ffn"` when it is a prefix of the path that ends at
//!   a `/` (`"encoder/layer0/ffn/norm" grad checkpoint="encoder/layer0/ffn"`). The root
//!   scope is not printed; a scope without a mark prints without one.
//! * `output "name" = %value` names an output.
//! * Strings escape `\"`, `\\`, `\n`, `\r`, `\t` and other control characters as `\u{1b}`.
//! * Numbers are printed with `{:?}` (shortest round-trip: `1.0`, `1e-10`, `inf`, `NaN`);
//!   the parser reads integers, decimals, exponents, `inf`, `-inf`, `nan` and `NaN`.
//!
//! The printer names values `%0, %1, ...` by index. The parser accepts any names made of
//! letters, digits and `_` and numbers them in order of definition. It type-checks every
//! instruction with [`infer_type`](crate::infer_type) and every sharding against the mesh
//! as it goes, so errors point at the offending line and column (1-based, counted in
//! characters), and it returns only programs that pass [`verify`](crate::verify()). Sizes
//! are bounded (2^40 elements per type, 2^40 per index attribute, 64 dims per type, 64 mesh
//! axes, 2^20 mesh devices) so that no later shape arithmetic can overflow and no check can
//! take quadratic time in a huge rank.
//!
//! Memory: tokens are lexed on demand and borrow their text from the line, so parsing a
//! line holds only what it keeps (a dense constant's values: 8 bytes per value of at least
//! 2 bytes of text). Lists bounded by a rank (a type's dims, an op's dim and axis lists, a
//! sharding's entries) fail at their 65th entry; other lists (device ids, a constant's
//! values) keep no more entries than the mesh or the type has, and count the rest.
//!
//! Files: `lex` (tokens and the cursor over one line), `items` (numbers, lists, types,
//! shardings, attribute values), `parse` (lines: mesh, instructions, outputs), `attrs` (the
//! attribute tables of every op), `print` (the printer).

mod attrs;
mod items;
mod lex;
mod parse;
pub(crate) mod print;

pub use parse::parse;
pub use print::{print, print_context, print_instr};

/// Most elements a type may have (counting a zero-sized dim as 1), and the largest value of
/// an index attribute: keeps every shape computation far from `u64` overflow.
const MAX_ELEMENTS: u64 = 1 << 40;
/// Most devices a mesh may have (a mesh stores one id per device).
const MAX_DEVICES: u64 = 1 << 20;
/// Most dims a type may have, and most axes a mesh may have (size-1 axes do not count
/// towards [`MAX_DEVICES`]): keeps the quadratic dim and axis checks downstream cheap.
const MAX_RANK: usize = 64;
