"""The int8 weight format of the inference package, as one rounding rule jaxcore owns.

Symmetric int8 with one float32 scale per output channel: ``scale = absmax / 127`` over
the contracted (input) axes, ``1`` where a channel is all zero, and
``q = clip(round(w / scale), -127, 127)``. ``inference/quantize.py`` stores weights this
way; jaxcore may not import ``inference`` (imports point the other way), so the rule lives
here and ``tests/jaxcore/test_compression_qat.py`` checks it equals
``inference.quantize.quantize_array`` bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Contracted (input) axes of each parameter of the reference Transformer, by the names the
# engine's params use: stacked blocks have a leading layers axis; ``embed`` is a lookup
# table (one scale per token row) and ``lm_head`` the output projection ``(d_model, vocab)``.
CONTRACTED_AXES: dict[str, tuple[int, ...]] = {
    "wq": (1,),
    "wk": (1,),
    "wv": (1,),
    "wo": (1, 2),
    "w_gate": (1,),
    "w_up": (1,),
    "w_down": (1,),
    "embed": (1,),
    "lm_head": (0,),
}


def int8_scale(w: jax.Array, contracted: tuple[int, ...]) -> jax.Array:
    """Per-output-channel scale ``absmax / 127`` (size 1 on ``contracted``; 1 if all zero)."""
    absmax = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=contracted, keepdims=True)
    return jnp.where(absmax > 0, absmax / 127.0, 1.0)


def int8_quantize(w: jax.Array, contracted: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """``(q int8, scale float32)`` of ``w`` in the inference int8 format."""
    scale = int8_scale(w, contracted)
    q = jnp.clip(jnp.round(w.astype(jnp.float32) / scale), -127, 127).astype(jnp.int8)
    return q, scale


def fake_quant(w: jax.Array, contracted: tuple[int, ...]) -> jax.Array:
    """``q * scale`` in ``w``'s dtype in the forward pass, identity in the backward pass.

    The straight-through estimator (Bengio et al. 2013; Jacob et al. 2018 for integer
    inference): rounding has zero gradient almost everywhere, so the gradient of the
    quantized weight is passed to the float weight unchanged. With absmax scales nothing
    is clipped, so no clipping mask is needed.
    """
    q, scale = int8_quantize(w, contracted)
    dequantized = (q.astype(jnp.float32) * scale).astype(w.dtype)
    return w + jax.lax.stop_gradient(dequantized - w)
