"""Activation checkpointing (rematerialisation) by policy name, applied per block.

Models wrap each repeated block with `checkpoint_block`; the engine chooses the policy
for the run, so the same model trains with any policy. The names map onto
``jax.checkpoint_policies``:

- ``none``: keep every activation (fastest, most memory).
- ``full``: keep only the block inputs; recompute the rest in the backward pass.
- ``dots_saveable``: keep matmul outputs, recompute the cheap element-wise work.
- ``dots_with_no_batch_dims_saveable``: keep only matmuls without batch dimensions
  (the weight projections), recompute attention scores.
- ``offload``: like the previous, but the saved values go to pinned host memory
  (needs a backend with a ``pinned_host`` memory space).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import jax

from jaxcore import trace_context
from jaxcore.errors import ConfigError

POLICY_NAMES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload")


def _policy(name: str):
    cp = jax.checkpoint_policies
    return {
        "full": cp.nothing_saveable,
        "dots_saveable": cp.dots_saveable,
        "dots_with_no_batch_dims_saveable": cp.dots_with_no_batch_dims_saveable,
        "offload": cp.offload_dot_with_no_batch_dims("device", "pinned_host"),
    }[name]


def validate_policy(name: str, device: jax.Device | None = None) -> str:
    """Check a policy name (and, for ``offload``, that the device has pinned host memory)."""
    if name not in POLICY_NAMES:
        raise ConfigError(f"remat={name!r} is not a known policy; use one of {POLICY_NAMES}.")
    if name == "offload":
        device = device or jax.devices()[0]
        kinds = {m.kind for m in device.addressable_memories()}
        if "pinned_host" not in kinds:
            raise ConfigError(
                f"remat='offload' needs a 'pinned_host' memory space, which {device.platform} "
                f"devices lack (they have {sorted(kinds)}); use 'dots_with_no_batch_dims_saveable'."
            )
    return name


# Blocks wrapped while a step traces (`counting_blocks`): a policy no block used did nothing.
_WRAPPED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "jaxcore_remat_blocks", default=None
)


@contextlib.contextmanager
def counting_blocks() -> Iterator[list[int]]:
    """Count the `checkpoint_block` calls made inside (``[count]``, read after)."""
    count = [0]
    token = _WRAPPED.set(count)
    try:
        yield count
    finally:
        _WRAPPED.reset(token)


def checkpoint_block(fn: Callable) -> Callable:
    """Wrap a block function with the remat policy of the step being traced."""
    ctx = trace_context.current()
    if ctx.remat == "none":
        return fn
    count = _WRAPPED.get()
    if count is not None:
        count[0] += 1
    # A block inside a loop (a layer scan, the pipeline's schedule) needs no CSE barrier:
    # the loop already keeps XLA from merging the recomputation into the forward pass
    # (jax.checkpoint docs). Unrolled layers (only when a user sets both remat and
    # unroll_layers=True) have no loop around them: without the barrier XLA would merge
    # the two and recompute nothing.
    unrolled = ctx.unroll_layers and ctx.pipeline is None
    return jax.checkpoint(fn, policy=_policy(ctx.remat), prevent_cse=unrolled)
