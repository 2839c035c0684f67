"""``single``, ``grid`` and ``random``: every trial trains to ``max_length``."""

from __future__ import annotations

import itertools

from jaxcore.experiments.searchers.base import Action, Create, SearchMethod


class _FixedSearch(SearchMethod):
    """A search whose trials are all created up front: progress is the share that ended.

    ``ended`` is a class default so a searcher pickled before it existed resumes at 0.
    """

    ended: int = 0

    def planned(self) -> int:
        return self.searcher.max_trials

    def exited(self, trial_id: int) -> list[Action]:
        self.ended += 1
        return []

    def errored(self, trial_id: int) -> list[Action]:
        self.ended += 1
        return []

    def progress(self) -> float:
        return min(self.ended / max(self.planned(), 1), 1.0)


class SingleSearch(_FixedSearch):
    """One trial with each hyperparameter at its ``const`` value or its sampled value."""

    def initial(self) -> list[Action]:
        return [Create(hparams=self.sample(), max_length=self.searcher.length)]

    def planned(self) -> int:
        return 1


class GridSearch(_FixedSearch):
    """The cross product of every hyperparameter's grid (``count`` points per range)."""

    def points(self) -> list[dict]:
        params = self.config.hyperparameters
        return [
            dict(zip([p.name for p in params], combo, strict=True))
            for combo in itertools.product(*(p.grid() for p in params))
        ]

    def initial(self) -> list[Action]:
        return [Create(hparams=h, max_length=self.searcher.length) for h in self.points()]

    def planned(self) -> int:
        return len(self.points())


class RandomSearch(_FixedSearch):
    """``max_trials`` independent samples."""

    def initial(self) -> list[Action]:
        return [
            Create(hparams=self.sample(), max_length=self.searcher.length)
            for _ in range(self.searcher.max_trials)
        ]
