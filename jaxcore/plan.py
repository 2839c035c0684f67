"""`TrainPlan`: a model and optimizer placed on a mesh, as one immutable value.

``engine.plan(model, optimizer)`` decides everything about a run before any array
exists: the model adapter, the optimizer (wrapped when some parameters are frozen), and a
`ShardingPlan` for parameters, gradients, optimizer state and batches, all derived from
the engine's rules table. From the plan come the abstract train state (shapes and
shardings, no compute), the sharded initial state, and the jitted steps::

    plan = engine.plan(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(3e-4))
    state = plan.init()                 # or plan.abstract() for a restore target
    step = plan.train_step(lm_loss)     # runs this plan's model, whatever plans follow
    state, metrics = step(state, batch)

Whoever needs shapes or shardings (checkpoints, cost estimates, serving) takes a plan;
nothing has to call a method for its side effect. A plan never changes after it is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxcore import sharding as shd
from jaxcore import trace_context
from jaxcore.adapters import ModelAdapter, as_adapter
from jaxcore.batch_checks import BatchChecker, BatchContract
from jaxcore.errors import ConfigError
from jaxcore.nonfinite import NonFiniteState
from jaxcore.pipeline import PipelineConfig
from jaxcore.precision import LossScaleState, PrecisionPolicy
from jaxcore.state import TrainState
from jaxcore.step import EvalStep, LossFn, TrainStep

if TYPE_CHECKING:
    from jaxcore.engine import EngineConfig

# A `trainable` predicate gets a parameter's path, e.g. "blocks/attn/wq".
Trainable = Callable[[str], bool]


@dataclasses.dataclass(frozen=True, eq=False)
class TrainPlan:
    """A model and optimizer planned onto a mesh (see the module docstring).

    Attributes:
        config: the engine config the plan was made with.
        mesh: the device mesh.
        policy: the precision policy.
        pipeline: the pipeline schedule (``None`` without a ``pipeline`` axis).
        adapter: the model as the engine uses it.
        optimizer: the optax transformation the step applies (with frozen parameters
            given by ``trainable``: wrapped so that they get no optimizer state).
        logical_axes: logical names per parameter (``None`` where the automatic rule
            applies).
        shardings: parameters, gradients, optimizer slots, batch; `ShardingPlan.activation`
            gives activation and KV-cache shardings from the same rules.
        state_shardings: a `TrainState` of shardings, the layout of every state leaf.
        trainable: tree of bools with the parameters' structure (``None``: all train).
        checker: the batch checks the plan's steps run (`jaxcore.batch_checks`).
    """

    config: EngineConfig
    mesh: Mesh
    policy: PrecisionPolicy
    pipeline: PipelineConfig | None
    adapter: ModelAdapter
    optimizer: optax.GradientTransformation
    logical_axes: Any
    shardings: shd.ShardingPlan
    state_shardings: TrainState
    trainable: Any | None
    checker: BatchChecker = dataclasses.field(repr=False)

    @property
    def rules(self) -> shd.Rules:
        """The logical-axis rules table everything here was derived from."""
        return self.shardings.rules

    @property
    def batch_sharding(self) -> NamedSharding:
        """The sharding of every batch leaf (leading axis by the ``batch`` rule)."""
        return self.shardings.batch

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def platform(self) -> str:
        """The mesh's device platform (``cpu``, ``gpu``, ``tpu``)."""
        return self.mesh.devices.flat[0].platform

    def trace_context(self) -> trace_context.TraceContext:
        """What the model sees while a step traces (mesh, rules, remat, pipeline, loop)."""
        unroll = self.config.unroll_layers
        if unroll is None:  # the trade-offs are measured in EngineConfig's docstring
            unroll = self.platform == "cpu" and self.config.remat == "none"
        return trace_context.TraceContext(
            mesh=self.mesh,
            rules=self.rules,
            remat=self.config.remat,
            pipeline=self.pipeline,
            unroll_layers=unroll,
        )

    # ----------------------------------------------------------------- state
    def _build(self, key: jax.Array, params: Any, model_state: Any) -> TrainState:
        params = jax.tree.map(
            lambda x: (
                x.astype(self.policy.param_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
            ),
            params,
        )
        return TrainState(
            step=jnp.asarray(0, jnp.int32),
            params=params,
            opt_state=self.optimizer.init(params),
            model_state=model_state,
            loss_scale=(
                LossScaleState.create(self.config.loss_scale) if self.policy.loss_scaling else None
            ),
            rng=key,
            nonfinite=NonFiniteState.create(),
        )

    def _init_fn(self) -> tuple[Callable[..., TrainState], tuple]:
        """A pure ``(key, *args) -> TrainState`` and its extra args (eager weights)."""
        if self.adapter.initial is not None:
            return self._build, tuple(self.adapter.initial)

        def init(key):
            init_key, step_key = jax.random.split(key)
            return self._build(step_key, *self.adapter.init(init_key))

        return init, ()

    def _key(self, key: int | jax.Array | None) -> jax.Array:
        if key is None:
            key = self.config.seed
        if isinstance(key, int | np.integer):
            return jax.random.key(int(key))
        return key

    def abstract(self) -> TrainState:
        """The train state `init` would build, as sharded ``ShapeDtypeStruct``s.

        Traced with ``jax.eval_shape``: nothing is computed or allocated, so this works
        for models larger than the host (a restore target, an AOT compile).
        """
        fn, args = self._init_fn()
        shapes = jax.eval_shape(fn, self._key(None), *args)
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            shapes,
            self.state_shardings,
        )

    def init(self, key: int | jax.Array | None = None) -> TrainState:
        """The initial `TrainState`, built inside ``jit`` straight into its shards.

        ``key``: a seed or a JAX key (default: ``EngineConfig.seed``). No device ever
        holds more than its shard of a parameter.
        """
        fn, args = self._init_fn()
        return jax.jit(fn, out_shardings=self.state_shardings)(self._key(key), *args)

    # ----------------------------------------------------------------- steps
    def train_step(self, loss_fn: LossFn) -> TrainStep:
        """A jitted ``(state, batch) -> (state, metrics)`` for ``loss_fn``; state is donated.

        ``loss_fn(model, batch, rng) -> (loss, aux)``: ``aux`` is a dict of scalars; an
        ``aux["weight"]`` (e.g. the number of real tokens) makes the accumulated loss the
        exact weighted mean over microbatches. See `jaxcore.step.TrainStep` for metrics.
        """
        return TrainStep(self, loss_fn)

    def eval_step(self, loss_fn: LossFn) -> EvalStep:
        """A jitted ``(state, batch) -> metrics`` for ``loss_fn`` (no update, no rng), with
        the model in eval mode (dropout off, BatchNorm from its running statistics)."""
        return EvalStep(self, loss_fn)

    def bind(self, state: TrainState, *, evaluation: bool = False) -> Any:
        """The model with ``state``'s parameters, in the compute dtype (for use in jit).

        ``evaluation``: in eval mode (dropout off, BatchNorm from its running statistics),
        as the eval step runs it; otherwise as built (training mode for NNX modules).
        """
        bind = self.adapter.bind
        if evaluation and self.adapter.bind_eval is not None:
            bind = self.adapter.bind_eval
        return bind(self.policy.cast_to_compute(state.params), state.model_state)

    # ----------------------------------------------------------------- batches
    def check_batch(self, batch: Any, *, local: bool = False) -> None:
        """Raise `BatchError` unless this plan's steps can run ``batch``."""
        self.checker.check(batch, local=local)

    def shard_batch(self, batch: Any) -> Any:
        """Turn this process's part of a batch (NumPy arrays) into global sharded arrays."""
        return shard_batch(batch, self.batch_sharding, self.checker)

    def _as_global(self, batch: Any, checker: BatchChecker) -> Any:
        return as_global(batch, self.batch_sharding, checker)


def shard_batch(batch: Any, sharding: NamedSharding, checker: BatchChecker) -> Any:
    """Check a process-local batch and assemble its global arrays on ``sharding``.

    In one process that is the whole batch; with several, each passes the rows its
    devices hold (`jaxcore.sharding.local_rows`): a ``1 / count`` block of the global
    batch, in process order, where ``count`` is the contract's ``process_blocks`` (all of
    it when the batch is not cut over the processes, as with a pipeline spanning hosts).
    """
    checker.check(batch, local=True)
    checker.check_processes_agree(batch)
    blocks = checker.contract.process_blocks

    def one(x):
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(
            sharding, x, (x.shape[0] * blocks, *x.shape[1:])
        )

    return jax.tree.map(one, batch)


def as_global(batch: Any, sharding: NamedSharding, checker: BatchChecker) -> Any:
    """``batch`` as global arrays: device batches are checked, host batches sharded."""
    leaves = jax.tree.leaves(batch)
    if leaves and all(isinstance(x, jax.Array) for x in leaves):
        checker.check(batch)
        return batch
    return shard_batch(batch, sharding, checker)


def batch_contract(
    config: EngineConfig,
    mesh: Mesh,
    rules: shd.Rules,
    pipeline: PipelineConfig | None,
    adapter: Any = None,
) -> BatchContract:
    """What a step on ``mesh`` needs of a batch (model limits from ``adapter`` if given)."""
    checks = config.check_batches
    block, blocks = shd.process_batch_block(mesh, rules)
    return BatchContract(
        ways=shd.batch_ways(mesh, rules),
        process_block=block,
        process_blocks=blocks,
        # A pipelined step cuts the batch into its microbatches (grad_accum folded in).
        per_shard=pipeline.microbatches if pipeline else config.grad_accum,
        per_shard_what="pipeline microbatches" if pipeline else "grad_accum",
        token_keys=tuple(config.token_keys) if checks else (),
        vocab_size=getattr(adapter, "vocab_size", None),
        max_seq_len=getattr(adapter, "max_seq_len", None),
        check_values=checks,
    )


def _frozen_mask(abs_params: Any, trainable: Trainable | None) -> Any | None:
    if trainable is None:
        return None
    if not callable(trainable):
        raise ConfigError(
            f"trainable={trainable!r}: pass a function of the parameter path, e.g. "
            "`trainable=lambda path: not path.startswith('embed')`."
        )
    mask = jax.tree_util.tree_map_with_path(
        lambda p, _: bool(trainable(shd.path_str(p))), abs_params
    )
    flags = jax.tree.leaves(mask)
    if not any(flags):
        raise ConfigError("trainable: the predicate froze every parameter; nothing would train.")
    return None if all(flags) else mask


def _check_pipeline_layers(pipeline: PipelineConfig, abs_params: Any, names: Any) -> None:
    flat = jax.tree_util.tree_flatten_with_path(abs_params)[0]
    leaves = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
    stacked = [
        (p, x, n) for (p, x), n in zip(flat, leaves, strict=True) if n is not None and "layers" in n
    ]
    if not stacked:
        raise ConfigError(
            "ParallelConfig.pipeline > 1 but no parameter has a 'layers' axis: pipeline "
            "parallelism needs the model's blocks stacked along a 'layers' axis and run "
            "with jaxcore.pipeline.scan_layers (as jaxcore.models.Transformer does)."
        )
    for path, leaf, n in stacked:
        pipeline.check_layers(leaf.shape[n.index("layers")], shd.path_str(path))


def make_plan(
    *,
    config: EngineConfig,
    mesh: Mesh,
    rules: shd.Rules,
    policy: PrecisionPolicy,
    pipeline: PipelineConfig | None,
    model: Any,
    optimizer: optax.GradientTransformation,
    trainable: Trainable | None = None,
) -> TrainPlan:
    """Plan ``model`` and ``optimizer`` on ``mesh`` (what `Engine.plan` calls)."""
    if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise ConfigError(
            f"plan(optimizer): got {type(optimizer).__name__}; pass an optax "
            "GradientTransformation such as optax.adamw(3e-4) (engine.prepare and "
            "engine.plan take the same arguments)."
        )
    adapter = as_adapter(model)
    abs_params, abs_model_state = adapter.abstract
    abs_params = jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, policy.param_dtype)
            if jnp.issubdtype(x.dtype, jnp.floating)
            else x
        ),
        abs_params,
    )
    names = shd.name_params(abs_params, adapter.logical_axes, config.param_rules)
    if pipeline is not None:
        _check_pipeline_layers(pipeline, abs_params, names)
    mask = _frozen_mask(abs_params, trainable)
    if mask is not None:
        # Frozen parameters get set_to_zero, whose state is empty: no slots, no memory.
        labels = jax.tree.map(lambda t: "trainable" if t else "frozen", mask)
        optimizer = optax.multi_transform(
            {"trainable": optimizer, "frozen": optax.set_to_zero()}, labels
        )
    sharding_plan = shd.plan(abs_params, names, mesh, rules, config.zero)
    rep = NamedSharding(mesh, PartitionSpec())
    abs_opt = jax.eval_shape(optimizer.init, abs_params)
    state_shardings = TrainState(
        step=rep,
        params=sharding_plan.params,
        opt_state=shd.opt_state_shardings(abs_opt, abs_params, sharding_plan.opt, rep),
        model_state=jax.tree.map(lambda _: rep, abs_model_state),
        loss_scale=(
            jax.tree.map(lambda _: rep, LossScaleState.create(config.loss_scale))
            if policy.loss_scaling
            else None
        ),
        rng=rep,
        nonfinite=jax.tree.map(lambda _: rep, NonFiniteState.create()),
    )
    return TrainPlan(
        config=config,
        mesh=mesh,
        policy=policy,
        pipeline=pipeline,
        adapter=adapter,
        optimizer=optimizer,
        logical_axes=names,
        shardings=sharding_plan,
        state_shardings=state_shardings,
        trainable=mask,
        checker=BatchChecker(batch_contract(config, mesh, rules, pipeline, adapter)),
    )
