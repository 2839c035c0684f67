"""PPO and GRPO as trials of a `jaxcore experiment`: ``entrypoint: rlhf.trial:ppo``.

Hyperparameters: ``rlhf_config`` (the path of a ``jaxcore rlhf`` YAML config) and any
``section.field`` override of it (``ppo.kl_coef``, ``train.lr``: what a searcher
varies). The searcher's length is the number of iterations; each iteration is reported
(``reward_mean``, ``kl``, ...), so the searcher metric can be any of them.

Checkpoints go where the experiment expects a trial's (`TrialCheckpoints`): the actor
through ``ctx.checkpoint`` into ``<trial_dir>/checkpoints/<iteration>``, recorded in the
store with the iteration's metrics (so retention ranks it and ``jaxcore model register``
exports the actor), the other roles and the host state inside that step, under
``rlhf/``. A paused, preempted or killed trial resumes from its
newest complete checkpoint; a pause or SIGTERM exits with the preemption code so the
experiment requeues the trial (as `jaxcore.experiments.tinylm` does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
from typing import Any

import yaml

from jaxcore import ConfigError, Engine
from rlhf.checkpoint import abstract_like, restore_trainer, save_trainer, saved_iterations
from rlhf.cli import run_rl
from rlhf.config import parse_config

PREEMPTED_EXIT = 75  # jaxcore.PREEMPTION_EXIT_CODE: the experiment requeues the trial


def trial_config(stage: str, hparams: dict[str, Any], out: pathlib.Path, steps: int) -> Any:
    """The `RunConfig` for one trial: the YAML file plus the trial's overrides."""
    if "rlhf_config" not in hparams:
        raise ConfigError(
            "hyperparameters.rlhf_config: missing; set it to a jaxcore rlhf YAML config "
            "(e.g. configs/rlhf/ppo.yaml)."
        )
    raw = yaml.safe_load(pathlib.Path(hparams["rlhf_config"]).read_text())
    for key, value in hparams.items():
        if key == "rlhf_config":
            continue
        section, dot, field = key.partition(".")
        if not dot:
            raise ConfigError(
                f"hyperparameters.{key}: write overrides as section.field (e.g. ppo.kl_coef)."
            )
        raw[section] = {**raw.get(section, {}), field: value}
    raw["train"] = {**raw.get("train", {}), "out": str(out), "steps": steps}
    return parse_config(stage, raw)


class TrialCheckpoints:
    """A trainer's checkpoints in a trial's store-backed directory (see the module doc).

    The store's row is the commit point: the other roles and the host state are saved
    first into ``<trial_dir>/rlhf/staging/<iteration>``, then the actor through
    ``ctx.checkpoint`` (which records the row), then the staged roles are renamed into
    the actor's step as ``<step>/rlhf``, so retention deletes a step whole. A process
    killed between the two is finished on restore (`_adopt`).
    """

    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.staging = ctx.trial_dir / "rlhf" / "staging"

    def _roles_dir(self, step: int) -> pathlib.Path:
        return self.ctx.checkpointer().step_dir(step) / "rlhf"

    def _adopt(self, step: int) -> None:
        """Move the staged roles of ``step`` into its (finalized) actor step."""
        src, dst = self.staging / str(step), self._roles_dir(step)
        if step in saved_iterations(src) and dst.parent.is_dir() and not dst.exists():
            os.replace(src, dst)
        shutil.rmtree(src, ignore_errors=True)
        with contextlib.suppress(OSError):  # only once nothing else is staged
            self.staging.rmdir()

    def restore(self, trainer: Any, actor_engine: Engine) -> int:
        ckpt = self.ctx.checkpointer()
        ckpt.engine = actor_engine  # steps record the actor's plan (logical axes)
        self.ctx.start_step = 0
        for step in reversed(ckpt.all_steps()):
            self._adopt(step)
            if step not in saved_iterations(self._roles_dir(step)):
                continue  # an actor step whose roles never arrived: not resumable
            actor = ckpt.restore(step, abstract_like(trainer.roles()["actor"]))
            restore_trainer(trainer, self._roles_dir(step), step, restored={"actor": actor})
            # A process killed between the save and its store record left the step
            # unlisted: this records it (the saved step itself is kept as it is).
            self.ctx.checkpoint(actor, step=step)
            self.ctx.start_step = step
            break
        shutil.rmtree(self.staging, ignore_errors=True)
        return self.ctx.start_step

    def save(self, trainer: Any) -> None:
        step = trainer.iteration
        shutil.rmtree(self.staging / str(step), ignore_errors=True)
        save_trainer(trainer, self.staging / str(step), exclude=("actor",))
        try:
            self.ctx.checkpoint(trainer.roles()["actor"], step=step)
        finally:  # a SIGTERM save raises Preempted after the actor is written
            self._adopt(step)


def _run(ctx: Any, stage: str) -> None:
    cfg = trial_config(stage, ctx.hparams, ctx.trial_dir / "rlhf", ctx.max_steps)
    ctx.model_config = dataclasses.asdict(cfg.model)  # registered versions carry it
    preempted = []

    def report(step: int, metrics: dict[str, float]) -> bool:
        ctx.report(step, metrics)
        if ctx.should_stop():
            return True
        if ctx.preempted():
            preempted.append(step)
            return True
        return False

    run_rl(cfg, report=report, checkpoints=TrialCheckpoints(ctx))
    if preempted:  # checkpointed at that step: exit so the experiment requeues the trial
        raise SystemExit(PREEMPTED_EXIT)


def ppo(ctx: Any) -> None:
    """A PPO trial (see the module docstring)."""
    _run(ctx, "ppo")


def grpo(ctx: Any) -> None:
    """A GRPO trial (see the module docstring)."""
    _run(ctx, "grpo")
