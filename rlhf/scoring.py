"""Trainer-side scoring of rollouts (log-probs, values) and the sampler/trainer parity check.

The sampler and the trainer compute the same log-probs with different kernels (KV-cache
decode vs. one full forward) and layouts; when they drift apart, training goes silently
off-policy. `parity` measures it; `truncated_is_weights` is the correction applied when it
exceeds a tolerance (truncated importance sampling, Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcore import ConfigError, Engine, TrainState
from rlhf.models import token_logprobs


def logprob_scorer(engine: Engine) -> Callable[[TrainState, np.ndarray], np.ndarray]:
    """``(state, tokens (batch, length)) -> log-probs (batch, length - 1)`` on the engine's
    mesh (any state with the engine's shardings: the actor's or the frozen reference's)."""

    def loss_fn(model, batch, rng):
        del rng
        return jnp.zeros(()), {"logp": token_logprobs(model, batch["tokens"])}

    step = engine.eval_step(loss_fn)
    return lambda state, tokens: np.asarray(step(state, {"tokens": tokens})["logp"])


def value_scorer(engine: Engine) -> Callable[[TrainState, np.ndarray], np.ndarray]:
    """``(critic state, tokens) -> values (batch, length - 1)``: the value of each state
    before the token at ``t + 1`` is taken, aligned with `logprob_scorer`."""

    def loss_fn(model, batch, rng):
        del rng
        return jnp.zeros(()), {"values": model.values(batch["tokens"][:, :-1])}

    step = engine.eval_step(loss_fn)
    return lambda state, tokens: np.asarray(step(state, {"tokens": tokens})["values"])


def parity(sampler_logp: np.ndarray, trainer_logp: np.ndarray, mask: np.ndarray) -> dict:
    """Max and mean absolute difference of the two log-probs over the masked tokens."""
    diff = np.abs(sampler_logp - trainer_logp) * mask
    n = max(float(mask.sum()), 1.0)
    return {
        "logprob_diff_max": float(diff.max(initial=0.0)),
        "logprob_diff_mean": float(diff.sum() / n),
    }


def truncated_is_weights(
    trainer_logp: np.ndarray, sampler_logp: np.ndarray, mask: np.ndarray, cap: float = 2.0
) -> np.ndarray:
    """``min(p_trainer / p_sampler, cap)`` per token (1 where masked out)."""
    w = np.minimum(np.exp(trainer_logp - sampler_logp), cap)
    return np.where(mask > 0, w, 1.0).astype(np.float32)


class ParityMonitor:
    """Which log-probs an iteration trains against, and when to check them.

    Every ``interval`` iterations (and every iteration while the last check was out of
    tolerance) the trainer rescores the rollout and compares it with the sampler's
    log-probs (`parity`); beyond ``tolerance`` the loss is weighted by
    `truncated_is_weights`. In between, the sampler's log-probs stand in for the
    trainer's and the rescoring forward pass is skipped (as verl's rollout log-probs).
    ``in_tolerance`` is host state a checkpoint carries (`rlhf.save_trainer`).
    """

    def __init__(self, interval: int, tolerance: float, cap: float):
        if interval < 1:
            raise ConfigError(f"parity_interval={interval}: must be >= 1 (1 checks every step).")
        self.interval, self.tolerance, self.cap = interval, tolerance, cap
        self.in_tolerance = True

    def old_logprobs(
        self, iteration: int, rollout: Any, rescore: Callable[[], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """``(old log-probs, per-token IS weights, metrics)`` for this iteration."""
        sampler, mask = rollout.sampler_logp, rollout.mask
        if iteration % self.interval and self.in_tolerance:
            ones = np.ones_like(sampler, dtype=np.float32)
            return sampler.astype(np.float32), ones, {"parity_checked": 0.0, "tis_applied": 0.0}
        trainer = rescore()
        stats = parity(sampler, trainer, mask)
        self.in_tolerance = stats["logprob_diff_max"] <= self.tolerance
        if self.in_tolerance:
            weights = np.ones_like(trainer, dtype=np.float32)
        else:
            weights = truncated_is_weights(trainer, sampler, mask, self.cap)
        return (
            trainer,
            weights,
            stats
            | {
                "parity_checked": 1.0,
                "tis_applied": float(not self.in_tolerance),
            },
        )
