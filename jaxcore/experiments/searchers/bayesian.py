"""Bayesian search through Optuna's ask-and-tell interface (TPE or GP sampler).

Each trial is one Optuna trial: hyperparameters come from ``study.ask`` with the
space's distributions, intermediate values go to ``trial.report`` so Optuna's pruners
(median, successive halving, Hyperband) can stop poor trials early, and the last value
is told when the trial ends. The study lives in memory or, with
``searcher.optuna_storage``, in an RDB (the experiment database URL works: Optuna adds
its own tables).
"""

from __future__ import annotations

import logging
import math
import time

import optuna
import sqlalchemy as sa

from jaxcore.experiments.config import ExperimentConfig, Param
from jaxcore.experiments.early_stopping import make_pruner
from jaxcore.experiments.searchers.base import Action, Create, SearchMethod, Stop
from jaxcore.experiments.store import StoreError, safe_url

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)


# How long a study database another process holds may keep us waiting: the store's own
# busy timeout (`jaxcore.experiments.store`), not sqlite3's default 5 s.
SQLITE_WAIT_S = 60
SCHEMA_RACE_ATTEMPTS = 5


def study_storage(url: str | None) -> optuna.storages.BaseStorage | None:
    """The Optuna RDB storage at ``url`` (None: in memory), safe to open from several
    processes at once.

    Two commands opening a fresh database both find no Optuna schema and both stamp its
    version; the later one's insert fails (``UNIQUE constraint failed:
    alembic_version.version_num``). Opened again, it finds the schema made and goes on.
    A SQLite file another writer holds is waited for as the store waits for it.
    """
    if url is None:
        return None
    kwargs = {"connect_args": {"timeout": SQLITE_WAIT_S}} if url.startswith("sqlite") else {}
    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except sa.exc.IntegrityError:  # the schema another process created at once
            if attempt == SCHEMA_RACE_ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
        except sa.exc.OperationalError as e:
            if "locked" not in str(e).lower() and "busy" not in str(e).lower():
                raise
            raise StoreError(
                f"the Optuna study storage {safe_url(url)} stayed locked for "
                f"{SQLITE_WAIT_S} s: another process holds a write transaction on it "
                "(another jaxcore experiment command on this store, or a sqlite3 shell "
                "with an open transaction). Let it finish or stop it, then run `jaxcore "
                "experiment resume ID`."
            ) from e
    return None


def distribution(p: Param) -> optuna.distributions.BaseDistribution:
    if p.type == "int":
        return optuna.distributions.IntDistribution(int(p.minval), int(p.maxval), log=p.log)
    if p.type == "double":
        return optuna.distributions.FloatDistribution(float(p.minval), float(p.maxval), log=p.log)
    return optuna.distributions.CategoricalDistribution(list(p.vals))


class BayesianSearch(SearchMethod):
    def __init__(self, config: ExperimentConfig, *, study_name: str | None = None):
        super().__init__(config)
        s = config.searcher
        if s.sampler == "gp":
            sampler = optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
        else:
            sampler = optuna.samplers.TPESampler(
                seed=s.seed, n_startup_trials=s.n_startup_trials, multivariate=True
            )
        self.study = optuna.create_study(
            direction="minimize" if s.smaller_is_better else "maximize",
            sampler=sampler,
            pruner=make_pruner(s.pruner, s),
            storage=study_storage(s.optuna_storage),
            study_name=study_name,
            load_if_exists=study_name is not None,
        )
        self.dists = {p.name: distribution(p) for p in config.hyperparameters if p.type != "const"}
        self.consts = {p.name: p.val for p in config.hyperparameters if p.type == "const"}
        self.asked = 0
        self.ot: dict[int, optuna.trial.Trial] = {}
        self.last: dict[int, float] = {}
        self.pruned: set[int] = set()
        self.told: set[int] = set()

    def _ask(self) -> Create:
        trial = self.study.ask(self.dists)
        self.asked += 1
        return Create(
            hparams={**self.consts, **trial.params}, max_length=self.searcher.length, tag=trial
        )

    def initial(self) -> list[Action]:
        n = self.searcher.max_concurrent_trials or self.searcher.max_trials
        return [self._ask() for _ in range(min(n, self.searcher.max_trials))]

    def created(self, trial_id: int, action: Create) -> list[Action]:
        self.ot[trial_id] = action.tag
        return []

    def validation(self, trial_id: int, step: int, metric: float) -> list[Action]:
        trial = self.ot[trial_id]
        self.last[trial_id] = metric
        trial.report(metric, step)
        if trial_id not in self.pruned and trial.should_prune():
            self.pruned.add(trial_id)
            return [Stop(trial_id)]
        return []

    def _tell(self, trial_id: int, failed: bool) -> list[Action]:
        if trial_id in self.told:
            return []
        self.told.add(trial_id)
        trial = self.ot[trial_id]
        value = self.last.get(trial_id)
        if failed or value is None or not math.isfinite(value):  # diverged: no value
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif trial_id in self.pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, value)
        return [self._ask()] if self.asked < self.searcher.max_trials else []

    def exited(self, trial_id: int) -> list[Action]:
        return self._tell(trial_id, failed=False)

    def errored(self, trial_id: int) -> list[Action]:
        return self._tell(trial_id, failed=True)

    def progress(self) -> float:
        return len(self.told) / self.searcher.max_trials
