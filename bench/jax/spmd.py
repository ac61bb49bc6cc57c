"""What XLA's SPMD partitioner makes of the MoE layer's training step on N virtual CPU devices:
the lower+compile time, and the collectives of the optimized program with the bytes each
device sends. The JAX side of bench/compile_time.sh and bench/bytes_vs_jax.sh.

usage: python spmd.py --devices N [--problem fixed|weak] [--reps 3]
  fixed: the large shape (G=128 S=128 E=128 M=256 H=1024 C=2) at every N;
  weak:  G = E = N (one group and one expert per device), S=128 M=64 H=256 C=4.
The step is value_and_grad of sum(y * lw) + 0.01 * aux with respect to x, wg, wi and wo,
lowered from shapes (nothing runs), a fresh function per repetition so nothing is cached.
Prints one JSON line: compile_seconds (median), per collective kind its count and the bytes
one device sends (all-to-all (n-1)/n of its result, a ring all-reduce 2(n-1)/n of it,
all-gather (n-1)/n, reduce-scatter (n-1) x, collective-permute 1 x; n the group size), and
the optimized program's line count."""
import argparse
import json
import os
import re
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--devices", type=int, default=2)
ap.add_argument("--problem", choices=["fixed", "weak"], default="fixed")
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
n = a.devices
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={n}")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import moe  # noqa: E402

if a.problem == "fixed":
    G, S, E, M, H, C = 128, 128, 128, 256, 1024, 2
else:
    G, S, E, M, H, C = n, 128, n, 64, 256, 4
mesh = jax.make_mesh((n,), ("expert",), axis_types=(AxisType.Auto,))
sds = lambda shape, *s: jax.ShapeDtypeStruct(shape, jnp.float32,
                                             sharding=NamedSharding(mesh, P(*s)))
args = (sds((G, S, M), "expert"), sds((M, E)), sds((E, M, H), "expert"),
        sds((E, H, M), "expert"), sds((G, S, M), "expert"))


def fresh_step():
    constrain = moe.expert_constrain(mesh)

    def loss(x, wg, wi, wo, lw):
        y, aux = moe.moe_layer(x, wg, wi, wo, C, constrain=constrain)
        return jnp.sum(y * lw) + 0.01 * aux
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


times = []
for _ in range(a.reps):
    step = fresh_step()
    t0 = time.perf_counter()
    compiled = step.lower(*args).compile()
    times.append(time.perf_counter() - t0)
hlo = compiled.as_text()

# Collectives of the optimized HLO. A tuple result (the CPU backend splits an all-to-all into
# one slice per peer and combines the all-reduces into one) counts its parts' bytes; an async
# *-start counts its output half, its *-done nothing.
BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "u64": 8, "s32": 4, "u32": 4,
         "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}
KINDS = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+(?P<op>"
                   + "|".join(KINDS) + r")(?P<suffix>-start|-done)?\((?P<rest>.*)$")
ARRAY = re.compile(r"\b(" + "|".join(BYTES) + r")\[([\d,]*)\]")


def group_size(rest):
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", rest)
    if m:
        return int(m.group(2))
    m = re.search(r"replica_groups=\{\{([^}]*)\}", rest)
    if m:
        return len([t for t in m.group(1).split(",") if t.strip()])
    return 2 if "source_target_pairs=" in rest else n


def sent(kind, payload, k):
    if k <= 1:
        return 0.0
    return payload * {"all-to-all": (k - 1) / k, "all-reduce": 2 * (k - 1) / k,
                      "all-gather": (k - 1) / k, "reduce-scatter": k - 1,
                      "collective-permute": 1}[kind]


stats = {k: {"count": 0, "tensors": 0, "bytes_sent": 0.0} for k in KINDS}
for line in hlo.splitlines():
    m = INSTR.match(line)
    if not m or m.group("suffix") == "-done":
        continue
    arrays = ARRAY.findall(m.group("shape"))
    if m.group("suffix") == "-start":
        arrays = arrays[len(arrays) // 2:]
    payload = 0
    for dt, dims in arrays:
        size = BYTES[dt]
        for d in filter(None, dims.split(",")):
            size *= int(d)
        payload += size
    st = stats[m.group("op")]
    st["count"] += 1
    st["tensors"] += max(1, len(arrays))
    st["bytes_sent"] += sent(m.group("op"), payload, group_size(m.group("rest")))

print(json.dumps({
    "devices": n, "problem": a.problem, "G": G, "S": S, "E": E, "M": M, "H": H, "C": C,
    "compile_seconds": statistics.median(times), "compile_all": times,
    "hlo_lines": hlo.count("\n"), "jax": jax.__version__,
    "collectives": {k: v for k, v in stats.items() if v["count"]},
    "bytes_sent_per_device": sum(v["bytes_sent"] for v in stats.values()),
}))
