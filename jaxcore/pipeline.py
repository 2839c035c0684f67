"""Pipeline parallelism over the ``pipeline`` mesh axis, as one SPMD program.

A model runs its stacked layers through `scan_layers` instead of ``lax.scan``. Without a
pipeline axis that *is* a ``lax.scan``. With ``pipeline = S > 1`` the layers (logical
axis ``layers``, sharded over ``pipeline``) form S stages and the batch is cut into M
microbatches that flow through them (the formulation of MaxText's ``pipeline.py``):

- a buffer ``state: (S, microbatch, ...)`` sharded over ``pipeline`` holds each stage's
  current input;
- every iteration, all stages run at once (``vmap`` over the stage axis with
  ``spmd_axis_name="pipeline"``, so each device computes only its own stage), then the
  buffer shifts by one stage (``jnp.roll``, which XLA lowers to a collective-permute);
- stage 0 takes the next microbatch; the last stage's output is stored per microbatch.

::

    iteration:   0    1    2    3    4          (S = 3 stages, M = 3 microbatches)
    stage 0:    m0   m1   m2    .    .
    stage 1:     .   m0   m1   m2    .          "." = bubble (idle work)
    stage 2:     .    .   m0   m1   m2

With ``repeats = R > 1`` (circular / interleaved schedule) each stage holds R chunks of
layers and every microbatch loops through the stages R times; the last stage's output
returns to stage 0 for the next repeat. The loop is a ``lax.scan`` over ``M*R + S - 1``
iterations; autodiff of it is the backward pipeline (GPipe: all forwards, then all
backwards). Of the ``(M*R + S - 1) * S`` stage computations ``M*R*S`` are useful, so the
bubble fraction is ``(S - 1) / (R*M + S - 1)`` (Huang et al. 2019; Narayanan et al. 2021).

Circular schedules place logical layer ``(r*S + s)*Lps + j`` on stage ``s``; the train
state keeps layers in their natural order (so checkpoints are layout-free), and the step
moves each stage's chunks to it with one all-to-all of the layer weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxcore import trace_context
from jaxcore.errors import ConfigError
from jaxcore.sharding import batch_spec

SCHEDULES = ("gpipe", "circular")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """The schedule a pipelined step runs.

    Attributes:
        stages: size of the ``pipeline`` mesh axis.
        microbatches: microbatches per step (a multiple of ``stages``).
        repeats: layer chunks per stage; 1 is GPipe, more is the circular schedule.
    """

    stages: int
    microbatches: int
    repeats: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"pipeline_repeats={self.repeats}: must be >= 1.")
        if self.microbatches < self.stages or self.microbatches % self.stages:
            raise ConfigError(
                f"microbatches={self.microbatches} with {self.stages} pipeline stages: the "
                f"microbatch count must be a multiple of the stages (at least {self.stages}) "
                "so every stage has work; raise microbatches or lower ParallelConfig.pipeline."
            )

    @property
    def bubble_fraction(self) -> float:
        """Share of stage computations that are idle: ``(S-1) / (R*M + S-1)``."""
        s, m, r = self.stages, self.microbatches, self.repeats
        return (s - 1) / (r * m + s - 1)

    def check_layers(self, n_layers: int, where: str = "layers") -> None:
        """Raise unless ``n_layers`` splits into ``stages * repeats`` equal chunks."""
        if n_layers % (self.stages * self.repeats):
            raise ConfigError(
                f"{where}: {n_layers} layers do not split into {self.stages} pipeline stages x "
                f"{self.repeats} repeats; use a layer count divisible by "
                f"{self.stages * self.repeats} or change pipeline / pipeline_repeats."
            )

    def check_batch(self, batch: int, data_ways: int) -> None:
        """Raise unless a batch of ``batch`` rows cuts into microbatches for every shard."""
        if batch % (self.microbatches * data_ways):
            raise ConfigError(
                f"a batch of {batch} does not split into {self.microbatches} pipeline "
                f"microbatches x {data_ways} data-parallel shards; use a batch size that is a "
                f"multiple of {self.microbatches * data_ways}."
            )


def scan_layers(
    layer_fn: Callable[..., jax.Array],
    x: jax.Array,
    layer_params: Any,
    per_example: Sequence[jax.Array] = (),
) -> jax.Array:
    """Apply stacked layers to ``x``: ``layer_fn(x, params_of_one_layer, *per_example)``.

    ``per_example`` arrays have the batch as leading axis (e.g. rotary tables for each
    example's positions); they are cut into microbatches along with ``x``. Runs the
    pipeline schedule when the step being traced has one, else a plain ``lax.scan``.
    """
    ctx = trace_context.current()
    if ctx.pipeline is None:

        def body(h, p):
            return layer_fn(h, p, *per_example), None

        return jax.lax.scan(body, x, layer_params)[0]
    return _pipelined(layer_fn, x, layer_params, tuple(per_example), ctx)


def _split_micro(a: jax.Array, m: int) -> jax.Array:
    # Strided split (row i goes to microbatch i % m): every microbatch keeps rows from all
    # data shards, so no data moves between devices.
    return a.reshape((a.shape[0] // m, m, *a.shape[1:])).swapaxes(0, 1)


def _merge_micro(a: jax.Array) -> jax.Array:
    return a.swapaxes(0, 1).reshape((a.shape[0] * a.shape[1], *a.shape[2:]))


def _pipelined(layer_fn, x, layer_params, per_example, ctx: trace_context.TraceContext):
    cfg: PipelineConfig = ctx.pipeline
    mesh = ctx.mesh
    S, M, R = cfg.stages, cfg.microbatches, cfg.repeats
    n_layers = jax.tree.leaves(layer_params)[0].shape[0]
    cfg.check_layers(n_layers)
    cfg.check_batch(x.shape[0], 1)
    lps = n_layers // (S * R)
    batch_axes = batch_spec(mesh, ctx.rules)[0]
    free = PartitionSpec.UNCONSTRAINED

    def constrain_dims(a: jax.Array, **dims: Any) -> jax.Array:
        spec = [free] * a.ndim
        for dim, axis in dims.items():
            spec[int(dim[1:])] = axis
        return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, PartitionSpec(*spec)))

    def on_stages(a: jax.Array) -> jax.Array:  # (S, microbatch, ...): stage and batch axes
        return constrain_dims(a, d0="pipeline", d1=batch_axes)

    def streamed(a: jax.Array) -> jax.Array:  # (iterations, microbatch, ...)
        return constrain_dims(a, d0=None, d1=batch_axes)

    # (L, ...) -> (S, R, Lps, ...): stage s, repeat r holds layers (r*S + s)*Lps + j.
    stage_params = jax.tree.map(
        lambda p: constrain_dims(
            p.reshape((R, S, lps, *p.shape[1:])).swapaxes(0, 1), d0="pipeline"
        ),
        layer_params,
    )
    xs = _split_micro(x, M)
    extras = tuple(_split_micro(e, M) for e in per_example)
    steps = M * R + S - 1

    # Everything an iteration reads or writes is one microbatch per stage; nothing of the
    # size of the whole batch. A loop that indexes a closed-over (M, ...) array pays for it
    # in the backward pass: the transpose of each read is a scatter into a zero buffer of
    # the whole batch, added to the gradient accumulator every iteration, a cost that grows
    # with M at a fixed batch (the gap between measured and theoretical efficiency). So:
    # - stage 0's next inputs are streamed in as the scan's per-iteration inputs (gathered
    #   once, outside the loop, with static indices);
    # - the per-example arrays (rotary tables) travel with their microbatch in the stage
    #   buffer, shifted with it, instead of being gathered per stage per iteration;
    # - the last stage's outputs leave as the scan's per-iteration outputs.
    # MaxText's pipeline.py streams its inputs the same way (its ``state_io`` buffer).
    feed = np.arange(1, steps + 1) % M  # the microbatch stage 0 takes after iteration t
    x_feed = streamed(jnp.take(xs, feed, axis=0))
    extras_feed = tuple(streamed(jnp.take(e, feed, axis=0)) for e in extras)

    def run_stage(h, params_r, *ex):
        def body(c, p):
            return layer_fn(c, p, *ex), None

        return jax.lax.scan(body, h, params_r)[0]

    stages = jnp.arange(S)
    is_first = lambda a: (stages == 0).reshape((S,) + (1,) * (a.ndim - 1))
    shift_in = lambda a, first: on_stages(jnp.where(is_first(a), first, jnp.roll(a, 1, axis=0)))
    if R == 1:  # GPipe: a static slice, no per-iteration gather of the weights
        gpipe_params = jax.tree.map(lambda p: p[:, 0], stage_params)

    def iteration(carry, feed_t):
        t, state, ex_state, loop = carry
        x_next, ex_next = feed_t[0], feed_t[1:]
        if R == 1:
            params_now = gpipe_params
        else:
            repeat = jnp.clip((t - stages) // M, 0, R - 1)
            params_now = jax.tree.map(
                lambda p: jax.vmap(lambda ps, r: ps[r])(p, repeat), stage_params
            )
        out = on_stages(
            jax.vmap(run_stage, spmd_axis_name="pipeline")(state, params_now, *ex_state)
        )
        first = x_next
        if R > 1:
            # Circular: a microbatch's pass through the last stage feeds stage 0 again M
            # iterations after it started; ``loop`` holds the last M such outputs.
            last = t - (S - 1)
            loop = jax.lax.dynamic_update_index_in_dim(loop, out[S - 1], jnp.mod(last, M), 0)
            nxt = t + 1
            again = jax.lax.dynamic_index_in_dim(loop, jnp.mod(nxt, M), 0, keepdims=False)
            first = jnp.where(nxt < M, x_next, again)
        state = shift_in(out, first)
        ex_state = tuple(shift_in(e, n) for e, n in zip(ex_state, ex_next, strict=True))
        return (t + 1, state, ex_state, loop), out[S - 1]

    def first_state(a: jax.Array) -> jax.Array:
        return on_stages(jnp.zeros((S, *a.shape[1:]), a.dtype).at[0].set(a[0]))

    loop0 = jnp.zeros_like(xs) if R > 1 else jnp.zeros((), xs.dtype)
    carry0 = (jnp.int32(0), first_state(xs), tuple(first_state(e) for e in extras), loop0)
    _, last_out = jax.lax.scan(iteration, carry0, (x_feed, *extras_feed))
    # Microbatch m's final pass leaves the last stage at iteration (R-1)*M + m + S - 1:
    # the last M iterations' outputs, in microbatch order.
    return _merge_micro(last_out[steps - M :])
