"""PPO and GRPO as trials of a `jaxcore experiment`: ``entrypoint: rlhf.trial:ppo``.

Hyperparameters: ``rlhf_config`` (the path of a ``jaxcore rlhf`` YAML config) and any
``section.field`` override of it (``ppo.kl_coef``, ``train.lr``: what a searcher
varies). The searcher's length is the number of iterations; each iteration is reported
(``reward_mean``, ``kl``, ...), so the searcher metric can be any of them. The roles are
checkpointed under ``<trial_dir>/rlhf/checkpoints`` each iteration and on stop or
preemption, and a restarted trial resumes from there (as ``jaxcore rlhf`` does).
"""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from jaxcore import ConfigError
from rlhf.cli import run_rl
from rlhf.config import parse_config


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


def _run(ctx: Any, stage: str) -> None:
    cfg = trial_config(stage, ctx.hparams, ctx.trial_dir / "rlhf", ctx.max_steps)

    def report(step: int, metrics: dict[str, float]) -> bool:
        ctx.report(step, metrics)
        return ctx.should_stop() or ctx.preempted()

    run_rl(cfg, report=report)


def ppo(ctx: Any) -> None:
    """A PPO trial (see the module docstring)."""
    _run(ctx, "ppo")


def grpo(ctx: Any) -> None:
    """A GRPO trial (see the module docstring)."""
    _run(ctx, "grpo")
