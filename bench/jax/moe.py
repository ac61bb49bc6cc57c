"""GShard top-2 MoE feed-forward layer in JAX (einsum formulation): the JAX side of every
comparison in bench/ (step time, memory, compile time, collective bytes, reference vectors).

Written from the semantics of
  * tensorflow/lingvo  lingvo/core/gshard_layers.py  Top2GatingOnLogits
  * google/praxis      praxis/gshard_utils.py        top2_gating_on_logits
with legacy_mtf_behavior=True (the setting used by both the lingvo GShard
builder and praxis' TransformerFeedForwardMoe), no paddings, no importance.

Shapes / letters (as in the GShard paper and the reference code):
  G groups, S tokens per group ("group size"), E experts, C expert capacity
  (slots per expert *per group*), M model dim, H expert hidden dim.

Top-2 gating (per group g, all ops below are exactly what the reference does):
  raw      = softmax(logits, axis=E)            # exp(l - max_e l) / sum_e(...)
  index_1  = argmax_e raw                       # ties -> lowest expert index
  mask_1   = one_hot(index_1, E)                # int32
  gate_1   = sum_e raw * mask_1
  raw_wo1  = raw * (1 - mask_1)
  index_2  = argmax_e raw_wo1                   # ties -> lowest expert index
  mask_2   = one_hot(index_2, E)
  gate_2   = sum_e raw_wo1 * mask_2
  denom    = gate_1 + gate_2 + 1e-9             # legacy_mtf_behavior: normalise
  gate_1  /= denom ; gate_2 /= denom            # BEFORE capacity / random drop
  pos_1    = exclusive_cumsum_S(mask_1)         # [G,S,E]
  density_1       = mean_S(mask_1)              # [G,E] (before capacity!)
  density_1_proxy = mean_S(raw)                 # [G,E]
  aux_loss = mean_{G,E}(density_1_proxy * density_1) * E * E
  mask_1  *= (pos_1 < C)                        # overflow dropped
  pos_1    = sum_e pos_1 * mask_1               # [G,S]
  count_1  = sum_S mask_1                       # [G,E] accepted top-1 per expert
  flat_1   = sum_e mask_1                       # [G,S] 1 = kept, 0 = dropped
  if policy == 'random':                        # GShard "random routing"
      keep_2  = noise < gate_2 / max(threshold, 1e-9)   # noise: [G,S] U[0,1)
      gate_2 *= keep_2 ; mask_2 *= keep_2
  pos_2    = exclusive_cumsum_S(mask_2) + count_1[:, None, :]
  mask_2  *= (pos_2 < C)
  pos_2    = sum_e pos_2 * mask_2 ; flat_2 = sum_e mask_2
  gate_1  *= flat_1 ; gate_2 *= flat_2
  combine[g,s,e,c] = gate_1 * [e==index_1][c==pos_1] + gate_2 * [e==index_2][c==pos_2]
  dispatch = (combine != 0)                     # reference: combine.astype(bool)

MoE layer:
  logits          = einsum('GSM,ME->GSE',   x, wg)
  expert_inputs   = einsum('GSEC,GSM->EGCM', dispatch, x)
  h               = act(einsum('EGCM,EMH->EGCH', expert_inputs, wi))
  expert_outputs  = einsum('EGCH,EHM->EGCM', h, wo)
  y               = einsum('GSEC,EGCM->GSM', combine, expert_outputs)

Gradients: index/mask/position/dispatch tensors are piecewise constant (no
gradient).  Gradient flows through combine -> gate_1/gate_2 (incl. the
1e-9-normalisation) -> raw -> logits, and through aux_loss via
density_1_proxy only (density_1 is a count).

Expert capacity C: see capacity_gshard() below (GShard, Lepikhin et al. 2020,
arXiv 2006.16668); the gating itself takes C as an explicit integer so every
implementation can be fed the same C.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax


# --------------------------------------------------------------------------
# Expert capacity
# --------------------------------------------------------------------------
def capacity_gshard(S: int, E: int, capacity_factor: float) -> int:
    """C = ceil(2 * S * capacity_factor / E)   (GShard paper: C = 2N/E, x cf).

    Computed in exact rational arithmetic on the binary value of
    capacity_factor (no floating point rounding), floored at 1.
    """
    c = math.ceil(Fraction(2 * S) * Fraction(capacity_factor) / E)
    return max(1, int(c))


# --------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------
def relu(x):
    return jnp.maximum(x, 0)


def gelu_tanh(x):
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (jax.nn.gelu default)
    return jax.nn.gelu(x, approximate=True)


def gelu_erf(x):
    # 0.5 x (1 + erf(x / sqrt(2)))
    return jax.nn.gelu(x, approximate=False)


ACTIVATIONS = {"relu": relu, "gelu_tanh": gelu_tanh, "gelu": gelu_tanh,
               "gelu_erf": gelu_erf}


# --------------------------------------------------------------------------
# Top-2 gating
# --------------------------------------------------------------------------
def _excl_cumsum_s(m):
    """Exclusive cumulative sum over the S axis (axis 1) of a [G,S,E] tensor."""
    return jnp.cumsum(m, axis=1, dtype=m.dtype) - m


def top2_gating(logits, capacity: int, *, policy: str = "all", noise=None,
                threshold: float = 0.5, eps: float = 1e-9):
    """GShard top-2 gating on logits [G,S,E].

    policy: 'all'    -> deterministic: always route to the 2nd expert
                        (capacity permitting).  noise is ignored.
            'random' -> GShard random routing with the uniform noise given
                        explicitly as a [G,S] tensor in [0,1): the 2nd expert
                        is kept iff noise < gate_2 / max(threshold, 1e-9)
                        (gate_2 already normalised).  threshold=0.5 gives the
                        paper's "keep with probability 2*g2".
    Returns a dict of tensors (float tensors in logits.dtype).
    """
    G, S, E = logits.shape
    C = int(capacity)
    dt = logits.dtype
    mi = jnp.int32

    raw = jax.nn.softmax(logits, axis=-1)
    index_1 = jnp.argmax(raw, axis=-1).astype(mi)
    mask_1 = jax.nn.one_hot(index_1, E, dtype=mi)
    density_1_proxy = raw

    gate_1 = jnp.einsum("GSE,GSE->GS", raw, mask_1.astype(dt))
    raw_wo1 = raw * (1.0 - mask_1.astype(dt))
    index_2 = jnp.argmax(raw_wo1, axis=-1).astype(mi)
    mask_2 = jax.nn.one_hot(index_2, E, dtype=mi)
    gate_2 = jnp.einsum("GSE,GSE->GS", raw_wo1, mask_2.astype(dt))

    # legacy_mtf_behavior=True: renormalise before capacity / random drop
    denom = gate_1 + gate_2 + eps
    gate_1 = gate_1 / denom
    gate_2 = gate_2 / denom

    pos_1_full = _excl_cumsum_s(mask_1)  # [G,S,E]

    density_1 = jnp.mean(mask_1.astype(dt), axis=-2)           # [G,E]
    density_1_proxy = jnp.mean(density_1_proxy, axis=-2)        # [G,E]
    aux_loss = jnp.mean(density_1_proxy * density_1) * (E * E)

    over_1 = (jnp.sum((mask_1 * pos_1_full) >= C).astype(dt)
              / jnp.maximum(1.0, jnp.sum(mask_1).astype(dt)))

    mask_1 = mask_1 * (pos_1_full < C).astype(mi)
    pos_1 = jnp.einsum("GSE,GSE->GS", pos_1_full, mask_1)
    count_1 = jnp.sum(mask_1, axis=-2)   # [G,E]
    flat_1 = jnp.sum(mask_1, axis=-1)    # [G,S]

    if policy == "all":
        keep_2 = None
    elif policy == "random":
        if noise is None:
            raise ValueError("policy='random' needs the explicit noise tensor [G,S]")
        noise = jnp.asarray(noise, dt)
        keep_2 = noise < (gate_2 / max(float(threshold), 1e-9))
        gate_2 = gate_2 * keep_2.astype(dt)
        mask_2 = mask_2 * keep_2[..., None].astype(mi)
    else:
        raise ValueError(policy)

    pos_2_full = _excl_cumsum_s(mask_2) + count_1[:, None, :]
    over_2 = (jnp.sum((mask_2 * pos_2_full) >= C).astype(dt)
              / jnp.maximum(1.0, jnp.sum(mask_2).astype(dt)))
    mask_2 = mask_2 * (pos_2_full < C).astype(mi)
    pos_2 = jnp.einsum("GSE,GSE->GS", pos_2_full, mask_2)
    flat_2 = jnp.sum(mask_2, axis=-1)

    gate_1 = gate_1 * flat_1.astype(dt)
    gate_2 = gate_2 * flat_2.astype(dt)

    oh_c1 = jax.nn.one_hot(pos_1, C, dtype=dt)
    oh_e1 = jax.nn.one_hot(index_1, E, dtype=dt)
    oh_c2 = jax.nn.one_hot(pos_2, C, dtype=dt)
    oh_e2 = jax.nn.one_hot(index_2, E, dtype=dt)
    a1 = (gate_1 * flat_1.astype(dt))[..., None] * oh_e1
    a2 = (gate_2 * flat_2.astype(dt))[..., None] * oh_e2
    combine = (jnp.einsum("GSE,GSC->GSEC", a1, oh_c1)
               + jnp.einsum("GSE,GSC->GSEC", a2, oh_c2))
    dispatch = lax.stop_gradient((combine != 0).astype(dt))

    return dict(raw_gates=raw, index_1=index_1, index_2=index_2,
                gate_1=gate_1, gate_2=gate_2, pos_1=pos_1, pos_2=pos_2,
                kept_1=flat_1, kept_2=flat_2, keep_2=keep_2,
                combine=combine, dispatch=dispatch, aux_loss=aux_loss,
                over_capacity_1=over_1, over_capacity_2=over_2)


# --------------------------------------------------------------------------
# MoE layer
# --------------------------------------------------------------------------
def _noop(name, t):
    return t


def moe_layer(x, wg, wi, wo, capacity: int, *, activation: str = "relu",
              policy: str = "all", noise=None, threshold: float = 0.5,
              precision=None, constrain: Callable = _noop,
              return_aux: bool = False):
    """GShard MoE FFN.  x [G,S,M], wg [M,E], wi [E,M,H], wo [E,H,M].

    constrain(name, tensor) is a hook the benchmarks use to attach sharding
    annotations (identity by default); see EXPERT_LAYOUT.
    Returns (y, aux_loss) or (y, aux_loss, extras) if return_aux.
    """
    act = ACTIVATIONS[activation]
    ein = lambda s, a, b: jnp.einsum(s, a, b, precision=precision)
    x = constrain("x", x)
    logits = ein("GSM,ME->GSE", x, wg)
    logits = constrain("GSE", logits)
    gt = top2_gating(logits, capacity, policy=policy, noise=noise,
                     threshold=threshold)
    combine = constrain("GSEC", gt["combine"])
    dispatch = constrain("GSEC", gt["dispatch"])
    expert_inputs = ein("GSEC,GSM->EGCM", dispatch, x)
    expert_inputs = constrain("EGCM_e", expert_inputs)     # all-to-all G->E
    h = act(ein("EGCM,EMH->EGCH", expert_inputs, wi))
    h = constrain("EGCH_e", h)
    expert_outputs = ein("EGCH,EHM->EGCM", h, wo)
    expert_outputs = constrain("EGCM_e", expert_outputs)
    expert_outputs = constrain("EGCM_g", expert_outputs)   # all-to-all E->G
    y = ein("GSEC,EGCM->GSM", combine, expert_outputs)
    y = constrain("x", y)
    if return_aux:
        extras = dict(gt)
        extras.update(logits=logits, expert_inputs=expert_inputs,
                      expert_outputs=expert_outputs, hidden=h)
        return y, gt["aux_loss"], extras
    return y, gt["aux_loss"]


def moe_flops(G, S, E, M, H, C):
    """FLOPs (2 per MAC) of the forward einsums: gating logits, dispatch,
    the two expert matmuls and combine."""
    gate = 2 * G * S * M * E
    dispatch = 2 * G * S * E * C * M
    experts = 2 * E * G * C * M * H * 2
    combine = 2 * G * S * E * C * M
    return dict(gate=gate, dispatch=dispatch, experts=experts, combine=combine,
                total=gate + dispatch + experts + combine)


# GShard's 1-D layout over one mesh axis `expert` (the layout of `gshard export moe-layer`):
# tokens split on G, expert buffers and wi/wo on E, the expert outputs moved back to G
# before the combine einsum (the two all-to-alls of the forward pass).
EXPERT_LAYOUT = {"x": ("expert",), "GSE": ("expert",), "GSEC": ("expert",),
                 "EGCM_e": ("expert",), "EGCH_e": ("expert",), "EGCM_g": (None, "expert")}


def expert_constrain(mesh):
    """The constrain hook of moe_layer for EXPERT_LAYOUT on `mesh` (axis `expert`)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    def constrain(name, t):
        spec = EXPERT_LAYOUT.get(name)
        return t if spec is None else lax.with_sharding_constraint(t, NamedSharding(mesh, P(*spec)))
    return constrain

