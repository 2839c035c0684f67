"""Forward and gradient parity with torch autograd (float32, max abs diff < 1e-5)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.torchbridge import models
from torchbridge import from_torch
from torchbridge.module import flatten

TOL = 1e-5


def _inputs(name: str, rng: np.random.Generator):
    if name == "mlp":
        return rng.standard_normal((4, 8), dtype=np.float32)
    if name == "encoder":
        return rng.standard_normal((2, 6, 16), dtype=np.float32)
    if name == "gpt":
        return rng.integers(0, 64, (2, 8)).astype(np.int64)
    if name == "gru":
        return rng.standard_normal((2, 5, 6), dtype=np.float32)
    raise KeyError(name)


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return {
        "mlp": lambda: models.MLP(),
        "encoder": lambda: torch.nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True
        ),
        "gpt": lambda: models.GPT(dropout=0.0),
        "gru": lambda: models.GRUModel(),
    }[name]()


@pytest.mark.parametrize("name", ["mlp", "encoder", "gpt", "gru"])
def test_forward_and_grad_match_torch(name):
    module = _model(name)
    x = _inputs(name, np.random.default_rng(0))
    with torch.no_grad():
        probe_shape = module(torch.from_numpy(x)).shape
    w = np.random.default_rng(1).standard_normal(probe_shape, dtype=np.float32)

    out_t = module(torch.from_numpy(x))
    loss_t = (out_t * torch.from_numpy(w)).mean()
    loss_t.backward()

    adapter = from_torch(module)
    params, state = adapter.initial

    def loss(params, x):
        out = adapter.bind(params, state)(x, rng=jax.random.key(0))
        return jnp.mean(out * w), out

    (loss_j, out_j), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, x)
    assert np.max(np.abs(np.asarray(out_j) - out_t.detach().numpy())) < TOL
    assert abs(float(loss_j) - float(loss_t.detach())) < TOL
    flat = flatten(grads)
    assert set(flat) == {n for n, _ in module.named_parameters()}
    for n, p in module.named_parameters():
        diff = np.max(np.abs(np.asarray(flat[n]) - p.grad.numpy()))
        assert diff < TOL, (n, diff)
