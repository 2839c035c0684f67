"""Early stopping besides the searcher's own: patience / min-delta / threshold policies
on any reported metric, and Optuna pruners for the Bayesian searcher.

The policy is kept per trial by the experiment loop, fed every report that carries its
metric; ``update`` returns a reason to stop or ``None`` (after Keras' ``EarlyStopping``:
``patience`` reports without an improvement larger than ``min_delta``).
"""

from __future__ import annotations

import math
from typing import Any

from jaxcore.experiments.config import EarlyStoppingConfig


class EarlyStopping:
    """One trial's patience/threshold state."""

    def __init__(self, config: EarlyStoppingConfig):
        self.config = config
        self.best = math.inf
        self.bad = 0

    def update(self, metrics: dict[str, float]) -> str | None:
        cfg = self.config
        if cfg.metric is None or cfg.metric not in metrics:
            return None
        value = float(metrics[cfg.metric])
        value = value if cfg.smaller_is_better else -value
        if cfg.threshold is not None:
            goal = cfg.threshold if cfg.smaller_is_better else -cfg.threshold
            if value <= goal:
                return f"{cfg.metric} reached the threshold {cfg.threshold}"
        if value < self.best - cfg.min_delta:
            self.best, self.bad = value, 0
            return None
        self.bad += 1
        if cfg.patience is not None and self.bad >= cfg.patience:
            return f"{cfg.metric} did not improve by {cfg.min_delta} in {cfg.patience} reports"
        return None


def make_pruner(name: str, searcher: Any = None) -> Any:
    """An Optuna pruner by name: ``none``, ``median``, ``successive_halving``, ``hyperband``."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=0)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            reduction_factor=int(getattr(searcher, "divisor", 4))
        )
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=1,
            max_resource=getattr(searcher, "length", None) or "auto",
            reduction_factor=int(getattr(searcher, "divisor", 3)),
        )
    return optuna.pruners.NopPruner()
