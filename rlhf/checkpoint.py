"""Checkpoint and resume every role of an RLHF trainer, plus its host-side state.

Each role's `TrainState` (weights, optimizer state, step, key) goes through
`jaxcore.Checkpointer` in its own sub-directory (``actor/``, ``critic/``, ``reference/``),
so restores reshard like any jaxcore checkpoint; the iteration counter, the KL
controller's coefficient and the parity monitor's state go into
``trainer-<iteration>.json``, written last: a step without it is incomplete and ignored.
Rollout keys and minibatch orders derive from ``(seed, iteration)``, so a resumed run
repeats the uninterrupted one.

`rlhf.cli.run_rl` saves through a `TrainerCheckpoints`: `DirectoryCheckpoints` for
``jaxcore rlhf`` runs, `rlhf.trial.TrialCheckpoints` for `jaxcore experiment` trials.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

import jax

from jaxcore import CheckpointConfig, Checkpointer, ConfigError, Engine
from jaxcore.checkpointing.preemption import sigint_deferred
from rlhf.faults import fault_point


def abstract_like(state: Any) -> Any:
    """The restore target of ``state``: its shapes, dtypes and shardings."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )


def _host_file(directory: pathlib.Path, step: int) -> pathlib.Path:
    return directory / f"trainer-{step}.json"


def role_checkpointer(directory: pathlib.Path, engine: Engine | None = None) -> Checkpointer:
    """A synchronous `Checkpointer` that leaves SIGTERM alone: the run's own handler
    (``jaxcore rlhf``'s or a trial's) decides when to stop. One of its own would replace
    that handler while it is open and swallow a SIGTERM that arrives during a save.
    ``engine``: the role's, whose plan each saved step records (without it every save
    warned that the checkpoint has no plan)."""
    return Checkpointer(
        CheckpointConfig(directory=directory, async_save=False, save_on_sigterm=False),
        engine=engine,
    )


def save_trainer(
    trainer: Any, directory: str | pathlib.Path, *, exclude: Iterable[str] = ()
) -> int:
    """Save all roles of ``trainer`` (a `PPOTrainer` or `GRPOTrainer`) at its iteration,
    but those in ``exclude`` (saved elsewhere by the caller, before it relies on them).
    Ctrl-C during the save takes effect once it is complete (`sigint_deferred`)."""
    with sigint_deferred():
        return _save_trainer(trainer, pathlib.Path(directory), set(exclude))


def _save_trainer(trainer: Any, directory: pathlib.Path, skip: set[str]) -> int:
    step = trainer.iteration
    # A trainer of the user's own need not say its engines (its steps then record no plan).
    engines = getattr(trainer, "role_engines", dict)()
    for name, state in trainer.roles().items():
        if name in skip:
            continue
        with role_checkpointer(directory / name, engines.get(name)) as ckpt:
            ckpt.save(state, force=True, step=step)
    fault_point(step, "saving")
    host = {
        "iteration": step,
        "kl_coef": getattr(getattr(trainer, "kl_ctl", None), "value", None),
        "parity_in_tolerance": trainer.parity.in_tolerance,
    }
    # Written aside and renamed: the host file marks the step complete, so a kill while
    # writing must leave no (empty) trainer-<step>.json behind.
    write_atomic(_host_file(directory, step), json.dumps(host))
    return step


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Write ``text`` aside, fsync it and rename it over ``path``: a kill leaves the old
    file or the new one, never a torn or empty one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def saved_iterations(directory: str | pathlib.Path) -> list[int]:
    """Iterations with a complete checkpoint in ``directory`` (their host file exists)."""
    return sorted(int(p.stem.split("-")[1]) for p in pathlib.Path(directory).glob("trainer-*.json"))


def latest_iteration(directory: str | pathlib.Path) -> int | None:
    return max(saved_iterations(directory), default=None)


def restore_trainer(
    trainer: Any,
    directory: str | pathlib.Path,
    iteration: int | None = None,
    *,
    restored: dict[str, Any] | None = None,
) -> int:
    """Load the roles and host state saved at ``iteration`` (default: the latest) into a
    freshly built ``trainer`` of the same configuration; returns the iteration.

    ``restored`` holds roles the caller already loaded from elsewhere (a trial's actor).
    """
    directory = pathlib.Path(directory)
    step = latest_iteration(directory) if iteration is None else iteration
    if step is None or not _host_file(directory, step).is_file():
        raise ConfigError(
            f"restore_trainer: no RLHF checkpoint {'' if step is None else step} in "
            f"{directory}; save one with rlhf.save_trainer(trainer, directory)."
        )
    host = json.loads(_host_file(directory, step).read_text())
    roles = dict(restored or {})
    for name, state in trainer.roles().items():
        if name in roles:
            continue
        with role_checkpointer(directory / name) as ckpt:
            roles[name] = ckpt.restore(step, abstract_like(state))
    trainer.set_roles(roles)
    trainer.iteration = host["iteration"]
    trainer.parity.in_tolerance = host.get("parity_in_tolerance", True)  # older files
    if host["kl_coef"] is not None:
        trainer.kl_ctl.value = host["kl_coef"]
    return step


class TrainerCheckpoints(Protocol):
    """Where `rlhf.cli.run_rl` saves a trainer and resumes it from."""

    def restore(self, trainer: Any, actor_engine: Engine) -> int:
        """Load the newest complete checkpoint into ``trainer``: its iteration (0: none)."""
        ...

    def save(self, trainer: Any) -> None:
        """Save every role and the host state at ``trainer.iteration``."""
        ...


class DirectoryCheckpoints:
    """All roles under one directory (``<train.out>/checkpoints`` of ``jaxcore rlhf``)."""

    def __init__(self, directory: str | pathlib.Path):
        self.directory = pathlib.Path(directory)

    def restore(self, trainer: Any, actor_engine: Engine) -> int:
        del actor_engine  # each role's record carries its own layout
        if latest_iteration(self.directory) is None:
            return 0
        return restore_trainer(trainer, self.directory)

    def save(self, trainer: Any) -> None:
        save_trainer(trainer, self.directory)
