"""A paged KV cache for the reference `Transformer`: fixed-size pages in one pool, a page
table per sequence (vLLM's PagedAttention, Kwon et al. SOSP 2023; JetStream's page
manager keeps the same layout).

Pages are ``(layers, pages, kv_heads, page_size, head_dim)``; row ``b``'s position ``t``
lives in page ``tables[b, t // page_size]`` at offset ``t % page_size``. Attention
gathers a row's pages into the contiguous ``(kv_heads, time, head_dim)`` view and runs the
same ``jax.nn.dot_product_attention`` as the contiguous cache, so both give the same
tokens and log-probs; this gather is where a Pallas paged-attention kernel (reading pages
in place) plugs in on GPU/TPU. `extend` prefills a prompt *suffix* on top of positions
already in the row's pages, which is what prefix caching needs: shared prompt blocks are
computed once and only the rest of each prompt is run.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxcore.models.decoding import (
    Matmul,
    Weights,
    _attend,
    _finish_block,
    _logits,
    _project_qkv,
    _step_inputs,
    embed_tokens,
    over_layers,
    plain_matmul,
)
from jaxcore.models.transformer import TransformerConfig, rope_tables

# (layers, pages, kv_heads, page_size, head_dim): pages belong to no one row, so that axis
# is not the batch.
PAGE_AXES = ("layers", None, "kv_heads", None, "head_dim")


class PagedKVCache(struct.PyTreeNode):
    """A pool of key/value pages, each row's page table and valid length.

    Attributes:
        k, v: ``(layers, pages, kv_heads, page_size, head_dim)``.
        tables: ``(batch, pages_per_row)`` int32 page ids (unused entries name any page:
            they are masked by ``lengths`` and never written).
        lengths: ``(batch,)`` int32 valid positions per row.
    """

    k: jax.Array
    v: jax.Array
    tables: jax.Array
    lengths: jax.Array

    @property
    def page_size(self) -> int:
        return self.k.shape[3]

    @property
    def max_len(self) -> int:
        return self.tables.shape[1] * self.page_size


def init_paged_cache(
    cfg: TransformerConfig,
    batch: int,
    max_len: int,
    pages: int,
    page_size: int,
    dtype: Any = jnp.float32,
) -> PagedKVCache:
    """An empty pool of ``pages`` pages; each row may address ``max_len`` positions."""
    shape = (cfg.n_layers, pages, cfg.n_kv_heads, page_size, cfg.head_size)
    per_row = -(-max_len // page_size)
    return PagedKVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        tables=jnp.zeros((batch, per_row), jnp.int32),
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def gather_pages(pages: jax.Array, tables: jax.Array) -> jax.Array:
    """``(pages, kv_heads, page_size, head_dim)`` + ``(rows, n)`` tables ->
    ``(rows, n * page_size, kv_heads, head_dim)``: each row's positions in order."""
    g = pages[tables]  # (rows, n, kv_heads, page_size, head_dim)
    rows, n, kvh, ps, hd = g.shape
    return g.transpose(0, 1, 3, 2, 4).reshape(rows, n * ps, kvh, hd)


def _write(pages, layer, page, offset, values, keep):
    """Scatter ``values (rows, kv_heads, head_dim)`` at (page, offset); rows where ``keep``
    is false are dropped (their page id is pushed out of range)."""
    page = jnp.where(keep, page, pages.shape[1])
    return pages.at[layer, page, :, offset, :].set(values.astype(pages.dtype), mode="drop")


def paged_decode_step(
    cfg: TransformerConfig,
    weights: Weights,
    tokens: jax.Array,
    cache: PagedKVCache,
    *,
    active: jax.Array | None = None,
    matmul: Matmul = plain_matmul,
) -> tuple[jax.Array, PagedKVCache]:
    """`jaxcore.models.decode_step` on pages: one token per row at ``cache.lengths``.

    Inactive rows write nothing (their stale tables may name pages now owned by others).
    """
    pos = cache.lengths
    if active is None:
        active = jnp.ones((tokens.shape[0],), bool)
    ps = cache.page_size
    # The contiguous step's inputs: rotary tables with the model's rope scaling (Llama 3)
    # and its sliding-window mask (Mistral); both were missing here, so such checkpoints
    # generated other tokens on pages than on the contiguous cache and in transformers.
    x, cos, sin, kv_len, rows, window_mask = _step_inputs(cfg, weights, tokens, pos, cache.max_len)
    page = cache.tables[rows, jnp.minimum(pos, cache.max_len - 1) // ps]
    offset = pos % ps
    keep = active & (pos < cache.max_len)

    def body(carry, layer):
        x, k_all, v_all = carry
        p, index = layer
        q, k, v = _project_qkv(cfg, p, x, cos, sin, matmul)
        k_all = _write(k_all, index, page, offset, k[:, 0], keep)
        v_all = _write(v_all, index, page, offset, v[:, 0], keep)
        k_l = gather_pages(k_all[index], cache.tables).astype(q.dtype)
        v_l = gather_pages(v_all[index], cache.tables).astype(q.dtype)
        attn = _attend(q, k_l, v_l, key_value_seq_lengths=kv_len, mask=window_mask)
        return (_finish_block(cfg, p, x, attn, matmul), k_all, v_all), None

    (x, k_all, v_all), _ = over_layers(body, (x, cache.k, cache.v), weights["blocks"])
    lengths = jnp.where(active, kv_len, pos)
    logits = _logits(cfg, weights, x, matmul)[:, 0]
    return logits, cache.replace(k=k_all, v=v_all, lengths=lengths)


def paged_extend(
    cfg: TransformerConfig,
    weights: Weights,
    tokens: jax.Array,
    start: jax.Array,
    length: jax.Array,
    cache: PagedKVCache,
    row: jax.Array,
    *,
    matmul: Matmul = plain_matmul,
) -> tuple[jax.Array, PagedKVCache]:
    """Prefill ``tokens: (T,)`` (the first ``length`` real, the rest padding) at positions
    ``start ...`` of row ``row``, attending to the ``start`` positions already in its
    pages. Returns logits ``(T, vocab)`` and the cache with ``lengths[row] = start +
    length``. With ``start = 0`` it is a plain prefill into pages.
    """
    T = tokens.shape[0]
    ps = cache.page_size
    positions = start + jnp.arange(T)
    real = jnp.arange(T) < length
    page = cache.tables[row, jnp.minimum(positions, cache.max_len - 1) // ps]
    offset = positions % ps
    keep = real & (positions < cache.max_len)
    cos, sin = rope_tables(positions[None, :], cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
    x = embed_tokens(weights["embed"], tokens[None, :])
    table = cache.tables[row][None]
    # Query t sees key j when j <= start + t (causal), j holds a real position and, with a
    # sliding window, j is one of the last ``sliding_window`` positions (itself included).
    keys = jnp.arange(cache.max_len)[None, :]
    mask = (keys <= positions[:, None]) & (keys < start + length)
    if cfg.sliding_window is not None:
        mask = mask & (keys > positions[:, None] - cfg.sliding_window)

    def body(carry, layer):
        x, k_all, v_all = carry
        p, index = layer
        q, k, v = _project_qkv(cfg, p, x, cos, sin, matmul)
        k_all = _write(k_all, index, page, offset, k[0], keep)
        v_all = _write(v_all, index, page, offset, v[0], keep)
        k_l = gather_pages(k_all[index], table).astype(q.dtype)
        v_l = gather_pages(v_all[index], table).astype(q.dtype)
        attn = _attend(q, k_l, v_l, mask=mask[None, None])
        return (_finish_block(cfg, p, x, attn, matmul), k_all, v_all), None

    (x, k_all, v_all), _ = over_layers(body, (x, cache.k, cache.v), weights["blocks"])
    lengths = cache.lengths.at[row].set(start + length)
    return _logits(cfg, weights, x, matmul)[0], cache.replace(k=k_all, v=v_all, lengths=lengths)
