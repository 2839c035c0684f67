"""The Engine: prepare a model and optimizer on a mesh, and build jitted train/eval steps.

The engine composes the small modules around it (mesh, sharding rules, precision, remat,
train state) and owns no parallelism logic itself: data, ZeRO 1-3 and tensor parallelism
all come from the mesh plus the rules table, so the step below is the only code path.

    engine = Engine(parallel=ParallelConfig(fsdp=-1, tensor=2), zero=3, precision="bf16")
    state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(3e-4))
    step = engine.train_step(lm_loss)
    state, metrics = step(state, batch)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxcore import context, remat
from jaxcore import sharding as shd
from jaxcore.adapters import ModelAdapter, as_adapter
from jaxcore.errors import BatchError, ConfigError
from jaxcore.mesh import BATCH_AXES, ParallelConfig, batch_parallelism, build_mesh
from jaxcore.pipeline import SCHEDULES, PipelineConfig
from jaxcore.precision import LossScaleConfig, LossScaleState, all_finite, get_policy
from jaxcore.state import TrainState

log = logging.getLogger(__name__)

LossFn = Callable[[Any, Any, jax.Array | None], tuple[jax.Array, dict[str, Any]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Everything that decides how a model trains on the devices.

    Attributes:
        parallel: mesh axis sizes (see `ParallelConfig`).
        zero: ZeRO stage 0-3: what is sharded over ``fsdp`` (see `jaxcore.sharding`).
        precision: ``fp32``, ``bf16`` (float32 master weights, bfloat16 compute) or ``fp16``
            (with dynamic loss scaling).
        grad_accum: microbatches per step, accumulated inside the one jitted step.
        remat: activation checkpointing policy per block (see `jaxcore.remat`).
        clip_grad_norm: clip gradients to this global norm (``None``: no clipping).
        rules: the logical-axis rules table (first match wins).
        param_rules: ``(regex on parameter path, logical names)`` pairs that name or rename
            parameters, e.g. ``(r".*q_proj/weight", ("heads", "embed"))``.
        loss_scale: dynamic loss-scale settings (fp16 only).
        seed: seed of the parameter init and of the step keys.
        microbatches: pipeline microbatches per step (``pipeline > 1`` only; default: the
            number of stages). With ``grad_accum = k`` the schedule runs ``k`` times as
            many microbatches instead of nesting a second loop.
        pipeline_schedule: ``gpipe`` or ``circular`` (interleaved layer chunks per stage).
        pipeline_repeats: layer chunks per stage for ``circular`` (default 2).
    """

    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    zero: int = 3
    precision: str = "fp32"
    grad_accum: int = 1
    remat: str = "none"
    clip_grad_norm: float | None = None
    rules: shd.Rules = shd.DEFAULT_RULES
    param_rules: tuple[tuple[str, tuple], ...] = ()
    loss_scale: LossScaleConfig = dataclasses.field(default_factory=LossScaleConfig)
    seed: int = 0
    microbatches: int | None = None
    pipeline_schedule: str = "gpipe"
    pipeline_repeats: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.parallel, ParallelConfig):
            raise ConfigError(
                f"parallel={self.parallel!r}: pass a jaxcore.ParallelConfig, "
                "e.g. ParallelConfig(fsdp=-1, tensor=2)."
            )
        if self.zero not in shd.ZERO_STAGES:
            raise ConfigError(f"zero={self.zero!r}: the ZeRO stage must be one of 0, 1, 2, 3.")
        get_policy(self.precision)
        if not isinstance(self.grad_accum, int) or self.grad_accum < 1:
            raise ConfigError(f"grad_accum={self.grad_accum!r}: must be an integer >= 1.")
        if self.remat not in remat.POLICY_NAMES:
            remat.validate_policy(self.remat)
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(
                f"clip_grad_norm={self.clip_grad_norm!r}: must be positive, or None to disable."
            )
        if self.pipeline_schedule not in SCHEDULES:
            raise ConfigError(
                f"pipeline_schedule={self.pipeline_schedule!r}: use one of {SCHEDULES}."
            )
        repeats = self.pipeline_repeats
        if self.pipeline_schedule == "gpipe" and repeats not in (None, 1):
            raise ConfigError(
                f"pipeline_repeats={repeats} needs pipeline_schedule='circular' (GPipe runs "
                "each stage's layers once)."
            )
        if self.pipeline_schedule == "circular" and repeats is not None and repeats < 2:
            raise ConfigError(
                f"pipeline_repeats={repeats}: the circular schedule needs at least 2 repeats."
            )
        if self.microbatches is not None and self.microbatches < 1:
            raise ConfigError(f"microbatches={self.microbatches}: must be >= 1.")

    def pipeline_config(self, stages: int) -> PipelineConfig | None:
        """The schedule for ``stages`` pipeline stages (``None`` without a pipeline)."""
        if stages == 1:
            if self.microbatches not in (None, 1) or self.pipeline_schedule != "gpipe":
                log.warning("microbatches / pipeline_schedule are ignored: pipeline=1.")
            return None
        repeats = self.pipeline_repeats or (2 if self.pipeline_schedule == "circular" else 1)
        micro = (self.microbatches or stages) * self.grad_accum
        return PipelineConfig(stages=stages, microbatches=micro, repeats=repeats)


class Engine:
    """Prepares a model and optimizer on a mesh and builds jitted, sharded steps."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        devices: Sequence[jax.Device] | None = None,
        **fields: Any,
    ):
        if config is None:
            config = EngineConfig(**fields)
        elif fields:
            config = dataclasses.replace(config, **fields)
        self.config = config
        self.mesh = build_mesh(config.parallel, devices)
        self.policy = get_policy(config.precision)
        remat.validate_policy(config.remat, self.mesh.devices.flat[0])
        self.rules = shd.validate_rules(config.rules, self.mesh.axis_names)
        self.pipeline = config.pipeline_config(self.mesh.shape["pipeline"])
        self.model: ModelAdapter | None = None
        self.optimizer: optax.GradientTransformation | None = None
        self.plan: shd.ShardingPlan | None = None
        self.state_shardings: TrainState | None = None
        batch_axes = tuple(a for a in BATCH_AXES if self.mesh.shape[a] > 1)
        self._batch_spec = PartitionSpec(batch_axes or None)
        self.batch_sharding = NamedSharding(self.mesh, self._batch_spec)
        self._replicated = NamedSharding(self.mesh, PartitionSpec())

    # ----------------------------------------------------------------- preparation
    def prepare(
        self, model: Any, optimizer: optax.GradientTransformation, *, seed: int | None = None
    ) -> TrainState:
        """Place a model and optimizer on the mesh; return the initial `TrainState`.

        ``model`` is preferably a factory ``rngs -> nnx.Module``: its parameters are then
        initialised inside ``jit`` with output shardings, so no device ever holds more
        than its shard. A built ``nnx.Module`` or a `ModelAdapter` work too.
        """
        if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
            raise ConfigError(
                f"prepare(optimizer): got {type(optimizer).__name__}; pass an optax "
                "GradientTransformation such as optax.adamw(3e-4)."
            )
        adapter = as_adapter(model)
        self.model, self.optimizer = adapter, optimizer
        abs_params, abs_model_state = adapter.abstract
        abs_params = jax.tree.map(
            lambda x: (
                jax.ShapeDtypeStruct(x.shape, self.policy.param_dtype)
                if jnp.issubdtype(x.dtype, jnp.floating)
                else x
            ),
            abs_params,
        )
        names = shd.name_params(abs_params, adapter.logical_axes, self.config.param_rules)
        if self.pipeline is not None:
            self._check_pipeline_layers(abs_params, names)
        self.plan = shd.plan(abs_params, names, self.mesh, self.rules, self.config.zero)
        abs_opt = jax.eval_shape(optimizer.init, abs_params)
        opt_shardings = optax.tree_map_params(
            optimizer,
            # optax.masked leaves a MaskedNode (no state) for unselected parameters.
            lambda x, s: x if isinstance(x, optax.MaskedNode) else s,
            abs_opt,
            self.plan.opt,
            transform_non_params=lambda _: self._replicated,
            is_leaf=lambda x: isinstance(x, optax.MaskedNode),
        )
        rep = self._replicated
        self.state_shardings = TrainState(
            step=rep,
            params=self.plan.params,
            opt_state=opt_shardings,
            model_state=jax.tree.map(lambda _: rep, abs_model_state),
            loss_scale=(
                jax.tree.map(lambda _: rep, LossScaleState.create(self.config.loss_scale))
                if self.policy.loss_scaling
                else None
            ),
            rng=rep,
        )
        key = jax.random.key(self.config.seed if seed is None else seed)

        def build(key, params, model_state):
            params = jax.tree.map(
                lambda x: (
                    x.astype(self.policy.param_dtype)
                    if jnp.issubdtype(x.dtype, jnp.floating)
                    else x
                ),
                params,
            )
            return TrainState(
                step=jnp.asarray(0, jnp.int32),
                params=params,
                opt_state=optimizer.init(params),
                model_state=model_state,
                loss_scale=(
                    LossScaleState.create(self.config.loss_scale)
                    if self.policy.loss_scaling
                    else None
                ),
                rng=key,
            )

        if adapter.initial is not None:
            fn = jax.jit(build, out_shardings=self.state_shardings)
            return fn(key, *adapter.initial)

        def init(key):
            init_key, step_key = jax.random.split(key)
            return build(step_key, *adapter.init(init_key))

        return jax.jit(init, out_shardings=self.state_shardings)(key)

    def _check_pipeline_layers(self, abs_params: Any, names: Any) -> None:
        flat = jax.tree_util.tree_flatten_with_path(abs_params)[0]
        leaves = jax.tree.leaves(names, is_leaf=lambda x: x is None or isinstance(x, tuple))
        stacked = [
            (p, x, n)
            for (p, x), n in zip(flat, leaves, strict=True)
            if n is not None and "layers" in n
        ]
        if not stacked:
            raise ConfigError(
                "ParallelConfig.pipeline > 1 but no parameter has a 'layers' axis: pipeline "
                "parallelism needs the model's blocks stacked along a 'layers' axis and run "
                "with jaxcore.pipeline.scan_layers (as jaxcore.models.Transformer does)."
            )
        for path, leaf, n in stacked:
            self.pipeline.check_layers(leaf.shape[n.index("layers")], shd.path_str(path))

    def _require_prepared(self, what: str) -> ModelAdapter:
        if self.model is None:
            raise ConfigError(f"Engine.{what}: call engine.prepare(model, optimizer) first.")
        return self.model

    def _trace_context(self) -> context.TraceContext:
        return context.TraceContext(
            mesh=self.mesh, rules=self.rules, remat=self.config.remat, pipeline=self.pipeline
        )

    def bind(self, state: TrainState) -> Any:
        """The model with ``state``'s parameters, in the compute dtype (for use in jit)."""
        adapter = self._require_prepared("bind")
        return adapter.bind(self.policy.cast_to_compute(state.params), state.model_state)

    # ----------------------------------------------------------------- batches
    def shard_batch(self, batch: Any) -> Any:
        """Turn this process's part of a batch (NumPy arrays) into global sharded arrays.

        In one process that is the whole batch; with several, each passes its own rows
        and the leading axis of the result is the concatenation over processes.
        """

        def one(x):
            if isinstance(x, jax.Array) and x.sharding == self.batch_sharding:
                return x
            x = np.asarray(x)
            return jax.make_array_from_process_local_data(self.batch_sharding, x)

        self.check_batch(batch, local=True)
        return jax.tree.map(one, batch)

    def check_batch(self, batch: Any, *, local: bool = False) -> None:
        """Raise `BatchError` unless every leaf's leading size splits over the mesh."""
        ways = batch_parallelism(self.mesh)
        if local:
            ways = max(1, ways // jax.process_count())
        # A pipelined step cuts the batch into its microbatches (grad_accum folded in).
        per_shard = self.pipeline.microbatches if self.pipeline else self.config.grad_accum
        need = ways * per_shard
        for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
            shape = np.shape(leaf)
            where = shd.path_str(path) or "batch"
            if not shape:
                raise BatchError(
                    f"batch[{where}] is a scalar; every batch leaf needs a leading batch axis."
                )
            if shape[0] % need:
                raise BatchError(
                    f"batch[{where}] has leading size {shape[0]}, which does not divide into "
                    f"{ways} data-parallel shards (data x fsdp = {ways}) x {per_shard} "
                    f"{'pipeline microbatches' if self.pipeline else 'grad_accum'}. Use a "
                    f"batch size that is a multiple of {need}."
                )

    def _as_global(self, batch: Any) -> Any:
        leaves = jax.tree.leaves(batch)
        if all(isinstance(x, jax.Array) for x in leaves):
            self.check_batch(batch)
            return batch
        return self.shard_batch(batch)

    # ----------------------------------------------------------------- steps
    def train_step(self, loss_fn: LossFn) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
        """A jitted ``(state, batch) -> (state, metrics)`` for ``loss_fn``; state is donated.

        ``loss_fn(model, batch, rng) -> (loss, aux)``: ``aux`` is a dict of scalars; an
        ``aux["weight"]`` (e.g. the number of real tokens) makes the accumulated loss the
        exact weighted mean over microbatches. Metrics hold ``loss``, ``grad_norm``, the
        aux metrics, and for fp16 ``loss_scale`` and ``skipped``.
        """
        adapter = self._require_prepared("train_step")
        cfg, policy, tx, plan = self.config, self.policy, self.optimizer, self.plan
        # With a pipeline, accumulation happens over the schedule's microbatches.
        accum = 1 if self.pipeline else cfg.grad_accum
        micro_sharding = NamedSharding(self.mesh, PartitionSpec(None, *self._batch_spec))

        def micro_loss(params, model_state, batch, key, scale):
            model = adapter.bind(policy.cast_to_compute(params), model_state)
            loss, aux = loss_fn(model, batch, key)
            aux = dict(aux)
            weight = jax.lax.stop_gradient(jnp.asarray(aux.pop("weight", 1.0), jnp.float32))
            new_model_state = adapter.state_of(model)
            # Scale the microbatch's mean loss; the weight multiplies the gradients afterwards,
            # so float16 backward passes see the usual magnitudes whatever the token count.
            scaled = loss.astype(jnp.float32) * scale
            return scaled, (loss.astype(jnp.float32), aux, weight, new_model_state)

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

        def accumulate(params, model_state, batch, key, scale):
            """Gradients (still loss-scaled), weighted-mean metrics, total weight, state."""
            if accum == 1:
                (_, (loss, aux, weight, model_state)), grads = grad_fn(
                    params, model_state, batch, jax.random.fold_in(key, 0), scale
                )
                return grads, {"loss": loss, **aux}, weight, model_state

            def split(x):
                x = x.reshape((x.shape[0] // accum, accum, *x.shape[1:])).swapaxes(0, 1)
                return jax.lax.with_sharding_constraint(x, micro_sharding)

            micro = jax.tree.map(split, batch)

            def body(carry, inputs):
                grads_sum, sums, model_state = carry
                i, mb = inputs
                (_, (loss, aux, w, model_state)), grads = grad_fn(
                    params, model_state, mb, jax.random.fold_in(key, i), scale
                )
                grads_sum = jax.tree.map(lambda s, g: s + w * g, grads_sum, grads)
                grads_sum = jax.lax.with_sharding_constraint(grads_sum, plan.grads)
                new = {"loss": loss * w, **{k: v * w for k, v in aux.items()}, "weight": w}
                sums = {k: sums[k] + new[k] for k in sums}
                return (grads_sum, sums, model_state), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            # One traced microbatch tells us which metrics the loss function reports.
            aux_keys = jax.eval_shape(
                lambda: grad_fn(
                    params, model_state, jax.tree.map(lambda x: x[0], micro), key, scale
                )[0][1][1]
            ).keys()
            sums0 = {k: jnp.zeros((), jnp.float32) for k in ("loss", *aux_keys, "weight")}
            (grads, sums, model_state), _ = jax.lax.scan(
                body, (zeros, sums0, model_state), (jnp.arange(accum), micro)
            )
            weight = jnp.maximum(sums.pop("weight"), 1e-12)
            grads = jax.tree.map(lambda g: g / weight, grads)
            return grads, {k: v / weight for k, v in sums.items()}, weight, model_state

        def step(state: TrainState, batch):
            with context.tracing(self._trace_context()):
                rng, key = jax.random.split(state.rng)
                scale = state.loss_scale.scale if state.loss_scale is not None else 1.0
                grads, metrics, weight, model_state = accumulate(
                    state.params, state.model_state, batch, key, scale
                )
                if state.loss_scale is not None:
                    grads = jax.tree.map(lambda g: g / scale, grads)
                metrics["weight"] = weight
                if self.pipeline is not None:
                    metrics["pipeline_bubble"] = jnp.float32(self.pipeline.bubble_fraction)
                grads = jax.lax.with_sharding_constraint(grads, plan.grads)
                grad_norm = optax.tree.norm(grads)
                metrics["grad_norm"] = grad_norm
                if cfg.clip_grad_norm is not None:
                    factor = jnp.minimum(1.0, cfg.clip_grad_norm / (grad_norm + 1e-6))
                    grads = jax.tree.map(lambda g: g * factor, grads)
                updates, opt_state = tx.update(grads, state.opt_state, state.params)
                params = optax.apply_updates(state.params, updates)
                params = jax.lax.with_sharding_constraint(params, plan.params)
                loss_scale = state.loss_scale
                if loss_scale is not None:
                    finite = all_finite(grads)
                    keep = lambda new, old: jax.tree.map(
                        lambda a, b: jnp.where(finite, a, b), new, old
                    )
                    params = keep(params, state.params)
                    opt_state = keep(opt_state, state.opt_state)
                    model_state = keep(model_state, state.model_state)
                    loss_scale = loss_scale.update(finite, cfg.loss_scale)
                    metrics["loss_scale"] = loss_scale.scale
                    metrics["skipped"] = loss_scale.skipped_steps
                new_state = TrainState(
                    step=state.step + 1,
                    params=params,
                    opt_state=opt_state,
                    model_state=model_state,
                    loss_scale=loss_scale,
                    rng=rng,
                )
                return new_state, metrics

        jitted = jax.jit(
            step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, self._replicated),
            donate_argnums=(0,),
        )

        def run(state: TrainState, batch: Any) -> tuple[TrainState, dict]:
            return jitted(state, self._as_global(batch))

        run.jitted = jitted  # for ahead-of-time lowering and cost analysis
        return run

    def eval_step(self, loss_fn: LossFn) -> Callable[[TrainState, Any], dict]:
        """A jitted ``(state, batch) -> metrics`` (no update; ``rng`` is ``None``).

        Metrics carry ``weight`` so that `jaxcore.MeanMetrics` combines batches into the
        exact mean over real tokens, whatever the padding.
        """
        self._require_prepared("eval_step")

        def evaluate(state: TrainState, batch):
            with context.tracing(self._trace_context()):
                loss, aux = loss_fn(self.bind(state), batch, None)
                aux = dict(aux)
                weight = jnp.asarray(aux.pop("weight", 1.0), jnp.float32)
                return {"loss": loss.astype(jnp.float32), **aux, "weight": weight}

        jitted = jax.jit(
            evaluate,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=self._replicated,
        )
        return lambda state, batch: jitted(state, self._as_global(batch))
