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


class _Attention(torch.nn.Module):
    """SDPA as a training call makes it: causal, or with an explicit mask / scale."""

    def __init__(self, heads: int, kv_heads: int, mode: str):
        super().__init__()
        self.q = torch.nn.Linear(8, heads * 4, bias=False)
        self.kv = torch.nn.Linear(8, 2 * kv_heads * 4, bias=False)
        self.heads, self.kv_heads, self.mode = heads, kv_heads, mode

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, 4).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, 4).permute(2, 0, 3, 1, 4)
        gqa = self.heads != self.kv_heads
        F = torch.nn.functional
        if self.mode == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if self.mode == "scaled":  # a non-default scale takes torchax's own lowering
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        mask = torch.ones(t, t, dtype=torch.bool).tril(-1) | torch.eye(t, dtype=torch.bool)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize(
    "heads, kv_heads, mode", [(4, 4, "causal"), (4, 2, "causal"), (2, 2, "scaled"), (2, 2, "mask")]
)
def test_sdpa_matches_torch(heads, kv_heads, mode):
    # 256 tokens: the causal call runs jaxcore's query-blocked kernel (4 blocks).
    torch.manual_seed(0)
    module = _Attention(heads, kv_heads, mode)
    x = np.random.default_rng(0).standard_normal((2, 256, 8), dtype=np.float32)
    out_t = module(torch.from_numpy(x))
    out_t.square().mean().backward()
    adapter = from_torch(module)
    params, state = adapter.initial

    def loss(params):
        out = adapter.bind(params, state)(x, rng=jax.random.key(0))
        return jnp.mean(out**2), out

    (_, out_j), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert np.max(np.abs(np.asarray(out_j) - out_t.detach().numpy())) < TOL
    flat = flatten(grads)
    for n, p in module.named_parameters():
        assert np.max(np.abs(np.asarray(flat[n]) - p.grad.numpy())) < TOL, n
    # Only the causal call skips the square: no (256, 256) score array is traced.
    eqns = jax.make_jaxpr(lambda p: loss(p)[0])(params).eqns
    full = any(tuple(v.aval.shape[-2:]) == (256, 256) for e in eqns for v in e.outvars)
    assert full == (mode != "causal")
