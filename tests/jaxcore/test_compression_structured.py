"""Structured pruning: removing heads and neurons for real equals masking them."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxcore as jc
from jaxcore.compression import mask_structure, select, shrink, unit_scores
from jaxcore.models import Transformer, TransformerConfig, lm_loss

# 8 query heads over 4 kv groups (g = 2): GQA pruning must stay consistent per group.
CFG = TransformerConfig.tiny(
    n_heads=8, n_kv_heads=4, head_dim=8, d_ff=96, max_seq_len=32, init_std=0.2
)


# Jitted by config: op-by-op, every primitive of the model (and of its gradient) would
# compile on its own, once per shape.
@partial(jax.jit, static_argnums=0)
def init(cfg):
    return nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param))


@partial(jax.jit, static_argnums=0)
def forward(cfg, params, tokens):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)(tokens)


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 24)), jnp.int32)


@pytest.mark.parametrize("by", ["query", "kv_group"])
@pytest.mark.parametrize("method", ["magnitude", "taylor"])
def test_half_the_heads_removed_equals_masked(by, method):
    params = init(CFG)
    grads = None
    if method == "taylor":

        @jax.jit
        def grad(p, t):
            return jax.grad(
                lambda p: lm_loss(lambda x: forward(CFG, p, x), {"tokens": t}, None)[0]
            )(p)

        grads = [grad(params, TOKENS[:, :s]) for s in (17, 24)]
    scores = unit_scores(params, method=method, grads=grads)
    structure = select(CFG, scores, heads=0.5, neurons=0.5, by=by)
    small_cfg, small = shrink(params, CFG, structure)
    if by == "query":  # every group keeps one of its two query heads, all kv heads stay
        assert (small_cfg.n_heads, small_cfg.n_kv_heads) == (4, 4)
        np.testing.assert_array_equal(structure.heads // 2, np.tile(np.arange(4), (2, 1)))
    else:  # two whole groups go, each with both its query heads
        assert (small_cfg.n_heads, small_cfg.n_kv_heads) == (4, 2)
        np.testing.assert_array_equal(structure.heads // 2, np.repeat(structure.kv_heads, 2, 1))
    assert small_cfg.d_ff == 48 and small_cfg.head_size == CFG.head_size
    assert small["wq"].shape == (2, 64, 4, 8) and small["wo"].shape == (2, 4, 8, 64)
    assert small["w_up"].shape == (2, 64, 48) and small["w_down"].shape == (2, 48, 64)
    masked = mask_structure(params, CFG, structure)
    out_masked = np.asarray(forward(CFG, masked, TOKENS))
    out_small = np.asarray(forward(small_cfg, small, TOKENS))
    np.testing.assert_allclose(out_small, out_masked, rtol=1e-5, atol=1e-5)
    # Pruning did change the function (the comparison above can fail).
    assert np.abs(out_masked - np.asarray(forward(CFG, params, TOKENS))).max() > 1e-2


def test_each_layer_keeps_its_own_best_units():
    params = init(CFG)
    scores = unit_scores(params)
    structure = select(CFG, scores, heads=0.5, neurons=0.25)
    for layer in range(CFG.n_layers):
        kept = set(structure.neurons[layer])
        dropped = [f for f in range(CFG.d_ff) if f not in kept]
        assert min(scores["neurons"][layer][list(kept)]) >= max(scores["neurons"][layer][dropped])
        for group in range(4):
            pair = scores["heads"][layer][2 * group : 2 * group + 2]
            assert structure.heads[layer][group] == 2 * group + int(np.argmax(pair))


def test_uneven_head_counts_are_refused():
    scores = unit_scores(init(CFG))
    with pytest.raises(jc.ConfigError, match="split evenly over the 4 kv groups"):
        select(CFG, scores, heads=0.25)
    with pytest.raises(jc.ConfigError, match="whole number of groups"):
        select(CFG, scores, heads=0.125, by="kv_group")
    with pytest.raises(jc.ConfigError, match="needs grads"):
        unit_scores(init(CFG), method="taylor")


def test_inference_serves_the_smaller_model():
    import inference

    params = init(CFG)
    structure = select(CFG, unit_scores(params), heads=0.5, neurons=0.5)
    small_cfg, small = shrink(params, CFG, structure)
    masked = mask_structure(params, CFG, structure)
    llm = inference.LLM(small, config=small_cfg)
    text = "def f(x):\n    return x"
    served = np.asarray(llm.score(text))  # log p of tokens 1...
    ids = jnp.asarray([list(text.encode())], jnp.int32)
    logp = jax.nn.log_softmax(forward(CFG, masked, ids)[0, :-1], axis=-1)
    want = np.asarray(jnp.take_along_axis(logp, ids[0, 1:, None], axis=-1)[:, 0])
    np.testing.assert_allclose(served, want, rtol=1e-4, atol=1e-4)
