#!/usr/bin/env bash
# Step time and compile time of the GShard MoE layer (forward + backward): ours
# (`gshard bench moe-layer --json`) against JAX/XLA (bench/jax/step_time.py), run
# back to back, alternating (who goes first alternates by round), for several rounds, at 1
# and 8 devices, on the large shape G=128 S=128 E=128 M=256 H=1024 C=2 and a smaller one.
# Prints one JSON line per run and a table of medians with the ratios ours/JAX (step time;
# partition+prepare vs lower+compile), the median (and range) of each round's own ratio, and
# the cores' rates probed around every run, ours and JAX's (`gshard bench probe`: FMA chains
# in registers, our GEMM micro-kernel on operands in L2, and the clock; on a shared host
# the first drops by about 30 % in spells that take the FMA pipes, the second in those and
# in spells that slow the caches, and GEMM-bound steps slow with them; the clock tells a
# spell of a lower clock from one of shared pipes; the two sides' runs alternate, so a
# spell can fall on either).
#
# Usage: bench/compare_jax.sh     (run from anywhere; builds target/release)
#   Env: ROUNDS (default 3), STEPS (default 10), DEVICES ("1 8"),
#   SHAPES ("large small"), QUIET_LOAD (wait until the 1-minute load average is below it
#   before each run, default 1.5; waits at most QUIET_WAIT seconds, default 120),
#   OUT (JSON lines file, default bench/results/compare_jax.jsonl).
# Sets up the JAX venv if missing (bench/jax/venv.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds="${ROUNDS:-3}"
steps="${STEPS:-10}"
devices="${DEVICES:-1 8}"
shapes="${SHAPES:-large small}"
quiet_load="${QUIET_LOAD:-1.5}"
quiet_wait="${QUIET_WAIT:-120}"
out="${OUT:-$root/bench/results/compare_jax.jsonl}"
# shellcheck source=bench/jax/venv.sh
. "$root/bench/jax/venv.sh"
(cd "$root" && cargo build --release -p cli -q)
gshard="$root/target/release/gshard"
mkdir -p "$(dirname "$out")"
: > "$out"

shape_args() {
    case "$1" in
        large) echo "--groups 128 --group-size 128 --experts 128 --model-dim 256 --hidden-dim 1024 --capacity 2" ;;
        small) echo "--groups 32 --group-size 128 --experts 32 --model-dim 128 --hidden-dim 512 --capacity 4" ;;
        *) echo "unknown shape $1" >&2; exit 2 ;;
    esac
}

wait_quiet() {
    local waited=0
    while awk -v q="$quiet_load" '{ exit !($1 >= q) }' /proc/loadavg && [ "$waited" -lt "$quiet_wait" ]; do
        sleep 5
        waited=$((waited + 5))
    done
    awk '{ print $1 }' /proc/loadavg
}

for round in $(seq 1 "$rounds"); do
    for shape in $shapes; do
        for d in $devices; do
            args=$(shape_args "$shape")
            # Who goes first alternates by round (ABBA), so a drift in the machine's speed
            # does not favour either side.
            order="ours jax"
            [ $((round % 2)) -eq 0 ] && order="jax ours"
            for who in $order; do
                load=$(wait_quiet)
                if [ "$who" = ours ]; then
                    # shellcheck disable=SC2086
                    line=$("$gshard" bench moe-layer $args --devices "$d" --steps "$steps" --warmup 2 --json)
                    step=$(echo "$line" | "$jax_python" -c 'import json,sys; print(json.load(sys.stdin)["step_seconds"])')
                    comp=$(echo "$line" | "$jax_python" -c 'import json,sys; print(json.load(sys.stdin)["partition_seconds"])')
                else
                    # The same probes as ours, just before and just after (the lower of each).
                    pre=$("$gshard" bench probe --json)
                    # shellcheck disable=SC2086
                    line=$("$jax_python" "$root/bench/jax/step_time.py" $args --devices "$d" --steps "$steps" --warmup 2 2>/dev/null | tail -1)
                    post=$("$gshard" bench probe --json)
                    line=$(printf '%s\n%s\n%s\n' "$line" "$pre" "$post" | "$jax_python" -c '
import json, sys
run, pre, post = (json.loads(l) for l in sys.stdin.read().split("\n")[:3])
for k in ("core_fma_gflops", "core_gemm_gflops", "core_clock_ghz"):
    a, b = pre.get(k), post.get(k)
    run[k] = min(a, b) if a is not None and b is not None else None
print(json.dumps(run))')
                    step=$(echo "$line" | "$jax_python" -c 'import json,sys; print(json.load(sys.stdin)["step_seconds"])')
                    comp=$(echo "$line" | "$jax_python" -c 'import json,sys; print(json.load(sys.stdin)["compile_seconds"])')
                fi
                printf '{"round": %s, "shape": "%s", "devices": %s, "who": "%s", "load": %s, "step_seconds": %s, "compile_seconds": %s, "raw": %s}\n' \
                    "$round" "$shape" "$d" "$who" "$load" "$step" "$comp" "$line" | tee -a "$out"
            done
        done
    done
done

"$jax_python" - "$out" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["shape"], r["devices"]) for r in rows}, key=lambda k: (k[0] != "large", k[1]))
print()
print("| shape | devices | ours step s | JAX step s | step ours/JAX | paired ours/JAX (range) | ours GFLOP/s | core FMA GFLOP/s, ours / JAX runs | core GEMM GFLOP/s, ours / JAX runs | core clock GHz, ours / JAX runs | ours partition+prepare s | JAX lower+compile s | compile ours/JAX | ours peak MiB/device | ours a2a bytes (analytic) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for shape, d in keys:
    o = [r for r in rows if r["shape"] == shape and r["devices"] == d and r["who"] == "ours"]
    j = [r for r in rows if r["shape"] == shape and r["devices"] == d and r["who"] == "jax"]
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    os_, js = med(o, "step_seconds"), med(j, "step_seconds")
    oc, jc = med(o, "compile_seconds"), med(j, "compile_seconds")
    raw = o[-1]["raw"]
    # Each round's ratio (the two runs were back to back), then their median.
    jr = {x["round"]: x["step_seconds"] for x in j}
    pr = sorted(x["step_seconds"] / jr[x["round"]] for x in o if x["round"] in jr)
    # The cores' rates around each run (a shared host's slow spells), as median (range).
    def rates(xs, k, p=0):
        v = sorted(x["raw"][k] for x in xs if x["raw"].get(k))
        return f"{statistics.median(v):.{p}f} ({v[0]:.{p}f}-{v[-1]:.{p}f})" if v else "-"
    fma_s = f"{rates(o, 'core_fma_gflops')} / {rates(j, 'core_fma_gflops')}"
    gemm_s = f"{rates(o, 'core_gemm_gflops')} / {rates(j, 'core_gemm_gflops')}"
    clock_s = f"{rates(o, 'core_clock_ghz', 2)} / {rates(j, 'core_clock_ghz', 2)}"
    print(f"| {shape} | {d} | {os_:.3f} | {js:.3f} | {os_/js:.2f} | {statistics.median(pr):.2f} ({pr[0]:.2f}-{pr[-1]:.2f}) | "
          f"{statistics.median(x['raw']['gflops'] for x in o):.1f} | {fma_s} | {gemm_s} | {clock_s} | "
          f"{oc:.4f} | {jc:.3f} | {oc/jc:.4f} | {raw['peak_bytes_per_device']/2**20:.0f} | "
          f"{raw['all_to_all_bytes']} ({raw['all_to_all_bytes_analytic']}) |")
EOF
