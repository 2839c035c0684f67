"""Next-token prediction loss with padding masks.

A batch is ``{"tokens": int (batch, length + 1)}`` and optionally ``{"mask": (batch,
length + 1)}`` marking real tokens (1) and padding (0). Position t predicts token t + 1;
a prediction counts when its target is real. The loss is the mean over counted targets,
and ``weight`` (their number) lets the engine combine microbatches and eval batches into
the exact mean over real tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxcore.errors import BatchError


def lm_loss(
    model: Callable[[jax.Array], jax.Array], batch: dict[str, jax.Array], rng: jax.Array | None
) -> tuple[jax.Array, dict[str, Any]]:
    """Cross-entropy of next-token prediction: ``(loss, {"weight", "accuracy"})``."""
    del rng  # the reference model has no dropout
    if "tokens" not in batch:
        raise BatchError(
            f"lm_loss: the batch has keys {sorted(batch)} but needs 'tokens' "
            "(int array of shape (batch, length + 1)) and optionally 'mask'."
        )
    tokens = batch["tokens"]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = batch.get("mask")
    mask = jnp.ones(targets.shape, jnp.float32) if mask is None else mask[:, 1:].astype(jnp.float32)
    logits = model(inputs).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weight = jnp.sum(mask)
    denom = jnp.maximum(weight, 1.0)
    loss = jnp.sum(losses * mask) / denom
    accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * mask) / denom
    return loss, {"weight": weight, "accuracy": accuracy}
