"""Reference vectors of the GShard top-2 MoE layer, computed by JAX (moe.py): every
intermediate tensor, the loss and the gradients, in f32 and in f64, for three configurations.
crates/cli/tests/moe_vectors.rs checks `gshard export moe-layer` + `gshard run` against them on
1 device and partitioned over expert=2 and expert=4 (floats at 1e-5 in f32 and 1e-10 in f64,
routing exactly).

usage: python vectors.py --out DIR [--seed 0]
then:  GSHARD_MOE_VECTORS=DIR cargo nextest run -p cli --test moe_vectors

Each configuration gives DIR/<name>.f32.safetensors and DIR/<name>.f64.safetensors with the
same inputs (drawn in f32, up-cast exactly for f64) and outputs computed in each dtype; the
safetensors metadata holds the configuration (JSON values: G S E M H C policy threshold
activation dtype ...). The loss is sum(y * loss_weight) + 0.01 * aux_loss."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # f64 where asked; f32 inputs stay f32
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import moe  # noqa: E402

CONFIGS = [
    # name, G, S, E, M, H, capacity factor, policy, activation
    ("tiny_cf1_all_relu", 2, 8, 4, 8, 16, 1.0, "all", "relu"),
    ("tiny_cf2_random_relu", 2, 8, 4, 8, 16, 2.0, "random", "relu"),
    ("medium_cf2_all_gelu", 4, 64, 8, 32, 64, 2.0, "all", "gelu_tanh"),
]
THRESHOLD = 0.5


def inputs(rng, G, S, E, M, H, policy):
    f = lambda shape, scale: (rng.standard_normal(shape) * scale).astype(np.float32)
    t = dict(x=f((G, S, M), 1.0), wg=f((M, E), 1.0 / np.sqrt(M)),
             wi=f((E, M, H), 1.0 / np.sqrt(M)), wo=f((E, H, M), 1.0 / np.sqrt(H)),
             loss_weight=f((G, S, M), 1.0))
    if policy == "random":
        t["noise"] = rng.random((G, S)).astype(np.float32)
    return t


def compute(t, C, policy, activation, dtype):
    x, wg, wi, wo, lw = (jnp.asarray(t[k], dtype) for k in ("x", "wg", "wi", "wo", "loss_weight"))
    noise = jnp.asarray(t["noise"], dtype) if "noise" in t else None
    hi = jax.lax.Precision.HIGHEST

    def loss(x, wg, wi, wo):
        y, aux = moe.moe_layer(x, wg, wi, wo, C, activation=activation, policy=policy,
                               noise=noise, threshold=THRESHOLD, precision=hi)
        return jnp.sum(y * lw) + 0.01 * aux

    y, aux, ex = moe.moe_layer(x, wg, wi, wo, C, activation=activation, policy=policy,
                               noise=noise, threshold=THRESHOLD, precision=hi, return_aux=True)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, wg, wi, wo)
    out = {k: v for k, v in ex.items() if v is not None}
    out.update(y=y, aux_loss=aux, loss=loss(x, wg, wi, wo),
               grad_x=grads[0], grad_wg=grads[1], grad_wi=grads[2], grad_wo=grads[3])
    res = {}
    for k, v in out.items():
        v = np.asarray(v)
        res[k] = v.astype(np.int32) if v.dtype.kind in "biu" else v.astype(dtype)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for i, (name, G, S, E, M, H, cf, policy, act) in enumerate(CONFIGS):
        C = moe.capacity_gshard(S, E, cf)
        t = inputs(np.random.default_rng(a.seed + i), G, S, E, M, H, policy)
        for dtype, tag in ((np.float32, "f32"), (np.float64, "f64")):
            tensors = {k: v.astype(dtype) for k, v in t.items()}
            tensors.update(compute(t, C, policy, act, dtype))
            tensors["capacity"] = np.asarray(C, np.int32)
            meta = dict(name=name, dtype=tag, G=G, S=S, E=E, M=M, H=H, C=C, capacity_factor=cf,
                        policy=policy, threshold=THRESHOLD if policy == "random" else None,
                        activation=act, loss="sum(y*loss_weight)+0.01*aux_loss",
                        jax_version=jax.__version__, seed=a.seed + i)
            path = os.path.join(a.out, f"{name}.{tag}.safetensors")
            save_file({k: np.array(v, order="C") for k, v in tensors.items()}, path,
                      metadata={k: json.dumps(v) for k, v in meta.items()})
            kept = int(tensors["kept_1"].sum()), int(tensors["kept_2"].sum())
            print(f"{path}: C={C}, top-1 kept {kept[0]}/{G * S}, top-2 kept {kept[1]}")


if __name__ == "__main__":
    main()
