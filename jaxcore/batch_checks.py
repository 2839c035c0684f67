"""Checks at the step's boundary: a batch and a loss function that the step can run.

Mistakes here otherwise surface as raw JAX errors deep in a trace ("indices must have an
integer type"), or not at all (a token id past the vocabulary gives a NaN loss; a negative
one silently wraps). Shape and dtype checks run once per new batch structure (they depend
on shapes only); the token-id range check reads values, so it runs on every NumPy batch
(a min and a max on the host, before the transfer) and on the first device batch of each
structure (a device batch is read once; after that the non-finite guard catches the NaN a
bad id produces).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxcore.errors import BatchError, ConfigError
from jaxcore.sharding import path_str

LOSS_SIGNATURE = (
    "def loss_fn(model, batch, rng) -> tuple[jax.Array, dict[str, jax.Array]]:\n"
    "    logits = model(batch['tokens'][:, :-1])\n"
    "    loss = ...  # a scalar\n"
    "    return loss, {'accuracy': ..., 'weight': n_real_tokens}  # aux: a dict of scalars"
)


def check_loss_output(out: Any) -> tuple[jax.Array, Mapping[str, Any]]:
    """``(loss, aux)`` from what a loss function returned, or `ConfigError` (at trace time)."""
    if not (isinstance(out, tuple | list) and len(out) == 2 and isinstance(out[1], Mapping)):
        if isinstance(out, tuple | list):
            got = f"a {type(out).__name__} of length {len(out)}"
            if len(out) == 2:
                got += f" whose second item is a {type(out[1]).__name__}, not a dict"
        elif hasattr(out, "shape"):
            got = f"a bare array of shape {tuple(out.shape)}"
        else:
            got = f"a {type(out).__name__}"
        raise ConfigError(
            f"loss_fn returned {got}; it must return (loss, aux): a scalar loss and a dict of "
            f"scalar metrics (an empty dict is fine). Expected:\n{LOSS_SIGNATURE}"
        )
    loss, aux = out
    shape = getattr(loss, "shape", ())
    if shape != ():
        raise ConfigError(
            f"loss_fn returned a loss of shape {tuple(shape)}; the loss must be a scalar "
            f"(reduce it, e.g. with .mean()). Expected:\n{LOSS_SIGNATURE}"
        )
    return loss, aux


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchContract:
    """What a step needs of a batch.

    Attributes:
        ways: shards of the leading axis (from the ``batch`` rule).
        per_shard: microbatches each shard is cut into (grad_accum or pipeline).
        per_shard_what: what those microbatches are, for messages.
        token_keys: top-level batch keys that hold token ids.
        vocab_size: ids must lie in ``[0, vocab_size)`` (``None``: not checked).
        max_seq_len: the model's longest sequence (``None``: not checked). A ``tokens``
            row may be one longer: it holds the inputs plus the shifted target
            (`jaxcore.models.lm_loss`).
        check_values: whether token ids are range-checked.
        tokens_2d: token ids are exactly ``(batch, length)`` (the native models); ``False``
            allows ``(batch, ..., length)`` (a bridged torch module's multiple-choice ids).
        process_block, process_blocks: which block of the batch's rows this process
            holds, of how many (`jaxcore.sharding.process_batch_block`); a process-local
            batch has ``1 / process_blocks`` of the rows.
    """

    ways: int
    per_shard: int
    per_shard_what: str
    token_keys: tuple[str, ...] = ()
    vocab_size: int | None = None
    max_seq_len: int | None = None
    check_values: bool = True
    tokens_2d: bool = True
    process_block: int = 0
    process_blocks: int = 1


def _structure(batch: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(batch)
    return (treedef, tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves))


def fingerprint(batch: Any) -> np.ndarray:
    """A SHA-256 of a batch's paths, shapes, dtypes and bytes, as 8 uint32 words.

    Leaves that are already global ``jax.Array``s count by shape and dtype only: they
    are one array by construction, and hashing their bytes would copy them back to host.
    """
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        x = leaf if isinstance(leaf, jax.Array) else np.ascontiguousarray(leaf)
        digest.update(f"{path_str(path)}:{x.shape}:{x.dtype};".encode())
        if not isinstance(leaf, jax.Array):
            digest.update(x.tobytes())
    return np.frombuffer(digest.digest(), np.uint32)


class BatchChecker:
    """Checks batches against a `BatchContract`, remembering the structures it has seen."""

    def __init__(self, contract: BatchContract):
        self.contract = contract
        self._seen: set = set()
        self._processes_agreed = False

    def check(self, batch: Any, *, local: bool = False) -> None:
        """Raise `BatchError` naming the array and the fix unless ``batch`` can run.

        ``local``: the batch is this process's part (its leading sizes are per process).
        """
        try:
            key = (_structure(batch), local)
            new = key not in self._seen
        except TypeError:  # unhashable leaf metadata: check every time
            key, new = None, True
        if new:
            self._check_shapes(batch, local)
            if key is not None:
                self._seen.add(key)
        if self.contract.check_values and self.contract.vocab_size is not None:
            self._check_ids(batch, first=new)

    def check_processes_agree(self, batch: Any) -> None:
        """Raise `BatchError` unless processes holding the same rows passed the same data.

        A collective (every process calls it); it runs on the first process-local batch
        only. When the mesh's cross-process split is on an axis the batch is not cut over
        (a ``pipeline`` axis spanning hosts), several processes hold the same rows; if
        each passed "its own" slice instead, JAX would build a global array whose copies
        disagree, and the step would train on mixed-up rows without an error.
        """
        c = self.contract
        if self._processes_agreed or jax.process_count() == c.process_blocks:
            return
        mine = np.concatenate([[c.process_block], fingerprint(batch)]).astype(np.int64)
        every = np.asarray(multihost_utils.process_allgather(mine))
        for block in sorted(set(every[:, 0].tolist())):
            procs = [p for p in range(len(every)) if every[p, 0] == block]
            if any((every[p, 1:] != every[procs[0], 1:]).any() for p in procs[1:]):
                raise BatchError(
                    f"processes {procs} hold the same rows of the batch (the mesh's "
                    "cross-process split is on an axis the batch is not cut over, e.g. a "
                    "pipeline spanning hosts) but passed different data to shard_batch. Each "
                    "process passes rows lo:hi of the global batch, with lo, hi = "
                    "engine.local_rows(global_batch_size): here "
                    f"{c.process_blocks} block(s), so processes {procs} pass the same rows."
                )
        self._processes_agreed = True

    def _check_shapes(self, batch: Any, local: bool) -> None:
        c = self.contract
        # A model that embeds token ids reads them by key; other models (a torch module fed
        # `step(state, x)`) may take a bare array.
        if c.token_keys and c.vocab_size is not None and not isinstance(batch, Mapping):
            shape = f" of shape {np.shape(batch)}" if hasattr(batch, "shape") else ""
            raise BatchError(
                f"the batch is a bare {type(batch).__name__}{shape}, but this model takes "
                f"token ids by key ({', '.join(c.token_keys)}); pass a dict of arrays, e.g. "
                "{'tokens': tokens} (jaxcore.models.lm_loss reads batch['tokens'])."
            )
        ways = c.ways
        if local:
            ways = max(1, ways // c.process_blocks)
        need = ways * c.per_shard
        first: tuple[str, int] | None = None
        for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
            shape = np.shape(leaf)
            where = path_str(path) or "batch"
            if not shape and isinstance(leaf, int | float | complex):
                raise BatchError(
                    f"batch[{where}] is a Python {type(leaf).__name__}: a batch holds arrays, "
                    "not (nested) lists of numbers. Convert them with np.asarray(...)."
                )
            if not shape:
                raise BatchError(
                    f"batch[{where}] is a scalar; every batch leaf needs a leading batch axis."
                )
            if shape[0] == 0:
                raise BatchError(
                    f"batch[{where}] has no rows (leading size 0); an empty batch has no "
                    "loss to train on. Drop it, or pass at least one row per shard."
                )
            if first is not None and shape[0] != first[1]:
                raise BatchError(
                    f"batch[{where}] has {shape[0]} rows but batch[{first[0]}] has "
                    f"{first[1]}; every leaf of a batch holds the same examples along its "
                    "leading axis. Slice them to the same rows."
                )
            first = first or (where, shape[0])
            if shape[0] % need:
                raise BatchError(
                    f"batch[{where}] has leading size {shape[0]}, which does not divide into "
                    f"{ways} data-parallel shards (the 'batch' rule) x {c.per_shard} "
                    f"{c.per_shard_what}. Use a batch size that is a multiple of {need}."
                )
        for name, x in self._token_arrays(batch):
            shape = np.shape(x)
            dtype = np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype
            if not np.issubdtype(dtype, np.integer):
                raise BatchError(
                    f"batch[{name}] has dtype {dtype}; token ids must be integers. Convert "
                    f"with tokens.astype(np.int32) (and check the data: floats often mean "
                    f"features were passed where ids belong)."
                )
            if len(shape) != 2 and (c.tokens_2d or len(shape) < 2):
                raise BatchError(
                    f"batch[{name}] has shape {tuple(shape)}; token ids must be "
                    + ("2-d (batch, length)" if c.tokens_2d else "(batch, ..., length)")
                    + ". Reshape it, or put extra dimensions under another key."
                )
            limit = c.max_seq_len
            if limit is not None:
                limit += 1 if name == "tokens" else 0
                if shape[-1] > limit:
                    raise BatchError(
                        f"batch[{name}] has rows of {shape[-1]} tokens but the model's "
                        f"max_seq_len is {c.max_seq_len} (a 'tokens' row may hold one more: "
                        f"the shifted target). Cut the sequences to {limit} or build the "
                        f"model with a larger max_seq_len."
                    )

    def _token_arrays(self, batch: Any) -> Sequence[tuple[str, Any]]:
        if not isinstance(batch, Mapping):
            return []
        return [(k, batch[k]) for k in self.contract.token_keys if k in batch]

    def _check_ids(self, batch: Any, *, first: bool) -> None:
        vocab = self.contract.vocab_size
        for name, x in self._token_arrays(batch):
            if isinstance(x, jax.Array):
                if not first:
                    continue
                # Each process reads the shards it holds: no cross-host transfer, no compile.
                parts = [np.asarray(s.data) for s in x.addressable_shards]
            else:
                parts = [np.asarray(x)]
            parts = [p for p in parts if p.size]
            if not parts or not np.issubdtype(parts[0].dtype, np.integer):
                continue
            lo = min(int(p.min()) for p in parts)
            hi = max(int(p.max()) for p in parts)
            if lo < 0 or hi >= vocab:
                raise BatchError(
                    f"batch[{name}] holds token ids from {lo} to {hi}, but the model's "
                    f"vocabulary is [0, {vocab}). Check the tokenizer matches the model's "
                    f"vocab_size (ids >= vocab give a NaN loss; negative ids wrap silently); "
                    f"pass check_batches=False to skip this check."
                )
