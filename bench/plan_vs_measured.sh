#!/usr/bin/env bash
# `gshard plan` against measured runs on this machine.
# For each of three run configs at 1 device, 2 (the main job's mesh) and 8 (data=2,expert=4):
# the planned step time on the `this-cpu` profile (measured when planning) and the planned
# peak memory per device, next to the median step time of `gshard train` (steps 4 to the end
# of a short run, from its metrics.jsonl) and the peak per device it measures.
#
# Usage: bench/plan_vs_measured.sh    Env: DATA (the corpus directory, default data; built
#   by `gshard data` when absent), STEPS (default 12), OUT (JSON lines, default
#   bench/results/plan_vs_measured.jsonl), GSHARD (the binary, default
#   the release build under $CARGO_TARGET_DIR or target/).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${DATA:-data}"
steps="${STEPS:-12}"
out="${OUT:-$root/bench/results/plan_vs_measured.jsonl}"
gshard="${GSHARD:-${CARGO_TARGET_DIR:-$root/target}/release/gshard}"
[ -n "${GSHARD:-}" ] || (cd "$root" && cargo build --release -p cli -q)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
: > "$out"

common="steps = $steps
log_every = 1
eval_every = 0
checkpoint_every = 1000000
[data]
dir = \"$data\"
dev_size = 8
"
# The default run's model; a wider one; one with more experts and layers.
printf '%s' "$common" > "$work/default.toml"
printf '%s[model]\nmodel_dim = 128\nheads = 8\nffn_dim = 512\n' "$common" > "$work/wide.toml"
printf '%s[model]\nexperts = 16\nenc_layers = 3\ndec_layers = 3\n' "$common" > "$work/deep.toml"

for name in default wide deep; do
    for mesh in data=1,expert=1 data=1,expert=2 data=2,expert=4; do
        plan=$("$gshard" plan --config "$work/$name.toml" --mesh "$mesh" --hardware this-cpu --json)
        rm -rf "$work/run"
        "$gshard" train --config "$work/$name.toml" --mesh "$mesh" --out "$work/run" > "$work/train.log"
        measured=$(python3 - "$work/run/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l]
times = [r["step_seconds"] for r in recs if r["step"] >= 4]
print(statistics.median(times))
PY
)
        peak=$(grep -o 'peak [0-9.]* [KMG]iB per device' "$work/train.log" | head -1)
        python3 - "$name" "$mesh" "$measured" "$peak" <<PY | tee -a "$out"
import json, sys
plan = json.loads('''$plan''')
name, mesh, measured, peak = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
print(json.dumps({"config": name, "mesh": mesh,
    "planned_step_seconds": plan["step_seconds"], "measured_step_seconds": measured,
    "ratio": plan["step_seconds"] / measured,
    "planned_peak_bytes_per_device": plan["peak_bytes_per_device"], "measured_peak": peak}))
PY
    done
done
