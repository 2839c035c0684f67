"""KV-cache decoding for the reference `Transformer`: prefill, single-token decode, insert.

The cache interface (`KVCache` plus the `CausalDecoder` protocol) is what the inference
engine drives; any model that implements it gets continuous batching, sampling and
serving. The cache is heads-first, ``(layers, batch, kv_heads, time, head_dim)``: with
time-major layouts XLA copied the whole cache every step and batch-16 decoding ran at half
speed (PERF-NOTES.md, "Generation"). Layers stay stacked so prefill and decode are one
``lax.scan`` over layers, like training.

Every weight matmul goes through a ``matmul(equation, x, w, name)`` hook, so the same code
runs with quantized weights (the hook dequantizes in the matmul) or records the matmul
inputs for activation-aware calibration. Attention goes through
``jax.nn.dot_product_attention`` so accelerators can use their fused kernels; decode masks
each row to its own length with ``key_value_seq_lengths`` (the prefill / insert / generate
split follows JetStream's engine API).

``weights["blocks"]`` is either stacked (one array per weight, leading ``layers`` axis:
the layers run as a ``lax.scan``) or a tuple of per-layer dicts (`unstack_layers`: the
layers are unrolled). Serving uses the tuple: a scan slices every layer's weights out of
the stack each step, and on XLA's CPU backend those slices are copies (16 MB per decode
step for the GPT-2-shaped benchmark model, 2.4x of the batch-1 step time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from jaxcore.models.transformer import (
    Transformer,
    TransformerConfig,
    apply_rope,
    rms_norm,
    rope_tables,
)

Weights = dict[str, Any]
Matmul = Callable[[str, jax.Array, Any, str], jax.Array]

# (layers, batch, kv_heads, time, head_dim): logical names for sharding the cache.
CACHE_AXES = ("layers", "batch", "kv_heads", "length", "head_dim")


def plain_matmul(equation: str, x: jax.Array, w: Any, name: str) -> jax.Array:
    """The default matmul hook: ``jnp.einsum`` on dense weights."""
    del name
    return jnp.einsum(equation, x, w)


class KVCache(struct.PyTreeNode):
    """Keys and values of every layer, plus how many positions each row holds.

    Attributes:
        k: ``(layers, batch, kv_heads, time, head_dim)`` keys (rotary already applied).
        v: ``(layers, batch, kv_heads, time, head_dim)`` values.
        lengths: ``(batch,)`` int32, the number of valid positions of each row; the next
            token of row ``b`` goes to position ``lengths[b]``.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class CausalDecoder(Protocol):
    """What the inference engine needs from a model (JetStream's prefill/insert/generate)."""

    config: Any

    def init_cache(self, batch: int, max_len: int, dtype: Any = jnp.float32) -> KVCache: ...

    def prefill(
        self, weights: Weights, tokens: jax.Array, *, matmul: Matmul = plain_matmul
    ) -> tuple[jax.Array, KVCache]: ...

    def decode_step(
        self,
        weights: Weights,
        tokens: jax.Array,
        cache: KVCache,
        *,
        active: jax.Array | None = None,
        matmul: Matmul = plain_matmul,
    ) -> tuple[jax.Array, KVCache]: ...

    def insert(
        self, cache: KVCache, prefix: KVCache, slot: jax.Array, length: jax.Array
    ) -> KVCache: ...


def decoding_weights(model: Transformer) -> Weights:
    """The weights decoding reads, taken from the model (stacked blocks stay stacked)."""
    head = model.embed[...].T if model.cfg.tie_embeddings else model.lm_head[...]
    return {
        "embed": model.embed[...],
        "final_norm": model.final_norm[...],
        "head": head,
        "blocks": model.block_params(),
    }


def unstack_layers(weights: Weights) -> Weights:
    """``weights`` with ``blocks`` as a tuple of per-layer dicts (see the module note)."""
    blocks = weights["blocks"]
    if isinstance(blocks, tuple | list):
        return weights
    n = jax.tree.leaves(blocks)[0].shape[0]
    return {**weights, "blocks": tuple(jax.tree.map(lambda a, i=i: a[i], blocks) for i in range(n))}


def over_layers(body: Callable, carry: Any, blocks: Any) -> tuple[Any, Any]:
    """``body(carry, (layer_weights, index))`` over the layers: unrolled for a tuple of
    per-layer weights (static indices), a ``lax.scan`` for stacked ones. The per-layer
    outputs come back stacked on a leading axis either way."""
    if isinstance(blocks, tuple | list):
        ys = []
        for index, p in enumerate(blocks):
            carry, y = body(carry, (p, index))
            ys.append(y)
        if ys[0] is None:
            return carry, None
        return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)
    n = jax.tree.leaves(blocks)[0].shape[0]
    return jax.lax.scan(body, carry, (blocks, jnp.arange(n)))


def init_cache(
    cfg: TransformerConfig, batch: int, max_len: int, dtype: Any = jnp.float32
) -> KVCache:
    """An empty cache of ``max_len`` positions for ``batch`` rows."""
    shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_size)
    return KVCache(
        k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype), lengths=jnp.zeros((batch,), jnp.int32)
    )


def _project_qkv(cfg, p, x, cos, sin, matmul):
    h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
    q = matmul("btd,dhk->bthk", h, p["wq"], "wq")
    k = matmul("btd,dhk->bthk", h, p["wk"], "wk")
    v = matmul("btd,dhk->bthk", h, p["wv"], "wv")
    if cfg.qkv_bias:  # Qwen2's q/k/v biases, added before the rotation as in training
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _finish_block(cfg, p, x, attn, matmul):
    x = x + matmul("bthk,hkd->btd", attn, p["wo"], "wo")
    h = rms_norm(x, p["mlp_norm"], cfg.norm_eps)
    gate = matmul("btd,df->btf", h, p["w_gate"], "w_gate")
    up = matmul("btd,df->btf", h, p["w_up"], "w_up")
    return x + matmul("btf,fd->btd", jax.nn.silu(gate) * up, p["w_down"], "w_down")


def _attend(q, k, v, **kwargs):
    # XLA's CPU backend has no float16 x float16 -> float32 dot (as in the model's attention).
    if q.dtype == jnp.float16 and jax.devices()[0].platform == "cpu":
        out = jax.nn.dot_product_attention(
            q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), **kwargs
        )
        return out.astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, **kwargs)


def block_prefill(
    cfg: TransformerConfig,
    p: Weights,
    x: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    *,
    matmul: Matmul = plain_matmul,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block over a whole prompt: ``(x_out, k, v)`` with heads-first ``k, v``."""
    q, k, v = _project_qkv(cfg, p, x, cos, sin, matmul)
    window = None if cfg.sliding_window is None else (cfg.sliding_window - 1, 0)
    attn = _attend(q, k, v, is_causal=True, local_window_size=window)
    return _finish_block(cfg, p, x, attn, matmul), k.swapaxes(1, 2), v.swapaxes(1, 2)


def embed_tokens(table: Any, tokens: jax.Array) -> jax.Array:
    """Rows of the embedding table; a table object with ``take`` (quantized) gathers itself."""
    if hasattr(table, "take") and not isinstance(table, jax.Array):
        return table.take(tokens)
    return jnp.take(table, tokens, axis=0)


def _logits(cfg, weights, x, matmul):
    x = rms_norm(x, weights["final_norm"], cfg.norm_eps)
    return matmul("btd,dv->btv", x, weights["head"], "head").astype(jnp.float32)


def prefill(
    cfg: TransformerConfig, weights: Weights, tokens: jax.Array, *, matmul: Matmul = plain_matmul
) -> tuple[jax.Array, KVCache]:
    """Run ``tokens: (batch, T)`` from position 0: logits ``(batch, T, vocab)`` and a cache.

    Right padding is harmless (causal attention never looks ahead); `insert` records each
    row's real length. The cache has exactly ``T`` positions.
    """
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    cos, sin = rope_tables(positions, cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
    x = embed_tokens(weights["embed"], tokens)

    def body(x, layer):
        x, k, v = block_prefill(cfg, layer[0], x, cos, sin, matmul=matmul)
        return x, (k, v)

    x, (k, v) = over_layers(body, x, weights["blocks"])
    lengths = jnp.full((batch,), length, jnp.int32)
    return _logits(cfg, weights, x, matmul), KVCache(k=k, v=v, lengths=lengths)


def _step_inputs(cfg, weights, tokens, pos, max_len):
    """What one decode step needs before its layers, for rows at positions ``pos``: the
    embedded tokens, rotary tables, attended lengths, row indices and the sliding-window
    mask (None without one). Shared by `decode_step` and the serving engine's per-layer
    cache (`inference.layer_cache`)."""
    cos, sin = rope_tables(pos[:, None], cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
    x = embed_tokens(weights["embed"], tokens[:, None])
    kv_len = jnp.minimum(pos + 1, max_len)
    rows = jnp.arange(tokens.shape[0])
    window_mask = None  # Mistral's sliding window: keys after pos - window only
    if cfg.sliding_window is not None:
        window_mask = (jnp.arange(max_len)[None, :] > pos[:, None] - cfg.sliding_window)[
            :, None, None, :
        ]
    return x, cos, sin, kv_len, rows, window_mask


def decode_step(
    cfg: TransformerConfig,
    weights: Weights,
    tokens: jax.Array,
    cache: KVCache,
    *,
    active: jax.Array | None = None,
    matmul: Matmul = plain_matmul,
) -> tuple[jax.Array, KVCache]:
    """Feed one token per row at position ``cache.lengths``: logits ``(batch, vocab)``.

    Rows where ``active`` is false still compute (the shape is fixed) but keep their
    length, so a free slot never runs past the cache.
    """
    max_len = cache.max_len
    pos = cache.lengths
    if active is None:
        active = jnp.ones((tokens.shape[0],), bool)
    x, cos, sin, kv_len, rows, window_mask = _step_inputs(cfg, weights, tokens, pos, max_len)

    def body(carry, layer):
        x, k_all, v_all = carry
        p, index = layer
        q, k, v = _project_qkv(cfg, p, x, cos, sin, matmul)
        # Write the new position in place (the cache is a loop carry, so XLA updates it
        # without copying); out-of-range rows (a full, inactive slot) are dropped.
        k_all = k_all.at[index, rows, :, pos, :].set(k[:, 0].astype(k_all.dtype), mode="drop")
        v_all = v_all.at[index, rows, :, pos, :].set(v[:, 0].astype(v_all.dtype), mode="drop")
        k_l = k_all[index].swapaxes(1, 2).astype(q.dtype)
        v_l = v_all[index].swapaxes(1, 2).astype(q.dtype)
        attn = _attend(q, k_l, v_l, key_value_seq_lengths=kv_len, mask=window_mask)
        return (_finish_block(cfg, p, x, attn, matmul), k_all, v_all), None

    (x, k_all, v_all), _ = over_layers(body, (x, cache.k, cache.v), weights["blocks"])
    lengths = jnp.where(active, kv_len, pos)
    logits = _logits(cfg, weights, x, matmul)[:, 0]
    return logits, KVCache(k=k_all, v=v_all, lengths=lengths)


def insert(cache: KVCache, prefix: KVCache, slot: jax.Array, length: jax.Array) -> KVCache:
    """Copy a one-row ``prefix`` cache (from `prefill`) into row ``slot`` of ``cache``.

    ``length`` is the real prompt length (the prefix may be padded to a bucket size).
    """
    zero = jnp.zeros((), jnp.int32)
    start = (zero, jnp.asarray(slot, jnp.int32), zero, zero, zero)
    k = jax.lax.dynamic_update_slice(cache.k, prefix.k.astype(cache.k.dtype), start)
    v = jax.lax.dynamic_update_slice(cache.v, prefix.v.astype(cache.v.dtype), start)
    lengths = cache.lengths.at[slot].set(jnp.asarray(length, jnp.int32))
    return KVCache(k=k, v=v, lengths=lengths)


def matmul_input_absmax(
    cfg: TransformerConfig, weights: Weights, tokens: jax.Array
) -> dict[str, jax.Array]:
    """Per-channel max ``|input|`` of every weight matmul while prefilling ``tokens``.

    Keys are the weight names; values keep the contracted (input-channel) dimensions, with
    a leading ``layers`` axis for block weights: ``wq: (layers, d_model)``,
    ``wo: (layers, heads, head_dim)``, ``w_down: (layers, d_ff)``, ``head: (d_model,)``.
    Activation-aware quantization (SmoothQuant) calibrates its scales on these.
    """
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    cos, sin = rope_tables(positions, cfg.head_size, cfg.rope_theta, cfg.rope_scaling)

    def recorder(stats):
        def matmul(equation, x, w, name):
            x_subs, rest = equation.split(",")
            out_subs = rest.split("->")[1]
            keep = sum(1 for c in x_subs if c not in out_subs)
            stats[name] = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=tuple(range(x.ndim - keep)))
            return plain_matmul(equation, x, w, name)

        return matmul

    def body(x, p):
        stats: dict[str, jax.Array] = {}
        x, _, _ = block_prefill(cfg, p, x, cos, sin, matmul=recorder(stats))
        return x, stats

    x, stats = jax.lax.scan(body, embed_tokens(weights["embed"], tokens), weights["blocks"])
    head_stats: dict[str, jax.Array] = {}
    _logits(cfg, weights, x, recorder(head_stats))
    return {**stats, **head_stats}


class TransformerDecoder:
    """The `CausalDecoder` of the reference `Transformer`."""

    def __init__(self, config: TransformerConfig):
        self.config = config

    def init_cache(self, batch: int, max_len: int, dtype: Any = jnp.float32) -> KVCache:
        return init_cache(self.config, batch, max_len, dtype)

    def prefill(
        self, weights: Weights, tokens: jax.Array, *, matmul: Matmul = plain_matmul
    ) -> tuple[jax.Array, KVCache]:
        return prefill(self.config, weights, tokens, matmul=matmul)

    def decode_step(
        self,
        weights: Weights,
        tokens: jax.Array,
        cache: KVCache,
        *,
        active: jax.Array | None = None,
        matmul: Matmul = plain_matmul,
    ) -> tuple[jax.Array, KVCache]:
        return decode_step(self.config, weights, tokens, cache, active=active, matmul=matmul)

    def insert(
        self, cache: KVCache, prefix: KVCache, slot: jax.Array, length: jax.Array
    ) -> KVCache:
        return insert(cache, prefix, slot, length)
