"""The experiment loop: searcher actions -> trials on an executor -> events -> searcher.

One process (``jaxcore experiment create``) owns the loop. Trials report into the store;
the loop reads new validations, hands them to the searcher and the early-stopping
policy, writes the decision back (``stop_requested``) and acknowledges the step so the
trial goes on. Failed trials are restarted from their latest checkpoint up to
``max_restarts`` times, then marked ``ERRORED`` (the search goes on). Pause (SIGTERM:
trials checkpoint and exit with code 75), resume and kill arrive through the
experiment's state in the store, so they work from any shell.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import pathlib
import pickle
import shutil
import signal
import time
from typing import Any

from jaxcore.experiments.config import ExperimentConfig, parse_config, to_dict
from jaxcore.experiments.context import trial_dir
from jaxcore.experiments.early_stopping import EarlyStopping
from jaxcore.experiments.executors import Executor, InlineExecutor, LocalExecutor
from jaxcore.experiments.retention import apply_retention
from jaxcore.experiments.searchers import Continue, Create, SearchMethod, Stop, make_searcher
from jaxcore.experiments.store import TERMINAL, Store, now

log = logging.getLogger(__name__)

PREEMPTED = 75  # jaxcore.checkpoint.PREEMPTION_EXIT_CODE (not imported: no JAX here)
COMMIT_LAG_S = 30.0  # a report's transaction commits well within this after its insert
BEAT_S = 1.0  # how often the loop records its heartbeat and searcher snapshot


class _InlineChannel:
    """The inline executor's channel: validations go straight to the loop."""

    def __init__(self, loop: ExperimentLoop):
        self.loop = loop

    def validation(self, trial_id: int, step: int, values: dict[str, float]) -> None:
        self.loop._on_report(trial_id, step, values, "validation")

    def should_stop(self, trial_id: int) -> bool:
        return trial_id in self.loop.stop_requested

    def paused(self) -> bool:
        return False


@dataclasses.dataclass
class Summary:
    """What a finished experiment returns (and `experiment describe` prints)."""

    experiment_id: int
    state: str
    trials: list[dict[str, Any]]
    best_trial: int | None
    best_metric: float | None
    steps_trained: int
    deleted_checkpoints: int


class ExperimentLoop:
    """Runs one experiment to its end on an executor.

    Args:
        config: the validated `ExperimentConfig`.
        executor: ``"local"`` (subprocesses, default), ``"inline"`` (in this process,
            one trial at a time), ``"ray"``, or an `Executor`.
        store: an open `Store` (default: ``config.database_url``).
        experiment_id: continue an existing experiment (``experiment resume``).
        progress: show a live ``rich`` table (trials running, best metric so far).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        executor: str | Executor = "local",
        store: Store | None = None,
        experiment_id: int | None = None,
        progress: bool = False,
        ray_address: str | None = None,
    ):
        self.config = config
        self.store = store or Store(config.database_url)
        self.progress = progress
        os.makedirs(config.workdir, exist_ok=True)
        self.workdir = os.path.abspath(config.workdir)
        if isinstance(executor, str):
            executor = self._make_executor(executor, ray_address)
        self.executor = executor
        if isinstance(executor, InlineExecutor):
            executor.loop = self
        self.channel = _InlineChannel(self)
        self.stop_requested: set[int] = set()
        self.pending: collections.deque[int] = collections.deque()
        self.policies: dict[int, EarlyStopping] = {}
        self.last_metric_id = 0
        self.last_ckpt_id = 0
        self.deleted = 0
        self.best: tuple[float, int] | None = None
        self._signalled: dict[int, int] = {}
        self._seen: dict[int, float] = {}  # metric id -> when this loop first saw it
        self._last_beat = 0.0
        self._was_paused = False
        if experiment_id is None:
            self.exp_id = self.store.create_experiment(config.name, _raw(config), self.workdir)
            self.searcher = make_searcher(config, study_name=f"jaxcore-exp-{self.exp_id}")
            self._handle(self.searcher.initial())
        else:
            self.exp_id = experiment_id
            self._reattach()

    def _make_executor(self, name: str, ray_address: str | None) -> Executor:
        res = self.config.resources
        if name == "inline":
            return InlineExecutor()
        if name == "local":
            return LocalExecutor(devices_per_trial=res.devices, slots=res.slots)
        if name == "ray":
            from jaxcore.experiments.executors import RayExecutor

            return RayExecutor(
                address=ray_address,
                devices_per_trial=res.devices,
                max_concurrent=self.config.searcher.max_concurrent_trials or None,
            )
        raise ValueError(f"executor {name!r}: use 'local', 'inline' or 'ray'")

    def _reattach(self) -> None:
        """Resume an experiment whose loop stopped: searcher from its snapshot."""
        exp = self.store.experiment(self.exp_id)
        if exp is None or exp["searcher_state"] is None:
            raise ValueError(f"experiment {self.exp_id} has no searcher snapshot to resume")
        self.searcher = pickle.loads(exp["searcher_state"])
        self.last_metric_id = max(
            (m["id"] for m in self.store.metrics(exp_id=self.exp_id)), default=0
        )
        for t in self.store.trials(self.exp_id):
            if t["state"] in ("RUNNING", "PENDING", "PAUSED"):
                self.store.update_trial(t["id"], state="PENDING")
                self.pending.append(t["id"])
            if t["stop_requested"]:
                self.stop_requested.add(t["id"])
        self.store.update_experiment(self.exp_id, state="ACTIVE")

    # ----------------------------------------------------------------- actions
    def _handle(self, actions: list[Any]) -> None:
        queue = collections.deque(actions)
        while queue:
            action = queue.popleft()
            if isinstance(action, Create):
                trial_id = self._create(action)
                queue.extend(self.searcher.created(trial_id, action))
            elif isinstance(action, Stop):
                self.stop_requested.add(action.trial_id)
                if not self.executor.inline:
                    self.store.update_trial(action.trial_id, stop_requested=True)
            elif isinstance(action, Continue):
                values: dict[str, Any] = dict(
                    max_length=action.max_length, state="PENDING", stop_requested=False
                )
                if action.hparams is not None:
                    values["hparams"] = action.hparams
                self.stop_requested.discard(action.trial_id)
                self.store.update_trial(action.trial_id, **values)
                self.pending.append(action.trial_id)

    def _create(self, action: Create) -> int:
        trial_id = self.store.create_trial(
            self.exp_id,
            action.hparams,
            action.max_length,
            milestones=list(action.milestones),
            parent_trial=action.source_trial,
        )
        if action.source_trial is not None:
            self._clone_checkpoint(action.source_trial, trial_id)
        self.pending.append(trial_id)
        return trial_id

    def _clone_checkpoint(self, source: int, trial_id: int) -> None:
        """PBT exploit: the child starts from a copy of its parent's newest checkpoint."""
        rows = [
            r
            for r in self.store.checkpoints(trial_id=source, state="COMPLETED")
            if pathlib.Path(r["path"]).exists()
        ]
        if not rows:
            log.warning("trial %d: parent %d has no checkpoint; starting fresh", trial_id, source)
            return
        src = max(rows, key=lambda r: r["step"])
        dst = trial_dir(self.workdir, self.exp_id, trial_id) / "checkpoints" / str(src["step"])
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src["path"], dst)
        self.store.add_checkpoint(trial_id, src["step"], str(dst), src["format"], src["metrics"])
        self.store.update_trial(trial_id, source_checkpoint=src["path"])

    # ----------------------------------------------------------------- events
    def _on_report(self, trial_id: int, step: int, values: dict[str, float], kind: str) -> None:
        cfg = self.config
        actions: list[Any] = []
        if kind == "validation":
            metric = values[cfg.searcher.metric]
            if math.isfinite(metric):
                score = metric if cfg.searcher.smaller_is_better else -metric
                if self.best is None or score < self.best[0]:
                    self.best = (score, trial_id)
                    self.store.update_experiment(self.exp_id, best_metric=metric)
            time_step = step
            if cfg.searcher.time_metric not in ("steps", "batches"):
                time_step = values.get(cfg.searcher.time_metric, step)
            actions += self.searcher.validation(trial_id, time_step, metric)
        if cfg.early_stopping.metric is not None:
            policy = self.policies.setdefault(trial_id, EarlyStopping(cfg.early_stopping))
            reason = policy.update(values)
            if reason is not None and trial_id not in self.stop_requested:
                log.info("trial %d: early stop (%s)", trial_id, reason)
                actions.append(Stop(trial_id))
        self._handle(actions)
        if kind == "validation" and not self.executor.inline:
            self.store.update_trial(trial_id, acked_step=step)

    def _on_exit(self, trial_id: int, code: int) -> None:
        row = self.store.trial(trial_id)
        exp_state = (self.store.experiment(self.exp_id) or {}).get("state")
        if exp_state == "KILLED":
            self.store.update_trial(trial_id, state="CANCELED", exit_code=code, ended=now())
            return
        if code == PREEMPTED:
            if exp_state == "PAUSED":
                self.store.update_trial(trial_id, state="PAUSED", exit_code=code)
            else:
                self.store.update_trial(trial_id, state="PENDING", exit_code=code)
                self.pending.appendleft(trial_id)
            return
        if code != 0:
            restarts = row["restarts"] + 1
            if restarts <= self.config.max_restarts:
                log.warning(
                    "trial %d exited with %d: restart %d of %d from its latest checkpoint",
                    trial_id,
                    code,
                    restarts,
                    self.config.max_restarts,
                )
                self.store.update_trial(
                    trial_id, state="PENDING", restarts=restarts, exit_code=code
                )
                self.pending.appendleft(trial_id)
                return
            log.error("trial %d failed %d times: marked errored", trial_id, restarts)
            self.store.update_trial(
                trial_id, state="ERRORED", restarts=restarts - 1, exit_code=code, ended=now()
            )
            self._handle(self.searcher.errored(trial_id))
            return
        stopped = trial_id in self.stop_requested and row["steps_done"] < row["max_length"]
        self.store.update_trial(
            trial_id, state="STOPPED" if stopped else "COMPLETED", exit_code=0, ended=now()
        )
        self._handle(self.searcher.exited(trial_id))

    def _poll_store(self) -> None:
        """Feed new reports to the searcher, each exactly once.

        Ids are handed out when a row is inserted but become visible when its
        transaction commits; on PostgreSQL concurrent trials can commit out of id order,
        so a plain ``id > last`` cursor could skip a row for good. The cursor therefore
        only advances past ids seen more than `COMMIT_LAG_S` ago; newer ones are
        deduplicated.
        """
        if self.executor.inline:
            return
        now_s = time.time()
        for m in self.store.metrics(exp_id=self.exp_id, after_id=self.last_metric_id):
            if m["id"] in self._seen:
                continue
            self._seen[m["id"]] = now_s
            self._on_report(m["trial_id"], m["step"], m["values"], m["kind"])
        settled = [i for i, t in self._seen.items() if t < now_s - COMMIT_LAG_S]
        if settled:
            self.last_metric_id = max(self.last_metric_id, *settled)
            self._seen = {i: t for i, t in self._seen.items() if i > self.last_metric_id}

    def _retention(self, force: bool = False) -> None:
        rows = self.store.checkpoints(exp_id=self.exp_id, state="COMPLETED")
        newest = max((r["id"] for r in rows), default=0)
        if not force and newest <= self.last_ckpt_id:
            return
        self.last_ckpt_id = newest
        live = {t["id"] for t in self.store.trials(self.exp_id) if t["state"] not in TERMINAL}
        live |= set(getattr(self.searcher, "members", {}))
        s = self.config.searcher
        self.deleted += len(
            apply_retention(
                self.store,
                self.exp_id,
                self.config.checkpoint_storage,
                s.metric,
                s.smaller_is_better,
                live,
            )
        )

    # ----------------------------------------------------------------- the loop
    def _launch(self) -> None:
        limit = self.executor.capacity()
        if self.config.searcher.max_concurrent_trials:
            limit = min(limit, self.config.searcher.max_concurrent_trials)
        while self.pending and len(self.executor.running()) < limit:
            trial_id = self.pending.popleft()
            row = self.store.trial(trial_id)
            if row["state"] in TERMINAL and row["state"] != "COMPLETED":
                continue
            if (
                trial_id in self.stop_requested
                and row["state"] == "PENDING"
                and row["steps_done"] == 0
            ):
                self.store.update_trial(trial_id, state="CANCELED", ended=now())
                self._handle(self.searcher.exited(trial_id))
                continue
            self.store.update_trial(trial_id, state="RUNNING")
            env = {
                **os.environ,
                **self.config.environment,
                "JAXCORE_DB_URL": self.store.url,
                "JAXCORE_TRIAL_ID": str(trial_id),
            }
            self.executor.launch(trial_id, env, self.log_path(trial_id))
            if self.executor.inline:
                break

    def log_path(self, trial_id: int) -> pathlib.Path:
        return trial_dir(self.workdir, self.exp_id, trial_id) / "logs.txt"

    def _control(self) -> str:
        exp = self.store.experiment(self.exp_id) or {}
        state = exp.get("state", "ACTIVE")
        if state in ("KILLED", "PAUSED"):
            sig = signal.SIGKILL if state == "KILLED" else signal.SIGTERM
            for t in self.executor.running():
                if self._signalled.get(t) != sig:
                    self._signalled[t] = sig
                    self.executor.signal(t, sig)
        elif state == "ACTIVE" and self._was_paused:
            for t in self.store.trials(self.exp_id):
                if t["state"] == "PAUSED":
                    self.store.update_trial(t["id"], state="PENDING")
                    self.pending.append(t["id"])
        self._was_paused = state == "PAUSED"
        return state

    def step(self) -> bool:
        """One turn of the loop; False when the experiment is over."""
        state = self._control()
        if state == "ACTIVE":
            self._launch()
        for trial_id, code in self.executor.poll():
            self._signalled.pop(trial_id, None)
            self._poll_store()  # the trial's last reports come before its exit
            self._on_exit(trial_id, code)
        self._poll_store()
        self._retention()
        self._beat()
        if state == "KILLED" and not self.executor.running():
            for t in self.store.trials(self.exp_id):
                if t["state"] not in TERMINAL:
                    self.store.update_trial(t["id"], state="CANCELED", ended=now())
            return False
        if state == "PAUSED":
            return True
        return bool(self.pending or self.executor.running())

    def _beat(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_beat > BEAT_S:
            self._last_beat = time.monotonic()
            self.store.update_experiment(
                self.exp_id, heartbeat=time.time(), searcher_state=_snapshot(self.searcher)
            )

    def run(self, poll_interval: float = 0.05) -> Summary:
        """Run until every trial has ended (or the experiment is killed)."""
        display = _Progress(self) if self.progress else None
        try:
            while self.step():
                if display:
                    display.update()
                if not self.executor.inline:
                    time.sleep(poll_interval)
        finally:
            self.executor.close()
            if display:
                display.close()
        self._retention(force=True)
        self._beat(force=True)
        exp = self.store.experiment(self.exp_id)
        final = "KILLED" if exp["state"] == "KILLED" else "COMPLETED"
        self.store.update_experiment(self.exp_id, state=final, ended=now())
        return self.summary()

    def summary(self) -> Summary:
        trials = self.store.trials(self.exp_id)
        exp = self.store.experiment(self.exp_id)
        return Summary(
            experiment_id=self.exp_id,
            state=exp["state"],
            trials=trials,
            best_trial=self.best[1] if self.best else None,
            best_metric=exp["best_metric"],
            steps_trained=steps_trained(self.store, self.exp_id),
            deleted_checkpoints=self.deleted,
        )


def steps_trained(store: Store, exp_id: int) -> int:
    """Steps actually trained by all trials (PBT children count from their parent's step)."""
    total = 0
    for t in store.trials(exp_id):
        start = 0
        if t["source_checkpoint"]:
            start = int(pathlib.Path(t["source_checkpoint"]).name)
        total += max(0, t["steps_done"] - start)
    return total


def _raw(config: ExperimentConfig) -> dict[str, Any]:
    return to_dict(config)


def _snapshot(searcher: SearchMethod) -> bytes | None:
    try:
        return pickle.dumps(searcher)
    except Exception:  # an Optuna study on an RDB holds a connection: it reloads by name
        return None


def config_of(store: Store, exp_id: int) -> ExperimentConfig:
    return parse_config(store.experiment(exp_id)["config"])


class _Progress:
    """A live rich table: trials by state, best metric so far, searcher progress."""

    def __init__(self, loop: ExperimentLoop):
        from rich.live import Live

        self.loop = loop
        self.live = Live(self._render(), refresh_per_second=2, transient=False)
        self.live.start()
        self.last = 0.0

    def _render(self) -> Any:
        from rich.table import Table

        counts = collections.Counter(t["state"] for t in self.loop.store.trials(self.loop.exp_id))
        exp = self.loop.store.experiment(self.loop.exp_id)
        table = Table(title=f"experiment {self.loop.exp_id}: {self.loop.config.name}")
        for col in (
            "running",
            "pending",
            "done",
            "errored",
            "best " + self.loop.config.searcher.metric,
            "progress",
        ):
            table.add_column(col)
        done = counts["COMPLETED"] + counts["STOPPED"]
        best = exp["best_metric"]
        table.add_row(
            str(counts["RUNNING"]),
            str(counts["PENDING"]),
            str(done),
            str(counts["ERRORED"]),
            "-" if best is None else f"{best:.4g}",
            f"{100 * self.loop.searcher.progress():.0f}%",
        )
        return table

    def update(self) -> None:
        if time.monotonic() - self.last > 0.5:
            self.last = time.monotonic()
            self.live.update(self._render())

    def close(self) -> None:
        self.live.update(self._render())
        self.live.stop()
        self.live.console.print()
