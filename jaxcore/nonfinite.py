"""The non-finite guard: a step whose loss or gradient norm is not finite changes nothing.

Policies (``Engine(nonfinite=...)``):

- ``"skip"`` (default): such a step keeps the old parameters, optimizer and model state,
  counts ``metrics["skipped"]``, and after ``max_consecutive_skips`` skips in a row the
  step raises `jaxcore.TrainingDivergedError` naming the step.
- ``"raise"``: as ``"skip"``, but the first non-finite step raises.
- ``"ignore"``: the update is applied whatever it holds (the pre-guard behaviour).

fp16 loss scaling uses the same mechanism: a gradient overflow skips the update and the
scaler halves. Such an overflow counts towards divergence only once the scale is at its
minimum (before that, shrinking the scale is the cure); a non-finite *loss* always counts.

The decision is taken inside the one jitted step (a ``jnp.where`` per leaf, which XLA
fuses into the optimizer's element-wise update). The host learns about divergence without
blocking: `DivergenceMonitor` keeps the counters of the last few steps and reads each
once it is ready (``jax.Array.is_ready``); only when two steps are still outstanding does
it wait for the older one, so the host may run at most two steps ahead of the devices.
Hence ``TrainingDivergedError`` surfaces at the latest two calls after the step that
crossed the limit, or at once from ``step.check()``. The guard is ``optax.apply_if_finite``'s
idea, moved from the optimizer into the step so that it also covers model state and loss.
"""

from __future__ import annotations

import collections
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxcore.errors import ConfigError, TrainingDivergedError

POLICIES = ("skip", "raise", "ignore")
# Steps the host may run ahead of the devices before it waits for an older step's counters.
MAX_OUTSTANDING = 2


def validate(policy: str, max_consecutive_skips: int) -> None:
    """Raise `ConfigError` for an unknown policy or a negative skip budget."""
    if policy not in POLICIES:
        raise ConfigError(f"nonfinite={policy!r}: use one of {POLICIES}.")
    if not isinstance(max_consecutive_skips, int) or max_consecutive_skips < 0:
        raise ConfigError(
            f"max_consecutive_skips={max_consecutive_skips!r}: must be an integer >= 0."
        )


class NonFiniteState(struct.PyTreeNode):
    """Counters carried in the train state (so they survive a checkpoint and restore).

    Attributes:
        skipped: steps whose update was skipped, for any reason (fp16 overflows included).
        consecutive: the current run of skipped steps that count towards divergence.
    """

    skipped: jax.Array
    consecutive: jax.Array

    @classmethod
    def create(cls) -> NonFiniteState:
        zero = jnp.asarray(0, jnp.int32)
        return cls(skipped=zero, consecutive=zero)

    def update(self, applied: jax.Array, counts: jax.Array) -> NonFiniteState:
        """After a step: ``applied`` whether its update was kept, ``counts`` whether its
        skip counts towards divergence (a skip that does not count leaves the run as is)."""
        consecutive = jnp.where(counts, self.consecutive + 1, self.consecutive)
        return NonFiniteState(
            skipped=self.skipped + (~applied).astype(jnp.int32),
            consecutive=jnp.where(applied, 0, consecutive).astype(jnp.int32),
        )


def keep_if(applied: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``applied`` else ``old``, leaf by leaf."""
    return jax.tree.map(lambda a, b: jnp.where(applied, a, b), new, old)


class DivergenceMonitor:
    """Host side of the guard: raises once the consecutive-skip counter passes the limit.

    ``record`` is called after each step is dispatched with that step's metrics; it reads
    counters that are already computed, and waits only when `MAX_OUTSTANDING` steps are
    pending. ``check`` waits for all of them.
    """

    def __init__(self, policy: str, max_consecutive_skips: int):
        self.policy = policy
        self.limit = 0 if policy == "raise" else max_consecutive_skips
        self._pending: collections.deque = collections.deque()

    def record(self, step: int, metrics: dict[str, Any], state: Any) -> None:
        """Note ``step``'s metrics; raise if an older step already crossed the limit."""
        self._pending.append((step, metrics))
        self._poll(state, block=False)

    def check(self, state: Any) -> None:
        """Wait for every recorded step and raise if one crossed the limit."""
        self._poll(state, block=True)

    def _poll(self, state: Any, *, block: bool) -> None:
        while self._pending:
            step, metrics = self._pending[0]
            counter = metrics["consecutive_skips"]
            if not (block or counter.is_ready() or len(self._pending) > MAX_OUTSTANDING):
                return
            self._pending.popleft()
            run = int(counter)
            if run > self.limit:
                self._pending.clear()
                raise TrainingDivergedError(
                    self._message(step, run, metrics), step=step, state=state
                )

    def _message(self, step: int, run: int, metrics: dict[str, Any]) -> str:
        values = f"loss={float(metrics['loss'])}, grad_norm={float(metrics['grad_norm'])}"
        if self.policy == "raise":
            head = f"step {step}: the loss or gradient norm is not finite ({values})"
            tail = "use nonfinite='skip' to skip such steps instead of stopping"
        else:
            head = (
                f"step {step}: {run} consecutive steps had a non-finite loss or gradient "
                f"norm ({values}), more than max_consecutive_skips={self.limit}"
            )
            tail = "raise max_consecutive_skips if the run recovers on its own"
        return (
            f"{head}. The update was skipped, so the error's .state holds the last finite "
            f"parameters. Check the data (token ids, NaNs), lower the learning rate or clip "
            f"gradients (clip_grad_norm); or {tail}."
        )
