"""Checkpoint and resume every role of an RLHF trainer, plus its host-side state.

Each role's `TrainState` (weights, optimizer state, step, key) goes through
`jaxcore.Checkpointer` in its own sub-directory (``actor/``, ``critic/``, ``reference/``),
so restores reshard like any jaxcore checkpoint; the iteration counter, the KL
controller's coefficient and the parity monitor's state go into
``trainer-<iteration>.json``, written last: a step without it is incomplete and ignored.
Rollout keys and minibatch orders derive from ``(seed, iteration)``, so a resumed run
repeats the uninterrupted one.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax

from jaxcore import CheckpointConfig, Checkpointer, ConfigError


def _abstract(state: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )


def save_trainer(trainer: Any, directory: str | pathlib.Path) -> int:
    """Save all roles of ``trainer`` (a `PPOTrainer` or `GRPOTrainer`) at its iteration."""
    directory = pathlib.Path(directory)
    step = trainer.iteration
    for name, state in trainer.roles().items():
        with Checkpointer(CheckpointConfig(directory=directory / name, async_save=False)) as ckpt:
            ckpt.save(state, force=True, step=step)
    host = {
        "iteration": step,
        "kl_coef": getattr(getattr(trainer, "kl_ctl", None), "value", None),
        "parity_in_tolerance": trainer.parity.in_tolerance,
    }
    (directory / f"trainer-{step}.json").write_text(json.dumps(host))
    return step


def latest_iteration(directory: str | pathlib.Path) -> int | None:
    steps = [int(p.stem.split("-")[1]) for p in pathlib.Path(directory).glob("trainer-*.json")]
    return max(steps, default=None)


def restore_trainer(
    trainer: Any, directory: str | pathlib.Path, iteration: int | None = None
) -> int:
    """Load the roles and host state saved at ``iteration`` (default: the latest) into a
    freshly built ``trainer`` of the same configuration; returns the iteration."""
    directory = pathlib.Path(directory)
    step = latest_iteration(directory) if iteration is None else iteration
    if step is None or not (directory / f"trainer-{step}.json").is_file():
        raise ConfigError(
            f"restore_trainer: no RLHF checkpoint {'' if step is None else step} in "
            f"{directory}; save one with rlhf.save_trainer(trainer, directory)."
        )
    host = json.loads((directory / f"trainer-{step}.json").read_text())
    roles = {}
    for name, state in trainer.roles().items():
        with Checkpointer(CheckpointConfig(directory=directory / name, async_save=False)) as ckpt:
            roles[name] = ckpt.restore(step, _abstract(state))
    trainer.set_roles(roles)
    trainer.iteration = host["iteration"]
    trainer.parity.in_tolerance = host.get("parity_in_tolerance", True)  # older files
    if host["kl_coef"] is not None:
        trainer.kl_ctl.value = host["kl_coef"]
    return step
