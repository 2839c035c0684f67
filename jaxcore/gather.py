"""Collect per-process values (predictions, losses, labels) on every host for metrics.

Like Accelerate's ``gather_for_metrics``: each process evaluates its rows of every batch;
`gather` concatenates the rows of all processes in process order (the order of the global
batch, since `Engine.shard_batch` builds it the same way) and, for the last, uneven batch,
drops the padding rows that loaders add so every process gets a full batch. `EvalGatherer`
counts the rows seen so the caller only states the dataset size once.

When a pipeline spans the hosts, several processes hold the same rows
(`jaxcore.Engine.process_batch_block`); given the ``engine``, `gather` keeps one copy of
each block of rows instead of concatenating duplicates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxcore.errors import ConfigError

if TYPE_CHECKING:
    from jaxcore.engine import Engine


def _block_owners(engine: Engine | None) -> list[int] | None:
    """One process per block of rows, in block order; None when every process holds its
    own block (concatenating in process order is then right)."""
    if engine is None or jax.process_count() == 1:
        return None
    index, count = engine.process_batch_block
    if count == jax.process_count():
        return None
    blocks = np.asarray(multihost_utils.process_allgather(np.int32(index), tiled=False))
    return [int(np.flatnonzero(blocks == b)[0]) for b in range(count)]


def _gather_leaf(x: Any, owners: list[int] | None) -> np.ndarray:
    if np.ndim(x) == 0:
        # A scalar per process becomes one entry per process.
        return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        # A global array comes back whole, whichever processes hold which rows.
        return np.asarray(multihost_utils.process_allgather(x))
    if owners is None:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    # Processes that share a block of rows sent the same rows: keep one copy per block.
    every = np.asarray(multihost_utils.process_allgather(x, tiled=False))
    return every[owners].reshape(-1, *every.shape[2:])


def gather(tree: Any, *, valid: int | None = None, engine: Engine | None = None) -> Any:
    """Every process's rows of ``tree``, concatenated along the leading axis, as NumPy.

    ``tree``'s leaves are this process's rows (NumPy or host-local arrays, the same shape
    on every process) or global `jax.Array` batches. ``valid`` keeps only the first
    ``valid`` rows of the result (the rest are padding of an uneven last batch).
    ``engine``, the engine the rows were fed to: with it, processes that hold the same
    rows (a pipeline across hosts, `Engine.local_rows`) count once; without it, every
    process's rows are concatenated. Every process must call it (it is a collective).
    """
    if valid is not None and valid < 0:
        raise ConfigError(f"gather(valid={valid}): must be >= 0.")
    owners = _block_owners(engine)
    out = jax.tree.map(lambda x: _gather_leaf(x, owners), tree)
    if valid is None:
        return out
    return jax.tree.map(lambda x: x[:valid] if x.ndim else x, out)


class EvalGatherer:
    """Gathers batch after batch and trims the padding of the last one.

    gatherer = EvalGatherer(total=len(eval_set), engine=engine)
    for batch in batches:
        preds = gatherer(predict(state, batch))   # only real rows, on every host
    """

    def __init__(self, total: int, *, engine: Engine | None = None):
        if total < 0:
            raise ConfigError(f"EvalGatherer(total={total}): the dataset size must be >= 0.")
        self.total = total
        self.seen = 0
        self.engine = engine

    def __call__(self, tree: Any) -> Any:
        out = gather(tree, engine=self.engine)
        rows = {x.shape[0] for x in jax.tree.leaves(out) if x.ndim}
        if len(rows) > 1:
            raise ConfigError(
                f"EvalGatherer: leaves have different numbers of rows {sorted(rows)}; gather "
                "one batch's values, which share the leading (row) axis."
            )
        n = rows.pop() if rows else 0
        keep = max(0, min(n, self.total - self.seen))
        self.seen += n
        return jax.tree.map(lambda x: x[:keep] if x.ndim else x, out)
