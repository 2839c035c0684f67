"""KV-cache decoding equals recomputing the full forward pass (float32, one device)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from inference.quantize import quantize_weights, quantized_matmul
from jaxcore.models import Transformer, TransformerConfig
from jaxcore.models.decoding import (
    KVCache,
    decode_step,
    decoding_weights,
    init_cache,
    insert,
    prefill,
    unstack_layers,
)
from tests.inference.helpers import reference_greedy

CFG = TransformerConfig.tiny(max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    return nnx.jit(lambda: Transformer(CFG, rngs=nnx.Rngs(3)))()


@pytest.fixture(scope="module")
def full_forward(model):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda tokens: nnx.merge(graphdef, state)(tokens))


def test_prefill_logits_equal_forward(model, full_forward):
    tokens = np.random.default_rng(0).integers(0, 256, (2, 24)).astype(np.int32)
    logits, cache = jax.jit(lambda w, t: prefill(CFG, w, t))(decoding_weights(model), tokens)
    np.testing.assert_allclose(logits, full_forward(tokens), atol=1e-5, rtol=0)
    assert cache.k.shape == (CFG.n_layers, 2, CFG.n_kv_heads, 24, CFG.head_size)


def test_greedy_kv_cache_equals_full_recompute(model, full_forward):
    """Same tokens, logits within 1e-5, in a batch where rows sit at different lengths."""
    weights = decoding_weights(model)
    prompts = [[5, 17, 99, 3, 42], list(range(60, 71)), [200]]
    steps = 24
    cache = init_cache(CFG, batch=4, max_len=CFG.max_seq_len)
    pre = jax.jit(lambda w, t: prefill(CFG, w, t))
    step = jax.jit(lambda w, t, c, a: decode_step(CFG, w, t, c, active=a))
    last = np.zeros(4, np.int32)
    got = {i: [] for i in range(3)}
    rows = {i: [] for i in range(3)}
    for slot, prompt in enumerate(prompts):
        padded = np.zeros((1, 16), np.int32)
        padded[0, : len(prompt)] = prompt
        logits, prefix = pre(weights, padded)
        cache = insert(cache, prefix, slot, len(prompt))
        row = np.asarray(logits[0, len(prompt) - 1])
        last[slot] = int(np.argmax(row))
        got[slot].append(int(last[slot]))
        rows[slot].append(row)
    active = np.array([True, True, True, False])
    for _ in range(steps - 1):
        logits, cache = step(weights, last, cache, active)
        logits = np.asarray(logits)
        for slot in range(3):
            last[slot] = int(np.argmax(logits[slot]))
            got[slot].append(int(last[slot]))
            rows[slot].append(logits[slot])
    assert int(cache.lengths[3]) == 0  # the inactive row never advanced
    for slot, prompt in enumerate(prompts):
        want, want_rows = reference_greedy(full_forward, prompt, steps, CFG.max_seq_len)
        assert got[slot] == want
        np.testing.assert_allclose(np.stack(rows[slot]), want_rows, atol=1e-5, rtol=0)


def test_quantized_matmul_equals_dequantized_dense(model):
    weights = decoding_weights(model)
    x = np.random.default_rng(0).normal(size=(2, 3, CFG.d_model)).astype(np.float32)
    h = np.random.default_rng(1).normal(size=(2, 3, CFG.n_heads, CFG.head_size)).astype(np.float32)
    ids = jnp.array([1, 2])

    @jax.jit
    def check(weights, x, h):
        qw = quantize_weights(weights)
        pairs = []
        for name, eq, inp, layer in (
            ("wq", "btd,dhk->bthk", x, 0),
            ("w_up", "btd,df->btf", x, 0),
            ("wo", "bthk,hkd->btd", h, 1),
        ):
            w = qw["blocks"][name][layer]
            pairs.append((quantized_matmul(eq, inp, w, name), jnp.einsum(eq, inp, w.dequantize())))
        table = qw["embed"]
        return pairs, table.take(ids), table.scale[ids]

    pairs, rows, step = check(weights, x, h)
    for got, want in pairs:
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # Rows of the quantized table dequantize to within half a step of the float table.
    assert np.all(np.abs(rows - np.asarray(weights["embed"])[[1, 2]]) <= step / 2 + 1e-7)


def test_per_layer_weights_decode_exactly_like_stacked(model):
    """`unstack_layers` (layers unrolled, as serving runs them) changes no bit of the
    prefill or decode logits, nor of the cache, against the stacked ``lax.scan``."""
    stacked = decoding_weights(model)
    per_layer = unstack_layers(stacked)
    assert isinstance(per_layer["blocks"], tuple) and len(per_layer["blocks"]) == CFG.n_layers
    assert unstack_layers(per_layer) is per_layer
    tokens = np.random.default_rng(1).integers(0, 256, (2, 12)).astype(np.int32)

    def run(w):
        logits, prefix = prefill(CFG, w, tokens)
        cache = insert(init_cache(CFG, 2, 32), prefix, 0, 12)
        cache = insert(cache, KVCache(prefix.k[:, 1:], prefix.v[:, 1:], prefix.lengths[1:]), 1, 7)
        step_logits, cache = decode_step(CFG, w, jnp.array([3, 9], jnp.int32), cache)
        return logits, step_logits, cache.k, cache.v, cache.lengths

    for a, b in zip(jax.jit(run)(stacked), jax.jit(run)(per_layer), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
