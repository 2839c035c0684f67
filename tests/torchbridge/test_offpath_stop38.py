"""DataLoader interop off the tested path: samplers, workers, iterable datasets, dataclass
batches, ReduceLROnPlateau, and DistributedSampler over 2 processes (this file is also the
script `jaxcore launch -n 2` runs for that test)."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import max_abs_diff_to_torch, torch_train
from tests.torchbridge.models import MLP


def _ids(loader) -> list[list[int]]:
    return [np.asarray(b[0]).tolist() for b in loader]


def _numbered(n: int = 24) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.arange(n), torch.randn(n, 8, generator=g), torch.arange(n) % 4)


def _xy_loss(module, batch):
    return F.cross_entropy(module(batch[1]), batch[2])


def _prepared(model, opt, scheduler=None):
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, model, opt, scheduler)
    return engine, state


def test_persistent_workers_epochs_after_the_first_match_the_dataloader():
    # A persistent DataLoader draws its iterator's base seed once, not once per epoch, so
    # the shuffle of epoch 2 onwards comes from a different point of the generator.
    def make():
        g = torch.Generator().manual_seed(1)
        return DataLoader(
            _numbered(10), batch_size=4, shuffle=True, num_workers=2,
            persistent_workers=True, prefetch_factor=3, generator=g,
        )  # fmt: skip

    dl = make()
    expected = [b[0].tolist() for _ in range(3) for b in dl]
    assert _ids(torchbridge.TorchLoader(make(), num_epochs=3)) == expected


def _weighted(g):
    return WeightedRandomSampler(torch.linspace(0.1, 1.0, 24), 20, generator=g)


def _subset(g):
    return SubsetRandomSampler(list(range(3, 24, 2)), generator=g)


@pytest.mark.parametrize("make_sampler", [_weighted, _subset])
@pytest.mark.parametrize("own_generator", [True, False])
def test_weighted_and_subset_samplers_give_torchs_batches_and_resume_mid_epoch(
    make_sampler, own_generator
):
    def make():
        g = torch.Generator().manual_seed(7) if own_generator else None
        return DataLoader(_numbered(), batch_size=4, sampler=make_sampler(g))

    torch.manual_seed(3)  # the global RNG a None generator draws from, as captured
    bridged = torchbridge.TorchLoader(make(), num_epochs=3)
    torch.manual_seed(3)
    dl = make()
    expected = [b[0].tolist() for _ in range(3) for b in dl]
    first = _ids(bridged)
    assert first == expected and len(bridged) == len(dl)

    torch.manual_seed(3)
    partial = torchbridge.TorchLoader(make(), num_epochs=3)
    it = iter(partial)
    for _ in range(len(dl) + 2):  # into the middle of epoch 2
        next(it)
    resumed = torchbridge.TorchLoader(make(), num_epochs=3)
    resumed.set_state(json.loads(json.dumps(partial.get_state())))
    assert _ids(resumed) == expected[len(dl) + 2 :]


class Shards(IterableDataset):
    """Each DataLoader worker yields its own share of 16 rows."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(16, 8, generator=g), torch.arange(16) % 4

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        me, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(me, 16, workers):
            yield torch.tensor(i), self.x[i], self.y[i]


def test_iterable_dataset_is_named_and_its_batches_train_straight_through_the_step():
    dl = DataLoader(Shards(), batch_size=8, num_workers=2)
    with pytest.raises(torchbridge.UnsupportedError, match=r"Shards is an IterableDataset"):
        torchbridge.TorchLoader(dl)
    # What the error says to do: the DataLoader's own batches, straight into the step.
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    engine, state = _prepared(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss(), inputs=1, target=2))
    seen = []
    for batch in dl:
        seen.extend(batch[0].tolist())
        state, _ = step(state, batch)
    assert sorted(seen) == list(range(16))
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    torch_train(reference, opt, _xy_loss, list(dl))
    assert max_abs_diff_to_torch(state.params, reference) < 1e-5


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class RegisteredPair:
    x: torch.Tensor
    y: torch.Tensor


def _pair_loss(model, batch, rng):
    return model.call(lambda m, x, y: F.cross_entropy(m(x), y), batch.x, batch.y, rng=rng), {}


def _collate_into(cls):
    return lambda rows: cls(torch.stack([r[1] for r in rows]), torch.stack([r[2] for r in rows]))


def test_a_dataclass_batch_trains_when_registered_and_is_named_when_not():
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    engine, state = _prepared(model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = engine.train_step(_pair_loss)
    plain = DataLoader(_numbered(16), batch_size=8, collate_fn=_collate_into(Pair))
    with pytest.raises(jc.BatchError, match=r"Pair dataclass.*register_dataclass\(Pair\)"):
        step(state, next(iter(plain)))
    dl = DataLoader(_numbered(16), batch_size=8, collate_fn=_collate_into(RegisteredPair))
    for batch in torchbridge.TorchLoader(dl, engine, num_epochs=1):
        state, _ = step(state, batch)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch_train(reference, opt, lambda m, b: F.cross_entropy(m(b.x), b.y), list(dl))
    assert max_abs_diff_to_torch(state.params, reference) < 1e-5


def test_reduce_lr_on_plateau_stepped_with_the_loss_matches_torch():
    def plateau(opt):  # a 50% relative threshold: the lr halves on most steps
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, threshold=0.5)

    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    batches = [next(iter(DataLoader(_numbered(), batch_size=8, shuffle=True))) for _ in range(6)]
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = plateau(opt)
    engine, state = _prepared(model, opt, sched)
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss(), inputs=1, target=2))
    lrs = []
    for batch in batches:
        state, metrics = step(state, batch)
        sched.step(float(metrics["loss"]))
        lrs.append(opt.param_groups[0]["lr"])

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    ref_sched, ref_lrs = plateau(ref_opt), []
    for batch in batches:
        ref_opt.zero_grad()
        loss = _xy_loss(reference, batch)
        loss.backward()
        ref_opt.step()
        ref_sched.step(loss.item())
        ref_lrs.append(ref_opt.param_groups[0]["lr"])
    assert lrs == ref_lrs and len(set(lrs)) > 2
    assert max_abs_diff_to_torch(state.params, reference) < 1e-5


def _bridged_linear():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    return _prepared(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_autocast_inside_the_bridged_loss_is_refused_not_silently_float32():
    engine, state = _bridged_linear()

    def loss_fn(model, batch, rng):
        def run(module, x, y):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.cross_entropy(module(x).float(), y)

        return model.call(run, batch[1], batch[2], rng=rng), {}

    batch = next(iter(DataLoader(_numbered(), batch_size=8)))
    with pytest.raises(torchbridge.UnsupportedError, match=r"'Linear' ran inside torch\.autocast"):
        engine.train_step(loss_fn)(state, batch)


def test_grad_scaler_scale_inside_the_bridged_loss_is_refused_not_scaled_gradients():
    # Unrefused, the step trained on 65536 x the loss: the bias moved by ~1000, not ~0.1.
    engine, state = _bridged_linear()
    scaler = torch.amp.GradScaler("cpu")

    def loss_fn(model, batch, rng):
        def run(module, x, y):
            return scaler.scale(F.cross_entropy(module(x), y))

        return model.call(run, batch[1], batch[2], rng=rng), {}

    batch = next(iter(DataLoader(_numbered(), batch_size=8)))
    with pytest.raises(torchbridge.UnsupportedError, match=r"GradScaler\.scale\(loss\)"):
        engine.train_step(loss_fn)(state, batch)
    assert scaler.scale(torch.ones(())).item() == 2.0**16  # eager torch is untouched


# ----------------------------------------------------------------------------- 2 processes
SCRIPT = Path(__file__)


class Logged(torch.utils.data.Dataset):
    """32 numbered rows that record the indices read, in order."""

    def __init__(self):
        self.data, self.read = _numbered(32), []

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.read.append(int(i))
        return self.data[i]


def _distributed(procs: int, rank: int, batch_size: int) -> tuple[DataLoader, MLP]:
    torch.manual_seed(0)
    data = Logged()
    sampler = DistributedSampler(data, num_replicas=procs, rank=rank, shuffle=True, seed=3)
    return DataLoader(data, batch_size=batch_size, sampler=sampler), MLP()


def distributed_run(procs: int, rank: int, batch_size: int) -> dict:
    """Two epochs of AdamW over this process's DistributedSampler share."""
    dl, model = _distributed(procs, rank, batch_size)
    engine, state = _prepared(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss(), inputs=1, target=2))
    loader = torchbridge.TorchLoader(dl, engine, num_epochs=2)
    for batch in loader:
        state, _ = step(state, batch)
    params = {k: v.numpy().tolist() for k, v in torchbridge.state_dict(state).items()}
    return {"len": len(loader), "read": dl.dataset.read, "params": params}


def _sampler_order(procs: int, rank: int) -> list[int]:
    dl, _ = _distributed(procs, rank, 1)
    order = []
    for epoch in range(2):
        dl.sampler.set_epoch(epoch)
        order += list(dl.sampler)
    return order


@pytest.mark.slow
@pytest.mark.multiprocess
def test_distributed_sampler_gives_each_process_its_share_and_the_one_process_result(tmp_path):
    from tests.jaxcore.test_launch import start_two_ranks

    proc = start_two_ranks(SCRIPT, str(tmp_path))
    one = distributed_run(1, 0, 8)
    # The one-process run is torch's: set_epoch(e) before each epoch.
    dl, reference = _distributed(1, 0, 8)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for epoch in range(2):
        dl.sampler.set_epoch(epoch)
        torch_train(reference, opt, _xy_loss, list(dl))
    for name, p in reference.state_dict().items():
        np.testing.assert_allclose(one["params"][name], p.numpy(), atol=1e-5)

    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    for rank in range(2):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["len"] == 4
        assert res["read"] == _sampler_order(2, rank)  # its own share, each epoch's order
        for name, value in one["params"].items():
            np.testing.assert_allclose(res["params"][name], value, atol=1e-5)


def test_a_distributed_sampler_for_another_process_count_is_refused_by_name():
    dl, _ = _distributed(2, 1, 4)  # this test runs one process
    with pytest.raises(jc.ConfigError, match=r"num_replicas=1, rank=0"):
        torchbridge.TorchLoader(dl)


if __name__ == "__main__":
    from jaxcore.distributed import initialize

    initialize()
    result = distributed_run(jax.process_count(), jax.process_index(), 4)
    Path(sys.argv[1], f"rank{jax.process_index()}.json").write_text(json.dumps(result))
