#!/usr/bin/env bash
# The MoE layer's step time on the multi-host test bed (scripts/testbed), one row per
# communication option: flat, chunked (blocking), overlapped, bf16 / fp8 all-to-alls,
# two-level, and a combination; for 2 hosts x 1 rank and 2 hosts x 2 ranks at RATE.
# Root only (network namespaces). Prints a Markdown table and appends the JSON lines to
# bench/results/testbed_moe.jsonl.
#
#   bench/testbed_moe.sh          # RATE=1gbit STEPS=9 ROUNDS=3 LAYOUTS="1 2" HIDDEN=256 ROWS="..."
#
# Every round runs every row once (so a slow spell of the shared host hits all rows
# alike); each cell is the median over the rounds of each run's median step.
#
# GSHARD=path/to/gshard uses that binary (built with --features mpi) instead of building
# the release one.
# The layer: 32 groups of 32 tokens, 4 experts, model dim 2048, hidden dim HIDDEN (256),
# capacity 16: few FLOPs per byte sent, so that the link matters on a 2-core machine. Overlap
# can hide at most the expert work a chunk's all-to-all flies behind: HIDDEN=1024 gives the
# experts four times the work for the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-1gbit}
STEPS=${STEPS:-9}
ROUNDS=${ROUNDS:-3}
LAYOUTS=${LAYOUTS:-"1 2"}
HIDDEN=${HIDDEN:-256}
OUT=bench/results/testbed_moe.jsonl
B="${GSHARD:-${CARGO_TARGET_DIR:-target}/release/gshard}"
[ -n "${GSHARD:-}" ] || cargo build --release -p cli --features mpi -q >&2
scripts/testbed up --hosts 2 --rate "$RATE" >&2
trap 'scripts/testbed down >&2' EXIT
LAYER=(--groups 32 --group-size 32 --experts 4 --model-dim 2048 --hidden-dim "$HIDDEN"
  --capacity-factor 1 --steps "$STEPS" --warmup 2 --prepare-reps 1 --json)
TMP=$(mktemp)
ALL_ROWS='flat|--overlap 1
chunks 2, blocking|--overlap 2 --blocking
overlap 2|--overlap 2
chunks 4, blocking|--overlap 4 --blocking
overlap 4|--overlap 4
all-to-all bf16|--compress all-to-all
all-to-all fp8|--compress all-to-all:fp8
two-level|--all-to-all two-level
overlap 2 + fp8 + two-level|--overlap 2 --compress all-to-all:fp8 --all-to-all two-level
overlap 4 + fp8|--overlap 4 --compress all-to-all:fp8'
for round in $(seq "$ROUNDS"); do
for per in $LAYOUTS; do
  while IFS='|' read -r name args; do
    # shellcheck disable=SC2086
    line=$(scripts/testbed mpirun --per-host "$per" -- "$B" bench moe-layer --backend mpi \
      "${LAYER[@]}" $args 2>/dev/null </dev/null | tail -1)
    echo "{\"layout\": \"2x$per\", \"rate\": \"$RATE\", \"hidden_dim\": $HIDDEN, \"round\": $round, \"row\": \"$name\", \"result\": $line}" | tee -a "$OUT" >>"$TMP"
  done <<<"${ROWS:-$ALL_ROWS}"
done
done
python3 - "$TMP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = {}
for r in rows:
    runs.setdefault((r["layout"], r["row"]), []).append(r["result"])
def med(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
keys = ("step_seconds", "all_to_all_blocking_seconds")
by = {k: {x: med([r[x] for r in v]) for x in keys} for k, v in runs.items()}
layouts = sorted({r["layout"] for r in rows})
print("| option | " + " | ".join(f"{l} step | {l} all-to-all (blocking) | {l} vs flat" for l in layouts) + " |")
print("|---|" + "---|---|---|" * len(layouts))
names = []
for r in rows:
    if r["row"] not in names:
        names.append(r["row"])
for n in names:
    cells = []
    for l in layouts:
        r, f = by[(l, n)], by[(l, "flat")]
        cells += [f"{r['step_seconds']*1e3:.0f} ms", f"{r['all_to_all_blocking_seconds']*1e3:.0f} ms",
                  f"{f['step_seconds']/r['step_seconds']:.2f}x"]
    print(f"| {n} | " + " | ".join(cells) + " |")
for l in layouts:
    for k in (2, 4):
        if (l, f"overlap {k}") not in by or (l, f"chunks {k}, blocking") not in by:
            continue
        b, o = by[(l, f"chunks {k}, blocking")], by[(l, f"overlap {k}")]
        a, w = b["all_to_all_blocking_seconds"], o["all_to_all_blocking_seconds"]
        hid = 1 - w / a if a > 0 else float("nan")
        print(f"{l}: overlap {k} hides {100*hid:.0f}% of the chunked all-to-alls' "
              f"{a*1e3:.0f} ms (blocked {w*1e3:.0f} ms at its waits; step "
              f"{b['step_seconds']*1e3:.0f} -> {o['step_seconds']*1e3:.0f} ms)")
PY
rm -f "$TMP"
