"""The reward role: Python reward functions with weights, or a frozen reward model.

A Python reward is ``fn(prompt_ids, completion_ids) -> float``; a `ModelReward` scores
whole rollouts on its engine's mesh. `score_rollout` sums ``weight * reward`` over all.
`load_reward_model` turns the output directory of ``jaxcore rlhf reward`` into a
`ModelReward` (its checkpoint records the stage and the model's shape, see `rlhf.cli`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcore import ConfigError, Engine, JaxcoreError, TrainState
from jaxcore.models import TransformerConfig
from rlhf.rollout import Rollout

RewardFn = Callable[[list[int], list[int]], float]


class ModelReward:
    """A frozen `ScalarHeadModel` (e.g. trained with `rlhf.reward`) as a reward role: the
    score of the last real token of prompt + completion."""

    def __init__(self, engine: Engine, state: TrainState):
        self.state = state

        def loss_fn(model, batch, rng):
            del rng
            return jnp.zeros(()), {"score": model.score(batch["tokens"], batch["lengths"])}

        self._score = engine.eval_step(loss_fn)
        self.last_scores: np.ndarray | None = None  # the latest rollout's, for metrics

    def __call__(self, rollout: Rollout) -> np.ndarray:
        lengths = rollout.prompt_lengths + rollout.mask.sum(1).astype(np.int32)
        batch = {"tokens": rollout.tokens, "lengths": lengths.astype(np.int32)}
        self.last_scores = np.asarray(self._score(self.state, batch)["score"])
        return self.last_scores


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardModelSection:
    """The ``reward:`` section of a PPO/GRPO config: ``model`` is the ``train.out`` of a
    ``jaxcore rlhf reward`` run, its score added with ``weight`` to any ``rewards``."""

    model: str
    weight: float = 1.0


REWARD_STAGE = "reward"  # what `rlhf.cli.run_supervised` records in a reward checkpoint


def _no_reward_model(path: pathlib.Path, found: str) -> ConfigError:
    return ConfigError(
        f"reward.model: {path} holds no reward model ({found}). Point it at the train.out "
        "of a reward run, made with: jaxcore rlhf reward configs/rlhf/reward.yaml"
    )


def load_reward_model(
    path: str | pathlib.Path,
    engine: Engine,
    policy: TransformerConfig,
    *,
    rollout_len: int | None = None,
) -> ModelReward:
    """The newest checkpoint under ``<path>/checkpoints`` of a ``jaxcore rlhf reward`` run,
    restored onto ``engine``'s mesh as a frozen `ModelReward` for a ``policy`` whose
    vocabulary it must share. ``rollout_len`` (the longest prompt + ``max_tokens``): the
    longest sequence it will score, checked against the reward model's own context."""
    import optax

    from jaxcore import CheckpointConfig, Checkpointer
    from rlhf.models import scalar_head_factory

    path = pathlib.Path(path)
    if not path.is_dir():
        raise _no_reward_model(path, "no such directory")
    ckpt_dir = path / "checkpoints"
    contents = sorted(p.name for p in path.iterdir())
    if not ckpt_dir.is_dir():
        raise _no_reward_model(path, f"no checkpoints/ directory; found {contents}")
    config = CheckpointConfig(directory=ckpt_dir, async_save=False, save_on_sigterm=False)
    with Checkpointer(config) as ckpt:  # SIGTERM stays with the run (role_checkpointer)
        step = ckpt.latest_step()
        if step is None:
            raise _no_reward_model(path, "checkpoints/ holds no finished step")
        run = ckpt.read_record(step).get("run") or {}
        if run.get("stage") != REWARD_STAGE:
            what = f"a '{run['stage']}' run's checkpoint" if run.get("stage") else "a checkpoint"
            raise _no_reward_model(path, f"{what} at step {step}, not a reward model's")
        cfg = TransformerConfig(**run["model"])
        if cfg.vocab_size != policy.vocab_size:
            raise ConfigError(
                f"reward.model: {path} scores a vocabulary of {cfg.vocab_size} ids but the "
                f"policy's model.vocab_size is {policy.vocab_size}; train the reward model "
                "with the policy's tokenizer and vocabulary."
            )
        # As the engine's batch check: a row may hold max_seq_len + 1 tokens.
        if rollout_len is not None and rollout_len > cfg.max_seq_len + 1:
            raise ConfigError(
                f"reward.model: {path} was trained with model.max_seq_len={cfg.max_seq_len}, "
                f"but the rollouts it scores run to {rollout_len} tokens (the longest prompt "
                "+ max_tokens); train it with a model.max_seq_len of at least "
                f"{rollout_len}, or shorten the prompts or lower max_tokens."
            )
        # The optimizer only shapes the restore target (the reward run trained with adam).
        state, _ = ckpt.restore_or_init(
            engine, scalar_head_factory(cfg, bias=run.get("head_bias", True)), optax.adam(0.0)
        )
    return ModelReward(engine, state)


def stage_record(stage: str, model: TransformerConfig, *, head_bias: bool = True) -> dict[str, Any]:
    """The ``run_config`` a ``jaxcore rlhf`` checkpoint carries: its stage and model shape
    (what `load_reward_model` checks and rebuilds the model from); ``head_bias: false``
    marks a reward model started from a Hugging Face checkpoint (no head bias)."""
    record = {"stage": stage, "model": json.loads(json.dumps(dataclasses.asdict(model)))}
    if not head_bias:
        record["head_bias"] = False
    return record


def as_weighted(rewards: Any) -> list[tuple[Any, float]]:
    """A reward, or a list of rewards or ``(reward, weight)`` pairs, as pairs."""
    items = rewards if isinstance(rewards, Sequence) else [rewards]
    out = []
    for item in items:
        fn, weight = item if isinstance(item, tuple) else (item, 1.0)
        if not callable(fn):
            raise ConfigError(
                f"reward {fn!r} is not callable: pass fn(prompt_ids, completion_ids) -> "
                "float, an rlhf.ModelReward, or (reward, weight) pairs."
            )
        out.append((fn, float(weight)))
    if not out:
        raise ConfigError("rewards: give at least one reward function or model.")
    return out


class RewardError(JaxcoreError, ValueError):
    """A reward came back NaN or infinite (it would train the policy on NaN), or raised."""


def _call(fn: Any, prompt: list[int], completion: list[int], i: int) -> float:
    """``fn(prompt, completion)`` as a float; an exception it raises becomes a
    `RewardError` naming the reward, the sequence and where it raised (the CLI prints
    only the message, and which completion broke the function is what a fix needs)."""
    try:
        value = fn(prompt, completion)
    except Exception as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise RewardError(
            f"reward {getattr(fn, '__name__', repr(fn))} raised {type(e).__name__}: {e} (at "
            f"{frame.filename}:{frame.lineno}) for sequence {i} (prompt {prompt}, completion "
            f"{completion}); make it return a float for every completion."
        ) from e
    return _as_float(fn, value, i)


def _as_float(fn: Any, value: Any, i: int) -> float:
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        name = getattr(fn, "__name__", repr(fn))
        raise RewardError(
            f"reward {name} returned {value!r} for sequence {i}, not a float; a reward "
            "function must return one number per completion."
        ) from None


def _check_finite(fn: Any, values: np.ndarray, prompts: list, rollout: Rollout) -> None:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        name = "model" if isinstance(fn, ModelReward) else getattr(fn, "__name__", repr(fn))
        fix = (
            "check the reward model's checkpoint (its weights or inputs are not finite)"
            if isinstance(fn, ModelReward)
            else "make the function return a finite float for every completion"
        )
        raise RewardError(
            f"reward {name} returned {values[i]} for sequence {i} (prompt {prompts[i]}, "
            f"completion {rollout.completions[i]}; {bad.size} of {values.size} not finite): "
            f"rewards must be finite; {fix}."
        )


def score_rollout(rewards: list[tuple[Any, float]], rollout: Rollout) -> np.ndarray:
    """``sum(weight * reward)`` per sequence, float32 ``(batch,)``; a NaN or infinite
    reward raises `RewardError` naming the reward and the sequence."""
    total = np.zeros(len(rollout.completions), np.float32)
    prompts = [rollout.tokens[i, :p].tolist() for i, p in enumerate(rollout.prompt_lengths)]
    for fn, weight in rewards:
        if isinstance(fn, ModelReward):
            values = np.asarray(fn(rollout), np.float32)
        else:
            values = np.array(
                [
                    _call(fn, p, c, i)
                    for i, (p, c) in enumerate(zip(prompts, rollout.completions, strict=True))
                ],
                np.float32,
            )
        _check_finite(fn, values, prompts, rollout)
        total += weight * values
    return total
