"""The search-method protocol: events in, actions out (Determined's ``SearchMethod``).

A searcher never runs anything. The experiment loop tells it when a trial was created,
reported its searcher metric, finished, or failed for good; it answers with actions:
`Create` a trial, `Stop` a trial, or `Continue` a finished one for more steps (PBT).
Keeping it this way (after Determined's ``master/pkg/searcher/search_method.go``) makes
every searcher a small pure-Python state machine, testable without processes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from jaxcore.experiments.config import ExperimentConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Create:
    """Start a new trial with ``hparams`` for at most ``max_length`` steps.

    ``source_trial``/``source_step``: start from that trial's checkpoint (PBT exploit);
    ``milestones``: steps the searcher wants a validation at (ASHA rungs); ``tag``: an
    opaque key the searcher uses to recognise its request (bracket index, Optuna trial).
    """

    hparams: dict[str, Any]
    max_length: int
    source_trial: int | None = None
    milestones: tuple[int, ...] = ()
    tag: Any = None


@dataclasses.dataclass(frozen=True)
class Stop:
    """Ask a running trial to stop (it checkpoints and exits cleanly)."""

    trial_id: int


@dataclasses.dataclass(frozen=True)
class Continue:
    """Run a finished trial again from its latest checkpoint up to ``max_length``."""

    trial_id: int
    max_length: int
    hparams: dict[str, Any] | None = None


Action = Create | Stop | Continue


class SearchMethod:
    """Base class: override the hooks you need; each returns a list of actions."""

    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.searcher = config.searcher
        self.rng = random.Random(config.searcher.seed)

    def sample(self) -> dict[str, Any]:
        return {p.name: p.sample(self.rng) for p in self.config.hyperparameters}

    def value(self, metric: float) -> float:
        """Sign-normalised metric: smaller is always better inside searchers.

        A non-finite metric (a diverged trial's NaN or inf) ranks last: NaN compares
        false with everything, so it would otherwise sort first and be promoted (ASHA)
        or cloned (PBT) ahead of trials with real results.
        """
        if not math.isfinite(metric):
            return math.inf
        return metric if self.searcher.smaller_is_better else -metric

    # ----------------------------------------------------------------- hooks
    def initial(self) -> list[Action]:
        return []

    def created(self, trial_id: int, action: Create) -> list[Action]:
        return []

    def validation(self, trial_id: int, step: int, metric: float) -> list[Action]:
        return []

    def exited(self, trial_id: int) -> list[Action]:
        """The trial ended normally (reached its length, or was stopped)."""
        return []

    def errored(self, trial_id: int) -> list[Action]:
        """The trial failed after its restarts (Determined's ``trialExitedEarly``)."""
        return []

    def progress(self) -> float:
        return 0.0
