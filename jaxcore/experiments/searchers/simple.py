"""``single``, ``grid`` and ``random``: every trial trains to ``max_length``."""

from __future__ import annotations

import itertools

from jaxcore.experiments.searchers.base import Action, Create, SearchMethod


class SingleSearch(SearchMethod):
    """One trial with each hyperparameter at its ``const`` value or its sampled value."""

    def initial(self) -> list[Action]:
        return [Create(hparams=self.sample(), max_length=self.searcher.length)]


class GridSearch(SearchMethod):
    """The cross product of every hyperparameter's grid (``count`` points per range)."""

    def points(self) -> list[dict]:
        params = self.config.hyperparameters
        return [
            dict(zip([p.name for p in params], combo, strict=True))
            for combo in itertools.product(*(p.grid() for p in params))
        ]

    def initial(self) -> list[Action]:
        return [Create(hparams=h, max_length=self.searcher.length) for h in self.points()]


class RandomSearch(SearchMethod):
    """``max_trials`` independent samples."""

    def initial(self) -> list[Action]:
        return [
            Create(hparams=self.sample(), max_length=self.searcher.length)
            for _ in range(self.searcher.max_trials)
        ]
