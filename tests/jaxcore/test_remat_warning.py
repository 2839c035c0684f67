"""A remat policy only acts on blocks a model wraps with `jaxcore.remat.checkpoint_block`;
for a model that wraps none, ``remat="full"`` silently kept every activation (the same
compiled temp memory as ``remat="none"``). The step now says so when it traces."""

from __future__ import annotations

import warnings

import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss


class Stack(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(16, 16, rngs=rngs) for _ in range(3)])

    def __call__(self, x):
        for layer in self.layers:
            x = nnx.tanh(layer(x))
        return x


def mse(model, batch, rng):
    del rng
    return ((model(batch["x"]) - batch["y"]) ** 2).mean(), {}


BATCH = {"x": np.ones((8, 16), np.float32), "y": np.zeros((8, 16), np.float32)}


def test_a_policy_no_block_uses_warns_when_the_step_traces():
    engine = jc.Engine(parallel=jc.ParallelConfig(data=8), remat="full")
    state = engine.prepare(Stack, optax.sgd(0.1))
    with pytest.warns(UserWarning, match=r"remat='full'.*checkpoint_block"):
        engine.train_step(mse)(state, BATCH)


def test_no_warning_when_the_model_wraps_its_blocks():
    cfg = TransformerConfig.tiny(n_layers=2)
    engine = jc.Engine(parallel=jc.ParallelConfig(data=8), remat="full")
    state = engine.prepare(lambda r: Transformer(cfg, rngs=r), optax.sgd(0.1))
    tokens = np.zeros((8, 17), np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine.train_step(lm_loss)(state, {"tokens": tokens})
