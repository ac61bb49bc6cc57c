"""XLA's own memory estimate of the MoE step that step_time.py times: compiles it and prints
compiled.memory_analysis() as one JSON line, to put beside `gshard bench moe-layer`'s
peak_bytes_per_device.

usage: python memory.py --devices N [--shape large|small]
XLA reports argument, output, alias and temp bytes of the compiled executable; with N virtual
devices these are per device (one SPMD program). total_bytes = arguments + outputs - aliases
+ temporaries."""
import json

import common

a = common.parse(__doc__.split("\n")[0])
import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import moe  # noqa: E402

G, S, E, M, H, C = a.G, a.S, a.E, a.M, a.H, a.C
mesh = common.expert_mesh(a.devices)
sds = lambda shape, *s: jax.ShapeDtypeStruct(shape, jnp.float32,
                                             sharding=NamedSharding(mesh, P(*s)))
constrain = moe.expert_constrain(mesh)


def loss(x, wg, wi, wo, lw):
    y, aux = moe.moe_layer(x, wg, wi, wo, C, constrain=constrain)
    return jnp.sum(y * lw) + 0.01 * aux


step = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
compiled = step.lower(sds((G, S, M), "expert"), sds((M, E)), sds((E, M, H), "expert"),
                      sds((E, H, M), "expert"), sds((G, S, M), "expert")).compile()
m = compiled.memory_analysis()
fields = ["argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes"]
out = {"devices": a.devices, "shape": a.shape}
for f in fields:
    out[f] = getattr(m, f, None)
if all(out.get(f) is not None for f in fields[:4]):
    out["total_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                          - out["alias_size_in_bytes"] + out["temp_size_in_bytes"])
print(json.dumps(out))
