"""int8 weight-only quantization with per-channel absmax scales, and SmoothQuant smoothing.

Weights are stored as int8 plus one float32 scale per output channel (``absmax / 127``
over the input dimensions): no calibration data needed. The matmul hook multiplies the
activations by the int8 matrix (converted in the dot) and applies the scales to the
output, which is exact for per-output-channel scales: ``x @ (q * s) == (x @ q) * s``.

The activation-aware option follows SmoothQuant (Xiao et al. 2023, eq. 4): per input
channel ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``, weights rows multiplied by ``s``
and the inverse folded into the op that produces ``X`` (the RMSNorm scale for the q/k/v,
gate/up and output projections, the value projection (and its bias) for the attention
output, the up projection for the down projection), so the float model is unchanged and
only the rounding error moves. ``max|X_j|`` comes from a few calibration batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxcore.models import matmul_input_absmax, plain_matmul

# Contracted (input) axes of each stacked weight of the reference model.
CONTRACTED_AXES: dict[str, tuple[int, ...]] = {
    "wq": (1,),
    "wk": (1,),
    "wv": (1,),
    "wo": (1, 2),
    "w_gate": (1,),
    "w_up": (1,),
    "w_down": (1,),
    "head": (0,),
    "embed": (1,),  # a lookup table: one scale per row (token)
}


class QuantizedWeight(struct.PyTreeNode):
    """An int8 weight and its float32 per-channel scales (size 1 on the contracted axes)."""

    q: jax.Array
    scale: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return int(
            self.q.size * self.q.dtype.itemsize + self.scale.size * self.scale.dtype.itemsize
        )

    def dequantize(self, dtype: Any = jnp.float32) -> jax.Array:
        return (self.q.astype(jnp.float32) * self.scale).astype(dtype)

    def take(self, tokens: jax.Array) -> jax.Array:
        """Embedding rows for ``tokens`` (only the gathered rows are dequantized)."""
        rows = jnp.take(self.q, tokens, axis=0).astype(jnp.float32)
        return rows * jnp.take(self.scale, tokens, axis=0)

    def __getitem__(self, index: Any) -> QuantizedWeight:
        # lax.scan slices stacked weights layer by layer through the pytree leaves, not
        # here; this serves eager indexing (``w[layer]``) in tests and tools.
        return QuantizedWeight(q=self.q[index], scale=self.scale[index])


def quantize_array(w: jax.Array, contracted: tuple[int, ...]) -> QuantizedWeight:
    """Symmetric int8 with one scale per output channel (absmax over ``contracted``)."""
    w = w.astype(jnp.float32)
    absmax = jnp.max(jnp.abs(w), axis=contracted, keepdims=True)
    scale = jnp.where(absmax > 0, absmax / 127.0, 1.0)
    q = jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8)
    return QuantizedWeight(q=q, scale=scale)


def quantized_matmul(equation: str, x: jax.Array, w: Any, name: str) -> jax.Array:
    """The decoding matmul hook: dense weights as usual, `QuantizedWeight` dequantized in
    the matmul (int8 converted inside the dot, scales applied to its output)."""
    if not isinstance(w, QuantizedWeight):
        return plain_matmul(equation, x, w, name)
    y = jnp.einsum(equation, x, w.q.astype(x.dtype))
    # The output ends with the weight's uncontracted axes, in order: squeeze the rest.
    keep = [d for d in range(w.scale.ndim) if w.scale.shape[d] != 1 or w.q.shape[d] == 1]
    scale = w.scale.reshape([w.scale.shape[d] for d in keep])
    return (y.astype(jnp.float32) * scale).astype(x.dtype)


def quantize_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """Decoding weights with every matmul weight (and the embedding) in int8."""
    blocks = {
        name: quantize_array(w, CONTRACTED_AXES[name]) if name in CONTRACTED_AXES else w
        for name, w in weights["blocks"].items()
    }
    out = {k: v for k, v in weights.items() if k != "blocks"}
    for name in ("embed", "head"):
        out[name] = quantize_array(weights[name], CONTRACTED_AXES[name])
    out["blocks"] = blocks
    return out


def _smooth_scale(act: jax.Array, wmax: jax.Array, alpha: float) -> jax.Array:
    s = jnp.power(jnp.maximum(act, 1e-5), alpha) / jnp.power(jnp.maximum(wmax, 1e-5), 1 - alpha)
    return jnp.clip(s, 1e-3, 1e3)


def smooth_weights(
    weights: dict[str, Any], stats: dict[str, jax.Array], *, alpha: float = 0.5, n_kv_heads: int
) -> dict[str, Any]:
    """Fold SmoothQuant scales into float weights (the float function is unchanged).

    ``stats`` are `matmul_input_absmax` results (max over the calibration batches).
    """
    b = dict(weights["blocks"])
    wq, wk, wv, wo = b["wq"], b["wk"], b["wv"], b["wo"]
    # q/k/v share their input, the attention RMSNorm output: one scale per channel.
    w_attn = jnp.maximum(
        jnp.max(jnp.abs(wq), axis=(2, 3)),
        jnp.maximum(jnp.max(jnp.abs(wk), axis=(2, 3)), jnp.max(jnp.abs(wv), axis=(2, 3))),
    )
    s_attn = _smooth_scale(stats["wq"], w_attn, alpha)  # (L, D)
    # The attention output channel (h, k) comes from value head h // group: one scale per
    # value channel, the max over the query heads that share it.
    layers, heads, head_dim = stats["wo"].shape
    group = heads // n_kv_heads
    act_o = jnp.max(stats["wo"].reshape(layers, n_kv_heads, group, head_dim), axis=2)
    w_o = jnp.max(jnp.abs(wo), axis=3).reshape(layers, n_kv_heads, group, head_dim).max(axis=2)
    s_o = _smooth_scale(act_o, w_o, alpha)  # (L, K, Dh)
    w_mlp = jnp.maximum(jnp.max(jnp.abs(b["w_gate"]), axis=2), jnp.max(jnp.abs(b["w_up"]), axis=2))
    s_mlp = _smooth_scale(stats["w_gate"], w_mlp, alpha)  # (L, D)
    s_down = _smooth_scale(stats["w_down"], jnp.max(jnp.abs(b["w_down"]), axis=2), alpha)  # (L, F)

    b["attn_norm"] = b["attn_norm"] / s_attn
    b["wq"] = wq * s_attn[:, :, None, None]
    b["wk"] = wk * s_attn[:, :, None, None]
    b["wv"] = wv * s_attn[:, :, None, None] / s_o[:, None, :, :]
    if "bv" in b:  # Qwen2's value bias is part of the value projection's output channel
        b["bv"] = b["bv"] / s_o
    b["wo"] = wo * jnp.repeat(s_o, group, axis=1)[..., None]
    b["mlp_norm"] = b["mlp_norm"] / s_mlp
    b["w_gate"] = b["w_gate"] * s_mlp[:, :, None]
    b["w_up"] = b["w_up"] * s_mlp[:, :, None] / s_down[:, None, :]
    b["w_down"] = b["w_down"] * s_down[:, :, None]
    s_head = _smooth_scale(stats["head"], jnp.max(jnp.abs(weights["head"]), axis=1), alpha)
    out = dict(weights)
    out["final_norm"] = weights["final_norm"] / s_head
    out["head"] = weights["head"] * s_head[:, None]
    out["blocks"] = b
    return out


def calibrate(cfg: Any, weights: dict[str, Any], batches: list[np.ndarray]) -> dict[str, jax.Array]:
    """Max per-channel matmul inputs over ``batches`` of token ids ``(batch, length)``."""
    fn = jax.jit(lambda w, t: matmul_input_absmax(cfg, w, t))
    stats = None
    for tokens in batches:
        new = fn(weights, jnp.asarray(tokens, jnp.int32))
        stats = new if stats is None else jax.tree.map(jnp.maximum, stats, new)
    if stats is None:
        raise ValueError("calibrate: pass at least one batch of token ids.")
    return stats


def weight_bytes(weights: Any) -> int:
    """Bytes the weights occupy (int8 values plus their scales for quantized ones)."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights)))
