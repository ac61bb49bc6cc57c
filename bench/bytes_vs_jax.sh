#!/usr/bin/env bash
# Bytes each device sends through collectives in one forward+backward step of the MoE layer's
# large shape (G=128 S=128 E=128 M=256 H=1024 C=2), ours against JAX's, at 2 to 128 devices.
# Ours: what the executor's collectives send (`gshard bench moe-layer --json --steps 1`,
# mesh expert=N; all-to-alls (N-1)/N of their result, all-reduces ring-counted 2(N-1)/N).
# JAX's: the collectives of XLA's optimized program for the same step and layout, counted
# the same way (bench/jax/spmd.py). Both are exact counts: they do not depend on the host.
#
# Usage: bench/bytes_vs_jax.sh     Env: DEVICES ("2 4 8 16 32 64 128"),
#   OUT (JSON lines, default bench/results/bytes_vs_jax_large.jsonl).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
devices="${DEVICES:-2 4 8 16 32 64 128}"
out="${OUT:-$root/bench/results/bytes_vs_jax_large.jsonl}"
# shellcheck source=bench/jax/venv.sh
. "$root/bench/jax/venv.sh"
(cd "$root" && cargo build --release -p cli -q)
gshard="$root/target/release/gshard"
mkdir -p "$(dirname "$out")"
: > "$out"

for d in $devices; do
    ours=$("$gshard" bench moe-layer --groups 128 --group-size 128 --experts 128 --model-dim 256 \
        --hidden-dim 1024 --capacity 2 --devices "$d" --steps 1 --warmup 0 --prepare-reps 1 --json)
    jax=$("$jax_python" "$root/bench/jax/spmd.py" --devices "$d" --problem fixed --reps 1 2>/dev/null | tail -1)
    printf '%s\n%s\n' "$ours" "$jax" | "$jax_python" -c '
import json, sys
ours, jax = (json.loads(l) for l in sys.stdin.read().strip().split("\n"))
d = ours["devices"]
kinds = {c["kind"]: c for c in ours["collectives"]}
per_dev = lambda k: kinds[k]["bytes"] / d if k in kinds else 0
jc = jax["collectives"]
print(json.dumps({
    "devices": d,
    "ours_all_to_all_bytes": per_dev("all_to_all"), "ours_all_reduce_bytes": per_dev("all_reduce"),
    "ours_all_to_all_count": kinds.get("all_to_all", {}).get("count", 0),
    "ours_all_reduce_count": kinds.get("all_reduce", {}).get("count", 0),
    "ours_all_to_all_equals_analytic": ours["all_to_all_bytes"] == ours["all_to_all_bytes_analytic"],
    "jax_all_to_all_bytes": jc.get("all-to-all", {}).get("bytes_sent", 0),
    "jax_all_reduce_bytes": jc.get("all-reduce", {}).get("bytes_sent", 0),
    "jax_collectives": jc, "jax": jax["jax"],
}))' | tee -a "$out"
done

"$jax_python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| devices | ours all-to-all MiB | ours all-reduce KiB | ours total MiB | JAX total MiB |")
print("|---|---|---|---|---|")
for r in rows:
    ours = r["ours_all_to_all_bytes"] + r["ours_all_reduce_bytes"]
    jax = r["jax_all_to_all_bytes"] + r["jax_all_reduce_bytes"]
    print(f"| {r['devices']} | {r['ours_all_to_all_bytes'] / 2**20:.3f} | "
          f"{r['ours_all_reduce_bytes'] / 2**10:.1f} | {ours / 2**20:.3f} | {jax / 2**20:.3f} |")
PY
