"""Collect per-process values (predictions, losses, labels) on every host for metrics.

Like Accelerate's ``gather_for_metrics``: each process evaluates its rows of every batch;
`gather` concatenates the rows of all processes in process order (the order of the global
batch, since `Engine.shard_batch` builds it the same way) and, for the last, uneven batch,
drops the padding rows that loaders add so every process gets a full batch. `EvalGatherer`
counts the rows seen so the caller only states the dataset size once.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxcore.errors import ConfigError


def _gather_leaf(x: Any) -> np.ndarray:
    if np.ndim(x) == 0:
        # A scalar per process becomes one entry per process.
        return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=False))
    if jax.process_count() == 1:
        return np.asarray(jax.device_get(x))
    # Global arrays come back whole; host-local ones are concatenated over processes.
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather(tree: Any, *, valid: int | None = None) -> Any:
    """Every process's rows of ``tree``, concatenated along the leading axis, as NumPy.

    ``tree``'s leaves are this process's rows (NumPy or host-local arrays, the same shape
    on every process) or global `jax.Array` batches. ``valid`` keeps only the first
    ``valid`` rows of the result (the rest are padding of an uneven last batch). Every
    process must call it (it is a collective).
    """
    out = jax.tree.map(_gather_leaf, tree)
    if valid is None:
        return out
    if valid < 0:
        raise ConfigError(f"gather(valid={valid}): must be >= 0.")
    return jax.tree.map(lambda x: x[:valid] if x.ndim else x, out)


class EvalGatherer:
    """Gathers batch after batch and trims the padding of the last one.

    gatherer = EvalGatherer(total=len(eval_set))
    for batch in batches:
        preds = gatherer(predict(state, batch))   # only real rows, on every host
    """

    def __init__(self, total: int):
        if total < 0:
            raise ConfigError(f"EvalGatherer(total={total}): the dataset size must be >= 0.")
        self.total = total
        self.seen = 0

    def __call__(self, tree: Any) -> Any:
        out = gather(tree)
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
