"""torchbridge for Hugging Face users: eval-mode modules, LambdaLR schedules, param groups."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

import jaxcore as jc
import torchbridge
from torchbridge.module import flatten, nest

from .helpers import host


class Dropper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


def _outputs(adapter, x, rng):
    params, state = jax.tree.map(jnp.asarray, adapter.initial)
    return np.asarray(adapter.bind(params, state)(jnp.asarray(x), rng=rng))


def test_a_module_in_eval_mode_warns_and_train_true_trains_it_in_train_mode():
    module = Dropper().eval()  # what from_pretrained hands back
    x = np.ones((4, 8), np.float32)
    with pytest.warns(UserWarning, match=r"eval mode .* pass train=True"):
        silent = torchbridge.from_torch(module)
    key = jax.random.key(0)
    # Eval mode, as warned: dropout is off even with a key.
    np.testing.assert_array_equal(_outputs(silent, x, key), _outputs(silent, x, None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit train= is a decision: no warning
        trained = torchbridge.from_torch(module, train=True)
        kept = torchbridge.from_torch(module, train=False)
    dropped = _outputs(trained, x, key)
    assert (dropped == 0).mean() > 0.2  # dropout on
    np.testing.assert_array_equal(_outputs(trained, x, None), _outputs(kept, x, key))
    assert not module.training  # the user's module keeps its own flags


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(6, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def _batches(n):
    rng = np.random.default_rng(0)
    return [
        {0: rng.normal(size=(8, 6)).astype(np.float32), 1: rng.integers(0, 3, 8).astype(np.int32)}
        for _ in range(n)
    ]


def test_lambda_lr_from_get_linear_schedule_with_warmup_matches_torch_for_20_steps():
    module = Tiny().train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    sched = transformers.get_linear_schedule_with_warmup(opt, 5, 20)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, module, opt, sched)
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    ours = []
    for b in _batches(20):
        state, _ = step(state, b)
        ours.append(float(state.opt_state.hyperparams["learning_rate"]))
    theirs = []
    for b in _batches(20):
        theirs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            module(torch.as_tensor(b[0])), torch.as_tensor(b[1]).long()
        ).backward()
        opt.step()
        sched.step()
    assert theirs[0] == 0.0 and max(theirs) == pytest.approx(1e-2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-12)
    flat = flatten(host(state.params))
    for name, p in module.named_parameters():
        np.testing.assert_allclose(flat[name], p.detach().numpy(), atol=1e-6, err_msg=name)


def test_a_lambda_that_cannot_be_evaluated_ahead_is_refused_clearly():
    module = Tiny()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9**step)
    with pytest.raises(torchbridge.UnsupportedError, match="schedule_steps=N"):
        torchbridge.to_optax(opt, module, sched)
    tx = torchbridge.to_optax(opt, module, sched, schedule_steps=4)
    state = tx.init(nest({n: jnp.zeros(p.shape) for n, p in module.named_parameters()}))
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)

    def stateful(step, seen=[]):  # noqa: B006 (the point: it depends on its calls)
        seen.append(step)
        if len(seen) > 2:
            raise RuntimeError("called too often")
        return 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD(module.parameters(), lr=0.1), stateful
    )
    with pytest.raises(torchbridge.UnsupportedError, match="pure function of the step"):
        torchbridge.to_optax(sched.optimizer, module, sched, schedule_steps=10)


def test_two_parameter_groups_match_torch_for_5_steps():
    """Per-group lr and weight decay through optax.multi_transform, in the engine."""
    module = Tiny().train()
    groups = [
        {"params": [module.body.weight, module.head.weight], "weight_decay": 0.1, "lr": 3e-2},
        {"params": [module.body.bias, module.head.bias], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-2)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, module, opt)
    assert isinstance(engine.optimizer, optax.GradientTransformation)
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    for b in _batches(5):
        state, _ = step(state, b)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            module(torch.as_tensor(b[0])), torch.as_tensor(b[1]).long()
        ).backward()
        opt.step()
    flat = flatten(host(state.params))
    for name, p in module.named_parameters():
        np.testing.assert_allclose(flat[name], p.detach().numpy(), atol=1e-6, err_msg=name)
    # One group (lr 1e-2, decay 0.01 everywhere) would have ended elsewhere.
    single = Tiny().train()
    one = torch.optim.AdamW(single.parameters(), lr=1e-2)
    for b in _batches(5):
        one.zero_grad()
        torch.nn.functional.cross_entropy(
            single(torch.as_tensor(b[0])), torch.as_tensor(b[1]).long()
        ).backward()
        one.step()
    assert np.abs(flat["body.weight"] - single.body.weight.detach().numpy()).max() > 1e-3


def _collectives(rules):
    """all-gather / collective-permute counts in the compiled fsdp=4, tensor=2 GPT-2 step."""
    import re

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        vocab_size=256,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg).train()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2), param_rules=rules(model))

    def loss_fn(m, batch, rng):
        return m.call(lambda mod, t: mod(t, labels=t).loss, batch["tokens"], rng=rng), {}

    state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    tokens = np.random.default_rng(0).integers(0, 256, (8, 16)).astype(np.int32)
    step = engine.train_step(loss_fn)
    hlo = step.jitted.lower(state, engine.shard_batch({"tokens": tokens})).compile().as_text()
    count = {
        op: len(re.findall(rf"= \S+ {op}(-start)?\(", hlo))
        for op in ("all-gather", "collective-permute")
    }
    return count, engine, state


@pytest.mark.slow
def test_gpt2_conv1d_rules_split_the_right_dimensions_and_cut_collectives():
    good, engine, state = _collectives(torchbridge.tensor_parallel_rules)
    spec = {k: tuple(v.spec) for k, v in flatten(engine.state_shardings.params).items()}
    # Conv1D (in, out): c_fc splits its output (dim 1) over tensor, c_proj its input (dim 0).
    assert spec["transformer.h.0.mlp.c_fc.weight"] == ("fsdp", "tensor")
    assert spec["transformer.h.0.mlp.c_proj.weight"] == ("tensor", "fsdp")
    assert spec["transformer.h.0.attn.c_attn.weight"] == ("fsdp", None)
    # Row-parallel biases are ZeRO-3 sharded: replicated, each cost a gradient all-gather.
    assert spec["transformer.h.0.attn.c_proj.bias"] == ("fsdp",)
    assert spec["transformer.h.0.mlp.c_proj.bias"] == ("fsdp",)
    with pytest.warns(UserWarning, match="Conv1D layers"):
        bad, _, _ = _collectives(lambda model: torchbridge.TENSOR_PARALLEL_RULES)
    # The bar (correct rules): at most 9 all-gathers and 6 collective-permutes.
    # Measured on this 2-layer model: 5 / 1 with these rules (the 3 token-index gathers of
    # the vocab-sharded embedding lookup, 2 of attention's backward), 39 / 40 with the
    # Linear rules.
    assert good["collective-permute"] <= 6 and good["all-gather"] <= 9, good
    assert bad["collective-permute"] > 3 * good["collective-permute"], (good, bad)
    assert bad["all-gather"] > 2 * good["all-gather"], (good, bad)
    del state
