"""Median forward+backward step time of the GShard MoE layer in JAX on N virtual CPU devices,
and its lower+compile time: the JAX side of bench/compare_jax.sh.

usage: python step_time.py --devices N [--shape large|small] [--steps 10] [--warmup 2]
Prints one JSON line: {"devices", "step_seconds", "compile_seconds"}. Mesh: one axis `expert`
(moe.EXPERT_LAYOUT: x split on G, the expert buffers and wi/wo on E)."""
import json
import statistics
import time

import common

a = common.parse(__doc__.split("\n")[0], [("steps", 10), ("warmup", 2)])
import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import moe  # noqa: E402

G, S, E, M, H, C = a.G, a.S, a.E, a.M, a.H, a.C
mesh = common.expert_mesh(a.devices)
ns = lambda *s: NamedSharding(mesh, P(*s))
rng = np.random.default_rng(0)
x = jax.device_put(rng.standard_normal((G, S, M), np.float32), ns("expert"))
wg = jax.device_put(rng.standard_normal((M, E), np.float32) * 0.1, ns())
wi = jax.device_put(rng.standard_normal((E, M, H), np.float32) * 0.05, ns("expert"))
wo = jax.device_put(rng.standard_normal((E, H, M), np.float32) * 0.05, ns("expert"))
lw = jax.device_put(rng.standard_normal((G, S, M), np.float32), ns("expert"))
constrain = moe.expert_constrain(mesh)


def loss(x, wg, wi, wo):
    y, aux = moe.moe_layer(x, wg, wi, wo, C, constrain=constrain)
    return jnp.sum(y * lw) + 0.01 * aux


step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
t0 = time.perf_counter()
compiled = step.lower(x, wg, wi, wo).compile()
tc = time.perf_counter() - t0
for _ in range(a.warmup):
    jax.block_until_ready(compiled(x, wg, wi, wo))
ts = []
for _ in range(a.steps):
    t = time.perf_counter()
    jax.block_until_ready(compiled(x, wg, wi, wo))
    ts.append(time.perf_counter() - t)
print(json.dumps({"devices": a.devices, "step_seconds": statistics.median(ts),
                  "compile_seconds": tc}))
