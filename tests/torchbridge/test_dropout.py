"""Dropout draws from the key the engine passes: same key, same mask; next key, new mask."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import jaxcore as jc
import torchbridge
from tests.torchbridge import models


@pytest.fixture(scope="module")
def forward():
    torch.manual_seed(0)
    module = models.GPT(dropout=0.5)
    adapter = torchbridge.from_torch(module)
    params, state = adapter.initial
    fn = jax.jit(lambda p, x, key: adapter.bind(p, state)(x, rng=key))
    evaluate = jax.jit(lambda p, x: adapter.bind(p, state)(x))
    x = np.random.default_rng(0).integers(0, 64, (2, 8)).astype(np.int32)
    return module, params, fn, evaluate, x


def test_same_key_same_mask_next_key_differs(forward):
    _, params, fn, _, x = forward
    key = jax.random.key(3)
    a, b = np.asarray(fn(params, x, key)), np.asarray(fn(params, x, key))
    np.testing.assert_array_equal(a, b)
    # The engine splits a fresh key from state.rng every step.
    _, next_key = jax.random.split(jax.random.split(key)[0])
    c = np.asarray(fn(params, x, next_key))
    assert np.max(np.abs(a - c)) > 1e-3


def test_no_key_means_eval_mode(forward):
    module, params, _, evaluate, x = forward
    module.eval()
    try:
        with torch.no_grad():
            ref = module(torch.from_numpy(x).long()).numpy()
    finally:
        module.train()
    np.testing.assert_allclose(np.asarray(evaluate(params, x)), ref, atol=1e-5)


@pytest.mark.slow
def test_engine_steps_use_a_new_key_each_step():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, module, torch.optim.SGD(module.parameters(), lr=0.0))

    def loss(model, batch, rng):
        out = model(batch, rng=rng)
        return (out**2).mean(), {}

    step = engine.train_step(loss)
    x = np.ones((8, 4), np.float32)
    seen = []
    for _ in range(3):
        state, metrics = step(state, x)
        seen.append(float(metrics["loss"]))
    assert len(set(seen)) == 3, seen  # lr 0: only the dropout mask changes the loss
