"""Checkpoint retention: keep what the policy names, delete the rest, record deletions.

Determined's ``checkpoint_storage`` policy: a checkpoint survives when it is among its
trial's ``save_trial_latest`` newest, its trial's ``save_trial_best`` best, or the
experiment's ``save_experiment_best`` best (ranked by the searcher metric recorded with
it). Two more rules keep runs safe: only finished checkpoints (recorded after the save
completed) are ever considered, so one being written is never touched; and the newest
checkpoint of every trial that may still run (a restart, a PBT continuation, or a PBT
child about to be cloned from it) is always kept.

Deletion works on paths, not rows: a directory is removed only when no kept row refers
to it, and its rows are marked ``DELETED`` before the files go (a crash in between
leaves an orphaned directory, never a ``COMPLETED`` row pointing at nothing).
"""

from __future__ import annotations

import logging
import math
import pathlib
import shutil
from collections import defaultdict
from typing import Any

from jaxcore.experiments.config import RetentionConfig
from jaxcore.experiments.store import Store

log = logging.getLogger(__name__)


def _score(row: dict[str, Any], metric: str, smaller_is_better: bool) -> float:
    value = (row.get("metrics") or {}).get(metric)
    if value is None or math.isnan(value):
        return math.inf
    return value if smaller_is_better else -value


def keep_set(
    rows: list[dict[str, Any]],
    policy: RetentionConfig,
    metric: str,
    smaller_is_better: bool,
    protected_trials: set[int] = frozenset(),
) -> set[int]:
    """Ids of the checkpoints (``COMPLETED`` rows) the policy keeps."""
    keep: set[int] = set()
    by_trial: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_trial[r["trial_id"]].append(r)
    for trial_id, mine in by_trial.items():
        newest = sorted(mine, key=lambda r: (r["step"], r["id"]), reverse=True)
        keep.update(r["id"] for r in newest[: policy.save_trial_latest])
        if trial_id in protected_trials:
            keep.add(newest[0]["id"])
        ranked = sorted(
            (r for r in mine if math.isfinite(_score(r, metric, smaller_is_better))),
            key=lambda r: (_score(r, metric, smaller_is_better), -r["step"]),
        )
        keep.update(r["id"] for r in ranked[: policy.save_trial_best])
    ranked = sorted(
        (r for r in rows if math.isfinite(_score(r, metric, smaller_is_better))),
        key=lambda r: (_score(r, metric, smaller_is_better), -r["step"]),
    )
    keep.update(r["id"] for r in ranked[: policy.save_experiment_best])
    return keep


def apply_retention(
    store: Store,
    exp_id: int,
    policy: RetentionConfig,
    metric: str,
    smaller_is_better: bool,
    protected_trials: set[int] = frozenset(),
) -> list[dict[str, Any]]:
    """Delete the checkpoints the policy no longer keeps; returns the deleted rows."""
    rows = store.checkpoints(exp_id=exp_id, state="COMPLETED")
    keep = keep_set(rows, policy, metric, smaller_is_better, protected_trials)
    kept_paths = {r["path"] for r in rows if r["id"] in keep}
    doomed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["path"] not in kept_paths:
            doomed[r["path"]].append(r)
    deleted = []
    for path, mine in doomed.items():
        store.mark_deleted([r["id"] for r in mine])
        shutil.rmtree(pathlib.Path(path), ignore_errors=True)
        deleted += mine
        log.info("retention: deleted checkpoint %s (trial %d)", path, mine[0]["trial_id"])
    return deleted
