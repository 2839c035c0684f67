"""Host-side combination of step metrics into exact weighted means."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class MeanMetrics:
    """Accumulates metrics dicts that carry a ``weight`` into their weighted mean.

    Each eval batch reports its mean over real tokens and how many there were; the mean
    over the whole set is then ``sum(mean * weight) / sum(weight)``, which padding and
    uneven last batches cannot skew.
    """

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weight = 0.0

    def update(self, metrics: Mapping[str, Any]) -> None:
        w = float(np.asarray(metrics.get("weight", 1.0)))
        self._weight += w
        for k, v in metrics.items():
            if k != "weight":
                self._sums[k] = self._sums.get(k, 0.0) + float(np.asarray(v)) * w

    def compute(self) -> dict[str, float]:
        """The weighted means, plus the total ``weight``."""
        if self._weight == 0:
            return {"weight": 0.0}
        return {**{k: s / self._weight for k, s in self._sums.items()}, "weight": self._weight}
