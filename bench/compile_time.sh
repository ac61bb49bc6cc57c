#!/usr/bin/env bash
# Compile time against the device count, ours and JAX's.
# Ours: `gshard bench partition` (propagation + partitioning of a 6+6-layer MoE Transformer
# training step, median of 5, at each device count; it also checks that the per-device
# programs differ only in numeric constants).
# JAX's: lower + compile of one MoE layer's training step with one group and one expert per
# device (G = E = N; bench/jax/spmd.py --problem weak), median of 3 (1 above 128 devices).
#
# Usage: bench/compile_time.sh     Env: DEVICES ("2 8 64 512 2048"; JAX at 2048 devices
#   takes minutes and several GiB), OUT (JSON lines, default bench/results/compile_time.jsonl).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
devices="${DEVICES:-2 8 64 512 2048}"
out="${OUT:-$root/bench/results/compile_time.jsonl}"
# shellcheck source=bench/jax/venv.sh
. "$root/bench/jax/venv.sh"
(cd "$root" && cargo build --release -p cli -q)
gshard="$root/target/release/gshard"
mkdir -p "$(dirname "$out")"
: > "$out"

"$gshard" bench partition --devices "$(echo "$devices" | tr ' ' ',')" --json \
    | sed 's/^{/{"who": "ours", /' | tee -a "$out"
for d in $devices; do
    reps=3
    [ "$d" -gt 128 ] && reps=1
    "$jax_python" "$root/bench/jax/spmd.py" --devices "$d" --problem weak --reps "$reps" 2>/dev/null \
        | tail -1 | sed 's/^{/{"who": "jax", /' | tee -a "$out"
done

"$jax_python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours = {r["devices"]: r["seconds"] for r in rows if r["who"] == "ours"}
jax = {r["devices"]: r["compile_seconds"] for r in rows if r["who"] == "jax"}
ds = sorted(set(ours) | set(jax))
print()
print("| devices | " + " | ".join(map(str, ds)) + " |")
print("|---" * (len(ds) + 1) + "|")
print("| ours, s | " + " | ".join(f"{ours[d]:.3f}" if d in ours else "-" for d in ds) + " |")
print("| JAX, s | " + " | ".join(f"{jax[d]:.2f}" if d in jax else "-" for d in ds) + " |")
PY
