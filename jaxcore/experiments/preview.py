"""``jaxcore experiment preview``: how many trials and steps a searcher will run.

Like ``det preview-search``: the searcher is driven with random metrics (nothing is
trained, nothing is written) and every trial's length is counted. For ASHA the counts
depend on the metrics, so it is a typical run, not a bound; ``max_length`` is the bound.
"""

from __future__ import annotations

import collections
import random
from typing import Any

from jaxcore.experiments.config import ExperimentConfig
from jaxcore.experiments.searchers import Continue, Create, Stop, make_searcher


def preview(config: ExperimentConfig, seed: int = 0) -> dict[str, Any]:
    """``{"trials", "steps", "by_length": {steps: trials}, "brackets"?}``."""
    rng = random.Random(seed)
    searcher = make_searcher(config)
    pending: collections.deque = collections.deque()
    lengths: dict[int, int] = {}
    stopped: set[int] = set()
    done_steps: dict[int, int] = {}
    start: dict[int, int] = {}
    next_id = 1

    def handle(actions: list) -> None:
        nonlocal next_id
        queue = collections.deque(actions)
        while queue:
            a = queue.popleft()
            if isinstance(a, Create):
                tid, next_id = next_id, next_id + 1
                lengths[tid] = a.max_length
                start[tid] = done_steps.get(a.source_trial, 0) if a.source_trial else 0
                done_steps[tid] = start[tid]
                pending.append((tid, a.milestones))
                queue.extend(searcher.created(tid, a))
            elif isinstance(a, Stop):
                stopped.add(a.trial_id)
            elif isinstance(a, Continue):
                lengths[a.trial_id] = a.max_length
                pending.append((a.trial_id, ()))

    handle(searcher.initial())
    while pending:
        tid, milestones = pending.popleft()
        points = sorted({m for m in milestones if m > done_steps[tid]} | {lengths[tid]})
        for step in points:
            done_steps[tid] = step
            handle(searcher.validation(tid, step, rng.random()))
            if tid in stopped:
                break
        handle(searcher.exited(tid))
    trained = {t: done_steps[t] - start[t] for t in lengths}
    out: dict[str, Any] = {
        "searcher": config.searcher.name,
        "trials": len(lengths),
        "steps": sum(trained.values()),
        "by_length": dict(sorted(collections.Counter(done_steps.values()).items())),
    }
    if config.searcher.name == "adaptive_asha":
        out["brackets"] = searcher.plan
    return out
