"""torch ``Dataset``/``DataLoader`` -> Grain -> global sharded batches, resumable exactly.

`DatasetSource` makes a map-style ``torch.utils.data.Dataset`` a Grain random-access
source (``__len__``/``__getitem__``, NumPy records, a stable ``repr`` so a checkpointed
position is checked against the same data). It feeds ``grain.MapDataset.source`` and so
any Grain-based loader (``jaxcore.input`` included).

`TorchLoader` carries a ``DataLoader``'s batch size, sampler (shuffle or not,
``WeightedRandomSampler``, ``SubsetRandomSampler``, ``DistributedSampler``), ``drop_last``
and ``collate_fn`` over (a ``batch_sampler=``: torch's ``BatchSampler`` the same way, a
custom one by iterating a copy after ``set_epoch(epoch)``, `_check_replayable`): epoch *e*
visits the same indices in the same batches as the DataLoader's *e*-th ``iter()`` (it
replays torch's RNG draws: the base-seed draw from the loader's generator, then
``randperm`` from the sampler's, the same one unless ``sampler=RandomSampler(ds,
generator=g)`` brings its own; a ``None`` generator is the
global RNG as captured when the bridge was built; with persistent workers only the first
epoch draws a base seed, as torch's one iterator does). Batches come out as global
``jax.Array``s sharded over the engine's data axes. Its state, ``{"epoch", "batch",
"rng"}`` (plus ``"sampler_rng"`` for a sampler's own generator; JSON-able), restores the
exact position. With several processes, process *p* loads torch batch ``k * P + p`` of each
step *k* (Accelerate's ``BatchSamplerShard``), so ``batch_size`` is per process. *P* and
*p* are the engine's row blocks (`jaxcore.Engine.process_batch_block`): the process count
and index unless processes share rows (then they load the same batches). A
``DistributedSampler`` built for that block already shards: each process loads its share.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
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
    (a ``UserDict``), which JAX would take for one leaf, not a dict of arrays. A dataclass
    keeps its type, and must be a JAX pytree (`_dataclass`).
    """
    import torch
    from torch.utils import _pytree

    def one(v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: numpy_tree(item) for k, item in v.items()}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return _dataclass(v)
        return to_numpy(v) if isinstance(v, torch.Tensor) else v

    return _pytree.tree_map(one, x, is_leaf=lambda v: isinstance(v, Mapping))


def _dataclass(v: Any) -> Any:
    """A dataclass batch (a ``collate_fn``'s) with its fields as NumPy.

    JAX takes an unregistered dataclass for a single leaf, and the step would then see one
    "scalar" instead of its arrays: refused, naming the registration that fixes it.
    """
    leaves = jax.tree.leaves(v)
    if len(leaves) == 1 and leaves[0] is v:
        name = type(v).__name__
        raise jc.BatchError(
            f"the batch is (or holds) a {name} dataclass, which JAX takes for one leaf, not "
            f"for its fields. Register it once: jax.tree_util.register_dataclass({name}), "
            "or return a dict, tuple or namedtuple from the collate_fn."
        )
    fields = {f.name: numpy_tree(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
    return dataclasses.replace(v, **fields)


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


def _check_sampler(sampler: Any) -> bool:
    """Refuse a sampler whose order cannot be replayed; whether it draws from a generator."""
    from torch.utils.data import (
        RandomSampler,
        SequentialSampler,
        SubsetRandomSampler,
        WeightedRandomSampler,
    )
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise UnsupportedError(
                "TorchLoader: RandomSampler with replacement or num_samples is not "
                "supported; use shuffle=True, or WeightedRandomSampler(torch.ones(n), "
                "num_samples) to draw with replacement."
            )
        return True
    if isinstance(sampler, (WeightedRandomSampler, SubsetRandomSampler)):
        return True
    if isinstance(sampler, (SequentialSampler, DistributedSampler)):
        return False
    raise UnsupportedError(
        f"TorchLoader: sampler {type(sampler).__name__} is not supported (its order cannot "
        "be replayed for an exact resume); use shuffle=True/False, RandomSampler, "
        "WeightedRandomSampler, SubsetRandomSampler or DistributedSampler."
    )


def _copy(batch_sampler: Any, dataset: Any) -> Any:
    """A deep copy of a batch sampler that shares the dataset it may hold (not copied)."""
    return copy.deepcopy(batch_sampler, {id(dataset): dataset})


def _custom_batches(batch_sampler: Any, epoch: int, dataset: Any) -> list[list[int]]:
    """A custom batch sampler's batches in ``epoch``: a copy's, after ``set_epoch(epoch)``.

    The copy leaves the loop's own sampler untouched; `_check_replayable` made sure its
    batches are a function of the epoch (or of nothing), so a resume gets the same ones.
    """
    c = _copy(batch_sampler, dataset)
    if hasattr(c, "set_epoch"):
        c.set_epoch(epoch)
    return [[int(i) for i in b] for b in c]


def _check_replayable(batch_sampler: Any, dataset: Any) -> None:
    """Refuse a custom batch sampler whose batches cannot be replayed for an exact resume.

    Its batches must be a function of the epoch it was ``set_epoch`` to (as
    ``DistributedSampler``'s are of ``(seed, epoch)``), or of nothing: one copy iterated
    twice, at epoch 0, must give the same batches. One that draws from a global RNG (torch,
    ``random``, NumPy) or advances a generator of its own gives others each time; the
    global RNGs are restored after the check.
    """
    import random

    import torch

    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        c = _copy(batch_sampler, dataset)
        runs = []
        for _ in range(2):
            if hasattr(c, "set_epoch"):
                c.set_epoch(0)
            runs.append([[int(i) for i in b] for b in c])
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
    if runs[0] != runs[1]:
        name = type(batch_sampler).__name__
        raise UnsupportedError(
            f"TorchLoader: batch_sampler {name} gives different batches each time it is "
            "iterated (it draws from a global RNG or advances a generator of its own), so "
            "its batches cannot be replayed for an exact resume. Give it a set_epoch(epoch) "
            "and draw its order from torch.Generator().manual_seed(seed + epoch) in "
            "__iter__, as DistributedSampler does; TorchLoader calls set_epoch with its "
            "epoch (call it in your torch loop too)."
        )


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
            default sequential or random (no replacement) sampler, a weighted, subset or
            distributed one; or a ``batch_sampler`` whose batches are a function of its
            ``set_epoch(epoch)`` (or of nothing), e.g. bucketing by length.
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
        from torch.utils.data import IterableDataset

        if isinstance(dataloader.dataset, IterableDataset):
            raise UnsupportedError(
                f"TorchLoader: {type(dataloader.dataset).__name__} is an IterableDataset, "
                "which has no indices to replay, so its position cannot be saved or its "
                "batches split over processes. Feed the DataLoader's batches to the step "
                "as they are (`for batch in dataloader: state, metrics = step(state, "
                "batch)`; not resumable mid-epoch, and with several processes each one's "
                "dataset must yield its own shard), or make the dataset map-style "
                "(__len__ and __getitem__)."
            )
        from torch.utils.data import BatchSampler

        batch_sampler = dataloader.batch_sampler
        if batch_sampler is None:
            raise UnsupportedError(
                "TorchLoader: a DataLoader with batch_size=None (no batching) is not "
                "supported; build it as DataLoader(dataset, batch_size=N, shuffle=..., "
                "drop_last=...)."
            )
        self.dataloader = dataloader
        self.engine = engine
        # torch's own BatchSampler (what batch_size=N builds, or passed as batch_sampler=)
        # is replayed from its sampler; any other batch sampler by `_custom_batches`.
        self.custom = None if type(batch_sampler) is BatchSampler else batch_sampler
        self.sampler = dataloader.sampler if self.custom is not None else batch_sampler.sampler
        self.shuffle = self.custom is None and _check_sampler(self.sampler)
        self.distributed = self.custom is None and self._check_distributed()
        self.batch_size = None if self.custom is not None else batch_sampler.batch_size
        self.drop_last = None if self.custom is not None else batch_sampler.drop_last
        if self.custom is not None:
            _check_replayable(self.custom, dataloader.dataset)
        # With persistent workers, only the DataLoader's first iter() draws a base seed.
        self._seeds_once = dataloader.persistent_workers and dataloader.num_workers > 0
        self.collate_fn = dataloader.collate_fn
        self.source = DatasetSource(dataloader.dataset, numpy=False)
        self.num_epochs = num_epochs
        self.prefetch = prefetch
        # Two random streams: the iterator's base seed comes from the loader's generator,
        # the permutation from the sampler's (the loader passes its own to the sampler it
        # builds; `sampler=RandomSampler(ds, generator=g)` has another); None is the global
        # RNG, as captured now. One stream when both are the same.
        loader_gen = dataloader.generator
        self._sampler_gen = self.sampler.generator if self.shuffle else loader_gen
        self._split = self._sampler_gen is not loader_gen
        self._state = {"epoch": 0, "batch": 0, "rng": _encode(_rng_state(loader_gen))}
        if self._split:
            self._state["sampler_rng"] = _encode(_rng_state(self._sampler_gen))

    def _check_distributed(self) -> bool:
        """Whether a ``DistributedSampler`` shards the data; it must name this process."""
        from torch.utils.data.distributed import DistributedSampler

        if not isinstance(self.sampler, DistributedSampler):
            return False
        me, procs = self._block()
        if (self.sampler.rank, self.sampler.num_replicas) != (me, procs):
            raise jc.ConfigError(
                f"TorchLoader: DistributedSampler(num_replicas={self.sampler.num_replicas}, "
                f"rank={self.sampler.rank}), but this is process {me} of the {procs} that "
                "load different batches. Build it as DistributedSampler(dataset, "
                f"num_replicas={procs}, rank={me}) (jax.process_count(), "
                "jax.process_index()), or use shuffle=True/False without it: TorchLoader "
                "then gives each process its own batches."
            )
        return True

    # ------------------------------------------------------------------ order
    def _epoch_batches(self, state: dict[str, Any]) -> tuple[list[list[int]], dict[str, str]]:
        """This epoch's batches of indices, and the RNG states the next epoch starts from."""
        import torch

        gen = torch.Generator()
        gen.set_state(_decode(state["rng"]))
        if not self._seeds_once or state["epoch"] == 0:
            torch.empty((), dtype=torch.int64).random_(generator=gen)  # the base seed
        perm = gen
        if self._split:
            perm = torch.Generator()
            perm.set_state(_decode(state["sampler_rng"]))
        if self.custom is not None:
            batches = _custom_batches(self.custom, state["epoch"], self.dataloader.dataset)
        else:
            order = self._order(perm, state["epoch"])
            size = self.batch_size
            batches = [order[i : i + size] for i in range(0, len(order), size)]
            if self.drop_last and batches and len(batches[-1]) < size:
                batches.pop()
        rngs = {"rng": _encode(gen.get_state())}
        if self._split:
            rngs["sampler_rng"] = _encode(perm.get_state())
        return batches, rngs

    def _order(self, perm: Any, epoch: int) -> list[int]:
        """The indices the sampler yields in ``epoch``, drawing from ``perm`` as it would."""
        import torch
        from torch.utils.data import SubsetRandomSampler, WeightedRandomSampler

        sampler, n = self.sampler, len(self.source)
        if self.distributed:  # seeded by (seed, epoch): the sampler itself, at that epoch
            at_epoch = copy.copy(sampler)
            at_epoch.set_epoch(epoch)
            return list(at_epoch)
        if isinstance(sampler, WeightedRandomSampler):
            draw = torch.multinomial(
                sampler.weights, sampler.num_samples, sampler.replacement, generator=perm
            )
            return draw.tolist()
        if isinstance(sampler, SubsetRandomSampler):
            return [
                sampler.indices[i] for i in torch.randperm(len(sampler.indices), generator=perm)
            ]
        if not self.shuffle:
            return list(range(n))
        if self._sampler_gen is None:  # RandomSampler seeds a fresh generator from the global RNG
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=perm).item())
            return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        order = torch.randperm(n, generator=perm).tolist()
        # RandomSampler.__iter__ ends with `randperm(n)[: num_samples % n]`, which still
        # draws a full permutation when the epoch is exhausted (torch 2.13).
        torch.randperm(n, generator=perm)
        return order

    def _block(self) -> tuple[int, int]:
        if self.engine is None:
            return jax.process_index(), jax.process_count()
        return self.engine.process_batch_block

    def _process_batches(self, batches: list[list[int]]) -> list[list[int]]:
        me, procs = self._block()
        if procs == 1 or self.distributed:  # a DistributedSampler gave this process's share
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
        if self.custom is not None:
            return len(self.custom) // self._block()[1]
        n, size = len(self.sampler), self.batch_size
        per = n // size if self.drop_last else -(-n // size)
        return per if self.distributed else per // self._block()[1]

    # ------------------------------------------------------------------ iteration
    def _collate(self, indices: list[int]) -> Any:
        return numpy_tree(self.collate_fn([self.source[i] for i in indices]))

    def __iter__(self) -> Iterator[Any]:
        while self.num_epochs is None or self._state["epoch"] < self.num_epochs:
            batches, next_rngs = self._epoch_batches(self._state)
            mine = self._process_batches(batches)
            if not mine and self.num_epochs is None:
                # Run forever over epochs without a batch would spin here, never yielding.
                raise jc.ConfigError(self._no_batches(len(batches)))
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

    def _no_batches(self, batches: int) -> str:
        procs = self._block()[1]
        if batches:
            why = f"its {batches} batch(es) are fewer than the {procs} processes that each need one"
        elif self.custom is not None:
            why = f"its batch_sampler {type(self.custom).__name__} yields no batches"
        else:
            why = (
                f"its sampler yields {len(self.sampler)} rows, "
                + ("fewer than" if self.drop_last and len(self.sampler) else "and")
                + f" batch_size={self.batch_size}"
                + (", drop_last=True" if self.drop_last else "")
            )
        return (
            f"TorchLoader(num_epochs=None): the DataLoader gives no batch in an epoch ({why}), "
            "so iterating it forever would never yield one. Use a non-empty dataset, a "
            "smaller batch_size or drop_last=False."
        )

    def _shard(self, batch: Any, rows: int) -> Any:
        try:
            return self.engine.shard_batch(batch)
        except jc.BatchError as e:
            if self.custom is not None or rows == self.batch_size:
                raise
            raise jc.BatchError(
                f"{e} This is the DataLoader's last, short batch ({rows} of "
                f"{self.batch_size} rows, drop_last=False): build the DataLoader with "
                "drop_last=True, or use a dataset whose size is a multiple of batch_size."
            ) from e


def as_numpy_batch(batch: Any) -> Any:
    """A batch as host NumPy (for comparisons and logging)."""
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), batch)
