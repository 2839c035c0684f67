"""Porting probes off the main path: what a torch training script does that the bridge must
either reproduce exactly or refuse by name (never train on silently wrong)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, Dataset, RandomSampler

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import host
from tests.torchbridge.models import TwoLayer
from torchbridge.module import flatten


class Numbers(Dataset):
    def __len__(self):
        return 21

    def __getitem__(self, i):
        return torch.full((2,), float(i)), torch.tensor(i % 3)


def _sgd(module):
    return torch.optim.SGD(module.parameters(), lr=0.1)


@pytest.mark.parametrize(
    "make_sched, name",
    [
        (lambda o: S.ChainedScheduler([S.StepLR(o, 2), S.LinearLR(o)]), "ChainedScheduler"),
        (
            lambda o: S.SequentialLR(o, [S.LinearLR(o), S.StepLR(o, 2)], milestones=[3]),
            "SequentialLR",
        ),
        (lambda o: S.ReduceLROnPlateau(o), "ReduceLROnPlateau"),
    ],
    ids=["chained", "sequential", "plateau"],
)
def test_scheduler_without_base_lrs_is_refused_by_name(make_sched, name):
    module = TwoLayer()
    opt = _sgd(module)
    with pytest.raises(torchbridge.UnsupportedError, match=f"{name} is not supported.*optax"):
        torchbridge.to_optax(opt, module, make_sched(opt))


def test_param_group_added_after_the_scheduler_is_refused():
    module = TwoLayer()
    opt = torch.optim.SGD([module.a.weight, module.a.bias], lr=0.1)
    sched = S.StepLR(opt, 2)
    opt.add_param_group({"params": [module.b.weight, module.b.bias], "lr": 0.01})
    with pytest.raises(torchbridge.UnsupportedError, match=r"group 1.*after the scheduler"):
        torchbridge.to_optax(opt, module, sched)


def _step_once(module, opt):
    opt.zero_grad()
    module(torch.ones(2, 4)).sum().backward()
    opt.step()


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    ],
    ids=["adamw", "sgd-momentum"],
)
def test_optimizer_with_state_is_refused_not_restarted(make_opt):
    """A stepped (or load_state_dict-resumed) optimizer's moments cannot be dropped."""
    module = TwoLayer()
    opt = make_opt(module)
    _step_once(module, opt)
    with pytest.raises(torchbridge.UnsupportedError, match=r"state.*freshly built"):
        torchbridge.to_optax(opt, module)
    loaded = make_opt(module)
    loaded.load_state_dict(opt.state_dict())
    with pytest.raises(torchbridge.UnsupportedError, match="state"):
        torchbridge.to_optax(loaded, module)


def test_stepped_sgd_without_momentum_has_no_state_to_lose():
    module = TwoLayer()
    opt = _sgd(module)
    _step_once(module, opt)  # leaves {"momentum_buffer": None} per parameter
    torchbridge.to_optax(opt, module)


def _torch_batches(loader, epochs):
    return [tuple(t.numpy() for t in b) for _ in range(epochs) for b in loader]


def _ours(loader):
    return [tuple(np.asarray(t) for t in b) for b in loader]


@pytest.mark.parametrize("loader_seed", [None, 4], ids=["global-loader", "loader-generator"])
@pytest.mark.parametrize("sampler_seed", [None, 9], ids=["global-sampler", "sampler-generator"])
def test_sampler_with_its_own_generator_gives_torchs_batches(loader_seed, sampler_seed):
    """``sampler=RandomSampler(ds, generator=g)``: the permutation comes from the sampler's
    generator (or the global RNG), the iterator's base seed from the loader's."""
    data = Numbers()

    def make():
        torch.manual_seed(11)
        sg = None if sampler_seed is None else torch.Generator().manual_seed(sampler_seed)
        lg = None if loader_seed is None else torch.Generator().manual_seed(loader_seed)
        return DataLoader(
            data, batch_size=4, sampler=RandomSampler(data, generator=sg), generator=lg
        )

    expected = _torch_batches(make(), epochs=3)
    bridged = torchbridge.TorchLoader(make(), num_epochs=3)
    got = _ours(bridged)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a[0], b[0])

    # resume mid-epoch 2 from the saved position
    first = torchbridge.TorchLoader(make(), num_epochs=3)
    it = iter(first)
    for _ in range(8):
        next(it)
    resumed = torchbridge.TorchLoader(make(), num_epochs=3)
    resumed.set_state(first.get_state())
    for a, b in zip(_ours(resumed), expected[8:], strict=True):
        np.testing.assert_array_equal(a[0], b[0])


def test_custom_batch_sampler_error_says_what_to_do():
    data = Numbers()
    dl = DataLoader(data, batch_size=None)  # torch's BatchSampler and replayable custom
    # batch samplers are supported (test_offpath_stop39.py); no batching is refused
    with pytest.raises(torchbridge.UnsupportedError, match=r"batch_size=None.*batch_size=N"):
        torchbridge.TorchLoader(dl)


class WithUnused(torch.nn.Module):
    """``unused`` never takes part in ``forward``: torch leaves its ``.grad`` None."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _bridged_steps(module, opt, steps=2):
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, module, opt)
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.standard_normal((8, 4), dtype=np.float32)
        state, _ = step(state, (x, rng.integers(0, 3, 8).astype(np.int32)))
    return state


def test_parameters_without_gradient_and_no_decay_stay_put_silently():
    torch.manual_seed(0)
    module = WithUnused()
    before = module.unused.weight.detach().numpy().copy()
    opt = torch.optim.AdamW(
        [
            {"params": [module.a.weight, module.a.bias, module.b.weight, module.b.bias]},
            {"params": module.unused.parameters(), "weight_decay": 0.0},
        ],
        lr=1e-2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = _bridged_steps(module, opt)
    np.testing.assert_array_equal(flatten(host(state.params))["unused.weight"], before)
