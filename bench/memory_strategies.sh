#!/usr/bin/env bash
# Per-device memory of one model under each parallelism strategy on 1, 2, 4 and 8 devices,
# from `gshard plan` (the executor's own buffer planning: the peak is the one the executor
# measures). Prints the README's table: weights, gradients and optimizer state held per
# device, the activations saved for the backward pass, and the step's peak.
#
# Usage: bench/memory_strategies.sh    Env: CONFIG (default bench/mid.toml), GSHARD (the
#   binary, default target/release/gshard, built when absent).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${CONFIG:-$root/bench/mid.toml}"
gshard="${GSHARD:-${CARGO_TARGET_DIR:-$root/target}/release/gshard}"
[ -n "${GSHARD:-}" ] || (cd "$root" && cargo build --release -p cli -q)

row() { # label mesh [plan flags...]
  local label="$1" mesh="$2"
  shift 2
  "$gshard" plan --config "$config" --mesh "$mesh" --hardware this-cpu --json "$@" \
    | LABEL="$label" MESH="$mesh" python3 -c '
import json, os, sys
r = json.load(sys.stdin); h = r["held"]; M = 2**20
print("| %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f |" % (os.environ["LABEL"], os.environ["MESH"],
      h["weights"] / M, h["gradients"] / M, h["optimizer_state"] / M,
      h["saved_activations"] / M, r["peak_bytes_per_device"] / M))'
}

echo "| strategy | mesh | weights | gradients | optimizer state | saved activations | peak |"
echo "|---|---|---|---|---|---|---|"
row "one device" "data=1"
for n in 2 4 8; do row "data" "data=$n"; done
for n in 2 4 8; do row "data, weights sharded over data" "data=$n" --shard-weights data; done
for n in 2 4 8; do row "model" "model=$n"; done
for n in 2 4 8; do row "expert" "expert=$n"; done
row "data x expert" "data=2,expert=4"
row "data x expert, weights sharded over data" "data=2,expert=4" --shard-weights data
row "data x model x expert" "data=2,model=2,expert=2"
row "data x model x expert, weights sharded over data" "data=2,model=2,expert=2" \
  --shard-weights data
