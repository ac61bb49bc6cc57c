//! Text format golden tests: hand-written programs (named values, comments, a mesh,
//! shardings, every attribute kind) print to the expected text, and malformed inputs fail
//! with the expected line, column and message.

use ir::text::{parse, print, print_context, print_instr};
use ir::{verify, Builder, DType, Literal, Mesh, Op, ParseError, Sharding, Type};

/// Parse `src`, check it verifies, print it, and check the printed text is a fixed point.
fn canonical(src: &str) -> String {
    let p = parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    verify(&p).unwrap();
    let text = print(&p);
    let again = parse(&text).unwrap_or_else(|e| panic!("reparse: {e}\n{text}"));
    assert_eq!(print(&again), text);
    text
}

#[test]
fn spec_example_prints_canonically() {
    let src = r#"
# comments run from '#' to end of line; blank lines are ignored
mesh [data=2, expert=4]                        # optional, before instructions
%0 = f32[4,8] parameter("x") @{data, _}         # sharding optional, at end
%1 = f32[8,16] parameter("w1")
%2 = f32[4,16] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]
%3 = f32[4,16] constant(0.0)                     # Literal::Splat
%4 = f32[2,2] constant([1.0, 2.0, 3.0, 4.0])     # Literal::Dense
%5 = f32[4,16] max(%2, %3)
%6 = i32[4] argmax(%5) dim=1
%7 = f32[] reduce(%5) op=sum dims=[0, 1]
output "y" = %5
output "loss" = %7
"#;
    let expected = r#"mesh [data=2, expert=4]
%0 = f32[4,8] parameter("x") @{data, _}
%1 = f32[8,16] parameter("w1")
%2 = f32[4,16] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]
%3 = f32[4,16] constant(0.0)
%4 = f32[2,2] constant([1.0, 2.0, 3.0, 4.0])
%5 = f32[4,16] max(%2, %3)
%6 = i32[4] argmax(%5) dim=1
%7 = f32[] reduce(%5) op=sum dims=[0, 1]
output "y" = %5
output "loss" = %7
"#;
    assert_eq!(canonical(src), expected);
    let p = parse(src).unwrap();
    assert_eq!(
        p.instrs[4].op,
        Op::Constant {
            value: Literal::Dense(vec![1.0, 2.0, 3.0, 4.0])
        }
    );
    assert_eq!(p.instrs[0].sharding, Some(Sharding::split(2, 0, "data")));
    assert_eq!(p.output("loss"), Some(ir::ValueId(7)));
}

#[test]
fn every_attribute_kind_with_named_values() {
    let src = r#"
mesh [a=2, b=2] devices=[3,1,0,2]
%x    = f32[4,8] parameter("x") @{a, _}
%w    = f32[8,4] parameter("w \"quoted\" \\ back") @{_, (a,b)}
%seed = i32[] parameter("seed") @{}
%i0   = i32[] constant(0)
%dot  = f32[4,4] dot_general(%x, %w) lhs_contract=[1] rhs_contract=[0] @{_, _ | partial a,b}
%bx   = f32[2,4,4] broadcast(%dot) dims=[1, 2]
%bd   = f32[2,4,4] dot_general(%bx, %bx) lhs_batch=[0] rhs_batch=[0] lhs_contract=[2] rhs_contract=[1]
%io   = i32[4,8] iota() dim=1
%tr   = f32[8,4] transpose(%x) perm=[1, 0]
%sl   = f32[2,8] slice(%x) start=[1, 0] limit=[3, 8]
%ds   = f32[2,8] dynamic_slice(%x, %i0, %i0) sizes=[2, 8]
%dus  = f32[4,8] dynamic_update_slice(%x, %ds, %i0, %i0)
%zero = f32[] constant(0)
%pd   = f32[5,10] pad(%x, %zero) low=[1, 0] high=[0, 2]
%cat  = f32[8,8] concatenate(%x, %dus) dim=0
%red  = f32[8] reduce(%cat) op=max dims=[0]
%cs   = f32[4,8] cumsum(%x) dim=1 exclusive=true reverse=false
%am   = i32[4] argmax(%x) dim=1
%idx  = i32[3] constant([0, 2, -1])
%g    = f32[3,8] gather(%x, %idx) axis=0 batch_dims=0
%upd  = f32[3,8] constant(1.5e0)
%sa   = f32[4,8] scatter_add(%x, %idx, %upd) axis=0 batch_dims=0
%r    = f32[4,8] rng(%seed) dist=normal stream=18446744073709551615 global_shape=[4, 8]
%ro   = bf16[2,2] rng(%seed, %i0, %i0) dist=uniform stream=0 global_shape=[4, 8]
%pid  = i32[] partition_id()
%ar   = f32[4,8] all_reduce(%x) op=sum axes=[a, b]
%ag   = f32[8,8] all_gather(%x) dim=0 axes=[b]
%rs   = f32[4,4] reduce_scatter(%x) op=min dim=1 axes=[a]
%a2a  = f32[2,16] all_to_all(%x) split_dim=0 concat_dim=1 axes=[a]
%cp   = f32[4,8] collective_permute(%x) axes=[b, a] pairs=[(0,1), (1,2), (2,3), (3,0)]
%none = f32[4,8] collective_permute(%x) axes=[] pairs=[]
%gt   = bool[4,8] gt(%x, %cs)
%sel  = f32[4,8] select(%gt, %x, %cs) @{_, b | partial a}
%cv   = bf16[4,8] convert(%x)
%neg  = f32[4,8] neg(%x)
%sg   = f32[4,8] stop_gradient(%neg)
%cp2  = f32[4,8] copy(%sg)
%rsh  = f32[32] reshape(%cp2)
%odd  = f64[5] constant([-inf, inf, NaN, 1e-10, 1e300])
%nan  = f64[] constant(nan)
output "sum" = %red
output "" = %x
"#;
    let expected = r#"mesh [a=2, b=2] devices=[3,1,0,2]
%0 = f32[4,8] parameter("x") @{a, _}
%1 = f32[8,4] parameter("w \"quoted\" \\ back") @{_, (a,b)}
%2 = i32[] parameter("seed") @{}
%3 = i32[] constant(0)
%4 = f32[4,4] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0] @{_, _ | partial a,b}
%5 = f32[2,4,4] broadcast(%4) dims=[1, 2]
%6 = f32[2,4,4] dot_general(%5, %5) lhs_batch=[0] rhs_batch=[0] lhs_contract=[2] rhs_contract=[1]
%7 = i32[4,8] iota() dim=1
%8 = f32[8,4] transpose(%0) perm=[1, 0]
%9 = f32[2,8] slice(%0) start=[1, 0] limit=[3, 8]
%10 = f32[2,8] dynamic_slice(%0, %3, %3) sizes=[2, 8]
%11 = f32[4,8] dynamic_update_slice(%0, %10, %3, %3)
%12 = f32[] constant(0.0)
%13 = f32[5,10] pad(%0, %12) low=[1, 0] high=[0, 2]
%14 = f32[8,8] concatenate(%0, %11) dim=0
%15 = f32[8] reduce(%14) op=max dims=[0]
%16 = f32[4,8] cumsum(%0) dim=1 exclusive=true reverse=false
%17 = i32[4] argmax(%0) dim=1
%18 = i32[3] constant([0, 2, -1])
%19 = f32[3,8] gather(%0, %18) axis=0 batch_dims=0
%20 = f32[3,8] constant(1.5)
%21 = f32[4,8] scatter_add(%0, %18, %20) axis=0 batch_dims=0
%22 = f32[4,8] rng(%2) dist=normal stream=18446744073709551615 global_shape=[4, 8]
%23 = bf16[2,2] rng(%2, %3, %3) dist=uniform stream=0 global_shape=[4, 8]
%24 = i32[] partition_id()
%25 = f32[4,8] all_reduce(%0) op=sum axes=[a, b]
%26 = f32[8,8] all_gather(%0) dim=0 axes=[b]
%27 = f32[4,4] reduce_scatter(%0) op=min dim=1 axes=[a]
%28 = f32[2,16] all_to_all(%0) split_dim=0 concat_dim=1 axes=[a]
%29 = f32[4,8] collective_permute(%0) axes=[b, a] pairs=[(0,1), (1,2), (2,3), (3,0)]
%30 = f32[4,8] collective_permute(%0) axes=[] pairs=[]
%31 = bool[4,8] gt(%0, %16)
%32 = f32[4,8] select(%31, %0, %16) @{_, b | partial a}
%33 = bf16[4,8] convert(%0)
%34 = f32[4,8] neg(%0)
%35 = f32[4,8] stop_gradient(%34)
%36 = f32[4,8] copy(%35)
%37 = f32[32] reshape(%36)
%38 = f64[5] constant([-inf, inf, NaN, 1e-10, 1e300])
%39 = f64[] constant(NaN)
output "sum" = %15
output "" = %0
"#;
    assert_eq!(canonical(src), expected);
    let p = parse(src).unwrap();
    assert_eq!(
        p.instrs[1].op,
        Op::Parameter {
            name: "w \"quoted\" \\ back".into()
        }
    );
    assert_eq!(
        p.mesh,
        Some(Mesh::with_devices(&[("a", 2), ("b", 2)], vec![3, 1, 0, 2]).unwrap())
    );
    assert_eq!(
        p.instrs[4].sharding,
        Some(Sharding {
            dims: vec![vec![], vec![]],
            partial: vec!["a".into(), "b".into()],
        })
    );
}

#[test]
fn scalar_partial_sharding_mesh_without_devices_and_string_escapes() {
    let src = "mesh [x=4] devices=[0,1,2,3]\r\n\
               %p = f32[] parameter(\"tab\\there\\nnew\\u{1b}é\") @{ | partial x}\r\n\
               %q = f32[] parameter(\"\\u{1F642}\")\n";
    let expected = "mesh [x=4]\n\
                    %0 = f32[] parameter(\"tab\\there\\nnew\\u{1b}é\") @{ | partial x}\n\
                    %1 = f32[] parameter(\"🙂\")\n";
    assert_eq!(canonical(src), expected);
}

#[test]
fn empty_and_comment_only_inputs_are_empty_programs() {
    for src in ["", "\n\n", "# nothing here\n   # or here", "\u{feff}"] {
        let p = parse(src).unwrap();
        assert_eq!(p, ir::Program::default());
        assert_eq!(print(&p), "");
    }
}

#[test]
fn builder_programs_print_and_parse_back() {
    let b = Builder::with_mesh(Mesh::new(&[("data", 2)]).unwrap());
    let x = b.param("x", Type::new(DType::F32, [4, 8]));
    let w = b.param("w", Type::new(DType::F32, [8, 2]));
    x.set_sharding(Some(Sharding::split(2, 0, "data")));
    let y = x.matmul(&w).relu();
    b.output("y", &y);
    let p = b.finish();
    let text = print(&p);
    assert_eq!(
        text,
        "mesh [data=2]
%0 = f32[4,8] parameter(\"x\") @{data, _}
%1 = f32[8,2] parameter(\"w\")
%2 = f32[4,2] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]
%3 = f32[4,2] constant(0.0)
%4 = f32[4,2] max(%2, %3)
output \"y\" = %4
"
    );
    assert_eq!(parse(&text), Ok(p.clone()));
    assert_eq!(p.to_string(), text);
    assert_eq!(
        print_instr(&p, 2),
        "%2 = f32[4,2] dot_general(%0, %1) lhs_contract=[1] rhs_contract=[0]"
    );
}

#[test]
fn print_context_marks_the_center_and_clamps() {
    let p = parse(
        "%a = f32[] parameter(\"a\")\n%b = f32[] neg(%a)\n%c = f32[] exp(%b)\n%d = f32[] log(%c)",
    )
    .unwrap();
    assert_eq!(
        print_context(&p, 1, 1),
        "   %0 = f32[] parameter(\"a\")\n>> %1 = f32[] neg(%0)\n   %2 = f32[] exp(%1)\n"
    );
    assert_eq!(
        print_context(&p, 3, 10),
        "   %0 = f32[] parameter(\"a\")\n   %1 = f32[] neg(%0)\n   %2 = f32[] exp(%1)\n>> %3 = f32[] log(%2)\n"
    );
    assert_eq!(
        print_context(&p, usize::MAX, usize::MAX),
        print_context(&p, 9, 100).replace(">>", "  ")
    );
    assert_eq!(print_context(&ir::Program::default(), 0, 10), "");
    assert_eq!(print_instr(&p, 7), "%7 = <no such instruction>");
}

#[test]
fn verify_errors_show_the_printed_context() {
    let mut p = parse("%a = f32[2] parameter(\"a\")\n%b = f32[2] neg(%a)").unwrap();
    p.instrs[1].ty = Type::new(DType::F32, [3]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.index, 1);
    assert!(
        e.context.contains(">> %1 = f32[3] neg(%0)"),
        "{}",
        e.context
    );
}

/// Parse `src`, expecting an error at `line`:`col` whose message contains `needle`.
#[track_caller]
fn fails(src: &str, line: usize, col: usize, needle: &str) {
    match parse(src) {
        Ok(p) => panic!("parsed but should fail:\n{src}\n=>\n{p}"),
        Err(ParseError {
            line: l,
            col: c,
            msg,
        }) => {
            assert_eq!((l, c), (line, col), "wrong position for {src:?}: {msg}");
            assert!(
                msg.contains(needle),
                "message {msg:?} lacks {needle:?} for {src:?}"
            );
        }
    }
}

const P: &str = "%0 = f32[2] parameter(\"x\")\n";

#[test]
fn syntax_errors_point_at_the_token_and_say_what_was_expected() {
    fails("%0 = f32[] frob()", 1, 12, "unknown op `frob`");
    fails(
        "%0 = f16[2] parameter(\"x\")",
        1,
        6,
        "unknown dtype `f16`: expected one of f32",
    );
    fails(
        "%0 = f32[2,] parameter(\"x\")",
        1,
        12,
        "expected a dimension size, found `]`",
    );
    fails(
        "%0 = f32 parameter(\"x\")",
        1,
        10,
        "expected `[` after the dtype",
    );
    fails(
        "%0 = f32[2 parameter(\"x\")",
        1,
        12,
        "expected `,` or `]` in the shape",
    );
    fails(
        "%0 = f32[-2] parameter(\"x\")",
        1,
        10,
        "expected a dimension size (a non-negative integer), found `-2`",
    );
    fails(
        "%0 = f32[] constant(1.2.3)",
        1,
        21,
        "bad number `1.2.3`: expected a number such as",
    );
    fails(
        "%0 = f32[] constant(1e999)",
        1,
        21,
        "bad number `1e999`: is out of range for f64",
    );
    fails(
        "%0 = f32[] constant(%1)",
        1,
        21,
        "expected a number, found `%1`",
    );
    fails("%0 = f32[] parameter(\"x)", 1, 22, "unterminated string");
    fails("%0 = f32[] parameter(\"a\\qb\")", 1, 24, "bad escape `\\q`");
    fails(
        "%0 = f32[] parameter(\"\\u{110000}\")",
        1,
        23,
        "bad escape `\\u`",
    );
    fails(
        "%0 = f32[] parameter(x)",
        1,
        22,
        "expected the parameter name as a string",
    );
    fails(
        "%0 = f32[] parameter(\"x\") junk",
        1,
        27,
        "unknown attribute `junk`: parameter takes no attributes",
    );
    fails(
        "%0 = f32[] parameter(\"x\") ,",
        1,
        27,
        "expected an attribute `name=value`, a sharding `@{...}`, a scope `\"path\"` or end of line, found `,`",
    );
    fails(
        "%0 = f32[] parameter(\"x\") @{} dim=1",
        1,
        31,
        "expected a scope `\"path\"` or end of line after the sharding, found `dim`",
    );
    fails(
        "%0 = f32[] parameter(\"x\") ; oops",
        1,
        27,
        "unexpected character `;`",
    );
    fails(
        "%0 f32[] parameter(\"x\")",
        1,
        4,
        "expected `=` after the value name, found `f32`",
    );
    fails(
        "% = f32[] parameter(\"x\")",
        1,
        1,
        "expected a value name after `%`",
    );
    fails(
        "x = f32[] parameter(\"x\")",
        1,
        1,
        "expected an instruction `%name = ...`",
    );
    fails(
        "%0 = f32[] partition_id",
        1,
        24,
        "expected `(` after the op name, found end of line",
    );
    fails(
        &format!("{P}%1 = f32[2] add(%0 %0)"),
        2,
        20,
        "expected `,` or `)`, found `%0`",
    );
    fails(
        &format!("{P}output y = %0"),
        2,
        8,
        "expected the output name as a string",
    );
    fails(
        &format!("{P}output \"y\" = %0 extra"),
        2,
        17,
        "expected end of line after the output",
    );
}

#[test]
fn attribute_errors() {
    fails(
        "%0 = f32[2] iota() dims=[0]",
        1,
        20,
        "unknown attribute `dims` for iota: expected one of dim",
    );
    fails(
        "%0 = f32[2] iota()",
        1,
        13,
        "iota needs attribute `dim` (e.g. `dim=0`)",
    );
    fails(
        "%0 = f32[2] iota() dim=0 dim=0",
        1,
        26,
        "attribute `dim` is given twice",
    );
    fails(
        "%0 = f32[2] iota() dim 0",
        1,
        24,
        "expected `=` after `dim`, found number `0`",
    );
    fails(
        "%0 = f32[2] iota() dim=99999999999999999999",
        1,
        24,
        "the value of `dim` `99999999999999999999` is too large",
    );
    fails(
        "%0 = f32[2] iota() dim=1099511627777",
        1,
        24,
        "(at most 2^40)",
    );
    fails(
        &format!("{P}%1 = f32[] reduce(%0) op=mean dims=[0]"),
        2,
        26,
        "expected the value of `op`: one of `sum`, `max`, `min`, found `mean`",
    );
    fails(
        &format!("{P}%1 = f32[2] cumsum(%0) dim=0 exclusive=yes reverse=false"),
        2,
        40,
        "one of `true`, `false`",
    );
    fails(
        &format!("{P}%1 = f32[] reduce(%0) op=sum dims=0"),
        2,
        35,
        "expected `[` starting the `dims` list, found number `0`",
    );
    fails(
        &format!("{P}%1 = f32[] reduce(%0) op=sum dims=[0,]"),
        2,
        38,
        "expected a non-negative integer, found `]`",
    );
    fails(
        "mesh [a=2]\n%0 = f32[2] parameter(\"x\")\n%1 = f32[2] collective_permute(%0) axes=[a] pairs=[(0 1)]",
        3,
        55,
        "expected `,` between the ranks of a pair",
    );
    fails(
        "mesh [a=2]\n%0 = f32[2] parameter(\"x\")\n%1 = f32[2] all_reduce(%0) op=sum axes=[a,,]",
        3,
        43,
        "expected a mesh axis name, found `,`",
    );
}

#[test]
fn name_errors() {
    fails(
        "%a = f32[] parameter(\"x\")\n%a = f32[] parameter(\"y\")",
        2,
        1,
        "%a is already defined on line 1",
    );
    fails(
        "%0 = f32[2] neg(%1)",
        1,
        17,
        "%1 is not defined: values must be defined before they are used",
    );
    fails("%0 = f32[2] neg(%0)", 1, 17, "%0 is not defined");
    fails(
        "%a = f32[] parameter(\"x\")\n\n%b = f32[] parameter(\"x\")",
        3,
        22,
        "parameter \"x\" is already declared on line 1",
    );
    fails(
        &format!("{P}output \"y\" = %0\noutput \"y\" = %0"),
        3,
        8,
        "output \"y\" is already declared on line 2",
    );
    fails(&format!("{P}output \"y\" = %1"), 2, 14, "%1 is not defined");
}

#[test]
fn type_errors_come_from_shape_inference_at_the_op() {
    fails(
        &format!("{P}%1 = f32[3] neg(%0)"),
        2,
        13,
        "neg: declared result f32[3] but operands (f32[2]) give f32[2]",
    );
    fails(
        &format!("{P}%1 = f32[2] add(%0)"),
        2,
        16,
        "add takes 2 operands, got 1",
    );
    fails(
        &format!("{P}%1 = f32[2] neg(%0, %0)"),
        2,
        16,
        "neg takes 1 operand, got 2",
    );
    fails(
        "%0 = i32[] constant(1.5)",
        1,
        12,
        "constant: value 1.5 is not a valid i32",
    );
    fails(
        "%0 = bool[] constant(2)",
        1,
        13,
        "constant: value 2 is not a valid bool",
    );
    fails(
        "%0 = f32[2,2] constant([1.0, 2.0])",
        1,
        24,
        "dense constant has 2 values but f32[2,2] has 4 elements",
    );
    fails(
        &format!("{P}%1 = f32[2] all_reduce(%0) op=sum axes=[a]"),
        2,
        13,
        "a collective needs a mesh",
    );
    fails(
        &format!("{P}%1 = bool[2] not(%0)"),
        2,
        14,
        "not: not defined for f32[2]",
    );
}

#[test]
fn mesh_and_sharding_errors() {
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{b}",
        2,
        28,
        "sharding names mesh axis `b`, which mesh [a=2] does not have",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{a, _}",
        2,
        28,
        "has 2 dims but the tensor has rank 1",
    );
    fails(
        "mesh [a=2, b=2]\n%0 = f32[4,4] parameter(\"x\") @{a, a}",
        2,
        30,
        "mesh axis `a` is used twice",
    );
    fails(
        "%0 = f32[4] parameter(\"x\") @{_}",
        1,
        28,
        "a sharding needs a mesh",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{a | full a}",
        2,
        34,
        "expected `partial` after `|`, found `full`",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{a b}",
        2,
        32,
        "expected `,`, `| partial ...` or `}`, found `b`",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{(a b)}",
        2,
        33,
        "expected `,` or `)`, found `b`",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @{[a]}",
        2,
        30,
        "expected `_`, a mesh axis name or `(axis,axis)`, found `[`",
    );
    fails(
        "mesh [a=2]\n%0 = f32[4] parameter(\"x\") @a",
        2,
        29,
        "expected `{` starting a sharding",
    );
    fails("mesh [a=2, a=3]", 1, 12, "mesh axis `a` appears twice");
    fails("mesh [a=0]", 1, 9, "mesh axis `a` has size 0");
    fails("mesh [_=2]", 1, 7, "`_` cannot name a mesh axis");
    fails(
        "mesh [a=1024, b=1024, c=2]",
        1,
        25,
        "too many devices (at most 2^20)",
    );
    fails(
        "mesh [a=2] devices=[0]",
        1,
        20,
        "mesh needs 2 device ids (the product of its axis sizes), got 1",
    );
    fails(
        "mesh [a=2] devices=[1,1]",
        1,
        20,
        "mesh device ids must be distinct",
    );
    fails(
        "mesh [a=2] devices=[0,4294967296]",
        1,
        23,
        "device id 4294967296 is too large",
    );
    fails(
        "mesh [a=2] extra",
        1,
        12,
        "expected `devices=[...]` or end of line, found `extra`",
    );
    fails(
        "mesh [a=2]\nmesh [b=2]",
        2,
        1,
        "the mesh is already declared on line 1",
    );
    fails(
        "%0 = i32[] partition_id()\nmesh [a=2]",
        2,
        1,
        "the mesh must be declared before any instruction",
    );
}

#[test]
fn huge_sizes_are_rejected_without_allocating() {
    fails(
        "%0 = f32[1099511627776,2] parameter(\"x\")",
        1,
        6,
        "type is too large: at most 2^40 elements",
    );
    fails(
        "%0 = f32[18446744073709551615] constant(0)",
        1,
        6,
        "too large",
    );
    fails(
        "%0 = f32[99999999999999999999999] constant(0)",
        1,
        10,
        "a dimension size `99999999999999999999999` is too large",
    );
    // A dense constant that claims 2^40 elements fails on its length, not by allocating.
    fails(
        "%0 = f32[1099511627776] constant([1.0])",
        1,
        34,
        "dense constant has 1 values but f32[1099511627776] has 1099511627776 elements",
    );
    // Zero-sized dims count as 1 towards the bound, so this is fine (and allocates nothing).
    let p = parse("%0 = f32[0,1099511627776] constant(0)\n%1 = f32[1099511627776] constant(1)")
        .unwrap();
    assert_eq!(p.instrs[1].ty.num_elements(), 1 << 40);
    // Ranks and mesh axis counts are bounded too (size-1 axes add no devices).
    let dims = vec!["1"; 65].join(",");
    fails(
        &format!("%0 = f32[{dims}] constant(0)"),
        1,
        138,
        "type has too many dims (at most 64)",
    );
    let axes: Vec<String> = (0..65).map(|i| format!("a{i}=1")).collect();
    let mesh = format!("mesh [{}]", axes.join(", "));
    let col = mesh.find("a64").unwrap() + 1;
    fails(&mesh, 1, col, "the mesh has too many axes (at most 64)");
    // Pad amounts cannot overflow shape arithmetic.
    fails(
        "%0 = f32[2] parameter(\"x\")\n%1 = f32[] constant(0)\n%2 = f32[2] pad(%0, %1) low=[1099511627776] high=[1099511627776]",
        3,
        13,
        "pad: declared result f32[2]",
    );
}

#[test]
fn fuzz_seeds_stay_in_sync_with_the_format() {
    canonical(include_str!("../fuzz/corpus/parse/seed-mlp.txt"));
    canonical(include_str!("../fuzz/corpus/parse/seed-collectives.txt"));
    canonical(include_str!("../fuzz/corpus/parse/seed-conv.txt"));
    fails(
        include_str!("../fuzz/corpus/parse/seed-errors.txt"),
        2,
        6,
        "type is too large",
    );
}

#[test]
fn readable_names_map_in_order_of_definition() {
    let p = parse(
        "%h_1 = f32[2] parameter(\"x\")  # first\n%5 = f32[2] exp(%h_1)\n%0 = f32[2] add(%5, %h_1)\noutput \"o\" = %0",
    )
    .unwrap();
    assert_eq!(
        print(&p),
        "%0 = f32[2] parameter(\"x\")\n%1 = f32[2] exp(%0)\n%2 = f32[2] add(%1, %0)\noutput \"o\" = %2\n"
    );
}

#[test]
fn numbers_in_every_spelling() {
    let p = parse("%0 = f64[8] constant([1, -2, 3.5, 1e3, 1E-3, 2.5e+2, -inf, 7.])").unwrap();
    assert_eq!(
        p.instrs[0].op,
        Op::Constant {
            value: Literal::Dense(vec![
                1.0,
                -2.0,
                3.5,
                1e3,
                1e-3,
                250.0,
                f64::NEG_INFINITY,
                7.0
            ])
        }
    );
    let p = parse("%0 = f64[] constant(nan)\n%1 = f64[] constant(NaN)\n%2 = f64[] constant(-0.0)")
        .unwrap();
    assert!(matches!(p.instrs[0].op, Op::Constant { value: Literal::Splat(v) } if v.is_nan()));
    assert_eq!(print_instr(&p, 1), "%1 = f64[] constant(NaN)");
    assert_eq!(print_instr(&p, 2), "%2 = f64[] constant(-0.0)");
}

#[test]
fn conv_and_reverse_print_parse_and_check_shapes() {
    let src = r#"
%x  = f32[2,8,3] parameter("x")
%w  = f32[3,3,5] parameter("w")
%y  = f32[2,8,5] conv(%x, %w) pad_lo=[1] pad_hi=[1]
%v  = f32[2,6,5] conv(%x, %w) pad_lo=[0] pad_hi=[0]
%x2 = f64[1,4,5,2] parameter("x2")
%w2 = f64[2,3,2,7] parameter("w2")
%y2 = f64[1,5,3,7] conv(%x2, %w2) pad_lo=[1, 0] pad_hi=[1, 0]
%r  = f32[3,3,5] reverse(%w) dims=[0, 1]
output "y" = %y
"#;
    let text = canonical(src);
    assert!(
        text.contains("%2 = f32[2,8,5] conv(%0, %1) pad_lo=[1] pad_hi=[1]"),
        "{text}"
    );
    assert!(
        text.contains("%7 = f32[3,3,5] reverse(%1) dims=[0, 1]"),
        "{text}"
    );
    let x = "%0 = f32[2,8,3] parameter(\"x\")\n";
    fails(
        &format!("{x}%1 = f32[3,4,5] parameter(\"w\")\n%2 = f32[2,8,5] conv(%0, %1) pad_lo=[1] pad_hi=[1]"),
        3,
        17,
        "lhs input features 3 differ from the kernel's 4",
    );
    fails(
        &format!("{x}%1 = f32[3,3,5] parameter(\"w\")\n%2 = f32[2,8,5] conv(%0, %1) pad_lo=[1, 1] pad_hi=[1, 1]"),
        3,
        17,
        "both of rank 4",
    );
    fails(
        &format!("{x}%1 = f32[12,3,5] parameter(\"w\")\n%2 = f32[2,0,5] conv(%0, %1) pad_lo=[1] pad_hi=[1]"),
        3,
        17,
        "kernel spatial dim 0 (12) must be between 1 and pad_lo + size + pad_hi + 1 (11)",
    );
    fails(
        &format!("{x}%1 = f32[3,3,5] parameter(\"w\")\n%2 = f32[2,8,5] conv(%0, %1) pad_lo=[1]"),
        3,
        17,
        "conv needs attribute `pad_hi`",
    );
    fails(
        &format!("{x}%1 = f32[2,8,3] reverse(%0) dims=[1, 1]"),
        2,
        17,
        "dims [1, 1] must be distinct dims of f32[2,8,3]",
    );
}

#[test]
fn scopes_print_as_metadata_and_parse_back() {
    let b = Builder::with_mesh(Mesh::new(&[("data", 2)]).unwrap());
    let x = b.param("x", Type::new(DType::F32, [4, 8]));
    let y = {
        let _enc = b.scope("encoder");
        let _l = b.scope("layer1");
        x.exp()
    };
    let z = {
        let g = b.grad_scope(b.current_scope());
        let prev = b.set_scope(g);
        let z = y.neg();
        b.set_scope(prev);
        z
    };
    let w = {
        let _s = b.enter(ir::Scope {
            grad: true,
            ..ir::Scope::new("encoder/layer1")
        });
        z.abs()
    };
    b.output("w", &w);
    let p = b.finish();
    let text = print(&p);
    assert_eq!(
        text,
        "mesh [data=2]
%0 = f32[4,8] parameter(\"x\")
%1 = f32[4,8] exp(%0) \"encoder/layer1\"
%2 = f32[4,8] neg(%1) \"\" grad
%3 = f32[4,8] abs(%2) \"encoder/layer1\" grad
output \"w\" = %3
"
    );
    let q = parse(&text).unwrap();
    assert_eq!(q, p);
    assert_eq!(q.scope(ir::ValueId(3)).path, "encoder/layer1");
    assert!(q.scope(ir::ValueId(3)).grad);
    // A different scope is a different program; the ids may differ, the paths decide.
    let other = parse(&text.replace("\"encoder/layer1\" grad", "\"encoder/layer2\" grad")).unwrap();
    assert_ne!(other, p);
    let reordered = parse(&text.replace("exp(%0) \"encoder/layer1\"", "exp(%0)")).unwrap();
    assert_ne!(reordered, p);
    // Sharding then scope; a scope takes no attributes after it.
    let s = canonical("mesh [a=2]\n%x = f32[4] parameter(\"x\") @{a} \"in/x\"\n");
    assert!(s.contains("@{a} \"in/x\""), "{s}");
    fails(
        "%0 = f32[] parameter(\"x\") \"s\" dim=1",
        1,
        31,
        "expected `grad`, `checkpoint` or end of line after the scope, found `dim`",
    );
}

#[test]
fn checkpoint_marks_print_and_parse_back() {
    let b = Builder::new();
    let x = b.param("x", Type::new(DType::F32, [4]));
    let z = {
        let _l = b.scope("encoder/layer0");
        let _f = b.checkpoint_scope("ffn");
        let y = x.exp();
        let _n = b.scope("norm");
        y.neg()
    };
    let w = {
        let g = b.grad_scope(b.scope_of(z.id));
        let prev = b.set_scope(g);
        let w = z.abs();
        b.set_scope(prev);
        w
    };
    let v = {
        let _l = b.scope("encoder/layer0/ffn");
        w.exp()
    };
    b.output("v", &v);
    let p = b.finish();
    let text = print(&p);
    assert_eq!(
        text,
        "%0 = f32[4] parameter(\"x\")
%1 = f32[4] exp(%0) \"encoder/layer0/ffn\" checkpoint
%2 = f32[4] neg(%1) \"encoder/layer0/ffn/norm\" checkpoint=\"encoder/layer0/ffn\"
%3 = f32[4] abs(%2) \"encoder/layer0/ffn/norm\" grad checkpoint=\"encoder/layer0/ffn\"
%4 = f32[4] exp(%3) \"encoder/layer0/ffn\"
output \"v\" = %4
"
    );
    let q = parse(&text).unwrap();
    assert_eq!(q, p);
    assert_eq!(
        q.scope(ir::ValueId(3)).checkpoint_region(),
        Some("encoder/layer0/ffn")
    );
    assert!(q.scope(ir::ValueId(3)).grad);
    // The mark is part of the scope: the unmarked path is another program.
    let unmarked = parse(&text.replace(" checkpoint\n", "\n")).unwrap();
    assert_ne!(unmarked, p);
    assert_eq!(unmarked.scope(ir::ValueId(1)).checkpoint_region(), None);
    // A region must contain its scope; the mark ends the line.
    fails(
        "%0 = f32[] parameter(\"x\") \"ab/c\" checkpoint=\"a\"",
        1,
        34,
        "checkpoint region \"a\" does not contain scope \"ab/c\"",
    );
    fails(
        "%0 = f32[] parameter(\"x\") \"\" checkpoint",
        1,
        30,
        "empty checkpoint region",
    );
    fails(
        "%0 = f32[] parameter(\"x\") \"a\" checkpoint=",
        1,
        42,
        "expected a checkpoint region `\"path\"` after `checkpoint=`, found end of line",
    );
    fails(
        "%0 = f32[] parameter(\"x\") \"a\" checkpoint grad",
        1,
        42,
        "expected end of line after the checkpoint mark, found `grad`",
    );
    fails(
        "%0 = f32[] parameter(\"x\") \"a\" grad grad",
        1,
        36,
        "expected `checkpoint` or end of line after `grad`, found `grad`",
    );
    // verify refuses a malformed mark made by hand.
    let mut bad = p.clone();
    let s = bad.scopes.intern(ir::Scope {
        checkpoint: Some("encoder/layer1".into()),
        ..ir::Scope::new("encoder/layer0/ffn")
    });
    bad.instrs[1].scope = s;
    let e = verify(&bad).unwrap_err().to_string();
    assert!(e.contains("does not contain scope"), "{e}");
}
