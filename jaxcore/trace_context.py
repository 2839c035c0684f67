"""The trace context: what the engine tells a model while it traces a step.

A model must not know the mesh or the run config, yet its activations need sharding
constraints and its blocks need the remat policy. The engine sets this context while it
traces a step; ``jaxcore.sharding.constrain`` and ``jaxcore.remat.checkpoint_block`` read
it, and do nothing when no engine is tracing (a model called on its own just runs).
This is the role Flax Linen's logical-axis-rules context plays in MaxText.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class TraceContext:
    mesh: Mesh | None = None
    rules: tuple = ()
    remat: str = "none"
    pipeline: Any = None  # a jaxcore.pipeline.PipelineConfig when the step is pipelined
    unroll_layers: bool = False  # `scan_layers` as an unrolled loop instead of a lax.scan


_EMPTY = TraceContext()
_CURRENT: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "jaxcore_trace_context", default=None
)


def current() -> TraceContext:
    """The context of the step being traced (an empty one outside the engine)."""
    return _CURRENT.get() or _EMPTY


@contextlib.contextmanager
def tracing(ctx: TraceContext) -> Iterator[TraceContext]:
    """Set ``ctx`` for the duration of a trace."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
