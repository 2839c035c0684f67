"""torch optimizers and LR schedulers mapped to optax: same updates, step for step."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
import torch
from torch.optim import lr_scheduler as S

import torchbridge
from torchbridge.module import flatten, nest

STEPS = 8


def _run_both(make_opt, make_sched=None, groups=None):
    """Same gradient sequence into a torch optimizer and its optax mapping."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    params = groups(module) if groups else module.parameters()
    opt = make_opt(params)
    sched = make_sched(opt) if make_sched else None
    tx = torchbridge.to_optax(opt, module, sched)
    jparams = nest({n: p.detach().numpy().copy() for n, p in module.named_parameters()})
    jstate = tx.init(jparams)
    update = jax.jit(tx.update)
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        grads = {
            n: rng.standard_normal(p.shape).astype(np.float32) for n, p in module.named_parameters()
        }
        for n, p in module.named_parameters():
            p.grad = torch.from_numpy(grads[n])
        opt.step()
        if sched:
            sched.step()
        updates, jstate = update(nest(grads), jstate, jparams)
        jparams = optax.apply_updates(jparams, updates)
    flat = flatten(jparams)
    return max(
        float(np.max(np.abs(np.asarray(flat[n]) - p.detach().numpy())))
        for n, p in module.named_parameters()
    )


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
        lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6),
        lambda p: torch.optim.AdamW(p, lr=0.01, maximize=True),
    ],
    ids=["sgd", "sgd-momentum-wd", "sgd-nesterov", "adam-l2", "adamw", "adamw-maximize"],
)
def test_optimizer_matches_torch(make_opt):
    assert _run_both(make_opt) < 1e-6


@pytest.mark.parametrize(
    "make_opt, make_sched",
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), lambda o: S.StepLR(o, step_size=3, gamma=0.5)),
        (lambda p: torch.optim.AdamW(p, lr=0.01), lambda o: S.CosineAnnealingLR(o, T_max=5)),
        (
            lambda p: torch.optim.AdamW(p, lr=0.01),
            lambda o: S.LinearLR(o, start_factor=0.1, total_iters=4),
        ),
        (
            lambda p: torch.optim.AdamW(p, lr=0.01),
            lambda o: S.OneCycleLR(o, max_lr=0.05, total_steps=STEPS),
        ),
        (
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            lambda o: S.OneCycleLR(o, max_lr=0.2, total_steps=STEPS, anneal_strategy="linear"),
        ),
    ],
    ids=["steplr", "cosine", "linear-warmup", "onecycle-adamw", "onecycle-sgd-linear"],
)
def test_scheduler_matches_torch(make_opt, make_sched):
    assert _run_both(make_opt, make_sched) < 1e-6


def test_param_groups_keep_their_own_settings():
    def groups(module):
        return [
            {"params": [module[0].weight, module[1].weight], "weight_decay": 0.1},
            {"params": [module[0].bias, module[1].bias], "weight_decay": 0.0, "lr": 0.05},
        ]

    assert _run_both(lambda g: torch.optim.AdamW(g, lr=0.01), groups=groups) < 1e-6


def test_adamw_default_weight_decay_is_torchs():
    module = torch.nn.Linear(2, 2)
    tx = torchbridge.to_optax(torch.optim.AdamW(module.parameters(), lr=1e-3), module)
    state = tx.init(nest({n: p.detach().numpy() for n, p in module.named_parameters()}))
    assert float(state.hyperparams["weight_decay"]) == pytest.approx(0.01)


def test_unsupported_optimizer_and_scheduler_are_named():
    module = torch.nn.Linear(2, 2)
    with pytest.raises(torchbridge.UnsupportedError, match="Adadelta"):
        torchbridge.to_optax(torch.optim.Adadelta(module.parameters()), module)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(torchbridge.UnsupportedError, match="ExponentialLR"):
        torchbridge.to_optax(opt, module, S.ExponentialLR(opt, gamma=0.9))
