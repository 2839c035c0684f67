"""The trial context: what a training function sees, alone or as one trial of a search.

In the spirit of Determined's Core API (``core.train.report_*``, ``core.preempt``,
``core.checkpoint``)::

    def train(ctx: TrialContext) -> None:
        lr = ctx.hparams["lr"]
        opt = optax.inject_hyperparams(optax.adamw)(learning_rate=ctx.hparams["lr"])
        state, loader = ctx.restore(engine, model_factory, opt, loader)
        for step in range(ctx.start_step + 1, ctx.max_steps + 1):
            state, m = train_step(state, next(loader))
            if ctx.validation_due(step):
                ctx.report(step, {"loss": float(m["loss"])})
                ctx.checkpoint(state, loader, step=step)
            if ctx.should_stop() or ctx.preempted():
                break

`report` writes every metric to the store and the trial's TensorBoard event file; a
report that carries the searcher metric is a validation: the searcher sees it before the
trial goes on (the call waits for its acknowledgement), so ``should_stop`` reflects the
decision at once, as with Determined's searcher operations.

Hyperparameters win over restored state: `restore` puts the values the trial's own
optimizer was built with into the restored optimizer state (optax's
``inject_hyperparams`` keeps them there), so a PBT child that clones its parent's
checkpoint trains with its own, perturbed, learning rate. `hparams_into` does the same
for a trial that restores by other means.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any, Protocol

from jaxcore.experiments.store import Store

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 600.0
PREEMPTED = 75  # jaxcore.checkpoint.PREEMPTION_EXIT_CODE (not imported: no JAX here)
SUPERSEDED = 76  # exit status of a trial process that finds another copy owns its trial
FINISHED_MARK = "finished"  # in the trial dir: its latest launch returned cleanly


class Channel(Protocol):
    """How a trial hears the searcher's decisions (inline call or the store)."""

    def validation(self, trial_id: int, step: int, values: dict[str, float]) -> None: ...
    def should_stop(self, trial_id: int) -> bool: ...
    def paused(self) -> bool: ...


class StoreChannel:
    """Decisions through the database: the scheduler acks each validation."""

    def __init__(self, store: Store, exp_id: int):
        self.store, self.exp_id = store, exp_id
        self._row: dict[str, Any] = {}
        self._checked = 0.0
        self._paused = False
        self._paused_checked = 0.0

    def _refresh(self, trial_id: int) -> dict[str, Any]:
        self._row = self.store.trial(trial_id) or {}
        self._checked = time.monotonic()
        pid = self._row.get("pid")
        if pid is not None and pid != os.getpid() and self._row.get("host") == socket.gethostname():
            # A loop launched another copy of this trial (this one outlived its loop):
            # two copies must never share a directory, so the stale one leaves at once.
            log.error("trial %d: process %d owns this trial now; exiting", trial_id, pid)
            os._exit(SUPERSEDED)
        return self._row

    def validation(self, trial_id: int, step: int, values: dict[str, float]) -> None:
        deadline = time.monotonic() + ACK_TIMEOUT_S
        delay = 0.005
        while time.monotonic() < deadline:
            row = self._refresh(trial_id)
            if row.get("acked_step", -1) >= step or row.get("stop_requested"):
                return
            time.sleep(delay)
            delay = min(delay * 1.5, 0.1)
        log.warning("trial %d: no searcher acknowledgement of step %d; going on", trial_id, step)

    def should_stop(self, trial_id: int) -> bool:
        if time.monotonic() - self._checked > 1.0:
            self._refresh(trial_id)
        return bool(self._row.get("stop_requested"))

    def paused(self) -> bool:
        # Checked every training step: read the store at most once a second.
        if time.monotonic() - self._paused_checked > 1.0:
            exp = self.store.experiment(self.exp_id) or {}
            self._paused = exp.get("state") in ("PAUSED", "CANCELED", "KILLED")
            self._paused_checked = time.monotonic()
        return self._paused


class TrialContext:
    """Hyperparameters, reporting, stop/preempt signals and checkpoints of one trial.

    Attributes:
        trial_id, experiment_id: the store's ids.
        hparams: this trial's hyperparameters.
        max_steps: train up to this step (the searcher's length for the trial).
        start_step: the step restored from (0 when fresh); set by `restore`.
        milestones: steps the searcher wants a validation at (ASHA's rungs).
        trial_dir: ``<workdir>/<experiment uuid>/trial-<id>``: checkpoints, logs,
            TensorBoard.
        searcher_metric: the metric whose reports are validations.
        model_config: set it (a dict, e.g. ``dataclasses.asdict(TransformerConfig)``)
            and every checkpoint records it, so a registered version is self-describing.
        tokenizer_path: likewise, the tokenizer file the model was trained with.
        lineage: likewise, where the training data came from (dataset version, manifest
            and tokenizer hashes, code version); the Orbax record and the store's
            checkpoint row both carry it.
    """

    def __init__(
        self,
        *,
        store: Store,
        trial_id: int,
        channel: Channel,
        validation_period: int | None = None,
        tensorboard: bool = True,
    ):
        self.store = store
        self.trial_id = trial_id
        self.channel = channel
        row = store.trial(trial_id)
        exp = store.experiment(row["experiment_id"])
        self.experiment_id: int = row["experiment_id"]
        self.config: dict[str, Any] = exp["config"]
        self.hparams: dict[str, Any] = dict(row["hparams"])
        self.max_steps: int = int(row["max_length"])
        self.milestones: tuple[int, ...] = tuple(row.get("milestones") or ())
        self.start_step = 0
        self.restarts: int = int(row["restarts"])
        self.searcher_metric: str = self.config["searcher"]["metric"]
        self.validation_period = validation_period
        self.trial_dir = trial_dir(exp, trial_id)
        self.model_config: dict[str, Any] | None = None
        self.tokenizer_path: str | None = None
        self.lineage: dict[str, Any] | None = None
        self.checkpoint_dir = self.trial_dir / "checkpoints"
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self._last_validation: dict[str, float] = {}
        self._sigterm = False
        self._checkpointer: Any = None
        self._tb: Any = None
        self._tb_enabled = tensorboard
        if threading.current_thread() is threading.main_thread():
            try:
                self._prev = signal.signal(signal.SIGTERM, self._on_sigterm)
            except ValueError:
                self._prev = None
        else:
            self._prev = None

    # ----------------------------------------------------------------- signals
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._sigterm = True
        if self._checkpointer is not None:
            self._checkpointer.request_preemption()  # its next save writes and exits with 75

    @property
    def terminated(self) -> bool:
        """Whether this process received SIGTERM while the trial ran."""
        return self._sigterm

    def should_stop(self) -> bool:
        """Whether the searcher (or an early-stopping policy) wants this trial to end."""
        return self.channel.should_stop(self.trial_id)

    def preempted(self) -> bool:
        """Whether the trial should checkpoint and exit now (SIGTERM, experiment paused)."""
        return self._sigterm or self.channel.paused()

    def validation_due(self, step: int) -> bool:
        """Whether ``step`` is one the searcher wants a validation at."""
        if step >= self.max_steps or step in self.milestones:
            return True
        return bool(self.validation_period) and step % self.validation_period == 0

    # ----------------------------------------------------------------- reporting
    def report(self, step: int, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` at ``step``; a report with the searcher metric is a validation."""
        values = {k: _metric_value(k, v, step) for k, v in metrics.items()}
        kind = "validation" if self.searcher_metric in values else "training"
        if kind == "validation" and not math.isfinite(values[self.searcher_metric]):
            log.warning(
                "trial %d: %s is %s at step %d",
                self.trial_id,
                self.searcher_metric,
                values[self.searcher_metric],
                step,
            )
        self.store.add_metrics(self.trial_id, step, values, kind)
        self._tensorboard(step, values, kind)
        if kind == "validation":
            self._last_validation = values
            self.channel.validation(self.trial_id, step, values)

    def _tensorboard(self, step: int, values: dict[str, float], kind: str) -> None:
        if not self._tb_enabled:
            return
        if self._tb is None:
            from jaxcore.experiments.tb_events import ScalarEventWriter

            self._tb = ScalarEventWriter(self.trial_dir / "tensorboard")
        self._tb.add(step, {f"{kind}/{k}": v for k, v in values.items()})

    # ----------------------------------------------------------------- checkpoints
    def checkpointer(self) -> Any:
        """A `jaxcore.Checkpointer` on this trial's directory (retention is the store's)."""
        if self._checkpointer is None:
            self._checkpointer = trial_checkpointer(
                self.checkpoint_dir, self.trial_id, self.hparams, self.lineage
            )
            if self._sigterm:
                self._checkpointer.request_preemption()
        return self._checkpointer

    def checkpoint(
        self,
        state: Any,
        loader: Any = None,
        *,
        step: int | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> pathlib.Path:
        """Save ``state`` (a `jaxcore.TrainState` through Orbax, or any JSON-able value).

        The checkpoint is recorded in the store with ``metrics`` (default: the last
        validation), which ranks it for ``save_trial_best``/``save_experiment_best``.
        """
        values = {k: float(v) for k, v in (metrics or self._last_validation).items()}
        if _is_train_state(state):
            import jax

            from jaxcore.checkpoint import Preempted

            ckpt = self.checkpointer()
            step = int(jax.device_get(state.step)) if step is None else int(step)
            path = ckpt.step_dir(step)
            try:
                # A step that is already saved is kept as it is (Checkpointer.save skips
                # it): its ledger row is updated below, never duplicated.
                ckpt.save(state, loader, metrics=values or None, force=True, step=step)
                ckpt.wait()
            except Preempted:
                # The SIGTERM save finished: record it like any other before exiting, or
                # retention and restarts would not know it exists.
                self._record(step, path, "orbax", values)
                raise
            self._record(step, path, "orbax", values)
            return path
        if step is None:
            raise ValueError("ctx.checkpoint(state, step=...): give the step of a plain state")
        path = self.checkpoint_dir / str(int(step))
        tmp = self.checkpoint_dir / f".tmp-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "state.json").write_text(json.dumps({"step": int(step), "state": state}))
        if path.exists():  # a re-save of the step: swap atomically, same path, same row
            old = self.checkpoint_dir / f".old-{step}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        self._record(step, path, "json", values)
        return path

    def _record(self, step: int, path: pathlib.Path, fmt: str, values: dict | None) -> None:
        meta = None
        if self.model_config is not None or self.tokenizer_path is not None or self.lineage:
            meta = {"model_config": self.model_config, "tokenizer": self.tokenizer_path}
            if self.lineage:
                meta["lineage"] = self.lineage
        self.store.add_checkpoint(self.trial_id, step, str(path), fmt, values or None, meta)

    def _record_unlisted(self) -> None:
        """Checkpoints on disk but not in the ledger (the process died between the save
        and its record) are recorded now, so the restart and retention both see them."""
        listed = {r["path"] for r in self.store.checkpoints(trial_id=self.trial_id)}
        for d in self.checkpoint_dir.iterdir() if self.checkpoint_dir.exists() else ():
            if not d.name.isdigit() or str(d) in listed:
                continue
            if (d / "state.json").exists():
                self._record(int(d.name), d, "json", None)
            elif self._checkpointer is not None and int(d.name) in self._checkpointer.all_steps():
                self._record(int(d.name), d, "orbax", None)

    def latest_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint row of this trial that is still on disk."""
        rows = self.store.checkpoints(trial_id=self.trial_id, state="COMPLETED")
        rows = [r for r in rows if pathlib.Path(r["path"]).exists()]
        return max(rows, key=lambda r: r["step"]) if rows else None

    def restore(
        self, engine: Any = None, model: Any = None, optimizer: Any = None, loader: Any = None
    ) -> Any:
        """Resume from this trial's latest checkpoint (or its PBT parent's), else start.

        With an engine (or a `TrainPlan`): ``(state, loader)`` as from
        `Checkpointer.restore_or_init`, with the optimizer's hyperparameters taken from
        ``optimizer`` (`hparams_into`), not from the checkpoint. Without one: the saved
        plain state, or ``None`` when there is none. Sets ``start_step``.
        """
        if engine is not None:
            ckpt = self.checkpointer()
            self._record_unlisted()
            state, loader = ckpt.restore_or_init(engine, model, optimizer, loader)
            self.start_step = ckpt.resumed_step or 0
            if ckpt.resumed_step is not None:
                state = self.hparams_into(state, optimizer)
            return state, loader
        self._record_unlisted()
        row = self.latest_checkpoint()
        if row is None:
            self.start_step = 0
            return None
        saved = json.loads((pathlib.Path(row["path"]) / "state.json").read_text())
        self.start_step = int(saved["step"])
        return saved["state"]

    def hparams_into(self, state: Any, optimizer: Any) -> Any:
        """``state`` with the hyperparameters ``optimizer`` was built with.

        A restored optimizer state carries the values it was saved with (optax's
        ``inject_hyperparams`` keeps them in the state, not in the program); this puts
        the trial's own values back, so its hyperparameters win over the checkpoint's.
        """
        return state.replace(opt_state=apply_hyperparams(state.opt_state, optimizer, state.params))

    def mark_finished(self) -> None:
        """Record that the trial function returned: a loop that dies before it sees this
        process exit then ends the trial on resume instead of running it again."""
        with contextlib.suppress(OSError):  # best effort: without it a resume reruns it
            (self.trial_dir / FINISHED_MARK).write_text(f"{os.getpid()}\n")

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._prev is not None:
            signal.signal(signal.SIGTERM, self._prev)
            self._prev = None


class Trial:
    """Class form of a trial: subclass, implement ``run``; ``self.ctx`` is the context."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx

    def run(self) -> None:
        raise NotImplementedError("a Trial subclass implements run()")


def _is_train_state(state: Any) -> bool:
    """Whether ``state`` is a `jaxcore.TrainState`, without importing JAX to find out: a
    plain-state trial never loaded ``jaxcore.state``, and its process need not (~1.5
    CPU-s at every checkpoint's first call)."""
    module = sys.modules.get("jaxcore.state")
    return module is not None and isinstance(state, module.TrainState)


def trial_dir(experiment: dict[str, Any], trial_id: int) -> pathlib.Path:
    """``<workdir>/<experiment uuid>/trial-<id>`` (``exp-<id>`` for pre-UUID stores)."""
    name = experiment.get("uuid") or f"exp-{experiment['id']}"
    return pathlib.Path(experiment["workdir"]) / name / f"trial-{trial_id}"


def _is_inject_state(node: Any) -> bool:
    fields = getattr(node, "_fields", ())
    return "hyperparams" in fields and "inner_state" in fields


def inject_states(tree: Any) -> list[Any]:
    """The ``inject_hyperparams`` states inside an optimizer state, in tree order."""
    import jax

    leaves = jax.tree_util.tree_leaves(tree, is_leaf=_is_inject_state)
    return [x for x in leaves if _is_inject_state(x)]


def apply_hyperparams(opt_state: Any, optimizer: Any, params: Any) -> Any:
    """``opt_state`` with every ``inject_hyperparams`` value replaced by ``optimizer``'s.

    The fresh values come from ``optimizer.init`` on scalar stand-ins for the parameters
    (no optimizer-sized allocation); the replaced values keep the restored arrays' dtype
    and sharding. Scheduled hyperparameters follow the optimizer's schedule from the
    restored step at the next update, as optax computes them then.
    """
    import jax
    import jax.numpy as jnp

    restored = inject_states(opt_state)
    if not restored:
        return opt_state
    fresh = inject_states(optimizer.init(jax.tree.map(lambda x: jnp.zeros((), x.dtype), params)))
    if len(fresh) != len(restored):  # the init depends on shapes: use the real ones
        fresh = inject_states(optimizer.init(params))
    mine = {id(old): new for old, new in zip(restored, fresh, strict=True)}

    def replace(node: Any) -> Any:
        if not _is_inject_state(node):
            return node
        new = mine[id(node)].hyperparams
        values = {}
        for k, old in node.hyperparams.items():
            if k not in new:
                values[k] = old
                continue
            value = jnp.asarray(new[k], dtype=getattr(old, "dtype", None))
            sharding = getattr(old, "sharding", None)
            values[k] = jax.device_put(value, sharding) if sharding is not None else value
        return node._replace(hyperparams=values)

    return jax.tree.map(replace, opt_state, is_leaf=_is_inject_state)


def trial_checkpointer(
    directory: pathlib.Path, trial_id: Any, hparams: dict[str, Any], lineage: Any
) -> Any:
    """The `jaxcore.Checkpointer` every process of a trial uses: synchronous saves, no
    retention of its own (the store's ranks steps) and no SIGTERM hook (the trial loop's)."""
    import jaxcore as jc

    return jc.Checkpointer(
        jc.CheckpointConfig(
            directory=directory,
            keep_last=None,
            async_save=False,
            save_on_sigterm=False,
            announce=False,
        ),
        run_config={"trial": trial_id, "hparams": hparams, "lineage": lineage},
    )


def _metric_value(name: str, value: Any, step: int) -> float:
    """``value`` as a float, or a TypeError naming the metric (not float()'s bare one)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"ctx.report(step={step}): metric {name!r} is {value!r} ({type(value).__name__}); "
            "report numbers (a Python/NumPy float or int, or a JAX scalar)."
        ) from None
