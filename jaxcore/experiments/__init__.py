"""Experiments: trials, hyperparameter search, early stopping, a store, a model registry.

Write a training function against a `TrialContext`; run it alone (``jaxcore train``) or
as a search (``jaxcore experiment create``) with grid, random, Bayesian (Optuna),
adaptive ASHA or PBT; every metric and checkpoint lands in one SQL store (SQLite by
default, PostgreSQL for a team), and good checkpoints become registered model versions.
This module imports neither JAX nor Optuna until they are needed.
"""

from jaxcore.experiments import registry
from jaxcore.experiments.config import (
    EarlyStoppingConfig,
    ExperimentConfig,
    Param,
    ResourcesConfig,
    RetentionConfig,
    SearcherConfig,
    load_config,
    parse_config,
)
from jaxcore.experiments.early_stopping import EarlyStopping, make_pruner
from jaxcore.experiments.experiment import ExperimentLoop, Summary
from jaxcore.experiments.registry import Registry, ResolvedModel
from jaxcore.experiments.store import Store, StoreError
from jaxcore.experiments.trial_context import Trial, TrialContext
from jaxcore.experiments.trial_executors import (
    InlineTrialExecutor,
    RayTrialExecutor,
    SubprocessTrialExecutor,
    TrialExecutor,
)


def run_experiment(
    config: "ExperimentConfig | dict | str",
    *,
    executor: str = "local",
    progress: bool = False,
    **kwargs,
) -> Summary:
    """Run an experiment (a config, a dict or a YAML path) to its end; returns a `Summary`."""
    if isinstance(config, str):
        config = load_config(config)
    elif isinstance(config, dict):
        config = parse_config(config)
    loop = ExperimentLoop(config, executor=executor, progress=progress, **kwargs)
    try:
        return loop.run()
    finally:
        loop.store.close()


__all__ = [
    "EarlyStopping",
    "EarlyStoppingConfig",
    "ExperimentConfig",
    "ExperimentLoop",
    "InlineTrialExecutor",
    "Param",
    "RayTrialExecutor",
    "Registry",
    "ResolvedModel",
    "ResourcesConfig",
    "RetentionConfig",
    "SearcherConfig",
    "Store",
    "StoreError",
    "SubprocessTrialExecutor",
    "Summary",
    "Trial",
    "TrialContext",
    "TrialExecutor",
    "load_config",
    "make_pruner",
    "parse_config",
    "registry",
    "run_experiment",
]
