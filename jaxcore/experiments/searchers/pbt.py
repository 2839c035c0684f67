"""Population-based training (Jaderberg et al. 2017), with Determined's knobs.

``population_size`` trials train ``length_per_round`` steps per round. When every member
of a round has reported, they are ranked by the searcher metric: the worst
``truncate_fraction`` are closed and replaced by copies of the best ones (*exploit*: the
new trial starts from the parent's checkpoint) with *explored* hyperparameters (each is
resampled with ``resample_probability``, else multiplied by ``1 - perturb_factor`` or
``1 + perturb_factor``); the rest continue from their own checkpoints. After
``num_rounds`` rounds the search ends. Mirrors Determined's ``pbt.go`` (truncation
selection, perturb-or-resample exploration).
"""

from __future__ import annotations

import math
from typing import Any

from jaxcore.experiments.config import ExperimentConfig
from jaxcore.experiments.searchers.base import Action, Continue, Create, SearchMethod


class PBTSearch(SearchMethod):
    def __init__(self, config: ExperimentConfig):
        super().__init__(config)
        self.round = 1
        self.members: dict[int, dict[str, Any]] = {}  # trial -> hparams (this round)
        self.metric: dict[int, float] = {}
        self.done: set[int] = set()
        self.expected = config.searcher.population_size
        self.history: list[dict] = []

    def _end(self, round_: int) -> int:
        return round_ * self.searcher.length_per_round

    def explore(self, hparams: dict[str, Any]) -> dict[str, Any]:
        s = self.searcher
        out = dict(hparams)
        for p in self.config.hyperparameters:
            if p.type == "const":
                continue
            if self.rng.random() < s.resample_probability or p.type == "categorical":
                if p.type == "categorical" and self.rng.random() >= s.resample_probability:
                    continue
                out[p.name] = p.sample(self.rng)
            else:
                factor = 1 - s.perturb_factor if self.rng.random() < 0.5 else 1 + s.perturb_factor
                out[p.name] = p.clip(hparams[p.name] * factor)
        return out

    def initial(self) -> list[Action]:
        return [
            Create(hparams=self.sample(), max_length=self._end(1)) for _ in range(self.expected)
        ]

    def created(self, trial_id: int, action: Create) -> list[Action]:
        self.members[trial_id] = action.hparams
        return []

    def validation(self, trial_id: int, step: int, metric: float) -> list[Action]:
        if step >= self._end(self.round):
            self.metric[trial_id] = self.value(metric)
        return []

    def exited(self, trial_id: int) -> list[Action]:
        self.done.add(trial_id)
        return self._maybe_next_round()

    def errored(self, trial_id: int) -> list[Action]:
        self.metric[trial_id] = math.inf
        return self.exited(trial_id)

    def _maybe_next_round(self) -> list[Action]:
        if len(self.done & set(self.members)) < self.expected:
            return []
        ranked = sorted(self.members, key=lambda t: self.metric.get(t, math.inf))
        self.history.append(
            {"round": self.round, "ranked": [(t, self.metric.get(t, math.inf)) for t in ranked]}
        )
        if self.round >= self.searcher.num_rounds:
            self.members = {}
            return []
        n_cut = max(1, int(self.searcher.truncate_fraction * len(ranked)))
        survivors, losers = ranked[:-n_cut], ranked[-n_cut:]
        self.round += 1
        end = self._end(self.round)
        actions: list[Action] = []
        members: dict[int, dict[str, Any]] = {}
        for t in survivors:
            if math.isinf(self.metric.get(t, math.inf)):
                continue  # an errored survivor (tiny populations) is not continued
            actions.append(Continue(trial_id=t, max_length=end))
            members[t] = self.members[t]
        parents = ranked[:n_cut]
        for i in range(len(losers) + (len(survivors) - len(members))):
            parent = parents[i % len(parents)]
            actions.append(
                Create(
                    hparams=self.explore(self.members[parent]), max_length=end, source_trial=parent
                )
            )
        self.members = members
        self.done = set()
        return actions

    def progress(self) -> float:
        return (self.round - 1) / self.searcher.num_rounds
