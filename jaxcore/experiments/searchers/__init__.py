"""Searchers: `make_searcher(config)` returns the one ``searcher.name`` asks for."""

from __future__ import annotations

from jaxcore.experiments.config import ExperimentConfig
from jaxcore.experiments.searchers.asha import AdaptiveASHASearch
from jaxcore.experiments.searchers.base import Action, Continue, Create, SearchMethod, Stop
from jaxcore.experiments.searchers.pbt import PBTSearch
from jaxcore.experiments.searchers.simple import GridSearch, RandomSearch, SingleSearch


def make_searcher(config: ExperimentConfig, *, study_name: str | None = None) -> SearchMethod:
    name = config.searcher.name
    if name == "single":
        return SingleSearch(config)
    if name == "grid":
        return GridSearch(config)
    if name == "random":
        return RandomSearch(config)
    if name == "adaptive_asha":
        return AdaptiveASHASearch(config)
    if name == "pbt":
        return PBTSearch(config)
    from jaxcore.experiments.searchers.bayesian import BayesianSearch  # optuna is heavy

    return BayesianSearch(config, study_name=study_name)


__all__ = [
    "Action",
    "AdaptiveASHASearch",
    "Continue",
    "Create",
    "GridSearch",
    "PBTSearch",
    "RandomSearch",
    "SearchMethod",
    "SingleSearch",
    "Stop",
    "make_searcher",
]
