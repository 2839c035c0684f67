"""Reward-model training: Bradley-Terry on preference pairs through the jaxcore engine.

A batch is ``{"chosen", "rejected": int (batch, length), "chosen_len", "rejected_len":
int (batch,)}`` and optionally ``{"margin": float (batch,)}`` (Llama 2's graded margin).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxcore import BatchError
from rlhf.losses import bradley_terry_loss

PAIR_KEYS = ("chosen", "rejected", "chosen_len", "rejected_len")


def pair_scores(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Scores of the chosen and rejected sequences, in one forward pass over both."""
    missing = [k for k in PAIR_KEYS if k not in batch]
    if missing:
        raise BatchError(
            f"reward batch lacks {missing}: it needs int arrays 'chosen', 'rejected' "
            "(batch, length) and their lengths 'chosen_len', 'rejected_len' (batch,)."
        )
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]], axis=0)
    lengths = jnp.concatenate([batch["chosen_len"], batch["rejected_len"]], axis=0)
    scores = model.score(tokens, lengths)
    n = batch["chosen"].shape[0]
    return scores[:n], scores[n:]


def reward_loss(*, center_coef: float | None = None) -> Callable:
    """A jaxcore ``loss_fn`` for a `ScalarHeadModel`: Bradley-Terry with the batch's
    ``margin`` (if any) and optional reward centering; reports pair ``accuracy``."""

    def loss_fn(model, batch, rng):
        del rng
        chosen, rejected = pair_scores(model, batch)
        margin = batch.get("margin", 0.0)
        loss = bradley_terry_loss(chosen, rejected, margin=margin, center_coef=center_coef)
        accuracy = jnp.mean((chosen > rejected).astype(jnp.float32))
        return loss, {
            "accuracy": accuracy,
            "reward_mean": jnp.mean(jnp.concatenate([chosen, rejected])),
        }

    return loss_fn
