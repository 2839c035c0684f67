"""Mixed precision: dtype policies and dynamic loss scaling for float16.

Policies keep float32 master weights and optimizer state; only the forward and backward
computation runs in the compute dtype. Loss scaling follows DeepSpeed's
``DynamicLossScaler`` defaults (initial scale 2**16, double after 1000 clean steps,
hysteresis 2, minimum 1): on an overflow the update is skipped; the scale halves once the
hysteresis budget is spent (with hysteresis 2, the first overflow after clean steps only
uses up the budget, the second halves). Set ``hysteresis=1`` to halve on every overflow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxcore.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
    """Dtypes of a run.

    Attributes:
        name: ``fp32``, ``bf16`` or ``fp16``.
        param_dtype: dtype of master weights and optimizer state (always float32 here).
        compute_dtype: dtype the model computes in.
        loss_scaling: whether gradients are computed on a scaled loss (``fp16`` only).
    """

    name: str
    param_dtype: Any
    compute_dtype: Any
    loss_scaling: bool

    def cast_to_compute(self, tree: Any) -> Any:
        """Cast floating leaves of ``tree`` to the compute dtype (integers are left alone)."""
        if self.compute_dtype == self.param_dtype:
            return tree
        return jax.tree.map(
            lambda x: x.astype(self.compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
            tree,
        )


POLICIES = {
    "fp32": PrecisionPolicy(
        name="fp32", param_dtype=jnp.float32, compute_dtype=jnp.float32, loss_scaling=False
    ),
    "bf16": PrecisionPolicy(
        name="bf16", param_dtype=jnp.float32, compute_dtype=jnp.bfloat16, loss_scaling=False
    ),
    "fp16": PrecisionPolicy(
        name="fp16", param_dtype=jnp.float32, compute_dtype=jnp.float16, loss_scaling=True
    ),
}


def default_precision(platform: str) -> str:
    """The policy a run on ``platform`` should pick: ``bf16`` on accelerators, ``fp32`` on CPU.

    GPUs and TPUs run bfloat16 matmuls several times faster than float32 (float32 master
    weights keep the update exact); XLA's CPU backend runs its bfloat16 matmul slower than
    its float32 one (155 vs 183 GFLOP/s at 2048², PERF-NOTES.md), so bf16 buys nothing there.
    """
    return "fp32" if platform == "cpu" else "bf16"


def get_policy(name: str | PrecisionPolicy) -> PrecisionPolicy:
    """Look up a policy by name; a `PrecisionPolicy` passes through."""
    if isinstance(name, PrecisionPolicy):
        return name
    if name not in POLICIES:
        raise ConfigError(
            f"precision={name!r} is not a known policy; use one of {sorted(POLICIES)} "
            "(bf16 = float32 master weights with bfloat16 compute)."
        )
    return POLICIES[name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossScaleConfig:
    """Dynamic loss scaling (DeepSpeed's defaults).

    Attributes:
        initial_scale: scale at step 0.
        growth_interval: clean steps after which the scale doubles.
        hysteresis: overflows tolerated before the scale halves.
        min_scale: the scale never drops below this.
    """

    initial_scale: float = 2.0**16
    growth_interval: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.initial_scale <= 0 or self.min_scale <= 0:
            raise ConfigError("LossScaleConfig: initial_scale and min_scale must be positive.")
        if self.growth_interval < 1 or self.hysteresis < 1:
            raise ConfigError("LossScaleConfig: growth_interval and hysteresis must be >= 1.")


class LossScaleState(struct.PyTreeNode):
    """The loss scaler's state, carried in the train state."""

    scale: jax.Array
    clean_steps: jax.Array
    hysteresis_left: jax.Array
    skipped_steps: jax.Array

    @classmethod
    def create(cls, cfg: LossScaleConfig) -> LossScaleState:
        return cls(
            scale=jnp.asarray(cfg.initial_scale, jnp.float32),
            clean_steps=jnp.asarray(0, jnp.int32),
            hysteresis_left=jnp.asarray(cfg.hysteresis, jnp.int32),
            skipped_steps=jnp.asarray(0, jnp.int32),
        )

    def update(self, finite: jax.Array, cfg: LossScaleConfig) -> LossScaleState:
        """The next state after a step whose gradients were ``finite`` (or not)."""
        shrink = jnp.logical_and(~finite, self.hysteresis_left <= 1)
        clean = jnp.where(finite, self.clean_steps + 1, 0)
        grow = jnp.logical_and(finite, clean >= cfg.growth_interval)
        scale = jnp.where(shrink, jnp.maximum(self.scale / 2, cfg.min_scale), self.scale)
        scale = jnp.where(grow, scale * 2, scale)
        hysteresis = jnp.where(finite, self.hysteresis_left, self.hysteresis_left - 1)
        # As DeepSpeed (consecutive_hysteresis=False): the budget refills only when the scale grows.
        hysteresis = jnp.where(grow, cfg.hysteresis, jnp.maximum(hysteresis, 1))
        return LossScaleState(
            scale=scale,
            clean_steps=jnp.where(grow, 0, clean).astype(jnp.int32),
            hysteresis_left=hysteresis.astype(jnp.int32),
            skipped_steps=self.skipped_steps + (~finite).astype(jnp.int32),
        )


def all_finite(tree: Any) -> jax.Array:
    """True when every element of every leaf of ``tree`` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)
