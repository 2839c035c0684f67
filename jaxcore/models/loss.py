"""Next-token prediction loss with padding masks.

A batch is ``{"tokens": int (batch, length + 1)}`` and optionally ``{"mask": (batch,
length + 1)}`` marking real tokens (1) and padding (0). Position t predicts token t + 1;
a prediction counts when its target is real. The loss is the mean over counted targets,
and ``weight`` (their number) lets the engine combine microbatches and eval batches into
the exact mean over real tokens.

Packed rows (several examples end to end) add ``"segments"`` (an id per example, 0 for
padding) and ``"positions"`` (each example's own, from 0), both ``(batch, length + 1)``:
the model then attends within each example only, and a prediction counts only when its
target is in the same example (the first token of the next one is not predicted from the
previous example), so every example's loss equals its loss alone.
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
    segments, positions = batch.get("segments"), batch.get("positions")
    if segments is None and positions is None:
        logits = model(inputs).astype(jnp.float32)
    else:
        if segments is None or positions is None:
            raise BatchError(
                "lm_loss: a packed batch needs both 'segments' (an id per example, 0 for "
                "padding) and 'positions' (each example's own, from 0), each shaped like "
                f"'tokens'; this one has only {'segments' if positions is None else 'positions'}."
            )
        same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
        mask = mask * same.astype(jnp.float32)
        logits = model(inputs, positions[:, :-1], segments[:, :-1]).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    weight = jnp.sum(mask)
    denom = jnp.maximum(weight, 1.0)
    loss = jnp.sum(losses * mask) / denom
    accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * mask) / denom
    return loss, {"weight": weight, "accuracy": accuracy}
