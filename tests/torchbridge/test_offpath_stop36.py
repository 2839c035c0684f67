"""A torch training loop's host-side habits, bridged: each compared with plain torch.

Manual warmup (``group["lr"] = ...`` between steps), parameters without a gradient,
``requires_grad_(False)`` and ``model.eval()`` after prepare, gradient accumulation,
``clip_grad_value_``, and the optimizer's state dicts.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import max_abs_diff_to_torch

STEPS = 5


class Branchy(torch.nn.Module):
    """An auxiliary head the loss never reads (``use_aux`` off): torch's grad is None."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 3)
        self.aux = torch.nn.Linear(8, 3)
        self.use_aux = False

    def forward(self, x):
        h = torch.relu(self.a(x))
        out = self.b(h)
        return out + self.aux(h) if self.use_aux else out


def _pair(make=Branchy):
    """The same freshly initialised module twice: one for torch, one for the bridge."""
    torch.manual_seed(0)
    ours = make()
    theirs = make()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _batches(n=STEPS, rows=8):
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((rows, 4), dtype=np.float32), rng.integers(0, 3, rows))
        for _ in range(n)
    ]


def _torch_step(module, opt, x, y, clip=None):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(module(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    if clip is not None:
        torch.nn.utils.clip_grad_value_(module.parameters(), clip)
    opt.step()


def _bridged(module, opt, **kw):
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, module, opt, **kw)
    return state, engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))


def _two_groups(module, opt_cls, **kw):
    return opt_cls(
        [
            {"params": [*module.a.parameters(), *module.aux.parameters()], "lr": 1e-2},
            {"params": module.b.parameters(), "lr": 3e-2, "weight_decay": 0.1},
        ],
        **kw,
    )


def test_manual_warmup_writes_to_param_groups_take_effect_without_recompiling():
    """``for g in opt.param_groups: g["lr"] = ...`` before each step, and weight decay
    changed at runtime: the bridged run follows, step for step, in one compiled step."""
    ours, theirs = _pair()
    opt, topt = _two_groups(ours, torch.optim.AdamW), _two_groups(theirs, torch.optim.AdamW)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, ours, opt)
    traces = []
    criterion = torchbridge.loss(torch.nn.CrossEntropyLoss())

    def loss_fn(model, batch, rng):
        traces.append(1)  # runs once per trace, not per step
        return criterion(model, batch, rng)

    step = engine.train_step(loss_fn)
    for i, (x, y) in enumerate(_batches()):
        for o in (opt, topt):
            for k, g in enumerate(o.param_groups):
                g["lr"] = (1e-2, 3e-2)[k] * (i + 1) / STEPS
                g["weight_decay"] = 0.2 * (i % 2)
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6
    assert len(traces) == 1


@pytest.mark.parametrize(
    "opt_cls, kw",
    [
        (torch.optim.AdamW, {"weight_decay": 0.1}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
    ],
    ids=["adamw", "sgd-momentum"],
)
def test_parameters_the_loss_never_reads_are_skipped_like_torch(opt_cls, kw):
    """torch skips a parameter whose .grad is None: no decay, no moment update."""
    ours, theirs = _pair()
    before = ours.aux.weight.detach().numpy().copy()
    opt, topt = opt_cls(ours.parameters(), **kw), opt_cls(theirs.parameters(), **kw)
    state, step = _bridged(ours, opt)
    for x, y in _batches():
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6
    np.testing.assert_array_equal(np.asarray(state.params["aux"]["weight"]), before)


def test_requires_grad_false_after_prepare_freezes_like_torch():
    ours, theirs = _pair()
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    state, step = _bridged(ours, opt)
    for i, (x, y) in enumerate(_batches()):
        if i == 2:
            ours.a.requires_grad_(False)
            theirs.a.requires_grad_(False)
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


def test_unfreezing_a_parameter_frozen_at_prepare_is_refused_by_name():
    ours, _ = _pair()
    ours.a.weight.requires_grad_(False)
    state, step = _bridged(ours, torch.optim.SGD(ours.b.parameters(), lr=0.1))
    ours.a.weight.requires_grad_(True)
    x, y = _batches(1)[0]
    with pytest.raises(torchbridge.UnsupportedError, match=r"\['a.weight'\].*before torchbridge"):
        step(state, (x, y.astype(np.int32)))


class Dropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(self.drop(self.a(x)))


def test_model_eval_after_the_step_compiled_turns_dropout_off_like_torch():
    ours, theirs = _pair(Dropped)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    state, step = _bridged(ours, opt)
    (x, y), *rest = _batches(3)
    state, _ = step(state, (x, y.astype(np.int32)))  # compiled in train mode
    ours.eval()
    theirs.eval()
    theirs.load_state_dict(torchbridge.state_dict(state))
    for x, y in rest:
        state, metrics = step(state, (x, y.astype(np.int32)))
        expected = torch.nn.functional.cross_entropy(
            theirs(torch.from_numpy(x)), torch.from_numpy(y)
        )
        assert float(metrics["loss"]) == pytest.approx(float(expected.detach()), abs=1e-6)
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


def test_gradient_accumulation_matches_torchs_loss_over_k_backwards():
    """torch: ``(loss / k).backward()`` over k microbatches, then ``step()``; the bridge:
    ``grad_accum=k`` with the k microbatches as one batch."""
    ours, theirs = _pair()
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), grad_accum=2)
    state = torchbridge.prepare(engine, ours, torch.optim.AdamW(ours.parameters(), lr=1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    batches = _batches(4)
    for first, second in zip(batches[::2], batches[1::2], strict=True):
        topt.zero_grad()
        for x, y in (first, second):
            loss = torch.nn.functional.cross_entropy(
                theirs(torch.from_numpy(x)), torch.from_numpy(y)
            )
            (loss / 2).backward()
        topt.step()
        x = np.concatenate([first[0], second[0]])
        y = np.concatenate([first[1], second[1]]).astype(np.int32)
        state, _ = step(state, (x, y))
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


def test_clip_grad_value_matches_torchs_clip_grad_value_():
    ours, theirs = _pair()
    opt = torch.optim.SGD(ours.parameters(), lr=0.5, momentum=0.9)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.5, momentum=0.9)
    state, step = _bridged(ours, opt, clip_grad_value=0.05)
    for x, y in _batches():
        state, _ = step(state, (x, y.astype(np.int32)))
        _torch_step(theirs, topt, x, y, clip=0.05)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


def test_prepared_optimizers_state_dicts_raise_instead_of_saving_nothing():
    """Mid-run ``optimizer.state_dict()`` would hold no moments (they live in the
    TrainState), and a resume from it would restart Adam silently."""
    ours, _ = _pair()
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    _bridged(ours, opt)
    with pytest.raises(torchbridge.UnsupportedError, match=r"state_dict.*jaxcore.Checkpointer"):
        opt.state_dict()
    with pytest.raises(torchbridge.UnsupportedError, match=r"load_state_dict.*Checkpointer"):
        opt.load_state_dict({})
