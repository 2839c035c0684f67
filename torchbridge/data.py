"""torch ``Dataset``/``DataLoader`` -> Grain -> global sharded batches, resumable exactly.

`DatasetSource` makes a map-style ``torch.utils.data.Dataset`` a Grain random-access
source (``__len__``/``__getitem__``, NumPy records, a stable ``repr`` so a checkpointed
position is checked against the same data). It feeds ``grain.MapDataset.source`` and so
any Grain-based loader (``jaxcore.input`` included).

`TorchLoader` carries a ``DataLoader``'s batch size, shuffle, ``drop_last`` and
``collate_fn`` over: epoch *e* visits the same indices in the same batches as the
DataLoader's *e*-th ``iter()`` (it replays torch's RNG draws: the base-seed draw from the
loader's generator, then ``randperm`` from the sampler's, the same one unless
``sampler=RandomSampler(ds, generator=g)`` brings its own; a ``None`` generator is the
global RNG as captured when the bridge was built). Batches come out as global
``jax.Array``s sharded over the engine's data axes. Its state, ``{"epoch", "batch",
"rng"}`` (plus ``"sampler_rng"`` for a sampler's own generator; JSON-able), restores the
exact position. With several processes, process *p* loads torch batch ``k * P + p`` of each
step *k* (Accelerate's ``BatchSamplerShard``), so ``batch_size`` is per process. *P* and
*p* are the engine's row blocks (`jaxcore.Engine.process_batch_block`): the process count
and index unless processes share rows (then they load the same batches).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import grain
import jax
import numpy as np

import jaxcore as jc
from torchbridge.errors import UnsupportedError
from torchbridge.module import to_numpy

log = logging.getLogger(__name__)


def numpy_tree(x: Any) -> Any:
    """Torch tensors (in any nesting of mappings, lists and tuples) as NumPy arrays.

    Every mapping becomes a plain dict: transformers' collators return a ``BatchEncoding``
    (a ``UserDict``), which JAX would take for one leaf, not a dict of arrays.
    """
    import torch
    from torch.utils import _pytree

    def one(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: numpy_tree(item) for k, item in v.items()}
        return to_numpy(v) if isinstance(v, torch.Tensor) else v

    return _pytree.tree_map(one, x, is_leaf=lambda v: isinstance(v, Mapping))


class DatasetSource:
    """A map-style torch ``Dataset`` as a Grain ``RandomAccessDataSource``.

    ``numpy=True`` (default) converts each record's tensors to NumPy (what Grain
    pipelines expect); ``numpy=False`` returns records as the dataset does, for a torch
    ``collate_fn``. ``name`` fixes the identity Grain checkpoints record (default: the
    dataset's class name and length).
    """

    def __init__(self, dataset: Any, *, name: str | None = None, numpy: bool = True):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise UnsupportedError(
                f"DatasetSource: {type(dataset).__name__} is not a map-style Dataset "
                "(needs __len__ and __getitem__); IterableDataset is not supported."
            )
        self.dataset = dataset
        self.numpy = numpy
        self.name = name or f"{type(dataset).__module__}.{type(dataset).__qualname__}"

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        record = self.dataset[int(index)]
        return numpy_tree(record) if self.numpy else record

    def __repr__(self) -> str:
        return f"DatasetSource(name={self.name!r}, len={len(self)})"


def _encode(state: Any) -> str:
    return base64.b64encode(bytes(state.numpy().tobytes())).decode("ascii")


def _rng_state(generator: Any) -> Any:
    """A generator's state, or the global RNG's for ``None``."""
    import torch

    return torch.get_rng_state() if generator is None else generator.get_state()


def _decode(text: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


class TorchLoader:
    """Iterate a ``DataLoader``'s batches as global sharded arrays, with exact resume.

    Args:
        dataloader: a ``torch.utils.data.DataLoader`` over a map-style dataset, with the
            default sequential or random (no replacement) sampler.
        engine: batches go through ``engine.shard_batch``; ``None`` yields NumPy.
        num_epochs: stop after this many epochs (``None``: run forever).
        prefetch: batches Grain prepares ahead in background threads.

    It implements `jaxcore.ResumableLoader`, so ``jaxcore.Checkpointer`` saves and restores
    its position; that position counts this process's batches, so a run resumes with the
    same number of processes.
    """

    step_indexed = False  # jaxcore.ResumableLoader: one position per process

    def __init__(
        self,
        dataloader: Any,
        engine: jc.Engine | None = None,
        *,
        num_epochs: int | None = None,
        prefetch: int = 2,
    ):
        from torch.utils.data import RandomSampler, SequentialSampler

        if dataloader.batch_size is None:
            raise UnsupportedError(
                "TorchLoader: a DataLoader without batch_size (batch_size=None or a custom "
                "batch_sampler) is not supported; build it as DataLoader(dataset, "
                "batch_size=N, shuffle=..., drop_last=...)."
            )
        sampler = dataloader.sampler
        if isinstance(sampler, RandomSampler):
            if sampler.replacement or sampler._num_samples is not None:
                raise UnsupportedError(
                    "TorchLoader: RandomSampler with replacement or num_samples is not "
                    "supported; use shuffle=True."
                )
            self.shuffle = True
        elif isinstance(sampler, SequentialSampler):
            self.shuffle = False
        else:
            raise UnsupportedError(
                f"TorchLoader: sampler {type(sampler).__name__} is not supported; use "
                "DataLoader(shuffle=True/False)."
            )
        self.dataloader = dataloader
        self.engine = engine
        self.batch_size = dataloader.batch_size
        self.drop_last = dataloader.drop_last
        self.collate_fn = dataloader.collate_fn
        self.source = DatasetSource(dataloader.dataset, numpy=False)
        self.num_epochs = num_epochs
        self.prefetch = prefetch
        # Two random streams: the iterator's base seed comes from the loader's generator,
        # the permutation from the sampler's (the loader passes its own to the sampler it
        # builds; `sampler=RandomSampler(ds, generator=g)` has another); None is the global
        # RNG, as captured now. One stream when both are the same.
        loader_gen = dataloader.generator
        self._sampler_gen = sampler.generator if self.shuffle else loader_gen
        self._split = self._sampler_gen is not loader_gen
        self._state = {"epoch": 0, "batch": 0, "rng": _encode(_rng_state(loader_gen))}
        if self._split:
            self._state["sampler_rng"] = _encode(_rng_state(self._sampler_gen))

    # ------------------------------------------------------------------ order
    def _epoch_batches(self, state: dict[str, Any]) -> tuple[list[list[int]], dict[str, str]]:
        """This epoch's batches of indices, and the RNG states the next epoch starts from."""
        import torch

        n = len(self.source)
        gen = torch.Generator()
        gen.set_state(_decode(state["rng"]))
        torch.empty((), dtype=torch.int64).random_(generator=gen)  # the iterator's base seed
        perm = gen
        if self._split:
            perm = torch.Generator()
            perm.set_state(_decode(state["sampler_rng"]))
        if self.shuffle:
            if self._sampler_gen is not None:
                order = torch.randperm(n, generator=perm).tolist()
                # RandomSampler.__iter__ ends with `randperm(n)[: num_samples % n]`, which
                # still draws a full permutation when the epoch is exhausted (torch 2.13).
                torch.randperm(n, generator=perm)
            else:  # RandomSampler seeds a fresh generator from the global RNG
                seed = int(torch.empty((), dtype=torch.int64).random_(generator=perm).item())
                order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        else:
            order = list(range(n))
        size = self.batch_size
        batches = [order[i : i + size] for i in range(0, n, size)]
        if self.drop_last and batches and len(batches[-1]) < size:
            batches.pop()
        rngs = {"rng": _encode(gen.get_state())}
        if self._split:
            rngs["sampler_rng"] = _encode(perm.get_state())
        return batches, rngs

    def _block(self) -> tuple[int, int]:
        if self.engine is None:
            return jax.process_index(), jax.process_count()
        return self.engine.process_batch_block

    def _process_batches(self, batches: list[list[int]]) -> list[list[int]]:
        me, procs = self._block()
        if procs == 1:
            return batches
        steps = len(batches) // procs
        return [batches[k * procs + me] for k in range(steps)]

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """The position: epoch, batch within it, and the RNG state the epoch started from."""
        return dict(self._state)

    def set_state(self, state: dict[str, Any]) -> None:
        """Resume from a `get_state` result (next batch yielded is the one after it)."""
        missing = {"epoch", "batch", "rng"} - set(state)
        if self._split:
            missing |= {"sampler_rng"} - set(state)
        if missing:
            raise jc.ConfigError(f"TorchLoader.set_state: state lacks {sorted(missing)}.")
        self._state = {**state, "epoch": int(state["epoch"]), "batch": int(state["batch"])}

    def __len__(self) -> int:
        """Steps per epoch."""
        n, size = len(self.source), self.batch_size
        per = n // size if self.drop_last else -(-n // size)
        return per // self._block()[1]

    # ------------------------------------------------------------------ iteration
    def _collate(self, indices: list[int]) -> Any:
        return numpy_tree(self.collate_fn([self.source[i] for i in indices]))

    def __iter__(self) -> Iterator[Any]:
        while self.num_epochs is None or self._state["epoch"] < self.num_epochs:
            batches, next_rngs = self._epoch_batches(self._state)
            mine = self._process_batches(batches)
            dataset = (
                grain.MapDataset.source(mine)
                .map(self._collate)
                .to_iter_dataset(
                    grain.ReadOptions(num_threads=1, prefetch_buffer_size=self.prefetch)
                )
            )
            it = iter(dataset)
            start = self._state["batch"]
            if start:
                it.set_state({"next_index": start})
            for k in range(start, len(mine)):
                batch = next(it)
                self._state = {**self._state, "batch": k + 1}
                yield batch if self.engine is None else self._shard(batch, len(mine[k]))
            self._state = {"epoch": self._state["epoch"] + 1, "batch": 0, **next_rngs}

    def _shard(self, batch: Any, rows: int) -> Any:
        try:
            return self.engine.shard_batch(batch)
        except jc.BatchError as e:
            if rows == self.batch_size:
                raise
            raise jc.BatchError(
                f"{e} This is the DataLoader's last, short batch ({rows} of "
                f"{self.batch_size} rows, drop_last=False): build the DataLoader with "
                "drop_last=True, or use a dataset whose size is a multiple of batch_size."
            ) from e


def as_numpy_batch(batch: Any) -> Any:
    """A batch as host NumPy (for comparisons and logging)."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), batch)
