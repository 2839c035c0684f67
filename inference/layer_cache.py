"""The engine's contiguous KV cache, one buffer per layer, and its decode step.

`jaxcore.models.KVCache` stacks every layer into one ``(layers, batch, kv_heads, time,
head_dim)`` array. Inside the decode loop XLA:CPU then materializes each layer's slice
before the attention dots read it: for the serving benchmark's model at 16 slots that is
5 MB of copies per token, and a batch-16 decode step took 1.38x longer than with one
buffer per layer (13.7 ms against 9.9 ms CPU time, same process; benchmarks/inference.md).
Here each layer's keys and values are their own ``(batch, kv_heads, time, head_dim)``
buffer, written in place and read directly, as the minimal reference decoder in
``benchmarks/serving.py`` keeps them.

The arithmetic is `jaxcore.models.decoding`'s (the same projections, rotary, attention
and block), so tokens and log-probs match the stacked cache's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxcore.models import KVCache, TransformerConfig
from jaxcore.models.decoding import (
    Matmul,
    _attend,
    _finish_block,
    _logits,
    _project_qkv,
    _step_inputs,
    plain_matmul,
)


class LayerKVCache(struct.PyTreeNode):
    """Keys and values per layer, plus how many positions each row holds.

    Attributes:
        k: one ``(batch, kv_heads, time, head_dim)`` array per layer (rotary applied).
        v: one ``(batch, kv_heads, time, head_dim)`` array per layer.
        lengths: ``(batch,)`` int32 valid positions per row; row ``b``'s next token goes
            to position ``lengths[b]``.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]


def init_layer_cache(
    cfg: TransformerConfig, batch: int, max_len: int, dtype: Any = jnp.float32
) -> LayerKVCache:
    """An empty cache of ``max_len`` positions for ``batch`` rows (one buffer per array:
    donated buffers must not be shared)."""
    shape = (batch, cfg.n_kv_heads, max_len, cfg.head_size)
    n = cfg.n_layers
    return LayerKVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(n)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(n)),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def layer_insert(
    cache: LayerKVCache, prefix: KVCache, slot: jax.Array, length: jax.Array
) -> LayerKVCache:
    """Copy a one-row stacked ``prefix`` (from `jaxcore.models.decoding.prefill`) into row
    ``slot``; ``length`` is the real prompt length (the prefix may be bucket-padded)."""
    zero = jnp.zeros((), jnp.int32)
    start = (jnp.asarray(slot, jnp.int32), zero, zero, zero)

    def put(layers, stacked):
        return tuple(
            jax.lax.dynamic_update_slice(a, stacked[i].astype(a.dtype), start)
            for i, a in enumerate(layers)
        )

    lengths = cache.lengths.at[slot].set(jnp.asarray(length, jnp.int32))
    return LayerKVCache(k=put(cache.k, prefix.k), v=put(cache.v, prefix.v), lengths=lengths)


def layer_decode_step(
    cfg: TransformerConfig,
    weights: dict[str, Any],
    tokens: jax.Array,
    cache: LayerKVCache,
    *,
    active: jax.Array,
    matmul: Matmul = plain_matmul,
) -> tuple[jax.Array, LayerKVCache]:
    """`jaxcore.models.decoding.decode_step` on per-layer buffers (per-layer weights):
    logits ``(batch, vocab)``; rows where ``active`` is false keep their length."""
    pos = cache.lengths
    x, cos, sin, kv_len, rows, window_mask = _step_inputs(cfg, weights, tokens, pos, cache.max_len)
    ks, vs = list(cache.k), list(cache.v)
    for i, p in enumerate(weights["blocks"]):
        q, k, v = _project_qkv(cfg, p, x, cos, sin, matmul)
        # In place (the buffers are loop carries); a full, inactive row's write is dropped.
        ks[i] = ks[i].at[rows, :, pos, :].set(k[:, 0].astype(ks[i].dtype), mode="drop")
        vs[i] = vs[i].at[rows, :, pos, :].set(v[:, 0].astype(vs[i].dtype), mode="drop")
        k_l = ks[i].swapaxes(1, 2).astype(q.dtype)
        v_l = vs[i].swapaxes(1, 2).astype(q.dtype)
        attn = _attend(q, k_l, v_l, key_value_seq_lengths=kv_len, mask=window_mask)
        x = _finish_block(cfg, p, x, attn, matmul)
    lengths = jnp.where(active, kv_len, pos)
    logits = _logits(cfg, weights, x, matmul)[:, 0]
    return logits, LayerKVCache(k=tuple(ks), v=tuple(vs), lengths=lengths)
