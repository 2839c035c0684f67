"""Data-dependent ops fail with an error that names the module and the op."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from torch import nn

import torchbridge


class Nonzero(nn.Module):
    def forward(self, x):
        return x[torch.nonzero(x > 0)[:, 0]]


class BoolMask(nn.Module):
    def forward(self, x):
        return x[x > 0].sum()


class Item(nn.Module):
    def forward(self, x):
        return x * x.sum().item()


class Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class Net(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.inner = inner

    def forward(self, x):
        return self.inner(self.proj(x))


@pytest.mark.parametrize(
    "inner, op",
    [
        (Nonzero(), "nonzero"),
        (BoolMask(), "__getitem__"),
        (Item(), "item|_local_scalar_dense"),
        (Branch(), "_local_scalar_dense"),
    ],
    ids=["nonzero", "bool-mask", "item", "python-if"],
)
def test_untraceable_error_names_module_and_op(inner, op):
    adapter = torchbridge.from_torch(Net(inner))
    params, state = adapter.initial
    x = np.ones((2, 4), np.float32)
    with pytest.raises(torchbridge.UntraceableError) as info:
        jax.jit(lambda p: adapter.bind(p, state)(x, rng=jax.random.key(0)))(params)
    err = info.value
    assert err.module == "inner"
    assert type(inner).__name__ in str(err)
    assert err.op in str(err)
    assert "'inner'" in str(err)
    import re

    assert re.search(op, err.op), err.op
