"""Shared set-up of the JAX scripts: N virtual CPU devices (set before jax is imported), the
command-line shape of the MoE layer, and its inputs."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The two shapes of the comparisons (`gshard bench moe-layer` takes the same numbers).
SHAPES = {
    "large": dict(G=128, S=128, E=128, M=256, H=1024, C=2),  # 119 GFLOP per fwd+bwd step
    "small": dict(G=32, S=128, E=32, M=128, H=512, C=4),
}


def parse(description, extra=()):
    """Arguments: --devices N, the layer's shape (--shape large|small, or each of --groups
    --group-size --experts --model-dim --hidden-dim --capacity), and `extra` as
    (name, default) pairs. Sets XLA_FLAGS for N devices; import jax only after this."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--shape", choices=["large", "small"], default="large")
    for k in ("groups", "group-size", "experts", "model-dim", "hidden-dim", "capacity"):
        ap.add_argument("--" + k, type=int, help="overrides --shape")
    for k, d in extra:
        ap.add_argument("--" + k, type=type(d), default=d)
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    for k, letter in (("groups", "G"), ("group_size", "S"), ("experts", "E"),
                      ("model_dim", "M"), ("hidden_dim", "H"), ("capacity", "C")):
        if getattr(a, k) is not None:
            s[letter] = getattr(a, k)
    a.G, a.S, a.E, a.M, a.H, a.C = (s[k] for k in "GSEMHC")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={a.devices}")
    return a


def expert_mesh(n):
    import jax
    from jax.sharding import AxisType
    return jax.make_mesh((n,), ("expert",), axis_types=(AxisType.Auto,))
