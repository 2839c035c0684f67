"""Weights back to torch: state_dict round trip, ties, dtypes, safetensors both ways."""

from __future__ import annotations

import copy

import jax
import numpy as np
import optax
import pytest
import torch

import jaxcore as jc
import torchbridge
from tests.torchbridge import models
from tests.torchbridge.helpers import host
from torchbridge.module import flatten


class TiedWithBN(torch.nn.Module):
    """A tied GPT head plus a BatchNorm (int64 buffer) and a bfloat16 buffer."""

    def __init__(self):
        super().__init__()
        self.gpt = models.GPT(tie=True)
        self.bn = torch.nn.BatchNorm1d(64)
        self.register_buffer("scale", torch.ones(64, dtype=torch.bfloat16))

    def forward(self, tokens):
        logits = self.gpt(tokens)
        return self.bn(logits.transpose(1, 2)).transpose(1, 2) * self.scale.float()


def loss_fn(model, batch, rng):
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1], rng=rng)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), {}


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    module = TiedWithBN()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, module, torch.optim.AdamW(module.parameters(), lr=1e-2))
    step = engine.train_step(loss_fn)
    rng = np.random.default_rng(0)
    for _ in range(2):
        state, _ = step(state, {"tokens": rng.integers(0, 64, (8, 9)).astype(np.int32)})
    return module, engine, state


def _outputs(module, tokens):
    module.eval()
    with torch.no_grad():
        return module(torch.from_numpy(tokens).long()).numpy()


@pytest.mark.slow
def test_state_dict_round_trip(trained):
    module, _, state = trained
    sd = torchbridge.state_dict(state)
    assert list(sd) == list(module.state_dict())
    for k, v in module.state_dict().items():
        assert sd[k].shape == v.shape and sd[k].dtype == v.dtype, k
    # tied: one tensor under both names
    assert sd["gpt.lm_head.weight"] is sd["gpt.embed_tokens.weight"]
    assert int(sd["bn.num_batches_tracked"]) == 2

    fresh = TiedWithBN()
    fresh.load_state_dict(sd)  # strict
    assert fresh.gpt.lm_head.weight is fresh.gpt.embed_tokens.weight
    flat = flatten(host(state.params))
    np.testing.assert_array_equal(
        fresh.gpt.embed_tokens.weight.detach().numpy(), flat["gpt.embed_tokens.weight"]
    )
    # the torch model and the bridged model now compute the same outputs (eval mode)
    tokens = np.random.default_rng(1).integers(0, 64, (2, 8)).astype(np.int32)
    adapter = torchbridge.from_torch(fresh)
    params, buffers = adapter.initial
    ours = jax.jit(lambda p, s: adapter.bind(p, s)(tokens))(state.params, state.model_state)
    np.testing.assert_allclose(np.asarray(ours), _outputs(fresh, tokens), atol=1e-5)
    del params, buffers


@pytest.mark.slow
def test_safetensors_both_directions(trained, tmp_path):
    _, engine, state = trained
    path = tmp_path / "model.safetensors"
    torchbridge.save_safetensors(state, path)
    loaded = torchbridge.load_safetensors(path)
    assert loaded["gpt.lm_head.weight"] is loaded["gpt.embed_tokens.weight"]
    fresh = TiedWithBN()
    fresh.load_state_dict(loaded)
    sd = torchbridge.state_dict(state)
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)

    # torch -> jaxcore: a torch model's safetensors file loads into a train state
    torch.manual_seed(5)
    other = TiedWithBN()
    other_path = tmp_path / "other.safetensors"
    torchbridge.save_safetensors(copy.deepcopy(other.state_dict()), other_path)
    new_state = torchbridge.load_state_dict(engine, state, other_path)
    back = torchbridge.state_dict(new_state)
    for k, v in other.state_dict().items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=0)
    q = new_state.params["gpt"]["embed_tokens"]["weight"]
    assert q.sharding == engine.state_shardings.params["gpt"]["embed_tokens"]["weight"]
