"""Magnitude pruning: the sparsity schedule and the mask that keeps the largest weights.

The gradual schedule is Zhu & Gupta 2017 ("To prune, or not to prune", eq. 1): starting
at step ``t0`` the masks are recomputed every ``Δt`` steps, ``n`` times, to the sparsity

    s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n Δt))^3

which prunes fast while the network is redundant and slowly near the target. A one-shot
schedule is the special case ``n = 0``: the target sparsity from ``t0`` on.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from jaxcore.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparsitySchedule:
    """When masks are recomputed and to which sparsity.

    Attributes:
        final: target fraction of zero weights per layer, ``s_f`` in ``[0, 1)``.
        initial: sparsity of the first mask update, ``s_i`` (gradual schedule only).
        begin_step: optimizer step ``t0`` of the first mask update.
        num_updates: ``n``, mask updates after the first (``0``: one-shot pruning).
        frequency: ``Δt``, optimizer steps between mask updates.
    """

    final: float
    initial: float = 0.0
    begin_step: int = 0
    num_updates: int = 0
    frequency: int = 1

    def __post_init__(self) -> None:
        for name in ("final", "initial"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ConfigError(
                    f"SparsitySchedule.{name}={value!r}: a sparsity is a number in [0, 1) "
                    "(0.5 prunes half of each layer's weights)."
                )
        for name in ("begin_step", "num_updates", "frequency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ConfigError(
                    f"SparsitySchedule.{name}={value!r}: optimizer steps are counted in "
                    "whole updates; pass an int."
                )
        if not 0.0 <= self.final < 1.0:
            raise ConfigError(
                f"SparsitySchedule.final={self.final!r}: the target sparsity must be in "
                "[0, 1) (0.5 prunes half of each layer's weights)."
            )
        if not 0.0 <= self.initial <= self.final:
            raise ConfigError(
                f"SparsitySchedule.initial={self.initial!r}: must be in [0, final={self.final}]."
            )
        for name in ("begin_step", "num_updates"):
            if getattr(self, name) < 0:
                raise ConfigError(f"SparsitySchedule.{name}={getattr(self, name)}: must be >= 0.")
        if self.frequency < 1:
            raise ConfigError(f"SparsitySchedule.frequency={self.frequency}: must be >= 1.")
        if self.num_updates == 0 and self.initial not in (0.0, self.final):
            # Without updates after the first the schedule is one-shot to `final`: an
            # `initial` would be dropped without a word (a forgotten num_updates).
            raise ConfigError(
                f"SparsitySchedule(initial={self.initial}, num_updates=0): with no mask "
                f"updates after the first, pruning is one-shot to final={self.final} and "
                "initial has no effect; set num_updates (and frequency) for the gradual "
                "schedule, or drop initial (SparsitySchedule.one_shot)."
            )

    @classmethod
    def one_shot(cls, sparsity: float, *, at_step: int = 0) -> SparsitySchedule:
        """Prune to ``sparsity`` once, at optimizer step ``at_step``."""
        return cls(final=sparsity, initial=sparsity, begin_step=at_step)

    @property
    def end_step(self) -> int:
        """The step of the last mask update, ``t0 + n Δt``."""
        return self.begin_step + self.num_updates * self.frequency

    def sparsity(self, step: jax.Array | int) -> jax.Array:
        """``s_t``: the sparsity the masks have after the update at ``step``."""
        t = jnp.asarray(step, jnp.float32)
        if self.num_updates == 0:
            return jnp.where(t >= self.begin_step, self.final, 0.0).astype(jnp.float32)
        span = float(self.num_updates * self.frequency)
        progress = jnp.clip((t - self.begin_step) / span, 0.0, 1.0)
        s = self.final + (self.initial - self.final) * (1.0 - progress) ** 3
        return jnp.where(t >= self.begin_step, s, 0.0).astype(jnp.float32)

    def updates_at(self, step: jax.Array | int) -> jax.Array:
        """Whether the masks are recomputed at ``step`` (a traced boolean)."""
        t = jnp.asarray(step, jnp.int32)
        offset = t - self.begin_step
        return (offset >= 0) & (t <= self.end_step) & (offset % self.frequency == 0)


def pruned_count(size: int, sparsity: jax.Array) -> jax.Array:
    """How many of ``size`` weights a layer at ``sparsity`` prunes (rounded down)."""
    return jnp.floor(sparsity * size + 1e-4).astype(jnp.int32)


def magnitude_mask(w: jax.Array, sparsity: jax.Array, *, stacked: bool) -> jax.Array:
    """Boolean mask keeping the largest ``|w|``: exactly ``pruned_count`` zeros per layer.

    With ``stacked`` the leading axis holds layers (the reference model's stacked blocks)
    and every layer gets the sparsity on its own, as Zhu & Gupta prune each layer to the
    same target. Ties (weights already at zero) are broken by position via a stable sort,
    so the count is exact and already-pruned weights are pruned again first.
    """
    rows = w.reshape((w.shape[0], -1) if stacked else (1, -1))
    n = rows.shape[1]
    k = pruned_count(n, sparsity)
    order = jnp.argsort(jnp.abs(rows).astype(jnp.float32), axis=1, stable=True)
    keep_sorted = jnp.broadcast_to(jnp.arange(n) >= k, rows.shape)
    mask = jnp.zeros(rows.shape, bool)
    mask = jax.vmap(lambda m, o, v: m.at[o].set(v))(mask, order, keep_sorted)
    return mask.reshape(w.shape)
