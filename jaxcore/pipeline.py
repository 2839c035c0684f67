"""Pipeline parallelism over the ``pipeline`` mesh axis, as one SPMD program.

A model runs its stacked layers through `scan_layers` instead of ``lax.scan``. Without a
pipeline axis that *is* a ``lax.scan``. With ``pipeline = S > 1`` the layers (logical
axis ``layers``, sharded over ``pipeline``) form S stages and the batch is cut into M
microbatches that flow through them (the formulation of MaxText's ``pipeline.py``):

- a buffer ``state: (S, microbatch, ...)`` sharded over ``pipeline`` holds each stage's
  current input;
- every iteration, all stages run at once (a ``shard_map`` manual over ``pipeline``, so
  each device computes only its own stage, as plain per-device code), then the
  buffer shifts by one stage (a ``ppermute``: the only data an iteration moves between
  devices);
- stage 0 takes the next microbatch (GPipe: it rides the shift's wrap-around in the
  last stage's slot); every stage's output leaves as the loop's per-iteration output, and
  the last stage's are picked after the loop.

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
from jaxcore.sharding import Rules, batch_spec, batch_ways

SCHEDULES = ("gpipe", "circular")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """The schedule a pipelined step runs.

    Attributes:
        stages: size of the ``pipeline`` mesh axis.
        microbatches: microbatches per step (a multiple of ``stages``).
        repeats: layer chunks per stage; 1 is GPipe, more is the circular schedule.
        reduce_grads_once: sum the stage weights' gradients over the data shards once,
            after the loop, instead of in every iteration (needs the weights whole on each
            device: the engine turns it off under ZeRO-3).
    """

    stages: int
    microbatches: int
    repeats: int = 1
    reduce_grads_once: bool = True

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
    pipeline schedule when the step being traced has one, else a ``lax.scan``, unrolled
    when the engine says so (`jaxcore.EngineConfig.unroll_layers`).
    """
    ctx = trace_context.current()
    if ctx.pipeline is None:

        def body(h, p):
            return layer_fn(h, p, *per_example), None

        return jax.lax.scan(body, x, layer_params, unroll=ctx.unroll_layers)[0]
    return _pipelined(layer_fn, x, layer_params, tuple(per_example), ctx)


def _split_micro(a: jax.Array, m: int) -> jax.Array:
    # Strided split (row i goes to microbatch i % m): every microbatch keeps rows from all
    # data shards, so no data moves between devices.
    return a.reshape((a.shape[0] // m, m, *a.shape[1:])).swapaxes(0, 1)


def _merge_micro(a: jax.Array) -> jax.Array:
    return a.swapaxes(0, 1).reshape((a.shape[0] * a.shape[1], *a.shape[2:]))


def _as_tuple(axes: Any) -> tuple[str, ...]:
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _without_axes(rules: Rules, dropped: set[str]) -> Rules:
    """``rules`` with the mesh axes ``dropped`` taken out of every target."""
    out = []
    for name, target in rules:
        kept = tuple(a for a in _as_tuple(target) if a not in dropped)
        out.append((name, kept if kept else None))
    return tuple(out)


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

    def per_stage(a: jax.Array) -> jax.Array:  # (iterations, S, microbatch, ...)
        return constrain_dims(a, d0=None, d1="pipeline", d2=batch_axes)

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

    # Everything an iteration reads or writes is one microbatch per stage, and nothing in
    # the loop body moves data between devices but the one shift of the stage buffer:
    # - stage 0's next inputs are streamed in as the scan's per-iteration inputs (gathered
    #   once, outside the loop, with static indices). A loop that indexes a closed-over
    #   (M, ...) array pays in the backward pass: the transpose of each read is a scatter
    #   into a zero buffer of the whole batch, every iteration;
    # - the per-example arrays (rotary tables) are streamed the same way, already laid out
    #   per stage: ``(steps, S, microbatch, ...)`` sharded over ``pipeline``, so each device
    #   reads its own stage's slice (riding along in the shifted buffer cost one
    #   collective-permute per array per iteration);
    # - every stage's output leaves as the scan's per-iteration outputs, sharded over
    #   ``pipeline``; the last stage's are picked after the loop. Picking ``out[S-1]`` inside
    #   the loop made XLA replicate it: an all-reduce over the stages per iteration, and its
    #   transpose in the backward pass;
    # - the weight gradients are summed over the data shards once, after the loop (below).
    # MaxText's pipeline.py streams inputs and outputs the same way (its ``state_io``
    # buffer, sharded over stages) and marks stage weights ``reduced`` over data/fsdp.
    # Stage 0's next input, laid out per stage like everything else (one stage's slice is
    # read: the last stage's under GPipe, which sends it on to stage 0; stage 0's under
    # the circular schedule): a feed replicated over the stages would make the backward
    # pass all-reduce its cotangent over the stages every iteration.
    feed = np.arange(1, steps + 1) % M  # the microbatch stage 0 takes after iteration t
    x_feed = per_stage(jnp.take(xs, np.repeat(feed[:, None], S, axis=1), axis=0))
    # Stage s works on pass t - s at iteration t (garbage in the bubble: any index will do).
    passes = (np.arange(steps)[:, None] - np.arange(S)[None, :]) % M
    extras_feed = tuple(per_stage(jnp.take(e, passes, axis=0)) for e in extras)

    # Reduce the weight gradients once: below ZeRO-3 the stage weights are replicated over
    # the data shards, and each iteration's gradient is a partial sum over them, so XLA
    # all-reduces every layer's gradient in every backward iteration. Giving each data
    # shard its own broadcast copy of the weights (an axis sharded like the batch) keeps
    # the in-loop accumulator per shard; the broadcast's transpose sums the copies once,
    # after the loop. (MaxText gets this from ``reduced`` stage-weight shardings in
    # explicit mode.) ZeRO-3 keeps its per-iteration gather: a full stage's weights on
    # every device is the memory ZeRO-3 was asked to save.
    shards = batch_ways(mesh, ctx.rules) if cfg.reduce_grads_once else 1
    batch_mesh_axes = set(_as_tuple(batch_axes)) if shards > 1 else set()
    if shards > 1:
        stage_params = jax.tree.map(
            lambda p: constrain_dims(
                jnp.broadcast_to(p[:, None], (S, shards, *p.shape[1:])),
                d0="pipeline",
                d1=batch_axes,
            ),
            stage_params,
        )

    def run_layers(h, layers, *ex):
        # A stage's few layers unrolled in Python, each with its own weight arrays. As a
        # loop nested in the schedule's loop they cost every iteration a zero-filled
        # residual stack per layer input and a second copy of every residual into the outer
        # loop's stack (M=16 CPU-time efficiency 0.635 -> 0.790, theory 0.842, when they
        # were unrolled). The price is compile time that grows with the layers per stage.
        for p in layers:
            h = layer_fn(h, p, *ex)
        return h

    def split_layers(params: Any, axis: int) -> tuple[Any, ...]:
        # Per-layer weights out of the stacked (..., Lps, ...) arrays. For GPipe this runs
        # once, before the loop: slicing inside it copied every layer's weights out of the
        # stack in every iteration, forward and backward (28 slice copies, 3.4 MB per
        # device and iteration in pipeline_bubble's model, the same at any M).
        take = lambda j: jax.tree.map(lambda p: jnp.take(p, j, axis=axis), params)
        return tuple(take(j) for j in range(lps))

    # Every device runs its own stage on its own rows as plain per-device code: a
    # shard_map, manual over ``pipeline`` and (with the per-shard weight copies) the batch
    # axes; the other mesh axes (tensor, ZeRO-3's sharded weights) stay automatic, and
    # the model's constraints inside name only those. A ``vmap`` over the stages with
    # ``spmd_axis_name`` (MaxText's formulation, and this module's until 2026-12-04)
    # computes the same, but XLA then sees every projection as a dot with size-1 batch
    # dimensions: on CPU, weight gradients were accumulated through transposes, and the
    # steps of benchmarks/pipeline_bubble.py ran 3-5% slower in three A/Bs
    # (benchmarks/training_speed.md, section 2, round 7).
    manual = {"pipeline", *batch_mesh_axes}
    inner_ctx = dataclasses.replace(ctx, rules=_without_axes(ctx.rules, manual))
    # Rows and (with per-shard copies) weights: stage axis, then the shard axis if any.
    block_spec = PartitionSpec("pipeline", batch_axes if shards > 1 else None)
    weight_dims = 2 if shards > 1 else 1  # the stage (and shard) axes of a weight block

    def local_stage(h, layers, *ex):
        one = lambda a: a.reshape(a.shape[1:])  # this device's stage block
        layers = jax.tree.map(lambda w: w.reshape(w.shape[weight_dims:]), layers)
        with trace_context.tracing(inner_ctx):
            return run_layers(one(h), layers, *map(one, ex))[None]

    def run_stages(h, layers, *ex):
        return jax.shard_map(
            local_stage,
            mesh=mesh,
            in_specs=(block_spec, block_spec, *[block_spec] * len(ex)),
            out_specs=block_spec,
            axis_names=manual,
        )(h, layers, *ex)

    # The shift between stages as an explicit ppermute over ``pipeline`` only (the other
    # mesh axes stay automatic), as MaxText's ``_rotate_right``. ``jnp.roll`` compiles to
    # the same permute forward, but its transpose came out as two (the wrap-around
    # separately), and a concatenate of ``[first, out[:-1]]`` as three all-to-alls per
    # iteration. Both schedules rotate the whole ring: GPipe's last stage sends stage 0
    # its next microbatch (below).
    ring = [(s, (s + 1) % S) for s in range(S)]
    shift = jax.shard_map(
        lambda a: jax.lax.ppermute(a, "pipeline", ring),
        mesh=mesh,
        in_specs=PartitionSpec("pipeline"),
        out_specs=PartitionSpec("pipeline"),
        axis_names={"pipeline"},
    )
    stages = jnp.arange(S)
    is_first = lambda a: (stages == 0).reshape((S,) + (1,) * (a.ndim - 1))
    is_last = lambda a: (stages == S - 1).reshape((S,) + (1,) * (a.ndim - 1))
    p_dim = 2 if shards > 1 else 1  # where the repeat axis sits in stage_params
    if R == 1:  # GPipe: static slices, no per-iteration gather or copy of the weights
        gpipe_layers = split_layers(
            jax.tree.map(lambda p: jnp.take(p, 0, axis=p_dim), stage_params), p_dim
        )

    def iteration(carry, feed_t):
        t, state, loop = carry
        x_next, ex_now = feed_t[0], feed_t[1:]
        if R == 1:
            layers_now = gpipe_layers
        else:
            repeat = jnp.clip((t - stages) // M, 0, R - 1)
            params_now = jax.tree.map(
                lambda p: jax.vmap(lambda ps, r: jnp.take(ps, r, axis=p_dim - 1))(p, repeat),
                stage_params,
            )
            layers_now = split_layers(params_now, p_dim)
        out = on_stages(run_stages(state, layers_now, *ex_now))
        # Stage s's output to stage s+1: one collective-permute forward, one backward.
        if R == 1:
            # GPipe: the last stage's output has left (as ``out``), so its slot carries
            # stage 0's next microbatch through the shift's wrap-around. The select runs
            # before the permute and fuses into the stage's last op; picking stage 0's
            # input after it cost a separate op per iteration, forward and backward (in
            # pipeline_bubble's compiled model: one op fewer forward, two backward, at any M).
            sent = on_stages(jnp.where(is_last(out), x_next, out))
            return (t, on_stages(shift(sent)), loop), out
        # Circular: the last stage's output goes on to stage 0; a microbatch's pass through
        # the last stage feeds stage 0 again M iterations after it started. After the roll
        # that output sits on stage 0's devices; ``loop`` (S, M, ...) keeps the last M of
        # them there, stage-sharded (only stage 0's row is read), so storing and reading
        # it moves no data.
        rolled = on_stages(shift(out))
        last = t - (S - 1)
        loop = jax.lax.dynamic_update_index_in_dim(loop, rolled, jnp.mod(last, M), 1)
        nxt = t + 1
        again = jax.lax.dynamic_index_in_dim(loop, jnp.mod(nxt, M), 1, keepdims=False)
        first = jnp.where(nxt < M, x_next, again)
        state = on_stages(jnp.where(is_first(out), first, rolled))
        return (t + 1, state, loop), out

    state0 = on_stages(jnp.zeros((S, *xs.shape[1:]), xs.dtype).at[0].set(xs[0]))
    if R > 1:
        loop0 = constrain_dims(jnp.zeros((S, *xs.shape), xs.dtype), d0="pipeline", d2=batch_axes)
    else:
        loop0 = jnp.zeros((), xs.dtype)
    _, outs = jax.lax.scan(iteration, (jnp.int32(0), state0, loop0), (x_feed, *extras_feed))
    outs = per_stage(outs)
    # Microbatch m's final pass leaves the last stage at iteration (R-1)*M + m + S - 1:
    # the last M iterations' outputs, in microbatch order.
    return _merge_micro(outs[steps - M :, S - 1])
