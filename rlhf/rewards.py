"""The reward role: Python reward functions with weights, or a frozen reward model.

A Python reward is ``fn(prompt_ids, completion_ids) -> float``; a `ModelReward` scores
whole rollouts on its engine's mesh. `score_rollout` sums ``weight * reward`` over all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcore import ConfigError, Engine, TrainState
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

    def __call__(self, rollout: Rollout) -> np.ndarray:
        lengths = rollout.prompt_lengths + rollout.mask.sum(1).astype(np.int32)
        batch = {"tokens": rollout.tokens, "lengths": lengths.astype(np.int32)}
        return np.asarray(self._score(self.state, batch)["score"])


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


def score_rollout(rewards: list[tuple[Any, float]], rollout: Rollout) -> np.ndarray:
    """``sum(weight * reward)`` per sequence, float32 ``(batch,)``."""
    total = np.zeros(len(rollout.completions), np.float32)
    prompts = [rollout.tokens[i, :p].tolist() for i, p in enumerate(rollout.prompt_lengths)]
    for fn, weight in rewards:
        if isinstance(fn, ModelReward):
            total += weight * fn(rollout)
        else:
            total += weight * np.array(
                [fn(p, c) for p, c in zip(prompts, rollout.completions, strict=True)], np.float32
            )
    return total
