#!/usr/bin/env bash
# In-process A/B of an executor change, immune to this VM's slow spells (which drift over
# minutes and swamp a 3 % difference between two binaries run one after the other).
#
# Method: `step_parity.patch` makes `Executable::run_shared` flip a flag on every run when
# GSHARD_AB is set and print each run's wall time; the change under test reads
# `runtime::exec::ab_on()` and takes the old path when it is true. One `gshard bench
# moe-layer` process then alternates old and new step by step, and the median of the
# per-pair ratios (new-path step / old-path step, adjacent steps) is the effect.
#
# Usage: git apply bench/ab/step_parity.patch; wire `crate::exec::ab_on()` into the change;
#        cargo build --release; bench/ab/abrun.sh DEVICES STEPS   (LARGE=1: the large shape)
# Prints the median step of the runs with the flag off (the new path) and on (the old path)
# and the median of the paired ratios on/off: above 1, the change saves that fraction.
# Revert the patch before committing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
args="--groups 32 --group-size 128 --experts 32 --model-dim 128 --hidden-dim 512 --capacity 4"
[ -n "${LARGE:-}" ] && args="--groups 128 --group-size 128 --experts 128 --model-dim 256 --hidden-dim 1024 --capacity 2"
err=$(mktemp)
# shellcheck disable=SC2086
GSHARD_AB=1 "$root/target/release/gshard" bench moe-layer $args --devices "${1:-8}" \
    --steps "${2:-100}" --warmup 2 --json 2>"$err" >/dev/null
python3 - "$err" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("AB ")][4:]
off = [float(r[2]) for r in rows if r[1] == "0"]
on = [float(r[2]) for r in rows if r[1] == "1"]
pairs = [b / a for a, b in zip(off, on)]
print(f"pairs {len(pairs)}: flag off (new path) median {st.median(off):.2f} ms, "
      f"flag on (old path) median {st.median(on):.2f} ms, "
      f"paired on/off median {st.median(pairs):.4f} mean {st.mean(pairs):.4f}")
PY
rm -f "$err"
