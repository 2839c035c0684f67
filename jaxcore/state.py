"""The train state: one immutable pytree that a step takes and returns (donated)."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

from jaxcore.nonfinite import NonFiniteState
from jaxcore.precision import LossScaleState


class TrainState(struct.PyTreeNode):
    """Everything a run needs to continue: the step, weights, optimizer, scaler and key.

    Attributes:
        step: number of train steps taken (fp16 steps whose update was skipped count too).
        params: float32 master weights, a nested dict keyed by parameter names.
        opt_state: the optax optimizer state.
        model_state: non-trainable model variables (batch statistics, RNG counters).
        loss_scale: dynamic loss-scale state (``None`` unless precision is fp16).
        rng: the key the next step splits its randomness (dropout) from.
        nonfinite: the non-finite guard's counters (skipped steps, current run of skips);
            the engine always fills it, ``None`` only in states built by hand.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    model_state: Any
    loss_scale: LossScaleState | None
    rng: jax.Array
    nonfinite: NonFiniteState | None = None
