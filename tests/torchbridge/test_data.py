"""The bridged DataLoader: same batches as torch with the same seed, exact resume."""

from __future__ import annotations

import grain
import jax
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import jaxcore as jc
import torchbridge


class Squares(Dataset):
    def __init__(self, n: int = 21):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(i * i)}


def pairs_collate(samples):
    xs = torch.stack([s["x"] for s in samples])
    return {"x": xs, "y": torch.stack([s["y"] for s in samples]), "sum": xs.sum(1)}


def _np(batch):
    return {k: np.asarray(v) for k, v in batch.items()}


def _torch_batches(loader, epochs):
    return [_np({k: v.numpy() for k, v in b.items()}) for _ in range(epochs) for b in loader]


@pytest.mark.parametrize("shuffle, drop_last", [(True, True), (True, False), (False, False)])
def test_same_batches_as_dataloader(shuffle, drop_last):
    def make():
        g = torch.Generator().manual_seed(7)
        return DataLoader(
            Squares(),
            batch_size=4,
            shuffle=shuffle,
            drop_last=drop_last,
            generator=g,
            collate_fn=pairs_collate,
        )

    expected = _torch_batches(make(), epochs=3)
    ours = [_np(b) for b in torchbridge.TorchLoader(make(), num_epochs=3)]
    assert len(ours) == len(expected)
    for a, b in zip(ours, expected, strict=True):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def test_global_rng_mode_matches_dataloader():
    torch.manual_seed(11)
    expected = _torch_batches(DataLoader(Squares(), batch_size=5, shuffle=True), epochs=2)
    torch.manual_seed(11)
    loader = torchbridge.TorchLoader(
        DataLoader(Squares(), batch_size=5, shuffle=True), num_epochs=2
    )
    ours = [_np(b) for b in loader]
    for a, b in zip(ours, expected, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])


def test_resume_exactly_and_shard_over_the_engine():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))

    def make():
        g = torch.Generator().manual_seed(3)
        dl = DataLoader(Squares(40), batch_size=8, shuffle=True, drop_last=True, generator=g)
        return torchbridge.TorchLoader(dl, engine, num_epochs=3)

    full = [jax.tree.map(np.asarray, b) for b in make()]
    assert len(full) == 15
    first = make()
    it = iter(first)
    head = [jax.tree.map(np.asarray, next(it)) for _ in range(7)]  # crosses an epoch
    saved = first.get_state()
    batch = next(iter(make()))
    assert isinstance(batch["x"], jax.Array) and batch["x"].sharding == engine.batch_sharding

    resumed = make()
    resumed.set_state(saved)
    rest = [jax.tree.map(np.asarray, b) for b in resumed]
    got = head + rest
    assert len(got) == len(full)
    for a, b in zip(got, full, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])


def test_dataset_source_feeds_grain():
    source = torchbridge.DatasetSource(Squares(6))
    assert repr(source) == repr(torchbridge.DatasetSource(Squares(6)))
    ds = grain.MapDataset.source(source).shuffle(seed=0).batch(3)
    batches = list(ds)
    assert sorted(np.concatenate([b["y"] for b in batches]).tolist()) == [i * i for i in range(6)]
    assert isinstance(batches[0]["x"], np.ndarray)


def test_a_short_last_batch_the_engine_cannot_split_names_drop_last():
    """12 rows in batches of 8 over 8 devices: the last batch has 4 rows. The engine's
    error alone said "a multiple of 8"; it now says the cause and drop_last=True."""
    ds = torch.utils.data.TensorDataset(torch.arange(24, dtype=torch.float32).reshape(12, 2))
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    it = iter(torchbridge.TorchLoader(DataLoader(ds, batch_size=8), engine, num_epochs=1))
    next(it)
    with pytest.raises(jc.BatchError, match=r"last, short batch \(4 of 8 rows.*drop_last=True"):
        next(it)
    loader = torchbridge.TorchLoader(DataLoader(ds, batch_size=8, drop_last=True), engine)
    assert len(loader) == 1


def test_set_state_converts_the_position_to_integers():
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 1))
    loader = torchbridge.TorchLoader(DataLoader(ds, batch_size=2))
    state = loader.get_state()
    loader.set_state({**state, "epoch": "1", "batch": np.int64(1)})
    assert loader.get_state()["epoch"] == 1 and type(loader.get_state()["batch"]) is int
