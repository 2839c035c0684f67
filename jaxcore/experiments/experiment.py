"""The experiment loop: searcher actions -> trials on an executor -> events -> searcher.

One process (``jaxcore experiment create``) owns the loop. Trials report into the store;
the loop reads new validations, hands them to the searcher and the early-stopping
policy, writes the decision back (``stop_requested``) and acknowledges the step so the
trial goes on. Failed trials are restarted from their latest checkpoint up to
``max_restarts`` times, then marked ``ERRORED`` (the search goes on). Pause (SIGTERM:
trials checkpoint and exit with code 75), resume and cancel arrive through the
experiment's state in the store, so they work from any shell.

Recovery is safe by construction:

- Each turn of the loop is one store transaction: the decisions it makes (trials
  created, stopped, continued, exits recorded), the acknowledgements it sends and the
  snapshot of the searcher with its event cursor commit together. A loop killed at any
  moment leaves either all of a turn or none of it, and a resumed loop replays exactly
  the reports its snapshot had not seen (a validation written but not acknowledged is
  processed then, not skipped).
- Trial processes die with their loop (process group + parent-death signal, see
  `trial_executors`); a resumed loop also waits until no process of its trials is
  left before it launches any, so two copies of a trial never run and the concurrency
  limit holds across the restart. A trial whose function returned while no loop watched
  (its ``finished`` mark is in its directory) is recorded as ended, not run again.
- The experiment records its loop (``owner``: host and pid); ``resume`` sees at once
  that a loop on this host is dead, instead of waiting for its heartbeat to go stale.
- The final state is honest: ``FAILED`` when no trial finished (all errored, or the
  searcher made none) or none reported a finite metric (all diverged), ``CANCELED`` when
  killed, else ``COMPLETED``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import difflib
import json
import logging
import math
import os
import pathlib
import pickle
import shutil
import signal
import socket
import threading
import time
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.experiments.config import ExperimentConfig, parse_config, to_dict
from jaxcore.experiments.early_stopping import EarlyStopping
from jaxcore.experiments.retention import apply_retention
from jaxcore.experiments.searchers import Continue, Create, SearchMethod, Stop, make_searcher
from jaxcore.experiments.store import (
    EXPERIMENT_DONE,
    TERMINAL,
    Store,
    file_in_the_way,
    now,
    safe_url,
)
from jaxcore.experiments.trial_context import FINISHED_MARK, PREEMPTED, trial_dir
from jaxcore.experiments.trial_executors import (
    InlineTrialExecutor,
    SubprocessTrialExecutor,
    TrialExecutor,
    live_trial_processes,
)

log = logging.getLogger(__name__)

COMMIT_LAG_S = 30.0  # a report's transaction commits well within this after its insert
BEAT_S = 1.0  # how often the loop records its heartbeat
STALE_S = 10.0  # a loop on another host that has not beaten for this long is gone
STRAGGLER_WAIT_S = 10.0  # how long a resumed loop waits for a dead loop's trials to exit
TIMEOUT_GRACE_S = 30.0  # after trial_timeout's SIGTERM, how long until SIGKILL
WORKDIR_MARK = ".jaxcore-store.json"
OK_STATES = ("COMPLETED", "STOPPED")
SEARCH_KEYS = ("hyperparameters", "searcher", "early_stopping")  # fixed for a resume


def loop_owner() -> str:
    """``"<host> <pid>"``: who runs an experiment's loop."""
    return f"{socket.gethostname()} {os.getpid()}"


def owner_alive(exp: dict[str, Any]) -> bool:
    """Whether the loop recorded as the experiment's owner is still running.

    On this host the process table answers at once (a pid that is gone, or reused by a
    process that is not a jaxcore loop, is dead); for another host, the heartbeat.
    """
    owner = exp.get("owner")
    if not owner:
        return exp.get("heartbeat") is not None and time.time() - exp["heartbeat"] < STALE_S
    host, _, pid_text = owner.rpartition(" ")
    if host != socket.gethostname():
        return exp.get("heartbeat") is not None and time.time() - exp["heartbeat"] < STALE_S
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # this process: a loop object it abandoned, not a live loop
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False  # a zombie: dead, not yet reaped
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): the pid exists
    return b"jaxcore" in cmdline or b"pytest" in cmdline or b"python" in cmdline


def bind_workdir(workdir: str, store: Store) -> None:
    """Bind ``workdir`` to ``store``; refuse a workdir that another store owns.

    Trial directories are named by experiment UUIDs, but a second database over the
    same workdir would still mix two histories (and retention of one could delete the
    other's files), so the first store to use a workdir owns it.
    """
    mark = pathlib.Path(workdir) / WORKDIR_MARK
    mine = {"store_uuid": store.uuid, "store": safe_url(store.url)}
    while True:
        if mark.exists():
            try:
                theirs = json.loads(mark.read_text())
            except (OSError, ValueError):
                theirs = {}
            if theirs.get("store_uuid") not in (None, mine["store_uuid"]):
                raise ConfigError(
                    f"workdir {workdir} belongs to the store {theirs.get('store')} "
                    f"(id {theirs.get('store_uuid')}), but this run uses the store "
                    f"{mine['store']} (id {mine['store_uuid']}). Use that store (--db or "
                    "JAXCORE_DB), or give this experiment another workdir."
                )
            if theirs.get("store_uuid") == mine["store_uuid"]:
                return
            # A mark without a store id (unreadable, or an older one): this store takes it.
            _write_mark(mark, mine, replace=True)
            return
        # No mark yet: claim it with a hard link, which fails if another command (another
        # store) made one since the look above; that one then owns the workdir and the
        # next look refuses this store (a plain write would have let both go on).
        if _write_mark(mark, mine, replace=False):
            return


def _write_mark(mark: pathlib.Path, mine: dict[str, Any], *, replace: bool) -> bool:
    """Write ``mine`` to ``mark`` whole; without ``replace``, only if there is none yet."""
    tmp = mark.with_name(f"{mark.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(json.dumps(mine))
    try:
        if replace:
            os.replace(tmp, mark)
            return True
        try:
            os.link(tmp, mark)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: the plain (racy) write
            os.replace(tmp, mark)
        return True
    finally:
        tmp.unlink(missing_ok=True)


class _InlineChannel:
    """The inline executor's channel: validations go straight to the loop."""

    def __init__(self, loop: ExperimentLoop):
        self.loop = loop

    def validation(self, trial_id: int, step: int, values: dict[str, float]) -> None:
        self.loop._turn()  # the report is in the store: process it as any other

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
            one trial at a time), ``"ray"``, or a `TrialExecutor`.
        store: an open `Store` (default: ``config.database_url``).
        experiment_id: continue an existing experiment (``experiment resume``).
        progress: show a live ``rich`` table (trials running, best metric so far).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        *,
        executor: str | TrialExecutor = "local",
        store: Store | None = None,
        experiment_id: int | None = None,
        progress: bool = False,
        ray_address: str | None = None,
    ):
        # Checked before any store, directory or launch; the inline executor calls this
        # function (a file entrypoint is not re-run for every trial).
        # Imported here: the trial process runs ``python -m jaxcore.experiments.runner``,
        # and the package importing it first makes runpy warn in every trial's log.
        from jaxcore.experiments.runner import check_entrypoint

        self.entrypoint = check_entrypoint(config.entrypoint)
        inline = executor == "inline" or isinstance(executor, InlineTrialExecutor)
        if config.trial_timeout is not None and inline:
            raise ConfigError(
                f"trial_timeout: {config.trial_timeout:g} s needs trials in processes of "
                "their own, which the loop can stop; the inline executor runs them in this "
                "one. Use --executor local (the default) or ray."
            )
        if inline and config.environment:
            log.warning(
                "environment: %s are set for trial processes (--executor local or ray); "
                "an inline trial ('jaxcore train', --executor inline) runs in this process, "
                "which does not get them: export them before the command",
                ", ".join(sorted(config.environment)),
            )
        self.config = config
        self.store = store or Store(config.database_url)
        self.progress = progress
        blocker = file_in_the_way(config.workdir)
        if blocker is not None:
            raise ConfigError(
                f"workdir {config.workdir}: {blocker} is a file, not a folder; give a "
                "workdir that is a folder (or not there yet), e.g. experiments."
            )
        os.makedirs(config.workdir, exist_ok=True)
        self.workdir = os.path.abspath(config.workdir)
        bind_workdir(self.workdir, self.store)
        self.owner = loop_owner()
        self.channel = _InlineChannel(self)
        self.stop_requested: set[int] = set()
        self.pending: collections.deque[int] = collections.deque()
        self.exits: list[tuple[int, int]] = []  # found on resume, before any poll
        self.policies: dict[int, EarlyStopping] = {}
        self.last_metric_id = 0
        self.last_ckpt_id = 0
        self.deleted = 0
        self.best: tuple[float, int] | None = None
        self._signalled: dict[int, int] = {}
        self._launched: dict[int, float] = {}  # trial -> monotonic time of its launch
        self._timed_out: dict[int, float] = {}  # trial -> when trial_timeout stopped it
        self._seen: dict[int, float] = {}  # metric id -> when this loop first saw it
        self._last_beat = 0.0
        self._was_paused = False
        self._early_stopping_said = False  # a never-reported early_stopping.metric, said once
        if isinstance(executor, str):
            executor = self._make_executor(executor, ray_address)
        self.executor = executor
        if isinstance(executor, InlineTrialExecutor):
            executor.loop = self
        # An Optuna study in an RDB writes through its own connections while the searcher
        # runs, so its turns cannot hold the store's transaction (and its snapshot is the
        # study itself, reloaded by name).
        self._atomic = not config.searcher.optuna_storage
        if experiment_id is None:
            with self._transaction():
                self.exp_id = self.store.create_experiment(
                    config.name, _raw(config), self.workdir, owner=self.owner
                )
                self.experiment = self.store.experiment(self.exp_id)
                self.searcher = make_searcher(config, study_name=f"jaxcore-exp-{self.exp_id}")
                self._handle(self.searcher.initial())
                self._save_snapshot()
        else:
            self.exp_id = experiment_id
            self._reattach()

    def _make_executor(self, name: str, ray_address: str | None) -> TrialExecutor:
        res = self.config.resources
        if name == "inline":
            return InlineTrialExecutor()
        if name == "local":
            return SubprocessTrialExecutor(devices_per_trial=res.devices, slots=res.slots)
        if name == "ray":
            from jaxcore.experiments.trial_executors import RayTrialExecutor

            return RayTrialExecutor(
                address=ray_address,
                devices_per_trial=res.devices,
                max_concurrent=self.config.searcher.max_concurrent_trials or None,
            )
        raise ValueError(f"executor {name!r}: use 'local', 'inline' or 'ray'")

    def _reattach(self) -> None:
        """Resume an experiment whose loop stopped, from the snapshot of its last turn."""
        exp = self.store.experiment(self.exp_id)
        if exp is None:
            raise ConfigError(f"no experiment {self.exp_id} in {safe_url(self.store.url)}.")
        if exp["state"] in EXPERIMENT_DONE:
            raise ConfigError(f"experiment {self.exp_id} is {exp['state']}; nothing to resume.")
        if owner_alive(exp):
            raise ConfigError(
                f"experiment {self.exp_id} is run by a live loop ({exp['owner']}); "
                "pause, resume or cancel it through the store instead of starting another."
            )
        changed = changed_search(exp["config"], self.config)
        if changed:
            raise ConfigError(
                f"experiment {self.exp_id} cannot resume with a different search: "
                + "; ".join(changed)
                + ". Its searcher state and results belong to the search it was created "
                "with; resume it with that config (`jaxcore experiment resume "
                f"{self.exp_id}` uses the stored one), or start a new experiment for the "
                "new search."
            )
        if not self.store.claim_experiment(self.exp_id, self.owner, exp["owner"]):
            raise ConfigError(f"experiment {self.exp_id}: another loop claimed it just now.")
        snap = _load_snapshot(exp["searcher_state"])
        if snap.get("searcher") is None:
            raise ConfigError(f"experiment {self.exp_id} has no searcher snapshot to resume.")
        self.experiment = exp
        self.searcher = snap["searcher"]
        self.last_metric_id = snap.get("last_metric_id", 0)
        self._seen = dict.fromkeys(snap.get("seen", ()), time.time())
        self.policies = snap.get("policies", {})
        self.best = snap.get("best")
        trials = self.store.trials(self.exp_id)
        self._wait_for_stragglers({t["id"] for t in trials})
        for t in trials:
            if t["state"] == "RUNNING" and self._finished_mark(t["id"]).exists():
                self.exits.append((t["id"], 0))  # ended while no loop watched: no rerun
            elif t["state"] in ("RUNNING", "PENDING", "PAUSED"):
                self.store.update_trial(t["id"], state="PENDING", pid=None, host=None)
                self.pending.append(t["id"])
            if t["stop_requested"]:
                self.stop_requested.add(t["id"])
        self.store.update_experiment(self.exp_id, state="ACTIVE")

    def _wait_for_stragglers(self, trial_ids: set[int]) -> None:
        """Wait until no process of these trials is alive (they die with their old loop,
        a few milliseconds after it); SIGKILL any that linger past `STRAGGLER_WAIT_S`."""
        deadline = time.monotonic() + STRAGGLER_WAIT_S
        while True:
            live = live_trial_processes(self.store.url, trial_ids)
            if not live:
                return
            if time.monotonic() > deadline:
                for pid in (p for pids in live.values() for p in pids):
                    log.warning("killing trial process %d left by the previous loop", pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                deadline = time.monotonic() + STRAGGLER_WAIT_S
            time.sleep(0.05)

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
        dst = trial_dir(self.experiment, trial_id) / "checkpoints" / str(src["step"])
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dst, ignore_errors=True)  # left by a turn that did not commit
        shutil.copytree(src["path"], dst)
        self.store.add_checkpoint(
            trial_id, src["step"], str(dst), src["format"], src["metrics"], src.get("meta")
        )
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
        if kind == "validation":
            self.store.update_trial(trial_id, acked_step=step)

    def _on_exit(self, trial_id: int, code: int) -> None:
        row = self.store.trial(trial_id)
        exp_state = (self.store.experiment(self.exp_id) or {}).get("state")
        if exp_state in ("CANCELED", "KILLED"):
            self.store.update_trial(trial_id, state="CANCELED", exit_code=code, ended=now())
            return
        # A trial stopped by trial_timeout failed, even when its SIGTERM handler saved
        # and exited as preempted: rescheduling it as a preemption would loop for ever.
        timed_out = self._timed_out.pop(trial_id, None) is not None and exp_state != "PAUSED"
        if timed_out and code == 0 and not self._reported(trial_id):
            code = 1  # it returned when stopped, before its result
        if code == PREEMPTED and not timed_out:
            if exp_state == "PAUSED":
                self.store.update_trial(trial_id, state="PAUSED", exit_code=code)
            else:
                self.store.update_trial(trial_id, state="PENDING", exit_code=code)
                self.pending.appendleft(trial_id)
            return
        if code != 0:
            restarts = row["restarts"] + 1
            why = (
                f"ran past trial_timeout ({self.config.trial_timeout:g} s) and was stopped"
                if timed_out
                else f"exited with {code}"
            )
            if restarts <= self.config.max_restarts:
                log.warning(
                    "trial %d %s: restart %d of %d from its latest checkpoint",
                    trial_id,
                    why,
                    restarts,
                    self.config.max_restarts,
                )
                self.store.update_trial(
                    trial_id, state="PENDING", restarts=restarts, exit_code=code
                )
                self.pending.appendleft(trial_id)
                return
            log.error("trial %d %s, failed %d times: marked errored", trial_id, why, restarts)
            self.store.update_trial(
                trial_id,
                state="ERRORED",
                restarts=restarts - 1,
                exit_code=code,
                ended=now(),
                pid=None,
            )
            self._handle(self.searcher.errored(trial_id))
            return
        if trial_id not in self.stop_requested and not self._reported(trial_id):
            self._errored_unreported(trial_id)
            return
        self._check_early_stopping_metric(trial_id)
        stopped = trial_id in self.stop_requested and row["steps_done"] < row["max_length"]
        self.store.update_trial(
            trial_id,
            state="STOPPED" if stopped else "COMPLETED",
            exit_code=0,
            ended=now(),
            pid=None,
        )
        self._handle(self.searcher.exited(trial_id))

    def _trial_log(self, trial_id: int, line: str) -> None:
        """Append the loop's word on a trial to the trial's own log (best effort: the
        record in the store is what counts)."""
        with contextlib.suppress(OSError):
            path = self.log_path(trial_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"jaxcore: {line}\n")

    def _reported(self, trial_id: int) -> bool:
        """Whether the trial ever reported the searcher metric (in any of its processes)."""
        return any(
            self.config.searcher.metric in m["values"]
            for m in self.store.metrics(trial_id, kind="validation")
        )

    def _check_early_stopping_metric(self, trial_id: int) -> None:
        """Say so when a trial ended without ever reporting ``early_stopping.metric``
        (a typo such as ``los``): its policy never saw a value, so early stopping did not
        apply. Said once per loop, on stderr (the log) and in the trial's log, as Keras'
        ``EarlyStopping`` warns about a metric that is not available."""
        metric = self.config.early_stopping.metric
        if metric is None or self._early_stopping_said:
            return
        names, hint = self._reported_names(trial_id, "early_stopping.metric", metric)
        if metric in names:
            return
        self._early_stopping_said = True
        reason = (
            f"trial {trial_id} ended without reporting early_stopping.metric {metric!r} (it "
            f"reported {', '.join(map(repr, names)) or 'nothing'}{hint}): early stopping "
            "did not apply to it"
        )
        log.warning("%s", reason)
        self._trial_log(trial_id, reason)

    def _reported_names(self, trial_id: int, setting: str, metric: str) -> tuple[list[str], str]:
        """The metric names a trial reported, and "; did you mean <setting>: <name>?" for
        the one closest to ``metric`` (empty when none is close)."""
        names = sorted({k for m in self.store.metrics(trial_id) for k in m["values"]})
        close = difflib.get_close_matches(metric, names, n=1)
        return names, (f"; did you mean {setting}: {close[0]}?" if close else "")

    def _errored_unreported(self, trial_id: int) -> None:
        """A trial that ended cleanly without reporting the searcher metric gave the search
        nothing: it is ERRORED (not COMPLETED, which would let an experiment of such trials
        end COMPLETED with no result), without restarts, which would end the same way."""
        metric = self.config.searcher.metric
        names, hint = self._reported_names(trial_id, "searcher.metric", metric)
        # a mistyped searcher.metric: say what the trial did report
        seen = f" (it reported {', '.join(map(repr, names))}{hint})" if names else ""
        reason = (
            f"trial {trial_id} exited without reporting the searcher metric {metric!r}{seen}: "
            f"report it with ctx.report(step, {{{metric!r}: value}}) (a return value is "
            "not the objective); marked errored"
        )
        log.error("%s", reason)
        self._trial_log(trial_id, reason)
        self.store.update_trial(trial_id, state="ERRORED", exit_code=0, ended=now(), pid=None)
        self._handle(self.searcher.errored(trial_id))

    def _poll_store(self) -> None:
        """Feed new reports to the searcher, each exactly once.

        Ids are handed out when a row is inserted but become visible when its
        transaction commits; on PostgreSQL concurrent trials can commit out of id order,
        so a plain ``id > last`` cursor could skip a row for good. The cursor therefore
        only advances past ids seen more than `COMMIT_LAG_S` ago; newer ones are
        deduplicated.
        """
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
            # No pid while starting: the new process must not mistake an old one's for
            # a live owner (see StoreChannel); it is recorded once the process exists.
            self.store.update_trial(trial_id, state="RUNNING", pid=None, host=None)
            self._finished_mark(trial_id).unlink(missing_ok=True)  # an earlier launch's
            env = {
                **os.environ,
                **self.config.environment,
                "JAXCORE_DB_URL": self.store.url,
                "JAXCORE_TRIAL_ID": str(trial_id),
            }
            self._launched[trial_id] = time.monotonic()
            pid = self.executor.launch(trial_id, env, self.log_path(trial_id))
            if pid is not None:
                self.store.update_trial(trial_id, pid=pid, host=socket.gethostname())
            if self.executor.inline:
                break

    def _finished_mark(self, trial_id: int) -> pathlib.Path:
        return trial_dir(self.experiment, trial_id) / FINISHED_MARK

    def log_path(self, trial_id: int) -> pathlib.Path:
        return trial_dir(self.experiment, trial_id) / "logs.txt"

    def _control(self) -> str:
        exp = self.store.experiment(self.exp_id) or {}
        state = exp.get("state", "ACTIVE")
        if state in ("CANCELED", "KILLED", "PAUSED"):
            sig = signal.SIGTERM if state == "PAUSED" else signal.SIGKILL
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

    def _enforce_timeout(self) -> None:
        """SIGTERM each trial that has run past ``trial_timeout`` (its preemption save),
        SIGKILL it `TIMEOUT_GRACE_S` later if it is still there; `_on_exit` counts it failed."""
        limit = self.config.trial_timeout
        if limit is None:
            return
        clock = time.monotonic()
        for t in self.executor.running():
            stopped = self._timed_out.get(t)
            if stopped is None and clock - self._launched.get(t, clock) > limit:
                self._timed_out[t] = clock
                reason = (
                    f"trial {t} has run for more than trial_timeout ({limit:g} s): stopping "
                    f"it (SIGTERM, then SIGKILL after {TIMEOUT_GRACE_S:g} s)"
                )
                log.warning("%s", reason)
                self._trial_log(t, reason)
                self.executor.signal(t, signal.SIGTERM)
            elif (
                stopped is not None
                and clock - stopped > TIMEOUT_GRACE_S
                and self._signalled.get(t) != signal.SIGKILL
            ):
                self._signalled[t] = signal.SIGKILL
                self.executor.signal(t, signal.SIGKILL)

    def step(self) -> bool:
        """One turn of the loop; False when the experiment is over."""
        state = self._control()
        self._enforce_timeout()
        if state == "ACTIVE":
            self._launch()
        self._turn()
        self._retention()
        self._beat()
        if state in ("CANCELED", "KILLED") and not self.executor.running():
            for t in self.store.trials(self.exp_id):
                if t["state"] not in TERMINAL:
                    self.store.update_trial(t["id"], state="CANCELED", ended=now())
            return False
        if state == "PAUSED":
            return True
        return bool(self.pending or self.executor.running())

    def _turn(self) -> None:
        """Ended trials and new reports to the searcher, as one transaction with the
        snapshot of the state they lead to (see the module docstring)."""
        with self._transaction():
            exits, self.exits = [*self.exits, *self.executor.poll()], []
            for trial_id, code in exits:
                self._signalled.pop(trial_id, None)
                self._poll_store()  # the trial's last reports come before its exit
                self._on_exit(trial_id, code)
            self._poll_store()
            self._save_snapshot()

    def _transaction(self) -> Any:
        return self.store.transaction() if self._atomic else contextlib.nullcontext()

    def _save_snapshot(self) -> None:
        state = {
            "searcher": self.searcher,
            "last_metric_id": self.last_metric_id,
            "seen": sorted(self._seen),
            "policies": self.policies,
            "best": self.best,
        }
        blob = _snapshot(state)
        if blob is not None and blob != getattr(self, "_last_snapshot", None):
            self.store.update_experiment(self.exp_id, searcher_state=blob)
            self._last_snapshot = blob

    def _beat(self, force: bool = False) -> None:
        if force or time.monotonic() - self._last_beat > BEAT_S:
            self._last_beat = time.monotonic()
            self.store.update_experiment(self.exp_id, heartbeat=time.time())

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
        final = self._outcome()
        self.store.update_experiment(self.exp_id, state=final, ended=now(), owner=None)
        return self.summary()

    def _outcome(self) -> str:
        """CANCELED when killed; FAILED when no trial finished (all errored, or the
        searcher could not make any) or none reported a finite metric (all diverged); else
        COMPLETED."""
        exp = self.store.experiment(self.exp_id)
        if exp["state"] in ("CANCELED", "KILLED"):
            return "CANCELED"
        trials = self.store.trials(self.exp_id)
        if not any(t["state"] in OK_STATES for t in trials):
            errored = sum(t["state"] == "ERRORED" for t in trials)
            log.error(
                "experiment %d FAILED: %s",
                self.exp_id,
                f"all {errored} trials errored (see 'jaxcore trial logs ID')"
                if errored
                else "the searcher created no trial that finished",
            )
            return "FAILED"
        if self.best is None:  # trials ended, but not one gave the search a result
            log.error(
                "experiment %d FAILED: no trial reported a finite %r (every value was NaN "
                "or infinite: the runs diverged); lower the learning rate or check the loss, "
                "then run a new experiment",
                self.exp_id,
                self.config.searcher.metric,
            )
            return "FAILED"
        return "COMPLETED"

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


def changed_search(stored: dict[str, Any], config: ExperimentConfig) -> list[str]:
    """``"field: old -> new"`` for each part of the search (the searched hyperparameters,
    the searcher, early stopping) that ``config`` changes from the experiment's stored
    config.

    A resumed loop reuses the snapshot of the searcher built from the stored config and
    the results ranked by it; a different space, metric or direction would be mixed
    into them silently, so `ExperimentLoop` refuses it. Constants are not searched and
    may change (``jaxcore run`` passes a measured ``peak_flops``).
    """
    old, new = _search(to_dict(parse_config(stored))), _search(to_dict(config))
    return [d for key in SEARCH_KEYS for d in _differences(key, old[key], new[key])]


def _search(raw: dict[str, Any]) -> dict[str, Any]:
    """The parts of a config dict a resume must keep (a const is a plain value there)."""
    space = {k: v for k, v in raw["hyperparameters"].items() if isinstance(v, dict)}
    return {**raw, "hyperparameters": space}


def _differences(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new), key=str)
        return [d for k in keys for d in _differences(f"{path}.{k}", old.get(k), new.get(k))]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def _snapshot(state: dict[str, Any]) -> bytes | None:
    try:
        return pickle.dumps(state)
    except Exception:  # an Optuna study on an RDB holds a connection: it reloads by name
        return None


def _load_snapshot(blob: bytes | None) -> dict[str, Any]:
    if blob is None:
        return {}
    state = pickle.loads(blob)
    if isinstance(state, SearchMethod):  # written by a loop before snapshots had cursors
        return {"searcher": state}
    return state


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
