"""A TorchLoader (and a Grain iterator) through `jaxcore.Checkpointer`: exact resume."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import jaxcore as jc
import torchbridge
from jaxcore.models import Transformer, TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=16)
TX = optax.sgd(0.1)


def factory(rngs):
    return Transformer(CFG, rngs=rngs)


class Squares(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": torch.tensor(i * i)}


@pytest.fixture(scope="module")
def engine():
    return jc.Engine(parallel=jc.ParallelConfig(fsdp=8))


def _torch_loader(engine):
    g = torch.Generator().manual_seed(3)
    dl = DataLoader(Squares(), batch_size=8, shuffle=True, drop_last=True, generator=g)
    return torchbridge.TorchLoader(dl, engine, num_epochs=3)


def _host(batch):
    return jax.tree.map(np.asarray, batch)


def _save_after(directory, engine, loader, batches: int, take) -> list:
    """Fresh run: consume ``batches`` batches, save step ``batches`` with the loader."""
    with jc.Checkpointer(jc.CheckpointConfig(directory=directory), loader=loader) as ckpt:
        state, _ = ckpt.restore_or_init(engine, factory, TX)
        assert ckpt.resumed_step is None
        head = [take() for _ in range(batches)]
        ckpt.save(state.replace(step=jnp.int32(batches)), force=True)
    return head


def test_torch_loader_resumes_exactly_through_the_checkpointer(tmp_path, engine):
    full = [_host(b) for b in _torch_loader(engine)]
    assert len(full) == 15
    first = _torch_loader(engine)
    it = iter(first)
    head = _save_after(tmp_path, engine, first, 7, lambda: _host(next(it)))  # crosses an epoch

    resumed = _torch_loader(engine)
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path), loader=resumed) as ckpt:
        state, loader = ckpt.restore_or_init(engine, factory, TX)
    assert ckpt.resumed_step == 7 and int(state.step) == 7 and loader is resumed
    got = head + [_host(b) for b in resumed]
    assert len(got) == len(full)
    for a, b in zip(got, full, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])
    record = ckpt.read_record(7)
    assert record["input"] == {"step_indexed": False, "type": "TorchLoader"}


def test_grain_iterator_resumes_exactly_through_the_checkpointer(tmp_path, engine):
    def dataset():
        return grain.MapDataset.range(50).shuffle(seed=5).map(lambda i: i * 3).to_iter_dataset()

    full = list(dataset())
    it = iter(dataset())
    head = _save_after(tmp_path, engine, it, 12, lambda: next(it))
    resumed = iter(dataset())
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path), loader=resumed) as ckpt:
        ckpt.restore_or_init(engine, factory, TX)
    assert head + list(resumed) == full
