"""Checkpoints that resume exactly and never discard a run on a guess.

One directory per step (``<directory>/<step>/``) holds Orbax items:

- ``state``: the `TrainState` (params, optimizer state, loss scale, step, and the typed
  PRNG key stored as its raw ``key_data``), written by Orbax's sharded array handler;
- ``input`` / ``input_stream``: the loader position, once or per process
  (`jaxcore.checkpointing.positions`);
- ``meta``: a JSON record of the run (engine config, mesh shape, package versions, the
  shape/dtype of every state leaf, the parameters' logical axes);

and ``jaxcore_manifest.json``, the size and CRC32 of every file, written inside Orbax's
temporary directory before the rename that finalizes the step
(`jaxcore.checkpointing.atomic`): a finalized step always has one.

The guarantees (docs/checkpoints.md, each one a test):

- every restore is verified against the manifest first (processes share the reads);
- a step is moved to ``<directory>/damaged/`` only on proof from its own manifest (a file
  missing, of the wrong size or failing its CRC, or the manifest unreadable), at most one
  per start; any other failure raises `CheckpointError` naming the step and touches
  nothing;
- a step without a manifest (jaxcore 0.1) is refused unless
  ``CheckpointConfig(allow_unverified=True)``;
- on preemption every process saves the same step, then `Preempted` exits with 75
  (`jaxcore.checkpointing.preemption`).

Restores are made against the abstract state of the *current* plan (``plan.abstract()``,
sharded ``ShapeDtypeStruct``s, nothing computed): each process reads only the shards its
devices hold, so a checkpoint saved under ``fsdp=8`` restores onto ``fsdp=4,
tensor=2``, ``data=8`` or one device (Orbax's ``StandardRestore`` with sharded
``jax.ShapeDtypeStruct`` targets, as in MaxText's ``checkpointing.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import re
import shutil
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from jaxcore.checkpointing import positions
from jaxcore.checkpointing import record as rec
from jaxcore.checkpointing.atomic import manifested_rename
from jaxcore.checkpointing.manifest import VERIFY_MODES, Damage, has_manifest
from jaxcore.checkpointing.preemption import PreemptionWatch, sigint_deferred
from jaxcore.checkpointing.storage import failed_step, storage_failure
from jaxcore.checkpointing.verification import Unreadable, agree_on_damage
from jaxcore.checkpointing.writer_lock import BusyDirectory, WriterLock
from jaxcore.errors import ConfigError, JaxcoreError, check_keywords
from jaxcore.input import check_loader
from jaxcore.plan import TrainPlan
from jaxcore.runtime import PREEMPTION_EXIT_CODE  # defined there: the launcher needs no JAX
from jaxcore.state import TrainState

log = logging.getLogger(__name__)

DAMAGED_DIR = "damaged"
_ITEMS = ("state", "meta", positions.SHARED, positions.PER_PROCESS)


class Preempted(SystemExit):
    """Raised by `Checkpointer.save` after the final save that follows a SIGTERM."""

    def __init__(self, step: int):
        super().__init__(PREEMPTION_EXIT_CODE)
        self.step = step


class CheckpointError(JaxcoreError):
    """A checkpoint could not be verified or read, and nothing proves it is damaged; or
    the storage refused a save (a full disk, a quota, a read-only mount).

    Raised instead of guessing: the step directory is left where it is. The message names
    the step, the file or item, and the underlying exception.
    """


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When to save, what to keep, how to check.

    Attributes:
        directory: the folder step directories go in: a local (or mounted) path, ``~``
            expanded, created if missing. A URL (``gs://``, ``s3://``) is a `ConfigError`:
            the manifest, lock and quarantine use the local file system.
        save_every_steps: save when ``step % save_every_steps == 0`` (``None``: off).
        save_every_seconds: save when this long passed since the last save and no save
            is in flight (Orbax's continuous policy, in whole seconds, at least 1;
            ``None``: off). With neither, only
            ``save(..., force=True)`` and preemption save.
        async_save: write in a background thread; the loop is blocked only for the copy
            of the arrays to host memory.
        keep_last: keep the newest K checkpoints (``None``: keep all).
        keep_best: also keep the best K by ``best_metric`` (``None``: off).
        best_metric: name of the metric passed to ``save(metrics=...)`` that ranks steps.
        best_mode: ``min`` (e.g. loss) or ``max`` (e.g. accuracy).
        verify: before restoring, check the manifest's file sizes and CRC32s
            (``checksum``), sizes only (``size``), or nothing (``none``).
        allow_unverified: restore a step that has no manifest (written by jaxcore 0.1);
            its files are then trusted unchecked. Off: such a step raises
            `CheckpointError`.
        save_on_sigterm: in a single process, install a SIGTERM handler so that the next
            save writes a final checkpoint and exits with `PREEMPTION_EXIT_CODE`. With
            several processes JAX's preemption notifier owns SIGTERM and its sync point
            is always honoured (`jaxcore.checkpointing.preemption`).
        announce: print which checkpoint a run resumed from (process 0), besides logging.
    """

    directory: str | os.PathLike
    save_every_steps: int | None = None
    save_every_seconds: float | None = None
    async_save: bool = True
    keep_last: int | None = 3
    keep_best: int | None = None
    best_metric: str | None = None
    best_mode: str = "min"
    verify: str = "checksum"
    allow_unverified: bool = False
    save_on_sigterm: bool = True
    announce: bool = True

    def __post_init__(self) -> None:
        _check_directory(self.directory)
        for name in ("save_every_steps", "keep_last", "keep_best"):
            value = getattr(self, name)
            # bool is an int: keep_best=True read as 1 and save_every_steps=True as every step
            bad = isinstance(value, bool) or not isinstance(value, int) or value < 1
            if value is not None and bad:
                raise ConfigError(
                    f"CheckpointConfig.{name}={value!r}: must be an integer >= 1, or None."
                )
        if self.save_every_seconds is not None and not self.save_every_seconds > 0:
            raise ConfigError(
                f"CheckpointConfig.save_every_seconds={self.save_every_seconds!r}: must be "
                "positive, or None."
            )
        if self.keep_best is not None and not self.best_metric:
            raise ConfigError(
                "CheckpointConfig.keep_best is set but best_metric is not: name the metric "
                "(e.g. best_metric='loss') that save(metrics=...) reports."
            )
        if self.best_mode not in ("min", "max"):
            raise ConfigError(f"CheckpointConfig.best_mode={self.best_mode!r}: 'min' or 'max'.")
        if self.verify not in VERIFY_MODES:
            raise ConfigError(f"CheckpointConfig.verify={self.verify!r}: one of {VERIFY_MODES}.")


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _check_directory(directory: Any) -> None:
    """Refuse what `pathlib` would turn into a wrong local folder: an empty path (the
    working directory) and a URL (``gs://b/x`` became ``./gs:/b/x`` on the local disk)."""
    try:
        text = os.fspath(directory)
    except TypeError:
        text = None
    if not text:
        raise ConfigError(
            f"CheckpointConfig.directory={directory!r}: name the folder for the checkpoints "
            "(e.g. directory='runs/demo'; it is created if missing)."
        )
    if isinstance(text, str) and _URL.match(text):
        local = text.removeprefix("file://") if text.startswith("file:///") else None
        raise ConfigError(
            f"CheckpointConfig.directory={text!r}: checkpoints go to a local folder (or a "
            "bucket mounted as one, e.g. with gcsfuse or s3fs), not a URL: "
            + (f"pass {local!r}." if local else "mount it and pass the mount's path.")
        )


def _rank_value(metrics: Any, name: str, worst: float) -> float:
    try:
        value = float(metrics.get(name, math.nan))
    except (AttributeError, TypeError, ValueError):  # not a number: ranks last too
        return worst
    return worst if math.isnan(value) else value


class _Manager(ocp.CheckpointManager):
    """Orbax's manager, reading a step's saved metrics (``<step>/metrics/metrics``, what
    ``keep_best`` ranks by) without failing on a damaged file.

    Orbax (0.12.8) reads them for every step when it (re)loads the directory and lets any
    error but `FileNotFoundError` out, so one truncated metrics file made building the
    Checkpointer, `all_steps` and `restore_or_init` raise a bare `JSONDecodeError` before
    the manifest check that proves the step damaged (and quarantines it) could run. Such a
    step ranks as one without metrics.
    """

    def _get_metrics(self, step: int) -> Any:
        try:
            metrics = super()._get_metrics(step)
        except (OSError, ValueError) as e:
            log.warning("the metrics of checkpoint step %d cannot be read: %s", step, e)
            return None
        return metrics if isinstance(metrics, dict) else None


def _is_typed_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _culprit(root: pathlib.Path, error: BaseException, default: pathlib.Path) -> str:
    """The first path under ``root`` that ``error`` (or its causes) mentions."""
    pattern = re.compile(re.escape(str(root)) + r"[^\s'\",:\]\)]*")
    seen: BaseException | None = error
    while seen is not None:
        found = pattern.search(str(seen))
        if found:
            return found.group(0)
        seen = seen.__cause__ or seen.__context__
    return str(default)


# The Orbax managers of Checkpointers not closed yet, by id: closed when the interpreter
# exits. The managers only: a Checkpointer (its engine, plan and loader) is not kept alive.
_unclosed: dict[int, tuple[ocp.CheckpointManager, pathlib.Path]] = {}
_exit_hook = threading.Lock()
_exit_hook_installed = False
closing_at_exit = False  # set while that hook runs (tests wait for it)


def _close_unclosed() -> None:
    """Finish the saves in flight of the Checkpointers a single-process script left open
    (errors are logged). With several processes they are left: a finalize waits for every
    process, and one that died would hang the others."""
    global closing_at_exit
    closing_at_exit = True
    for manager, directory in list(_unclosed.values()):
        if jax.process_count() > 1:
            log.warning(
                "the Checkpointer of %s was not closed: a save still in flight, if any, is "
                "lost. Close it (close() or `with`) before the script ends.",
                directory,
            )
            continue
        log.info("closing the Checkpointer of %s at exit (it was not closed)", directory)
        try:
            manager.wait_until_finished()
            manager.close()
        except Exception as e:
            log.error(
                "closing the Checkpointer of %s at exit: %s: %s", directory, type(e).__name__, e
            )


def _install_exit_hook() -> None:
    """Close every open Checkpointer when the interpreter exits, before the thread pools
    stop: a script that ended without ``close()`` (or ``with``) lost its last async save,
    with "cannot schedule new futures after interpreter shutdown" tracebacks and exit 0
    (Orbax's finalize runs in those pools). `threading._register_atexit` is the hook
    `concurrent.futures` itself uses; its hooks run in reverse order, so this one, added
    after the pools' own (registered on import), runs before they refuse new work."""
    global _exit_hook_installed
    with _exit_hook:
        if _exit_hook_installed:
            return
        import concurrent.futures.thread  # noqa: F401 (registers the pools' hook first)

        threading._register_atexit(_close_unclosed)  # type: ignore[attr-defined]
        _exit_hook_installed = True


class Checkpointer:
    """Saves and restores runs; see the module docstring for the layout and guarantees.

    Typical loop::

        with Checkpointer(CheckpointConfig(directory="runs/a", save_every_steps=100),
                          loader=loader) as ckpt:
            state, loader = ckpt.restore_or_init(engine, model_factory, optimizer)
            for batch in loader:
                state, metrics = step(state, batch)
                ckpt.save(state, metrics={"loss": metrics["loss"]})

    Args:
        config: a `CheckpointConfig` (or pass its fields as keywords).
        plan: the `TrainPlan` whose mesh, engine config and logical axes every step
            records (`restore_or_init` sets it).
        engine: instead of ``plan``: an `Engine`, whose ``last_plan`` at save time is used.
        loader: the loader whose position every save records (a `ResumableLoader`;
            checked here, so a loader that cannot resume fails before the first step).
        run_config: any JSON-able description of the run, stored in every step's record.
    """

    def __init__(
        self,
        config: CheckpointConfig | None = None,
        *,
        plan: TrainPlan | None = None,
        engine: Any = None,
        loader: Any = None,
        run_config: Any = None,
        **fields: Any,
    ):
        known = [f.name for f in dataclasses.fields(CheckpointConfig)]
        check_keywords("Checkpointer", known, fields, owner="jaxcore.CheckpointConfig")
        if config is None:
            config = CheckpointConfig(**fields)
        elif fields:
            config = dataclasses.replace(config, **fields)
        check_loader(loader, "Checkpointer(loader=...)")
        self.config = config
        self.directory = pathlib.Path(os.fspath(config.directory)).expanduser().absolute()
        # A file where the folder (or one above it) should be was a bare NotADirectoryError
        # at the first save, after the first steps had run.
        there = next((p for p in (self.directory, *self.directory.parents) if p.exists()), None)
        if there is not None and not there.is_dir():
            raise ConfigError(
                f"CheckpointConfig.directory={os.fspath(config.directory)!r}: {there} is a "
                "file, not a folder. Pass a folder for the checkpoints (it is created if "
                "missing), or move the file."
            )
        self.run_config = run_config
        self.plan: TrainPlan | None = plan
        self.engine: Any = engine
        self.loader: Any = loader
        self.resumed_step: int | None = None
        self.resumed_from: pathlib.Path | None = None
        self._closed = False
        self._warned_planless = False
        self._warned_behind = False
        self._mgr = _Manager(self.directory, item_names=_ITEMS, options=self._options())
        self._preemption = PreemptionWatch(install=config.save_on_sigterm)
        self._writer = WriterLock(self.directory)
        _install_exit_hook()
        _unclosed[id(self._mgr)] = (self._mgr, self.directory)

    def _options(self) -> ocp.CheckpointManagerOptions:
        cfg = self.config
        save: list[Any] = [ocm.PreemptionCheckpointingPolicy()]
        if cfg.save_every_steps:
            save.append(ocm.FixedIntervalPolicy(cfg.save_every_steps))
        if cfg.save_every_seconds:
            save.append(
                ocm.ContinuousCheckpointingPolicy(
                    minimum_interval_secs=max(1, round(cfg.save_every_seconds))
                )
            )
        keep: list[Any] = [ocm.LatestN(cfg.keep_last)]
        rank = None
        if cfg.keep_best:
            metric, worst = cfg.best_metric, math.inf if cfg.best_mode == "min" else -math.inf

            def rank(m: dict[str, Any]) -> float:
                return _rank_value(m, metric, worst)

            keep.append(
                ocm.BestN(
                    # A NaN (a diverged step) or an absent metric ranks last: sorting with
                    # NaN keys is arbitrary and could delete the best step.
                    get_metric_fn=rank,
                    reverse=cfg.best_mode == "min",
                    n=cfg.keep_best,
                    keep_checkpoints_without_metrics=False,
                )
            )
        return ocp.CheckpointManagerOptions(
            save_decision_policy=ocm.AnySavePolicy(save),
            preservation_policy=ocm.AnyPreservationPolicy(keep) if len(keep) > 1 else keep[0],
            # Orbax writes a step's metrics (its ``metrics`` item, read back on every
            # reload) only with ``best_fn`` set; without them a restart, or any
            # `all_steps`, forgot the ranking and BestN deleted the best step.
            best_fn=rank,
            best_mode=cfg.best_mode,
            enable_async_checkpointing=cfg.async_save,
            # Leftover temporary directories are removed once the writer lock is ours
            # (`_claim_directory`): here they may be a live run's save in flight.
            cleanup_tmp_directories=False,
            # The manifest is written inside the temporary step, before its rename.
            temporary_path_class=manifested_rename(self.directory),
            create=True,
        )

    # ----------------------------------------------------------------- steps
    @property
    def manager(self) -> ocp.CheckpointManager:
        """The underlying Orbax `CheckpointManager` (for what this class does not cover)."""
        return self._mgr

    @property
    def preemption_requested(self) -> bool:
        """Whether this single process got a SIGTERM the next save will act on."""
        return self._preemption.requested

    def request_preemption(self) -> None:
        """Make the next `save` the final one, as a SIGTERM would (single process; with
        several, signal the processes and JAX's notifier agrees on the step)."""
        self._preemption.request()

    def all_steps(self) -> list[int]:
        """Finalized steps in the directory, oldest first."""
        self._mgr.reload()
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The finalized step with the best ``best_metric`` (``keep_best``; without it, the
        latest step), e.g. to export: ``export_checkpoint(ckpt.step_dir(ckpt.best_step()),
        ...)``. Steps saved without metrics rank after every step with them."""
        self._mgr.reload()
        best = self._mgr.best_step()
        return self.latest_step() if best is None else best

    def step_dir(self, step: int) -> pathlib.Path:
        return self.directory / str(step)

    # ----------------------------------------------------------------- saving
    def _loader(self, loader: Any, where: str) -> Any:
        if loader is None:
            return self.loader
        check_loader(loader, where)
        return loader

    def save(
        self,
        state: TrainState,
        loader: Any = None,
        *,
        metrics: dict[str, Any] | None = None,
        force: bool = False,
        step: int | None = None,
    ) -> bool:
        """Save if the policy says so (or ``force``); call it after every train step.

        Returns whether a save started. When preempted it saves, waits, and raises
        `Preempted` (exit code `PREEMPTION_EXIT_CODE`). ``loader`` defaults to the
        constructor's; ``step`` to ``state.step`` (passing it avoids a device read).
        """
        loader = self._loader(loader, "Checkpointer.save(loader=...)")
        best = self.config.best_metric
        if self.config.keep_best and metrics is not None and best not in metrics:
            raise ConfigError(
                f"Checkpointer.save(metrics=...) got {sorted(metrics)} but "
                f"CheckpointConfig.best_metric={best!r} ranks the steps to keep: pass "
                f"metrics={{{best!r}: ...}} or set best_metric to one of these."
            )
        step = int(jax.device_get(state.step)) if step is None else int(step)
        preempted = self._preemption.reached(step, self._mgr)
        saved = False
        if preempted or force or self._mgr.should_save(step):
            if step in self._mgr.all_steps():
                log.info("step %d is already saved in %s", step, self.directory)
            else:
                with sigint_deferred():  # Ctrl-C mid-save: the step completes first
                    saved = self._save(step, state, loader, metrics)
        elif not self._warned_behind:
            self._warn_if_behind(step)
        if preempted:
            self.close()
            msg = (
                f"preempted: saved step {step} to {self.step_dir(step)}; exiting with code "
                f"{PREEMPTION_EXIT_CODE}"
            )
            self._announce(msg, logging.WARNING)
            raise Preempted(step)
        return saved

    def _warn_if_behind(self, step: int) -> None:
        """Orbax's policies save only steps after the newest one in the directory: a run
        that started over there (no `restore_or_init`) or went back to an older step
        saved nothing, silently, until it passed that step."""
        newest = self._mgr.latest_step()
        if newest is None or step >= newest:
            return
        self._warned_behind = True
        msg = (
            f"this run is at step {step}, behind the newest checkpoint "
            f"{self.step_dir(newest)}: no step is saved until it passes step {newest} "
            "(the policy saves only newer steps), and a rerun would resume from there, not "
            "from this run. Resume with restore_or_init, use another "
            "CheckpointConfig.directory, or save(force=True)."
        )
        self._announce(msg, logging.WARNING)

    def _claim_directory(self) -> None:
        if jax.process_index() != 0:
            return
        try:
            first = self._writer.claim()
        except BusyDirectory as e:
            raise CheckpointError(
                f"another run ({e.owner}) is saving checkpoints to {self.directory}; two "
                "runs in one directory would interleave their steps. Stop that run, or give "
                "this one another CheckpointConfig.directory."
            ) from None
        if first:
            self._remove_killed_saves()

    def _remove_killed_saves(self) -> None:
        """Delete the temporary step directories of saves killed mid-write. Called with
        the writer lock just taken from no one: none of them is a live run's save."""
        from orbax.checkpoint._src.futures import future
        from orbax.checkpoint._src.path import temporary_paths

        future.CommitFuture(
            temporary_paths.cleanup_temporary_paths(
                self.directory, temporary_path_cls=manifested_rename(self.directory)
            )
        ).result()

    def _save(self, step: int, state: TrainState, loader: Any, metrics: Any) -> bool:
        self._claim_directory()
        rng = state.rng
        typed = _is_typed_key(rng)
        saveable = state.replace(rng=jax.random.key_data(rng)) if typed else state
        items: dict[str, Any] = {"state": ocp.args.StandardSave(saveable)}
        input_info = None
        if loader is not None:
            position_items, input_info = positions.save_items(loader)
            items.update(position_items)
        plan = self.plan or getattr(self.engine, "last_plan", None)
        if plan is None and not self._warned_planless:
            self._warned_planless = True
            log.warning(
                "Checkpointer has no plan: steps record the mesh but not the engine config "
                "or logical axes. Pass Checkpointer(plan=...) or engine=..."
            )
        record = rec.build(
            step,
            saveable,
            plan=plan,
            rng_impl=jax.random.key_impl(rng) if typed else None,
            input_info=input_info,
            run_config=self.run_config,
        )
        items["meta"] = ocp.args.JsonSave(record)
        if metrics is not None:
            metrics = {k: float(jax.device_get(v)) for k, v in metrics.items()}
        t0 = time.perf_counter()
        try:
            saved = self._mgr.save(
                step, args=ocp.args.Composite(**items), metrics=metrics, force=True
            )
        except Exception as e:
            self._raise_if_storage(e, step)
            raise
        if saved:
            log.info(
                "checkpoint step %d -> %s (%s, blocked %.2fs)",
                step,
                self.step_dir(step),
                "async" if self.config.async_save else "sync",
                time.perf_counter() - t0,
            )
        return saved

    def wait(self) -> None:
        """Block until every save in flight is finalized (manifest included)."""
        try:
            self._mgr.wait_until_finished()
        except Exception as e:
            self._raise_if_storage(e, None)
            raise

    def _raise_if_storage(self, error: Exception, step: int | None) -> None:
        """Turn a save that the storage refused (full disk, quota, read-only) into a
        `CheckpointError` that says which step was lost, what is intact and what to do."""
        reason = storage_failure(error)
        if reason is None:
            return
        step = failed_step(error) or step
        what = f"step {step}" if step is not None else "a step"
        try:
            free = f"{shutil.disk_usage(self.directory).free / 2**20:.1f} MiB free there now"
        except OSError:
            free = "free space unknown"
        steps = sorted(self._mgr.all_steps())
        intact = (
            f"the finalized steps {steps} are intact and a rerun resumes from step {steps[-1]}"
            if steps
            else "no step is finalized yet, so a rerun starts from scratch"
        )
        raise CheckpointError(
            f"saving checkpoint {what} to {self.directory} failed: {reason} ({free}). That "
            f"step was not saved; {intact}. Free space on that disk (a smaller "
            "CheckpointConfig.keep_last keeps fewer steps) or point "
            "CheckpointConfig.directory at a larger one."
        ) from error

    def close(self) -> None:
        """Finish pending saves, release Orbax's threads and SIGTERM (idempotent).

        A save the storage refused raises `CheckpointError`, from the pending saves or
        from Orbax's own shutdown (a write still queued when the disk filled).
        """
        self._shutdown(raising=True)

    def _shutdown(self, *, raising: bool) -> None:
        """`close`. Every step runs; the first failure is raised, the others are logged.
        With ``raising=False`` (an error is already on its way out) all are logged: they
        would replace that error, often with a raw OSError of the same full disk."""
        if self._closed:
            return
        self._closed = True
        _unclosed.pop(id(self._mgr), None)
        errors: list[Exception] = []
        try:
            for finish in (self.wait, self._close_manager):
                try:
                    finish()
                except Exception as e:
                    errors.append(e)
        finally:
            self._preemption.close()
            self._writer.release()
        for e in errors[1:] if raising else errors:
            log.error("closing the Checkpointer of %s: %s: %s", self.directory, type(e).__name__, e)
        if raising and errors:
            raise errors[0]

    def _close_manager(self) -> None:
        try:
            self._mgr.close()
        except Exception as e:
            self._raise_if_storage(e, None)
            raise

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._shutdown(raising=exc is None)

    # ----------------------------------------------------------------- verification
    def verify(self, step: int) -> Damage | None:
        """Check step ``step`` against its manifest: the `Damage` found, or ``None``.

        Every process checks a share of the files and all agree on the answer. A step
        without a manifest raises `CheckpointError` unless ``allow_unverified``; a file
        that cannot be read (permissions, I/O errors) raises `CheckpointError` too:
        neither proves damage.
        """
        root = self.step_dir(step)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint {root} (step {step}) does not exist.")
        if not ocp.utils.is_checkpoint_finalized(root):
            return Damage(root, "was never finalized (a save that did not finish)")
        if self.config.verify == "none":
            return None
        if not has_manifest(root):
            if self.config.allow_unverified:
                log.warning("%s has no manifest: restoring it UNVERIFIED", root)
                return None
            raise CheckpointError(
                f"checkpoint {root} (step {step}) has no manifest (jaxcore_manifest.json): it "
                "was written by jaxcore 0.1, copied without it, or partly deleted (a "
                "retention delete killed mid-way), so its files cannot be verified. "
                "Restore it anyway with CheckpointConfig(allow_unverified=True), "
                "or move it out of the directory."
            )
        try:
            return agree_on_damage(root, self.config.verify)
        except Unreadable as e:
            raise CheckpointError(
                f"checkpoint {root} (step {step}): {e}. Nothing was moved; fix the storage "
                "or permissions and rerun."
            ) from e.error

    def _quarantine(self, step: int, damage: Damage) -> None:
        src = self.step_dir(step)
        dst = self.directory / DAMAGED_DIR / f"{step}-{int(time.time())}"
        msg = f"checkpoint {src} is damaged: {damage}; moving it to {dst}"
        self._announce(msg, logging.ERROR)
        failure: OSError | None = None
        if jax.process_index() == 0 and src.exists():
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(dst))
            except OSError as e:  # a read-only mount, permissions: say so on every process
                failure = e
        failed = failure is not None
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            # Every process learns whether process 0 moved it: one raising alone would
            # leave the others waiting for it at their next collective.
            flags = multihost_utils.process_allgather(np.array([failed], np.int32))
            failed = bool(np.asarray(flags).any())
        if failed:
            older = [s for s in sorted(self._mgr.all_steps()) if s < step]
            fallback = (
                f"then the previous step {self.step_dir(older[-1])} is tried"
                if older
                else "then the run starts from step 0 (no older step)"
            )
            cause = (
                f"{type(failure).__name__}: {failure}"
                if failure is not None
                else "see process 0's error"
            )
            raise CheckpointError(
                f"checkpoint {src} (step {step}) is damaged: {damage}. It could not be "
                f"moved to {dst} ({cause}), so nothing was restored. Make "
                f"{self.directory} writable, or move or delete {src} yourself, and rerun: "
                f"{fallback}."
            ) from failure
        self._mgr.reload()

    # ----------------------------------------------------------------- restoring
    def abstract_state(self, engine: Any, model: Any, optimizer: Any) -> TrainState:
        """``engine.plan(model, optimizer).abstract()``: the restore target of that plan.

        Nothing is initialised; the plan becomes the engine's ``last_plan`` (the steps
        built afterwards use it) and this Checkpointer's ``plan``.
        """
        self.plan = engine.plan(model, optimizer)
        return self.plan.abstract()

    def read_record(self, step: int) -> dict[str, Any]:
        """The JSON record (``meta``) of a step."""
        return json.loads((self.step_dir(step) / "meta" / "metadata").read_text())

    def restore(self, step: int, target: TrainState, loader: Any = None) -> TrainState:
        """Verify ``step``, restore it onto ``target`` (sharded abstract state), position
        ``loader`` (default: the constructor's).

        Raises `CheckpointError` when the step is damaged (it is not moved: that is
        `restore_or_init`'s decision), unverifiable or unreadable, and `ConfigError` when
        it holds a different model or optimizer state or the loader cannot continue.
        """
        damage = self.verify(step)
        if damage is not None:
            raise CheckpointError(f"checkpoint {self.step_dir(step)} is damaged: {damage}.")
        return self._restore(step, target, self._loader(loader, "Checkpointer.restore"))

    def _restore(self, step: int, target: TrainState, loader: Any) -> TrainState:
        root = self.step_dir(step)
        try:
            record = self.read_record(step)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {root} (step {step}): its record {root / 'meta' / 'metadata'} "
                f"cannot be read ({type(e).__name__}: {e}); nothing was moved."
            ) from e
        typed = _is_typed_key(target.rng)
        if typed:
            kd = jax.eval_shape(jax.random.key_data, target.rng)
            target = target.replace(
                rng=jax.ShapeDtypeStruct(kd.shape, kd.dtype, sharding=target.rng.sharding)
            )
        self._check_compatible(step, record, target)
        items: dict[str, Any] = {"state": ocp.args.StandardRestore(target)}
        if loader is not None:
            items.update(positions.restore_items(record, str(root)))
        try:
            out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:
            if isinstance(e, ValueError) and "tree structures do not match" in str(e):
                # Same leaves, other containers: e.g. adamw's state vs adam's (the empty
                # states of a chain hold no leaf, so the record's leaf table cannot tell).
                diff = str(e).split("\n", 1)[-1].split("\nIf this mismatch", 1)[0]
                raise ConfigError(
                    f"checkpoint {root} holds a train state of another structure than this "
                    f"run's (a different optimizer or model):\n{diff}\nUse the model and "
                    "optimizer it was written with, or a new directory."
                ) from e
            where = _culprit(root, e, root / "state")
            raise CheckpointError(
                f"restoring checkpoint {root} (step {step}) failed at {where}: "
                f"{type(e).__name__}: {e}. Its files match their manifest, so it is not "
                "treated as damaged and nothing was moved. Common causes: a changed Orbax "
                "or JAX version, a storage error, a model that differs in a way the record "
                "cannot show. Fix the cause and rerun."
            ) from e
        state = out["state"]
        if typed:
            state = state.replace(rng=jax.random.wrap_key_data(state.rng, impl=record["rng_impl"]))
        if loader is not None and (record.get("input") or record.get("input_kind")):
            positions.apply(out, record, loader)
        elif loader is not None:
            msg = (
                f"checkpoint {root} (step {step}) holds no input position (it was saved "
                f"without a loader), so the {type(loader).__name__} was not moved: it "
                "repeats the data from its current position. Position it yourself (a "
                f"jaxcore.Loader: loader.seek({step})) or start a new directory."
            )
            self._announce(msg, logging.WARNING)
        return state

    def _check_compatible(self, step: int, record: dict, target: TrainState) -> None:
        saved = record.get("leaves", {})
        want = rec.leaf_table(target)
        if set(saved) != set(want):
            missing = sorted(set(want) - set(saved))[:5]
            extra = sorted(set(saved) - set(want))[:5]
            raise ConfigError(
                f"checkpoint {self.step_dir(step)} holds a different train state: this run "
                f"expects {missing or 'nothing more'} that it lacks, and it has {extra or 'no'} "
                "extra entries. Use the model and optimizer it was written with, or a new "
                "directory."
            )
        for path, (shape, dtype) in want.items():
            if saved[path] != [shape, dtype]:
                raise ConfigError(
                    f"checkpoint {self.step_dir(step)}: {path} was saved as {saved[path]} "
                    f"(shape, dtype) but this run has {[shape, dtype]}. Use the model "
                    "configuration it was written with, or a new directory."
                )

    def restore_or_init(
        self,
        engine: Any,
        model: Any = None,
        optimizer: Any = None,
        loader: Any = None,
    ) -> tuple[TrainState, Any]:
        """Resume from the newest good checkpoint, or start fresh: ``(state, loader)``.

        ``engine`` is a `TrainPlan`, or an `Engine` with the ``model`` and ``optimizer``
        to plan (``engine.plan(model, optimizer)``, which becomes its ``last_plan``). The
        state lands on the plan's mesh (any layout); ``loader`` (default: the
        constructor's) is positioned at the batch after the checkpoint's. A step proven
        damaged is moved to ``<directory>/damaged/`` and the previous one is tried; a
        second damaged step in the same start, and any other failure, raise
        `CheckpointError` with every step left in place.
        """
        loader = self._loader(loader, "Checkpointer.restore_or_init(loader=...)")
        if isinstance(engine, TrainPlan):
            plan = engine
        else:
            self.engine = engine
            plan = engine.plan(model, optimizer)
        self.plan = plan
        target = plan.abstract()
        quarantined: int | None = None
        for step in reversed(self.all_steps()):
            damage = self.verify(step)
            if damage is not None:
                if quarantined is not None:
                    raise CheckpointError(
                        f"checkpoint {self.step_dir(step)} is damaged too ({damage}), after "
                        f"step {quarantined} was moved to {self.directory / DAMAGED_DIR}. "
                        "Two damaged steps in a row point at a systemic problem (storage, "
                        "an incomplete copy), so nothing more is moved: inspect the "
                        "directory, then rerun."
                    )
                self._quarantine(step, damage)
                quarantined = step
                continue
            state = self._restore(step, target, loader)
            self.resumed_step, self.resumed_from = step, self.step_dir(step)
            checked = has_manifest(self.step_dir(step)) and self.config.verify != "none"
            how = "verified" if checked else "UNVERIFIED"
            msg = f"resumed from checkpoint {self.step_dir(step)} (step {step}, {how})"
            self._announce(msg, logging.INFO)
            return state, loader
        self.resumed_step = self.resumed_from = None
        msg = f"no checkpoint in {self.directory}: starting from step 0"
        self._announce(msg, logging.INFO)
        return plan.init(), loader

    def _announce(self, msg: str, level: int) -> None:
        """Print ``msg`` on process 0 (``announce``) and log it, once on the terminal.

        Importing Orbax gives the root logger absl's stderr handler, so a warning logged
        and printed showed twice; where the line is printed, its record goes at INFO.
        """
        if self.config.announce and jax.process_index() == 0:
            print(f"[jaxcore.checkpoint] {msg}", file=sys.stderr, flush=True)
            level = min(level, logging.INFO)
        log.log(level, msg)
