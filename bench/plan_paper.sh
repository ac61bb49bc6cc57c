#!/usr/bin/env bash
# GShard's Table 1 models and the 1T-parameter model planned on TPU v3 (`gshard plan
# --preset P --json`, one expert per device): our parameter count against the paper's,
# the per-device memory (as the preset is, and with `--remat layer`), the predicted steps/s
# against Table 3's, and the all-to-all share of the predicted step. Then §5.3's scaling:
# all-reduce and all-to-all per step of the 36-layer models from 128 to 2,048 devices, as
# planned and with the profile's per-hop start-up set to zero. Then the cost of
# planning the 600B model at 2 and at 2,048 devices: wall time and peak resident set of the
# `gshard plan` process (7 runs each, alternating).
#
# Usage: bench/plan_paper.sh    Env: OUT (JSON lines, default
#   bench/results/plan_paper.jsonl), GSHARD (the binary, default the release build of
#   `cargo build --release -p cli`, under $CARGO_TARGET_DIR or target/).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/bench/results/plan_paper.jsonl}"
gshard="${GSHARD:-${CARGO_TARGET_DIR:-$root/target}/release/gshard}"
[ -n "${GSHARD:-}" ] || (cd "$root" && cargo build --release -p cli -q)
mkdir -p "$(dirname "$out")"

TPU_V3_TOML="$root/crates/plan/hardware/tpu-v3.toml" python3 - "$gshard" "$out" <<'PY'
import json, os, statistics, subprocess, sys, time

gshard, out = sys.argv[1], sys.argv[2]
presets = ["gshard-128e-12l", "gshard-128e-36l", "gshard-512e-12l", "gshard-512e-36l",
           "gshard-2048e-12l", "gshard-2048e-36l", "gshard-2048e-60l"]

def plan(*args):
    """(report, wall seconds, peak resident bytes) of one `gshard plan ... --json`."""
    t0 = time.perf_counter()
    p = subprocess.Popen([gshard, "plan", *args, "--json"], stdout=subprocess.PIPE)
    text = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"gshard plan {' '.join(args)} failed ({p.returncode})")
    return json.loads(text), wall, usage.ru_maxrss * 1024  # Linux: KiB

def gib(b):
    return f"{b / 2**30:.2f} GiB"

rows = []
with open(out, "w") as f:
    print("| model | devices | parameters, ours / paper | ratio | memory per device | "
          "with `--remat layer` | steps/s, predicted / Table 3 | ratio | all-to-all share "
          "of the step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in presets:
        r, _, _ = plan("--preset", name)
        remat, _, _ = plan("--preset", name, "--remat", "layer")
        pre = r["preset"]
        t = r["time"]
        a2a = sum(v for k, v in t["collectives"].items() if k.startswith("all_to_all"))
        share = a2a / r["step_seconds"]
        steps = 1.0 / r["step_seconds"]
        paper_steps = pre["paper_steps_per_s"]
        row = {"preset": name, "devices": r["devices"], "params": r["params"],
               "paper_params": pre["paper_params"],
               "resident_bytes_per_device": r["resident_bytes_per_device"],
               "remat_layer_resident_bytes_per_device": remat["resident_bytes_per_device"],
               "remat_layer_step_seconds": remat["step_seconds"],
               "peak_bytes_per_device": r["peak_bytes_per_device"],
               "step_seconds": r["step_seconds"], "paper_steps_per_s": paper_steps,
               "all_to_all_share": share, "mfu": r["mfu"]}
        f.write(json.dumps(row) + "\n")
        steps_cell = (f"{steps:.2f} / {paper_steps:.2f} | {steps / paper_steps:.2f}"
                      if paper_steps else f"{steps:.2f} / - | -")
        label = name + (f" ({pre['alias']})" if pre["alias"] else "")
        print(f"| {label} | {r['devices']} | {r['params'] / 1e9:.1f} G / "
              f"{pre['paper_params'] / 1e9:.1f} G | {r['params'] / pre['paper_params']:.3f} | "
              f"{gib(r['resident_bytes_per_device'])} | "
              f"{gib(remat['resident_bytes_per_device'])} | {steps_cell} | {100 * share:.1f} % |")

    # §5.3: all-reduce about flat, all-to-all about sqrt(D). The same models planned on
    # a copy of the TPU v3 profile without per-hop start-up separate bandwidth from
    # latency (the partitioner does not combine the gradient all-reduces as XLA does).
    import re, tempfile
    with open(os.environ["TPU_V3_TOML"]) as src:
        text = re.sub(r"(?m)^latency_s = .*$", "latency_s = 0.0", src.read())
    no_latency = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    no_latency.write(text.replace('name = "tpu-v3"', 'name = "tpu-v3-no-latency"'))
    no_latency.close()
    def seconds(r, kind):
        return sum(v for k, v in r["time"]["collectives"].items() if k.startswith(kind))
    def sent(r, kind):
        return sum(c["bytes"] for c in r["collective_bytes"] if c["kind"] == kind)
    print()
    print("| model | devices | sqrt(D / 128) | all-reduce: GiB sent per device, seconds "
          "(without start-up) | all-to-all: GiB sent per device, seconds (without start-up) |")
    print("|---|---|---|---|---|")
    for name in ["gshard-128e-36l", "gshard-512e-36l", "gshard-2048e-36l"]:
        r, _, _ = plan("--preset", name)
        z, _, _ = plan("--preset", name, "--hardware", no_latency.name)
        row = {"preset": name, "devices": r["devices"],
               "all_reduce_bytes": sent(r, "all_reduce"),
               "all_reduce_seconds": seconds(r, "all_reduce"),
               "all_reduce_seconds_no_latency": seconds(z, "all_reduce"),
               "all_to_all_bytes": sent(r, "all_to_all"),
               "all_to_all_seconds": seconds(r, "all_to_all"),
               "all_to_all_seconds_no_latency": seconds(z, "all_to_all")}
        f.write(json.dumps(row) + "\n")
        print(f"| {name} | {r['devices']} | {(r['devices'] / 128) ** 0.5:.1f} | "
              f"{row['all_reduce_bytes'] / 2**30:.2f}, {row['all_reduce_seconds']:.3f} s "
              f"({row['all_reduce_seconds_no_latency']:.3f} s) | "
              f"{row['all_to_all_bytes'] / 2**30:.2f}, {row['all_to_all_seconds']:.3f} s "
              f"({row['all_to_all_seconds_no_latency']:.3f} s) |")
    os.unlink(no_latency.name)

    print()
    print("| gshard-600b planned at | wall time, median (fastest) | peak resident set | "
          "plan_seconds (inside), median | instructions per device |")
    print("|---|---|---|---|---|")
    meshes = ["expert=2", "expert=2048"]
    runs = {m: [] for m in meshes}
    for i in range(7):  # alternating, so a slow spell of a shared host hits both
        for mesh in meshes if i % 2 == 0 else meshes[::-1]:
            runs[mesh].append(plan("--preset", "gshard-600b", "--mesh", mesh))
    for mesh in meshes:
        walls = [w for _, w, _ in runs[mesh]]
        rss = max(m for _, _, m in runs[mesh])
        inside = statistics.median(r["plan_seconds"] for r, _, _ in runs[mesh])
        r = runs[mesh][0][0]
        f.write(json.dumps({"preset": "gshard-600b", "mesh": mesh, "wall_seconds": walls,
                            "max_rss_bytes": rss, "plan_seconds": inside,
                            "instructions": r["instructions"]}) + "\n")
        print(f"| {r['devices']} devices (`--mesh {mesh}`) | {statistics.median(walls):.2f} s "
              f"({min(walls):.2f} s) | {rss / 2**20:.0f} MiB | {inside:.2f} s | "
              f"{r['instructions']} |")
PY
