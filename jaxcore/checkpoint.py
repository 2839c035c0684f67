"""Checkpoints that resume exactly: Orbax `CheckpointManager` plus validation and preemption.

One directory per step (``<directory>/<step>/``) holds three Orbax items:

- ``state``: the `TrainState` (params, optimizer state, loss scale, step, and the typed
  PRNG key stored as its raw ``key_data``), written by Orbax's sharded array handler;
- ``input``: the loader position (`jaxcore.input.Loader.state_dict`), JSON; for streaming
  sources ``input_stream`` holds one Grain iterator state per process instead;
- ``meta``: a JSON record of the run (engine config, mesh shape, package versions, the
  shape/dtype of every state leaf, the parameters' logical axes);

and, once Orbax has finalized the step, a ``jaxcore_manifest.json`` with the size and
CRC32 of every file. Orbax writes each step into a temporary directory and renames it
when every process has finished (its atomicity protocol), so a save killed half-way is
never listed; the manifest lets `Checkpointer.validate` name a checkpoint whose files
were later truncated or lost, which `restore_or_init` then moves to
``<directory>/damaged/`` before falling back to the previous good step.

Restores are made against the abstract state of the *current* engine (`jax.eval_shape`
of ``engine.prepare`` with ``engine.state_shardings``): each process reads only the shards
its devices hold, so a checkpoint saved under ``fsdp=8`` restores onto ``fsdp=4,
tensor=2``, ``data=8`` or one device without a gather on one host (Orbax's
``StandardRestore`` with sharded ``jax.ShapeDtypeStruct`` targets, as in MaxText's
``checkpointing.py``).

SIGTERM (cloud preemption, Slurm's time limit) sets a flag; the next `Checkpointer.save`
writes a final checkpoint, waits for it and raises `Preempted`, a `SystemExit` with
`PREEMPTION_EXIT_CODE`. With several processes the agreed preemption point of JAX's
coordination service decides instead (Orbax ``reached_preemption``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import importlib.metadata
import json
import logging
import os
import pathlib
import platform
import shutil
import signal
import sys
import threading
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

from jaxcore import sharding as shd
from jaxcore.checkpointing.manifest import VERIFY_MODES, check_files, write_manifest
from jaxcore.errors import ConfigError, JaxcoreError
from jaxcore.state import TrainState

log = logging.getLogger(__name__)

# sysexits.h EX_TEMPFAIL ("temporary failure; the user is invited to retry"): distinct
# from 143 (killed by SIGTERM without saving) and from errors, so a scheduler or wrapper
# script can requeue the job when it sees it.
PREEMPTION_EXIT_CODE = 75
DAMAGED_DIR = "damaged"
_ITEMS = ("state", "meta", "input", "input_stream")
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy")


class Preempted(SystemExit):
    """Raised by `Checkpointer.save` after the final save that follows a SIGTERM."""

    def __init__(self, step: int):
        super().__init__(PREEMPTION_EXIT_CODE)
        self.step = step


class CheckpointError(JaxcoreError):
    """A checkpoint could not be read (after every candidate was tried)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When to save, what to keep, how to check.

    Attributes:
        directory: where step directories go (local path or any path Orbax/epath takes).
        save_every_steps: save when ``step % save_every_steps == 0`` (``None``: off).
        save_every_seconds: save when this long passed since the last save and no save
            is in flight (Orbax's continuous policy; ``None``: off). With neither, only
            ``save(..., force=True)`` and preemption save.
        async_save: write in a background thread; the loop is blocked only for the copy
            of the arrays to host memory.
        keep_last: keep the newest K checkpoints (``None``: keep all).
        keep_best: also keep the best K by ``best_metric`` (``None``: off).
        best_metric: name of the metric passed to ``save(metrics=...)`` that ranks steps.
        best_mode: ``min`` (e.g. loss) or ``max`` (e.g. accuracy).
        verify: before restoring, check the manifest's file sizes and CRC32s
            (``checksum``), sizes only (``size``), or nothing (``none``).
        save_on_sigterm: install a SIGTERM handler that triggers a final save.
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
    save_on_sigterm: bool = True
    announce: bool = True

    def __post_init__(self) -> None:
        for name in ("save_every_steps", "keep_last", "keep_best"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
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


# --------------------------------------------------------------------- helpers
def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _is_typed_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaf_table(tree: Any) -> dict[str, list]:
    """``path -> [shape, dtype]`` for every leaf (what `meta` records and restores check)."""
    return {
        shd.path_str(p): [list(x.shape), str(x.dtype)]
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


class _StreamState:
    """A snapshot of Grain iterator state in the form Grain's Orbax handler saves."""

    def __init__(self, state: Any = None):
        self.state = state

    def get_state(self) -> bytes:
        return json.dumps(self.state).encode()

    def set_state(self, state: bytes) -> None:
        self.state = json.loads(state)

    def start_prefetch(self) -> None:
        pass


# --------------------------------------------------------------------- the checkpointer
class Checkpointer:
    """Saves and restores runs; see the module docstring for the layout and guarantees.

    Typical loop::

        ckpt = Checkpointer(CheckpointConfig(directory="runs/a", save_every_steps=100))
        state, loader = ckpt.restore_or_init(engine, model_factory, optimizer, loader)
        for batch in loader:
            state, metrics = step(state, batch)
            ckpt.save(state, loader, metrics={"loss": metrics["loss"]})
        ckpt.close()

    Args:
        config: a `CheckpointConfig` (or pass its fields as keywords).
        run_config: any JSON-able description of the run, stored in every step's record.
    """

    def __init__(
        self,
        config: CheckpointConfig | None = None,
        *,
        run_config: Any = None,
        **fields: Any,
    ):
        if config is None:
            config = CheckpointConfig(**fields)
        elif fields:
            config = dataclasses.replace(config, **fields)
        self.config = config
        self.directory = pathlib.Path(os.fspath(config.directory)).absolute()
        self.run_config = run_config
        self.engine: Any = None
        self.resumed_step: int | None = None
        self.resumed_from: pathlib.Path | None = None
        self._sigterm = False
        self._previous_handler: Any = None
        self._manifests = concurrent.futures.ThreadPoolExecutor(1, "jaxcore-manifest")
        self._manifest_jobs: list[concurrent.futures.Future] = []
        self._drained = threading.Event()
        self._mgr = ocp.CheckpointManager(
            self.directory, item_names=_ITEMS, options=self._options()
        )
        if config.save_on_sigterm:
            self._install_sigterm()

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
        if cfg.keep_best:
            metric = cfg.best_metric
            keep.append(
                ocm.BestN(
                    get_metric_fn=lambda m: float(m[metric]),
                    reverse=cfg.best_mode == "min",
                    n=cfg.keep_best,
                    keep_checkpoints_without_metrics=False,
                )
            )
        return ocp.CheckpointManagerOptions(
            save_decision_policy=ocm.AnySavePolicy(save),
            preservation_policy=ocm.AnyPreservationPolicy(keep) if len(keep) > 1 else keep[0],
            enable_async_checkpointing=cfg.async_save,
            # Leftover temporary directories are saves that were killed mid-write.
            cleanup_tmp_directories=True,
            create=True,
        )

    # ----------------------------------------------------------------- preemption
    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("Checkpointer created off the main thread: no SIGTERM handler.")
            return

        def on_sigterm(signum, frame):
            self._sigterm = True
            log.warning("SIGTERM received: the next save() writes a final checkpoint.")

        self._previous_handler = signal.signal(signal.SIGTERM, on_sigterm)

    @property
    def preemption_requested(self) -> bool:
        """Whether a SIGTERM arrived (this process) that the next save will act on."""
        return self._sigterm

    def _preempted(self, step: int) -> bool:
        if self._mgr.reached_preemption(step):
            return True
        # One process decides alone only when it is alone; otherwise processes could
        # disagree about the step and deadlock in the save's collectives.
        return self._sigterm and jax.process_count() == 1

    # ----------------------------------------------------------------- saving
    @property
    def manager(self) -> ocp.CheckpointManager:
        """The underlying Orbax `CheckpointManager` (for what this class does not cover)."""
        return self._mgr

    def all_steps(self) -> list[int]:
        """Finalized steps in the directory, oldest first."""
        self._mgr.reload()
        return sorted(self._mgr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def step_dir(self, step: int) -> pathlib.Path:
        return self.directory / str(step)

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

        Returns whether a save started. After a SIGTERM it saves, waits, and raises
        `Preempted` (exit code `PREEMPTION_EXIT_CODE`). ``step`` defaults to
        ``state.step`` (passing it avoids reading the device value).
        """
        step = int(jax.device_get(state.step)) if step is None else int(step)
        preempted = self._preempted(step)
        saved = False
        if preempted or force or self._mgr.should_save(step):
            if step in self._mgr.all_steps():
                log.info("step %d is already saved in %s", step, self.directory)
            else:
                saved = self._save(step, state, loader, metrics)
        if preempted:
            self.close()
            msg = (
                f"preempted: saved step {step} to {self.step_dir(step)}; exiting with code "
                f"{PREEMPTION_EXIT_CODE}"
            )
            log.warning(msg)
            self._print(msg)
            raise Preempted(step)
        return saved

    def _save(self, step: int, state: TrainState, loader: Any, metrics: Any) -> bool:
        rng = state.rng
        typed = _is_typed_key(rng)
        saveable = state.replace(rng=jax.random.key_data(rng)) if typed else state
        record = self._record(step, saveable, loader, jax.random.key_impl(rng) if typed else None)
        items: dict[str, Any] = {
            "state": ocp.args.StandardSave(saveable),
            "meta": ocp.args.JsonSave(record),
        }
        if loader is not None:
            position = loader.state_dict()
            if position["kind"] == "stream":
                import grain

                grain_state = position.pop("grain_state")
                items["input_stream"] = grain.checkpoint.CheckpointSave(_StreamState(grain_state))
            items["input"] = ocp.args.JsonSave(position)
        if metrics is not None:
            metrics = {k: float(jax.device_get(v)) for k, v in metrics.items()}
        t0 = time.perf_counter()
        saved = self._mgr.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)
        if saved:
            log.info(
                "checkpoint step %d -> %s (%s, blocked %.2fs)",
                step,
                self.step_dir(step),
                "async" if self.config.async_save else "sync",
                time.perf_counter() - t0,
            )
            if jax.process_index() == 0:
                self._manifest_jobs = [f for f in self._manifest_jobs if not f.done()]
                self._manifest_jobs.append(self._manifests.submit(self._write_manifest, step))
        return saved

    def _record(self, step: int, saveable: TrainState, loader: Any, impl: Any) -> dict:
        engine = self.engine
        record: dict[str, Any] = {
            "format": 1,
            "step": step,
            "time": datetime.datetime.now(datetime.UTC).isoformat(),
            "versions": _versions(),
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "rng_impl": None if impl is None else str(impl),
            "leaves": _leaf_table(saveable),
            "input_kind": None
            if loader is None
            else ("stream" if loader.streaming else "random_access"),
            "run": _jsonable(self.run_config),
        }
        if engine is not None:
            record["mesh"] = dict(engine.mesh.shape)
            record["engine"] = _jsonable(engine.config)
            if engine.model is not None:
                names = shd.name_params(
                    saveable.params, engine.model.logical_axes, engine.config.param_rules
                )
                record["logical_axes"] = {
                    shd.path_str(p): None if n is None else list(n)
                    for p, n in jax.tree_util.tree_flatten_with_path(
                        names, is_leaf=lambda x: x is None or isinstance(x, tuple)
                    )[0]
                }
        return record

    def _write_manifest(self, step: int, timeout: float = 3600.0) -> None:
        """Wait until Orbax has finalized ``step``, then record its files' sizes and CRCs."""
        root = self.step_dir(step)
        deadline = time.monotonic() + timeout
        while not (root.is_dir() and ocp.utils.is_checkpoint_finalized(root)):
            # After wait() has drained Orbax, a step that is still not final never will be
            # (its save failed, or retention deleted it).
            if self._drained.is_set() or time.monotonic() > deadline:
                log.warning("step %d was not finalized: no manifest written", step)
                return
            time.sleep(0.05)
        try:
            write_manifest(root, step)
        except FileNotFoundError:
            log.info("step %d was deleted before its manifest was written", step)

    def wait(self) -> None:
        """Block until every save in flight (and its manifest) is on disk."""
        self._mgr.wait_until_finished()
        self._drained.set()
        try:
            for job in list(self._manifest_jobs):
                job.result()
        finally:
            self._drained.clear()
        self._manifest_jobs.clear()

    def close(self) -> None:
        """Finish pending saves, release Orbax's threads and the SIGTERM handler."""
        self.wait()
        self._mgr.close()
        self._manifests.shutdown(wait=True)
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------- validation
    def validate(self, step: int) -> str | None:
        """Why checkpoint ``step`` cannot be trusted, or ``None`` when it checks out.

        Checks that the step is finalized, that its items are there, and (when its
        manifest exists, i.e. the writing process lived past the finalize) that every
        file has its recorded size and, with ``verify='checksum'``, its CRC32.
        """
        root = self.step_dir(step)
        if not root.is_dir():
            return f"{root} does not exist"
        if not ocp.utils.is_checkpoint_finalized(root):
            return f"{root} was never finalized (a save that did not finish)"
        for item in ("state", "meta"):
            if not (root / item).is_dir():
                return f"{root / item} is missing"
        try:
            json.loads((root / "meta" / "metadata").read_text())
        except (OSError, ValueError) as e:
            return f"{root / 'meta' / 'metadata'} is unreadable ({e})"
        return check_files(root, self.config.verify)

    def _quarantine(self, step: int, problem: str) -> None:
        src = self.step_dir(step)
        dst = self.directory / DAMAGED_DIR / f"{step}-{int(time.time())}"
        msg = f"checkpoint {src} is damaged: {problem}; moving it to {dst}"
        log.error(msg)
        self._print(msg)
        if jax.process_index() == 0 and src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"jaxcore-quarantine-{step}")
        self._mgr.reload()

    # ----------------------------------------------------------------- restoring
    def abstract_state(self, engine: Any, model: Any, optimizer: Any) -> TrainState:
        """The state ``engine.prepare`` would build, as sharded ``ShapeDtypeStruct``s.

        Nothing is initialised: ``engine.plan(...).abstract()`` (the plan becomes the
        engine's ``last_plan``, which the steps built afterwards use).
        """
        return engine.plan(model, optimizer).abstract()

    def read_record(self, step: int) -> dict[str, Any]:
        """The JSON record (``meta``) of a step."""
        return json.loads((self.step_dir(step) / "meta" / "metadata").read_text())

    def restore(self, step: int, target: TrainState, loader: Any = None) -> TrainState:
        """Restore ``step`` onto ``target`` (sharded abstract state) and position ``loader``.

        Raises `ConfigError` when the checkpoint holds a different model or optimizer
        state, or the loader cannot continue from its position.
        """
        record = self.read_record(step)
        typed = _is_typed_key(target.rng)
        if typed:
            kd = jax.eval_shape(jax.random.key_data, target.rng)
            target = target.replace(
                rng=jax.ShapeDtypeStruct(kd.shape, kd.dtype, sharding=target.rng.sharding)
            )
        self._check_compatible(step, record, target)
        items: dict[str, Any] = {"state": ocp.args.StandardRestore(target)}
        kind = record.get("input_kind")
        if loader is not None and kind is not None:
            items["input"] = ocp.args.JsonRestore()
            if kind == "stream":
                if record["processes"] != jax.process_count():
                    raise ConfigError(
                        f"checkpoint {self.step_dir(step)} holds a streaming input position "
                        f"for {record['processes']} processes; this run has "
                        f"{jax.process_count()}. Resume a streaming source with the same "
                        "process count (or use a random-access source, which resumes on any)."
                    )
                import grain

                items["input_stream"] = grain.checkpoint.CheckpointRestore(_StreamState())
        out = self._mgr.restore(step, args=ocp.args.Composite(**items))
        state = out["state"]
        if typed:
            state = state.replace(rng=jax.random.wrap_key_data(state.rng, impl=record["rng_impl"]))
        if loader is not None and kind is not None:
            position = dict(out["input"])
            if kind == "stream":
                position["grain_state"] = out["input_stream"].state
            loader.load_state_dict(position)
        return state

    def _check_compatible(self, step: int, record: dict, target: TrainState) -> None:
        saved = record.get("leaves", {})
        want = _leaf_table(target)
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
        self, engine: Any, model: Any, optimizer: Any, loader: Any = None
    ) -> tuple[TrainState, Any]:
        """Resume from the newest good checkpoint, or start fresh: ``(state, loader)``.

        The state lands on ``engine``'s current mesh (any layout); ``loader`` is
        positioned at the batch after the checkpoint's. Damaged checkpoints are reported
        by name, moved to ``<directory>/damaged/``, and the previous one is tried.
        """
        self.engine = engine
        target = self.abstract_state(engine, model, optimizer)
        for step in reversed(self.all_steps()):
            problem = self.validate(step)
            if problem is None:
                try:
                    state = self.restore(step, target, loader)
                except ConfigError:
                    raise
                except Exception as e:  # an unreadable file Orbax tripped over
                    problem = f"restore failed with {type(e).__name__}: {e}"
                else:
                    self.resumed_step, self.resumed_from = step, self.step_dir(step)
                    msg = f"resumed from checkpoint {self.step_dir(step)} (step {step})"
                    log.info(msg)
                    self._print(msg)
                    return state, loader
            self._quarantine(step, problem)
        self.resumed_step = self.resumed_from = None
        msg = f"no checkpoint in {self.directory}: starting from step 0"
        log.info(msg)
        self._print(msg)
        return engine.prepare(model, optimizer), loader

    def _print(self, msg: str) -> None:
        if self.config.announce and jax.process_index() == 0:
            print(f"[jaxcore.checkpoint] {msg}", file=sys.stderr, flush=True)
