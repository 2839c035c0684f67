"""The train and eval steps of a `TrainPlan`: one jitted function each, state donated.

The train step, inside one ``jax.jit``: split the batch into ``grad_accum`` microbatches
and accumulate weighted gradients in a ``lax.scan`` (a pipelined step lets the schedule
do the microbatching), unscale (fp16), take the global gradient norm, clip, apply the
optimizer, and keep the old state when the loss or the gradient norm is not finite
(`jaxcore.nonfinite`). Around it, on the host: the batch checks of
`jaxcore.batch_checks`, a check that the state was not donated already, and the lazy
divergence check.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from jaxcore import remat, trace_context
from jaxcore.batch_checks import BatchChecker, check_loss_output
from jaxcore.errors import StateError
from jaxcore.nonfinite import DivergenceMonitor, keep_if
from jaxcore.state import TrainState
from jaxcore.xla_flags import compiler_options

if TYPE_CHECKING:
    from jaxcore.plan import TrainPlan

LossFn = Callable[[Any, Any, jax.Array | None], tuple[jax.Array, dict[str, Any]]]


def check_live(state: Any, what: str) -> None:
    """Raise `StateError` if ``state`` is not a `TrainState` or was donated already."""
    if not isinstance(state, TrainState):
        raise StateError(
            f"{what}: expected the TrainState from plan.init() / engine.prepare() or from "
            f"the previous step, got {type(state).__name__}."
        )
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array) and leaf.is_deleted():
            raise StateError(
                f"{what}: this TrainState was already passed to a train step, which donated "
                "(freed) its arrays. Use the state the step returned: "
                "`state, metrics = step(state, batch)`."
            )


def run_jitted(jitted: Callable, state: TrainState, batch: Any, what: str) -> Any:
    """Call a step's jitted function; a state of another plan is a `StateError`.

    A step is compiled for the state of the plan it was built from. A state of another
    plan (another optimizer, model or trainable set) reached JAX as a pytree mismatch
    against ``in_shardings``, which does not say which state or how to fix it.
    """
    try:
        return jitted(state, batch)
    except ValueError as e:
        if "pytree structure" not in str(e) or "in_shardings[0]" not in str(e):
            raise
        detail = next(
            (line.strip() for line in str(e).splitlines() if line.startswith("At that key")),
            str(e).splitlines()[0],
        )
        raise StateError(
            f"{what}: this TrainState is not of the plan the step was built from ({detail}). "
            "Build the step from the state's own plan (plan.train_step / plan.eval_step); "
            "engine.train_step uses the engine's latest plan, so with several models hold "
            "each plan."
        ) from None


def _train_fn(plan: TrainPlan, loss_fn: LossFn) -> Callable:
    """The pure ``(state, batch) -> (state, metrics)`` that gets jitted."""
    cfg, policy, adapter, tx = plan.config, plan.policy, plan.adapter, plan.optimizer
    shardings, pipeline, trainable = plan.shardings, plan.pipeline, plan.trainable
    guard = cfg.nonfinite != "ignore"
    # With a pipeline, accumulation happens over the schedule's microbatches.
    accum = 1 if pipeline else cfg.grad_accum
    micro_sharding = NamedSharding(plan.mesh, PartitionSpec(None, *shardings.batch.spec))

    def micro_loss(params, model_state, batch, key, scale):
        if trainable is not None:  # no gradient flows into frozen parameters
            params = jax.tree.map(
                lambda p, t: p if t else jax.lax.stop_gradient(p), params, trainable
            )
        model = adapter.bind(policy.cast_to_compute(params), model_state)
        loss, aux = check_loss_output(loss_fn(model, batch, key))
        loss = jnp.asarray(loss)
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
            grads_sum = jax.lax.with_sharding_constraint(grads_sum, shardings.grads)
            new = {"loss": loss * w, **{k: v * w for k, v in aux.items()}, "weight": w}
            sums = {k: sums[k] + new[k] for k in sums}
            return (grads_sum, sums, model_state), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        # One traced microbatch tells us which metrics the loss function reports.
        aux_keys = jax.eval_shape(
            lambda: grad_fn(params, model_state, jax.tree.map(lambda x: x[0], micro), key, scale)[
                0
            ][1][1]
        ).keys()
        sums0 = {k: jnp.zeros((), jnp.float32) for k in ("loss", *aux_keys, "weight")}
        (grads, sums, model_state), _ = jax.lax.scan(
            body, (zeros, sums0, model_state), (jnp.arange(accum), micro)
        )
        # An all-padding batch weighs 0: report that, but divide by a floor so the
        # zero gradients and metrics stay 0 rather than NaN.
        weight = sums.pop("weight")
        denom = jnp.maximum(weight, 1e-12)
        grads = jax.tree.map(lambda g: g / denom, grads)
        return grads, {k: v / denom for k, v in sums.items()}, weight, model_state

    def step(state: TrainState, batch):
        with trace_context.tracing(plan.trace_context()), remat.counting_blocks() as wrapped:
            rng, key = jax.random.split(state.rng)
            scale = state.loss_scale.scale if state.loss_scale is not None else 1.0
            grads, metrics, weight, model_state = accumulate(
                state.params, state.model_state, batch, key, scale
            )
            if cfg.remat != "none" and not wrapped[0]:
                warnings.warn(
                    f"remat={cfg.remat!r} had no effect: the model wrapped no block with "
                    "jaxcore.remat.checkpoint_block, so every activation is kept. Wrap each "
                    "repeated block's function with it (the policy applies per block), or "
                    "use remat='none'.",
                    stacklevel=2,
                )
            if state.loss_scale is not None:
                grads = jax.tree.map(lambda g: g / scale, grads)
            metrics["weight"] = weight
            if pipeline is not None:
                metrics["pipeline_bubble"] = jnp.float32(pipeline.bubble_fraction)
            grads = jax.lax.with_sharding_constraint(grads, shardings.grads)
            grad_norm = optax.tree.norm(grads)
            metrics["grad_norm"] = grad_norm
            if cfg.clip_grad_norm is not None:
                factor = jnp.minimum(1.0, cfg.clip_grad_norm / (grad_norm + 1e-6))
                grads = jax.tree.map(lambda g: g * factor, grads)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            if trainable is not None:  # frozen parameters stay bit-identical
                params = jax.tree.map(
                    lambda new, old, t: new if t else old, params, state.params, trainable
                )
            params = jax.lax.with_sharding_constraint(params, shardings.params)

            # The non-finite guard. The norm is NaN/inf exactly when a gradient is (or when
            # the squares overflow float32, which is as unusable), so no second pass is needed.
            grads_ok = jnp.isfinite(grad_norm)
            loss_ok = jnp.isfinite(metrics["loss"])
            loss_scale, counters = state.loss_scale, state.nonfinite
            applied = None
            if guard:
                applied = jnp.logical_and(grads_ok, loss_ok)
                counts = ~applied
            if loss_scale is not None:
                if applied is None:
                    applied = grads_ok
                    counts = jnp.asarray(False)
                else:
                    # An overflow at a scale that can still shrink is what the scaler is for.
                    at_min = loss_scale.scale <= cfg.loss_scale.min_scale
                    counts = jnp.logical_or(~loss_ok, jnp.logical_and(~grads_ok, at_min))
                loss_scale = loss_scale.update(grads_ok, cfg.loss_scale)
                metrics["loss_scale"] = loss_scale.scale
            if applied is not None:
                params = keep_if(applied, params, state.params)
                opt_state = keep_if(applied, opt_state, state.opt_state)
                model_state = keep_if(applied, model_state, state.model_state)
                counters = counters.update(applied, counts)
                metrics["skipped"] = counters.skipped
                if guard:
                    metrics["consecutive_skips"] = counters.consecutive
            new_state = TrainState(
                step=state.step + 1,
                params=params,
                opt_state=opt_state,
                model_state=model_state,
                loss_scale=loss_scale,
                rng=rng,
                nonfinite=counters,
            )
            return new_state, metrics

    return step


class TrainStep:
    """``step(state, batch) -> (state, metrics)``: a plan's jitted train step (state donated).

    ``metrics`` holds ``loss``, ``grad_norm``, ``weight``, the loss function's aux metrics,
    ``skipped`` and ``consecutive_skips`` (non-finite guard on, or fp16), ``loss_scale``
    (fp16) and ``pipeline_bubble`` (pipelined). ``jitted`` is the underlying ``jax.jit``
    function (for ahead-of-time lowering and cost analysis); ``check()`` waits for the
    steps in flight and raises `jaxcore.TrainingDivergedError` if one crossed the limit.
    """

    def __init__(self, plan: TrainPlan, loss_fn: LossFn):
        self.plan = plan
        self.jitted = jax.jit(
            _train_fn(plan, loss_fn),
            in_shardings=(plan.state_shardings, plan.batch_sharding),
            out_shardings=(plan.state_shardings, plan.replicated),
            donate_argnums=(0,),
            compiler_options=compiler_options(plan.platform),
        )
        cfg = plan.config
        self._monitor = (
            None
            if cfg.nonfinite == "ignore"
            else DivergenceMonitor(cfg.nonfinite, cfg.max_consecutive_skips)
        )
        self._checker = plan.checker
        # The state this step returned last, weakly: the step must not keep a run's
        # arrays alive. Its `step` is counted on the host (no device read per call).
        self._last: weakref.ref | None = None
        self._host_step = 0

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        check_live(state, "train step")
        own = self._last is not None and state is self._last()
        state = self.before_step(state, own=own)
        batch = self.plan._as_global(batch, self._checker)
        if self._monitor is not None and not own:
            self._host_step = int(state.step)  # a state this step did not make: read once
        new_state, metrics = run_jitted(self.jitted, state, batch, "train step")
        self._last = weakref.ref(new_state)
        if self._monitor is not None:
            self._host_step += 1
            self._monitor.record(self._host_step, metrics, new_state)
        return new_state, metrics

    def before_step(self, state: TrainState, *, own: bool) -> TrainState:
        """The state the jitted step gets; a hook for host-side changes between steps.

        ``own``: ``state`` is the newest one this step returned. The default returns it
        unchanged; `torchbridge` writes the torch loop's ``param_groups`` values here.
        """
        del own
        return state

    def check(self) -> None:
        """Wait for the steps in flight; raise `TrainingDivergedError` if one diverged.

        The error's ``state`` is the newest state this step returned, if still referenced.
        """
        if self._monitor is not None:
            self._monitor.check(None if self._last is None else self._last())


def _eval_fn(plan: TrainPlan, loss_fn: LossFn) -> Callable:
    def evaluate(state: TrainState, batch):
        with trace_context.tracing(plan.trace_context()):
            loss, aux = check_loss_output(loss_fn(plan.bind(state, evaluation=True), batch, None))
            aux = dict(aux)
            weight = jnp.asarray(aux.pop("weight", 1.0), jnp.float32)
            return {"loss": jnp.asarray(loss).astype(jnp.float32), **aux, "weight": weight}

    return evaluate


class EvalStep:
    """``evaluate(state, batch) -> metrics``: a plan's jitted eval step (``rng`` is ``None``).

    The model runs in eval mode (`TrainPlan.bind` with ``evaluation=True``): dropout off,
    BatchNorm from the running statistics the train steps kept.

    Metrics carry ``weight`` so that `jaxcore.MeanMetrics` combines batches into the exact
    mean over real tokens, whatever the padding.
    """

    def __init__(self, plan: TrainPlan, loss_fn: LossFn):
        self.plan = plan
        self.jitted = jax.jit(
            _eval_fn(plan, loss_fn),
            in_shardings=(plan.state_shardings, plan.batch_sharding),
            out_shardings=plan.replicated,
            compiler_options=compiler_options(plan.platform),
        )
        self._checker = plan.checker
        if plan.pipeline is None and plan.checker.contract.per_shard != 1:
            # The eval step runs a batch in one piece: only the pipeline schedule (which
            # cuts eval batches into its microbatches too) needs more than a row per shard.
            contract = dataclasses.replace(plan.checker.contract, per_shard=1)
            self._checker = BatchChecker(contract)

    def __call__(self, state: TrainState, batch: Any) -> dict:
        check_live(state, "eval step")
        return run_jitted(
            self.jitted, state, self.plan._as_global(batch, self._checker), "eval step"
        )
