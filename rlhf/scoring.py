"""Trainer-side scoring of rollouts (log-probs, values) and the sampler/trainer parity check.

The sampler and the trainer compute the same log-probs with different kernels (KV-cache
decode vs. one full forward) and layouts; when they drift apart, training goes silently
off-policy. `parity` measures it; `truncated_is_weights` is the correction applied when it
exceeds a tolerance (truncated importance sampling, Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training").
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from jaxcore import Engine, TrainState
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
