"""Training parity: the engine on 8 devices (FSDP, FSDP x tensor) vs plain PyTorch."""

from __future__ import annotations

import copy

import numpy as np
import optax
import pytest
import torch
from torch.nn import functional as F

import jaxcore as jc
import torchbridge
from tests.torchbridge import models
from tests.torchbridge.helpers import host, max_abs_diff_to_torch, torch_train
from torchbridge.module import flatten

TOL = 1e-5
STEPS = 5


def lm_loss(model, batch, rng):
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1], rng=rng)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss, {}


@pytest.fixture(scope="module")
def gpt_run():
    """The initial GPT, 5 token batches, and the torch AdamW reference after 5 steps."""
    torch.manual_seed(0)
    init = models.GPT(dropout=0.0)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 64, (8, 9)).astype(np.int32) for _ in range(STEPS)]
    ref = copy.deepcopy(init)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)  # torch's default weight_decay=0.01
    losses = torch_train(
        ref, opt, lambda m, b: models.gpt_loss(m, torch.from_numpy(b).long()), batches
    )
    return init, batches, ref, losses


@pytest.mark.slow
@pytest.mark.parametrize(
    "parallel, rules",
    [
        (jc.ParallelConfig(fsdp=-1), ()),
        (jc.ParallelConfig(fsdp=4, tensor=2), torchbridge.TENSOR_PARALLEL_RULES),
    ],
    ids=["fsdp8-zero3", "fsdp4-tensor2"],
)
def test_adamw_steps_match_torch(gpt_run, parallel, rules):
    init, batches, ref, ref_losses = gpt_run
    module = copy.deepcopy(init)
    engine = jc.Engine(parallel=parallel, zero=3, param_rules=rules)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    state = torchbridge.prepare(engine, module, opt)
    if parallel.tensor > 1:  # the Megatron rules really split the projections
        q = engine.state_shardings.params["layers"]["0"]["attn"]["q_proj"]["weight"]
        o = engine.state_shardings.params["layers"]["0"]["attn"]["o_proj"]["weight"]
        assert q.spec[0] == "tensor", q.spec
        assert o.spec[1] == "tensor", o.spec
    else:
        emb = engine.state_shardings.params["embed_tokens"]["weight"]
        assert "fsdp" in tuple(emb.spec), emb.spec
    step = engine.train_step(lm_loss)
    losses = []
    for b in batches:
        state, metrics = step(state, {"tokens": b})
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, ref_losses, atol=TOL)
    assert max_abs_diff_to_torch(state.params, ref) < TOL


@pytest.mark.slow
def test_batchnorm_running_stats_match_torch_after_3_steps():
    torch.manual_seed(0)
    init = models.CNN()
    rng = np.random.default_rng(0)
    data = [
        (rng.standard_normal((8, 3, 6, 6), dtype=np.float32), rng.integers(0, 4, 8))
        for _ in range(3)
    ]
    ref = copy.deepcopy(init)
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    torch_train(
        ref,
        sgd,
        lambda m, b: F.cross_entropy(m(torch.from_numpy(b[0])), torch.from_numpy(b[1])),
        data,
    )

    module = copy.deepcopy(init)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3)
    state = torchbridge.prepare(
        engine, module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    )
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    for x, y in data:
        state, _ = step(state, (x, y.astype(np.int32)))
    stats = flatten(host(state.model_state))
    for name in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(stats[name], ref.state_dict()[name].numpy(), atol=TOL)
    assert int(stats["bn.num_batches_tracked"]) == 3
    assert max_abs_diff_to_torch(state.params, ref) < TOL


def test_batchnorm_without_momentum_is_refused():
    module = torch.nn.Sequential(torch.nn.BatchNorm1d(4, momentum=None))
    with pytest.raises(torchbridge.UnsupportedError, match="momentum=None"):
        torchbridge.from_torch(module)
