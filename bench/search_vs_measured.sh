#!/usr/bin/env bash
# `gshard plan --search` against measured runs on this machine.
# Searches a config's layouts on 8 devices (`--hardware this-cpu`, measured when
# planning), takes PICK of the fitting layouts spread evenly over the ranking (fastest,
# slowest and between), trains each for STEPS steps and records the planned step time next
# to the median measured one (steps 4 to the end, from metrics.jsonl); prints the Spearman
# rank correlation of planned against measured. The optimizer is Adafactor without
# momentum or cool-down, as the README's tables were measured.
#
# Usage: bench/search_vs_measured.sh    Env: DATA (the corpus directory, default data),
#   MODEL (lines of the config's [model] table, default none: the main job's model; e.g.
#   MODEL=$'model_dim = 128\nheads = 8\nffn_dim = 512' for the wider one),
#   STEPS (default 12), PICK (default 8), MEMORY (default 16GiB), OUT (JSON lines, default
#   bench/results/search_vs_measured.jsonl), GSHARD (the binary, default the release build
#   under $CARGO_TARGET_DIR or target/).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${DATA:-data}"
steps="${STEPS:-12}"
pick="${PICK:-8}"
model="${MODEL:-}"
memory="${MEMORY:-16GiB}"
out="${OUT:-$root/bench/results/search_vs_measured.jsonl}"
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
[optimizer]
beta1 = 0.0
[optimizer.lr]
cooldown = 0.0
"
printf '%s[model]\n%s\n' "$common" "$model" > "$work/default.toml"
"$gshard" plan --config "$work/default.toml" --search --devices 8 --memory "$memory" \
    --top 100000 --hardware this-cpu --json > "$work/all.json"
python3 - "$work/all.json" "$pick" > "$work/picked.tsv" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); k = int(sys.argv[2])
idx = sorted({round(i * (len(c) - 1) / max(k - 1, 1)) for i in range(k)})
for i in idx:
    x = c[i]
    print("\t".join([str(i + 1), x["mesh"], x["remat"], str(x["capacity_factor"]),
                     x["shard_weights"] or "-", str(x["step_seconds"])]))
PY
while IFS=$'\t' read -r rank mesh remat cf shard planned; do
    printf '%s[model]\n%s\ncapacity_factor = %s\n' "$common" "$model" "$cf" > "$work/run.toml"
    extra=()
    [ "$shard" = "-" ] || extra=(--shard-weights "$shard")
    rm -rf "$work/run"
    "$gshard" train --config "$work/run.toml" --mesh "$mesh" --remat "$remat" "${extra[@]}" \
        --out "$work/run" > "$work/train.log"
    python3 - "$work/run/metrics.jsonl" "$rank" "$mesh" "$remat" "$cf" "$shard" "$planned" <<'PY' | tee -a "$out"
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_seconds"' in l]
measured = statistics.median(r["step_seconds"] for r in recs if r["step"] >= 4)
rank, mesh, remat, cf, shard, planned = sys.argv[2:8]
print(json.dumps({"rank": int(rank), "mesh": mesh, "remat": remat,
    "capacity_factor": float(cf), "shard_weights": "" if shard == "-" else shard,
    "planned_step_seconds": float(planned), "measured_step_seconds": measured,
    "ratio": float(planned) / measured}))
PY
done < "$work/picked.tsv"
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for t in range(i, j + 1):
            r[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return r
p = ranks([r["planned_step_seconds"] for r in rows])
m = ranks([r["measured_step_seconds"] for r in rows])
n = len(rows); mp = sum(p) / n; mm = sum(m) / n
cov = sum((a - mp) * (b - mm) for a, b in zip(p, m))
sd = (sum((a - mp) ** 2 for a in p) * sum((b - mm) ** 2 for b in m)) ** 0.5
print(json.dumps({"spearman": cov / sd if sd else float("nan"), "layouts": n}))
PY
