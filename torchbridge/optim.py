"""torch optimizers and LR schedulers as optax transformations with the same update rule.

`to_optax(optimizer, module, scheduler=None)` reads the hyperparameters out of a built
``torch.optim`` optimizer (so torch's defaults apply: AdamW's ``weight_decay`` is 0.01,
not optax's 1e-4) and builds the optax chain that computes the same update:

=========  ==============================================================================
torch      optax
=========  ==============================================================================
SGD        ``add_decayed_weights(wd)`` (L2 into the gradient), ``trace(momentum,
           nesterov)`` (torch's buffer starts at the first gradient, as optax's trace
           from zero does; with ``dampening``, `trace_with_dampening`), ``scale(-lr)``
Adam       ``add_decayed_weights(wd)``, ``scale_by_adam(b1, b2, eps)`` (with torch's
           step count per parameter: `scale_by_adam_per_parameter`), ``scale(-lr)``
AdamW      ``scale_by_adam``, ``add_decayed_weights(wd)`` (decoupled), ``scale(-lr)``:
           ``p - lr * (adam + wd * p)`` is torch's ``p * (1 - lr * wd) - lr * adam``
           (``amsgrad=True``: torch's maximum of the uncorrected second moment)
Adagrad    ``add_decayed_weights(wd)``, `scale_by_adagrad_torch` (``lr_decay``,
           ``initial_accumulator_value``, eps outside the root), ``scale(-lr)``
RMSprop    ``add_decayed_weights(wd)``, ``scale_by_rms`` / ``scale_by_stddev`` (centered)
           with ``eps_in_sqrt=False``, ``trace(momentum)``, ``scale(-lr)``
=========  ==============================================================================

Learning rates (and, for OneCycleLR, the momentum / ``beta1``) are injected per step with
``optax.inject_hyperparams``. ``ReduceLROnPlateau`` is no schedule: the loop's
``scheduler.step(metric)`` changes ``group["lr"]``, which `torchbridge.prepare`'s steps
feed to the next step like a manual change (`HostHyperparams`). ``LambdaLR`` (what
transformers' ``get_*_schedule_with_warmup`` return) is evaluated ahead into a per-step
table. A scheduler is read as stepped once per optimizer step (``scheduler.step()`` after
each ``optimizer.step()``), the usual form; its closed form below matches torch's
recursive one. Parameter groups map to
``optax.multi_transform`` labels by parameter identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from torchbridge.errors import UnsupportedError
from torchbridge.module import NO_GRAD, ModuleSpec, nest

Schedule = Callable[[Any], Any]

_SGD_OK = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}
_ADAM_OK = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"}
_ADAGRAD_OK = {"lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value", "maximize"}
_RMSPROP_OK = {"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize"}
# Options that change speed or memory, not the update.
_IGNORED = {
    "foreach",
    "fused",
    "capturable",
    "differentiable",
    "params",
    "initial_lr",
    "decoupled_weight_decay",
    "max_lr",
    "min_lr",
    "base_momentum",
    "max_momentum",
}


# ----------------------------------------------------------------------------- schedulers
def _lambda_steps(fn: Callable[[int], float], steps: int | None) -> int:
    """How many steps of a LambdaLR lambda to tabulate.

    transformers' ``get_*_schedule_with_warmup`` return ``functools.partial`` objects whose
    keywords say the horizon: ``num_training_steps`` (the schedule ends there) or, for the
    constant-after-warmup ones, only ``num_warmup_steps`` (constant from there on).
    """
    if steps is not None:
        return int(steps)
    keywords = getattr(fn, "keywords", None) or {}
    if "num_training_steps" in keywords:
        return int(keywords["num_training_steps"]) + 1
    if set(keywords) == {"num_warmup_steps"}:
        return int(keywords["num_warmup_steps"]) + 1
    raise UnsupportedError(
        f"torchbridge: LambdaLR's lambda {getattr(fn, '__name__', fn)!r} cannot be evaluated "
        "ahead: its number of steps is unknown. Pass schedule_steps=N (the optimizer steps "
        "you will run) to torchbridge.prepare / to_optax; the lambda is then evaluated for "
        "steps 0..N-1 into a table (steps after N keep the last value)."
    )


def _lambda_lr(scheduler: Any, group: int, pos: SchedulePosition, steps: int | None) -> Schedule:
    """torch's LambdaLR (``base_lr * lambda(step)``) as a table evaluated ahead.

    The lambda is ordinary Python (``if step < warmup:``, ``math.cos``), which JAX cannot
    trace on a step counter; evaluating it on the host for every step it will see keeps
    torch's values (rounded to float32, the update's precision).
    """
    fn = scheduler.lr_lambdas[group]
    count = scheduler.last_epoch + _lambda_steps(fn, steps)  # from step 0: see `resync`
    base = float(scheduler.base_lrs[group])
    values = []
    for n in range(count):
        try:
            values.append(base * float(fn(n)))
        except Exception as e:
            raise UnsupportedError(
                f"torchbridge: LambdaLR's lambda raised {type(e).__name__}: {e} when evaluated "
                f"ahead at step {n}; it must be a pure function of the step number."
            ) from e
    table = jnp.asarray(values, jnp.float32)
    return lambda n: table[jnp.clip(n + pos.offset, 0, count - 1)]


def host_driven(scheduler: Any) -> bool:
    """Whether the scheduler sets ``group["lr"]`` from the loop's metric (ReduceLROnPlateau).

    Its learning rate is no function of the step count: the loop's ``scheduler.step(metric)``
    writes it into the parameter groups, and `HostHyperparams` feeds it to the next step.
    """
    from torch.optim.lr_scheduler import ReduceLROnPlateau

    return isinstance(scheduler, ReduceLROnPlateau)


class SchedulePosition:
    """Where a scheduler given to prepare is read: at the optimizer's count + ``offset``.

    ``offset`` is read when the step traces. At a state that is not the step's own output
    (the first step after prepare, a `jaxcore.Checkpointer` restore), `resync` sets it so
    the schedule stands where torch's would: at ``scheduler.last_epoch`` when the
    scheduler was stepped or loaded (``load_state_dict`` of a resumed script: the restored
    count already holds those steps, which used to be added twice), and at the restored
    count for a fresh one (the checkpoint carries the position). `check` then refuses a
    loop that steps the scheduler at another rate than once per optimizer step (per
    epoch): prepare applies it per step, so the loop's calls were ignored.
    """

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        # Steps taken before prepare (fresh state). ChainedScheduler has no last_epoch;
        # `schedule_of` refuses it by name.
        self.offset = int(getattr(scheduler, "last_epoch", 0))
        self.since = self.offset  # last_epoch when `steps` started counting
        self.steps = 0  # optimizer steps since then

    def resync(self, count: int) -> bool:
        """Re-anchor at a state whose optimizer has taken ``count`` steps; True if the
        offset changed (the step must retrace)."""
        epoch = int(self.scheduler.last_epoch)
        offset = epoch - count if epoch else 0
        self.since, self.steps = epoch, 0
        changed, self.offset = offset != self.offset, offset
        return changed

    def check(self) -> None:
        """Refuse a scheduler the loop steps, but not once per optimizer step."""
        stepped = int(self.scheduler.last_epoch) - self.since
        if stepped in (0, self.steps):
            return
        kind = type(self.scheduler).__name__
        raise UnsupportedError(
            f"torchbridge: the {kind} given to torchbridge.prepare was stepped {stepped} "
            f"time(s) by the loop after {self.steps} optimizer steps. prepare applies it "
            "once per optimizer step inside the step, so a scheduler stepped per epoch (or "
            "at any other rate) would not be followed. For a scheduler you step yourself, "
            "do not pass it to torchbridge.prepare: keep scheduler.step() in the loop, and "
            "each step reads group['lr'] as it sets it, as in torch."
        )


def schedule_of(
    scheduler: Any,
    group: int,
    *,
    schedule_steps: int | None = None,
    position: SchedulePosition | None = None,
) -> tuple[Schedule, Schedule | None]:
    """``(lr(count), beta1_or_momentum(count) or None)`` for one parameter group.

    The schedule is read at ``count + position.offset`` (`SchedulePosition`; by default
    the scheduler's ``last_epoch``, the steps it took before).
    """
    from torch.optim import lr_scheduler as S

    kind = type(scheduler).__name__
    if host_driven(scheduler):
        raise UnsupportedError(
            f"torchbridge: {kind} is not supported by to_optax alone: its learning rate "
            "follows the loop's metric, not the step count. Pass it to torchbridge.prepare, "
            "whose steps read group['lr'] as scheduler.step(metric) sets it, or give prepare "
            "an optax optimizer chained with optax.contrib.reduce_on_plateau."
        )
    supported = (S.StepLR, S.CosineAnnealingLR, S.LinearLR, S.OneCycleLR)
    if not (isinstance(scheduler, supported) or type(scheduler) is S.LambdaLR):
        raise UnsupportedError(
            f"torchbridge: LR scheduler {kind} is not supported by prepare (it evaluates "
            "StepLR, CosineAnnealingLR, LinearLR, OneCycleLR and LambdaLR ahead). Do not "
            "pass it to prepare and call scheduler.step() in the loop as in torch: each "
            "step reads group['lr'] as it sets it. Or pass prepare an optax optimizer whose "
            "learning rate is an optax schedule (optax.join_schedules chains several)."
        )
    if group >= len(scheduler.base_lrs):
        raise UnsupportedError(
            f"torchbridge: parameter group {group} was added to the optimizer after the "
            f"scheduler {kind} was built, so the scheduler has no learning rate for it. "
            "Call add_param_group before building the scheduler."
        )
    pos = position if position is not None else SchedulePosition(scheduler)
    base = float(scheduler.base_lrs[group])

    if isinstance(scheduler, S.StepLR):
        size, gamma = scheduler.step_size, scheduler.gamma
        return lambda n: base * gamma ** ((n + pos.offset) // size), None
    if isinstance(scheduler, S.CosineAnnealingLR):
        t_max, eta_min = scheduler.T_max, scheduler.eta_min
        return (
            lambda n: (
                eta_min + (base - eta_min) * (1 + jnp.cos(jnp.pi * (n + pos.offset) / t_max)) / 2
            )
        ), None
    if isinstance(scheduler, S.LinearLR):
        start, end, total = scheduler.start_factor, scheduler.end_factor, scheduler.total_iters
        return (
            lambda n: base * (start + (end - start) * jnp.minimum(n + pos.offset, total) / total)
        ), None
    if isinstance(scheduler, S.OneCycleLR):
        return _one_cycle(scheduler, group, pos)
    return _lambda_lr(scheduler, group, pos, schedule_steps), None


def _one_cycle(
    scheduler: Any, group: int, pos: SchedulePosition
) -> tuple[Schedule, Schedule | None]:
    """torch's OneCycleLR phases, evaluated in closed form at step ``n``."""
    opt_group = scheduler.optimizer.param_groups[group]
    cos = scheduler._anneal_func_type == "cos"
    phases = scheduler._schedule_phases
    initial, peak, low = opt_group["initial_lr"], opt_group["max_lr"], opt_group["min_lr"]
    values = {"initial_lr": initial, "max_lr": peak, "min_lr": low}
    momenta = {
        "max_momentum": opt_group.get("max_momentum"),
        "base_momentum": opt_group.get("base_momentum"),
    }

    def anneal(start, end, pct):
        if cos:
            return end + (start - end) / 2.0 * (jnp.cos(jnp.pi * pct) + 1)
        return (end - start) * pct + start

    def piecewise(table: dict, start_key: str, end_key: str) -> Schedule:
        # torch picks the first phase whose end_step the step has not passed (the last
        # phase catches the rest); nested `where`s from the last phase inwards do the same.
        bounds, begin = [], 0.0
        for phase in phases:
            bounds.append((begin, float(phase["end_step"]), phase))
            begin = float(phase["end_step"])

        def fn(n):
            step = jnp.asarray(n + pos.offset, jnp.float32)
            out = None
            for begin, end, phase in reversed(bounds):
                pct = (step - begin) / (end - begin)
                val = anneal(table[phase[start_key]], table[phase[end_key]], pct)
                out = val if out is None else jnp.where(step <= end, val, out)
            return out

        return fn

    lr = piecewise(values, "start_lr", "end_lr")
    beta = None
    if scheduler.cycle_momentum:
        beta = piecewise(momenta, "start_momentum", "end_momentum")
    return lr, beta


# ----------------------------------------------------------------------------- optimizers
def _check(kind: str, group: dict, allowed: set[str]) -> None:
    for key, value in group.items():
        if key in allowed or key in _IGNORED:
            continue
        raise UnsupportedError(
            f"torchbridge: {kind} option {key}={value!r} is not supported by the bridge; "
            "leave it at its default or pass prepare an optax transformation instead."
        )


class AdamState(NamedTuple):
    """`scale_by_adam_per_parameter`'s state: each count has its parameter's tree path."""

    count: Any
    mu: Any
    nu: Any


class AMSGradState(NamedTuple):
    """`scale_by_adam_per_parameter(amsgrad=True)`'s state: `AdamState` and the running
    maximum of ``nu`` (torch's ``max_exp_avg_sq``)."""

    count: Any
    mu: Any
    nu: Any
    nu_max: Any


def _counts(params: Any) -> Any:
    return jax.tree.map(lambda _: jnp.zeros([], jnp.int32), params)


def scale_by_adam_per_parameter(
    b1: Any, b2: Any, eps: Any, *, amsgrad: bool = False
) -> optax.GradientTransformation:
    """``optax.scale_by_adam`` with one step count per parameter, as torch keeps it.

    torch's Adam counts steps per parameter (``state["step"]``): a parameter frozen or
    unread for k steps, then trained again, bias-corrects its moments with its own count,
    not the group's. `skip_without_grad` keeps a skipped parameter's count as it keeps its
    moments. The arithmetic is optax's, term for term. ``amsgrad`` is torch's: the running
    maximum of the *uncorrected* second moment, bias-corrected with the current count
    (``optax.scale_by_amsgrad`` takes the maximum of the corrected one, another rule).
    """

    def init(params):
        zeros = optax.tree.zeros_like(params)
        if amsgrad:
            return AMSGradState(_counts(params), zeros, zeros, optax.tree.zeros_like(params))
        return AdamState(count=_counts(params), mu=zeros, nu=optax.tree.zeros_like(params))

    def correct(moment, decay, count):
        return jax.tree.map(lambda t, n: t / (1 - decay**n).astype(t.dtype), moment, count)

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        nu = optax.tree.cast_like(nu, state.nu)
        count = jax.tree.map(optax.safe_increment, state.count)
        second = jax.tree.map(jnp.maximum, state.nu_max, nu) if amsgrad else nu
        updates = jax.tree.map(
            lambda m, v: m / (jnp.sqrt(v) + eps),
            correct(mu, b1, count),
            correct(second, b2, count),
        )
        if amsgrad:
            return updates, AMSGradState(count, mu, nu, second)
        return updates, AdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init, update)


class AdagradState(NamedTuple):
    """`scale_by_adagrad_torch`'s state: torch's per-parameter ``step`` and ``sum``."""

    count: Any
    sum: Any


def scale_by_adagrad_torch(
    lr_decay: Any, eps: Any, initial_accumulator_value: float
) -> optax.GradientTransformation:
    """torch's Adagrad direction: ``g / (sqrt(sum) + eps) / (1 + (step - 1) * lr_decay)``.

    ``optax.scale_by_rss`` puts ``eps`` under the square root and has no ``lr_decay``, so
    torch's rule is written out: ``sum`` starts at ``initial_accumulator_value`` and gains
    ``g**2`` per step; the step count is per parameter (torch's ``state["step"]``).
    """

    def init(params):
        total = jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator_value), params)
        return AdagradState(count=_counts(params), sum=total)

    def update(updates, state, params=None):
        del params
        count = jax.tree.map(optax.safe_increment, state.count)
        total = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        updates = jax.tree.map(
            lambda g, s, n: g / (jnp.sqrt(s) + eps) / (1 + (n - 1) * lr_decay).astype(g.dtype),
            updates,
            total,
            count,
        )
        return updates, AdagradState(count=count, sum=total)

    return optax.GradientTransformation(init, update)


def _torch_rule(direction, learning_rate, weight_decay, *, maximize, decoupled=False):
    """torch's update around an optimizer's ``direction``: the gradient negated
    (``maximize``), L2 weight decay added to it (after the direction when ``decoupled``,
    AdamW's), then ``-lr``."""
    decay = optax.add_decayed_weights(weight_decay)
    parts = [optax.scale(-1.0)] if maximize else []
    parts += [direction, decay] if decoupled else [decay, direction]
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


class DampedTraceState(NamedTuple):
    count: Any  # per parameter: the steps it was given (torch's buffer is None at 0)
    trace: Any


def trace_with_dampening(momentum: Any, dampening: float) -> optax.GradientTransformation:
    """torch's SGD momentum buffer with ``dampening``: the first step's buffer is the
    gradient itself, later ``momentum * buf + (1 - dampening) * g`` (torch.optim.SGD).
    The count is per parameter, as torch's "buffer is None" is: `skip_without_grad` keeps
    a skipped parameter's count and buffer."""

    def init(params):
        return DampedTraceState(_counts(params), optax.tree.zeros_like(params))

    def update(updates, state, params=None):
        del params
        trace = jax.tree.map(
            lambda g, b, n: jnp.where(n == 0, g, momentum * b + (1 - dampening) * g).astype(
                b.dtype
            ),
            updates,
            state.trace,
            state.count,
        )
        count = jax.tree.map(optax.safe_increment, state.count)
        return trace, DampedTraceState(count, trace)

    return optax.GradientTransformation(init, update)


def _sgd(learning_rate, momentum, weight_decay, *, nesterov, maximize, dampening=0.0):
    if dampening:
        direction = trace_with_dampening(momentum, dampening)
    else:
        direction = optax.trace(decay=momentum, nesterov=nesterov)
    return _torch_rule(direction, learning_rate, weight_decay, maximize=maximize)


def _adagrad(learning_rate, lr_decay, eps, weight_decay, *, initial, maximize):
    direction = scale_by_adagrad_torch(lr_decay, eps, initial)
    return _torch_rule(direction, learning_rate, weight_decay, maximize=maximize)


def _rmsprop(learning_rate, alpha, eps, momentum, weight_decay, *, centered, maximize):
    """torch's RMSprop: ``g / (sqrt(square_avg [- grad_avg**2]) + eps)`` (eps outside the
    root: optax's ``eps_in_sqrt=False``), then the momentum buffer (`optax.trace`)."""
    scale = optax.scale_by_stddev if centered else optax.scale_by_rms
    direction = optax.chain(scale(alpha, eps, eps_in_sqrt=False), optax.trace(decay=momentum))
    return _torch_rule(direction, learning_rate, weight_decay, maximize=maximize)


def _adam(learning_rate, b1, b2, eps, weight_decay, *, decoupled, maximize, amsgrad=False):
    direction = scale_by_adam_per_parameter(b1, b2, eps, amsgrad=amsgrad)
    return _torch_rule(
        direction, learning_rate, weight_decay, maximize=maximize, decoupled=decoupled
    )


def _group_transform(
    optimizer: Any, group: dict, lr: Any, beta: Any
) -> optax.GradientTransformation:
    import torch

    kind = type(optimizer).__name__
    maximize = bool(group.get("maximize", False))
    if type(optimizer) is torch.optim.SGD:
        _check(kind, group, _SGD_OK)
        momentum = beta if beta is not None else float(group.get("momentum", 0.0))
        static = ("nesterov", "maximize", "dampening")
        return optax.inject_hyperparams(_sgd, static_args=static)(
            learning_rate=lr,
            momentum=momentum,
            weight_decay=float(group["weight_decay"]),
            nesterov=bool(group.get("nesterov", False)),
            maximize=maximize,
            # torch ignores dampening without momentum (there is no buffer to damp)
            dampening=float(group.get("dampening", 0)) if group.get("momentum", 0) else 0.0,
        )
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        _check(kind, group, _ADAM_OK)
        decoupled = type(optimizer) is torch.optim.AdamW or bool(
            group.get("decoupled_weight_decay", False)
        )
        b1, b2 = group["betas"]
        static = ("decoupled", "maximize", "amsgrad")
        return optax.inject_hyperparams(_adam, static_args=static)(
            learning_rate=lr,
            b1=beta if beta is not None else float(b1),
            b2=float(b2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            decoupled=decoupled,
            maximize=maximize,
            amsgrad=bool(group.get("amsgrad", False)),
        )
    if type(optimizer) is torch.optim.Adagrad:
        _check(kind, group, _ADAGRAD_OK)
        return optax.inject_hyperparams(_adagrad, static_args=("initial", "maximize"))(
            learning_rate=lr,
            lr_decay=float(group["lr_decay"]),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            initial=float(group["initial_accumulator_value"]),
            maximize=maximize,
        )
    if type(optimizer) is torch.optim.RMSprop:
        _check(kind, group, _RMSPROP_OK)
        return optax.inject_hyperparams(_rmsprop, static_args=("centered", "maximize"))(
            learning_rate=lr,
            alpha=float(group["alpha"]),
            eps=float(group["eps"]),
            momentum=beta if beta is not None else float(group["momentum"]),
            weight_decay=float(group["weight_decay"]),
            centered=bool(group["centered"]),
            maximize=maximize,
        )
    raise UnsupportedError(
        f"torchbridge: optimizer {kind} is not supported; use torch.optim.SGD, Adam, AdamW, "
        "Adagrad or RMSprop (or pass an optax transformation)."
    )


def _torch_name(path: tuple) -> str:
    """A parameter's torch name from its path in the nested parameter tree."""
    return ".".join(str(getattr(k, "key", k)) for k in path)


def skip_without_grad(
    inner: optax.GradientTransformation, module: Any
) -> optax.GradientTransformation:
    """``inner``, leaving alone the parameters torch's optimizer skips (``.grad`` is None).

    torch steps only parameters that have a gradient: one the loss never reads (or one
    frozen after prepare) gets no weight decay and keeps its moments. Which ones is known
    when the step traces (`torchbridge.module.NO_GRAD`, recorded by the loss just before
    the update traces), so the mask is static and costs nothing when every parameter has
    a gradient.
    """

    def update(updates, state, params=None):
        new_updates, new_state = inner.update(updates, state, params)
        skipped = NO_GRAD.get(module, frozenset())
        mask = jax.tree_util.tree_map_with_path(
            lambda path, _: _torch_name(path) in skipped, updates
        )
        if not any(jax.tree.leaves(mask)):
            return new_updates, new_state
        shape = jax.tree.structure(updates)

        def keep(new, old):  # per-parameter slots (moments, momentum): the old value
            if jax.tree.structure(new) != shape:
                return new
            return jax.tree.map(lambda n, o, skip: o if skip else n, new, old, mask)

        new_updates = jax.tree.map(
            lambda u, skip: jnp.zeros_like(u) if skip else u, new_updates, mask
        )
        new_state = jax.tree.map(
            keep, new_state, state, is_leaf=lambda x: jax.tree.structure(x) == shape
        )
        return new_updates, new_state

    return optax.GradientTransformation(inner.init, update)


def to_optax(
    optimizer: Any,
    module: Any,
    scheduler: Any | None = None,
    *,
    schedule_steps: int | None = None,
    clip_grad_value: float | None = None,
    position: SchedulePosition | None = None,
) -> optax.GradientTransformation:
    """The optax transformation with the same update as ``optimizer`` (and ``scheduler``).

    ``module`` is the torch module whose parameters the optimizer holds; it maps each
    parameter group (its own lr, weight decay, betas) onto the bridged parameter tree
    through ``optax.multi_transform``. ``schedule_steps`` is how many steps a
    ``LambdaLR`` lambda is evaluated for when its horizon cannot be read from it.
    ``clip_grad_value`` clips every gradient element to ``[-v, v]`` first, what
    ``torch.nn.utils.clip_grad_value_(model.parameters(), v)`` before ``step()`` does
    (the bridged loop has no ``.grad`` for that call to clip). ``position`` is where the
    schedule is read (`SchedulePosition`; `torchbridge.prepare` re-anchors it at a restore).
    """
    if scheduler is not None and position is None:
        position = SchedulePosition(scheduler)
    tx = _to_optax(optimizer, module, scheduler, schedule_steps, position)
    if clip_grad_value is None:
        return tx
    return optax.chain(optax.clip(float(clip_grad_value)), tx)


def _stepped(param_state: dict) -> bool:
    """Whether one parameter's torch optimizer state is more than its constructor's.

    Adagrad builds ``step = 0`` and ``sum = initial_accumulator_value`` in its
    constructor, so a fresh one already has tensors; any state with a positive step, or
    tensors without a step (SGD's ``momentum_buffer``), was stepped or loaded.
    """
    import torch

    if "step" in param_state:
        return float(param_state["step"]) > 0
    return any(torch.is_tensor(v) for v in param_state.values())


def _to_optax(
    optimizer: Any,
    module: Any,
    scheduler: Any | None,
    schedule_steps: int | None,
    position: SchedulePosition | None,
) -> optax.GradientTransformation:
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedError(
            f"to_optax: got {type(optimizer).__name__}; pass a torch.optim optimizer."
        )
    if scheduler is not None and scheduler.optimizer is not optimizer:
        raise UnsupportedError("to_optax: the scheduler belongs to a different optimizer.")
    stateful = [k for st in optimizer.state.values() if _stepped(st) for k in st]
    if stateful:
        raise UnsupportedError(
            f"to_optax: the {type(optimizer).__name__} already holds state "
            f"({sorted(set(stateful))}: it was stepped or loaded with load_state_dict), and "
            "the bridge starts the optimizer from zero, which would not continue that run. "
            "Pass a freshly built optimizer (the module's current weights are kept); to "
            "resume bridged training exactly, save and restore with jaxcore.Checkpointer."
        )
    spec = ModuleSpec.of(module)
    by_id = {id(p): n for n, p in module.named_parameters()}
    labels: dict[str, str] = {}
    transforms = {}
    for i, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in by_id:
                raise UnsupportedError(
                    f"to_optax: parameter group {i} holds a tensor that is not a parameter "
                    "of the module being prepared."
                )
            labels[by_id[id(p)]] = f"group{i}"
        lr, beta = (float(group["lr"]), None)
        if scheduler is not None:
            lr, beta = schedule_of(scheduler, i, schedule_steps=schedule_steps, position=position)
        transforms[f"group{i}"] = skip_without_grad(
            _group_transform(optimizer, group, lr, beta), module
        )
    # Trainable parameters no group holds are not updated (torch would not touch them).
    transforms["frozen"] = optax.set_to_zero()
    label_tree = nest({n: labels.get(n, "frozen") for n in spec.params})
    if len(transforms) == 2 and "frozen" not in label_tree_values(label_tree):
        return transforms["group0"]
    return optax.multi_transform(transforms, label_tree)


def label_tree_values(tree: Any) -> set[str]:
    """The set of labels in a nested label dict."""
    if isinstance(tree, dict):
        out: set[str] = set()
        for v in tree.values():
            out |= label_tree_values(v)
        return out
    return {tree}


# ----------------------------------------------------------------------------- host values
# torch param_group key -> the injected optax hyperparameters it sets.
_FED = {
    "lr": ("learning_rate",),
    "weight_decay": ("weight_decay",),
    "momentum": ("momentum",),
    "betas": ("b1", "b2"),
    "eps": ("eps",),
    "alpha": ("alpha",),
    "lr_decay": ("lr_decay",),
}
Fed = tuple[tuple[str, str, float], ...]


def optimizer_count(opt_state: Any) -> int | None:
    """The optimizer's step count (``inject_hyperparams``' count: what schedules read)."""
    found: list[Any] = []

    def visit(node: Any) -> bool:
        if isinstance(node, optax.InjectStatefulHyperparamsState):
            found.append(node.count)
            return True
        return False

    jax.tree.leaves(opt_state, is_leaf=visit)
    return int(jax.device_get(found[0])) if found else None


class HostHyperparams:
    """The torch optimizer's ``param_groups`` values, written into the optax state per step.

    A training loop that sets ``group["lr"]`` (manual warmup) or ``group["weight_decay"]``
    between steps changes what torch's next ``step()`` uses. The bridged step reads the
    groups on the host before each call and writes the values into the optimizer state's
    injected hyperparameters: a traced input, so nothing recompiles. Values a scheduler
    drives (the learning rate; OneCycleLR's momentum or beta1) come from the schedule.
    """

    def __init__(
        self,
        optimizer: Any,
        scheduler: Any | None = None,
        position: SchedulePosition | None = None,
    ):
        self.optimizer = optimizer
        self.position = position  # where the scheduler given to prepare is read
        self.groups = len(optimizer.param_groups)
        # Whether the loop's latest `optimizer.zero_grad` kept zeroed gradients
        # (set_to_none=False), so torch would still step a parameter that had one.
        self.keeps_grads = False
        self.scheduled: set[str] = set()
        if scheduler is not None and scheduler.optimizer is not optimizer:
            raise UnsupportedError("torchbridge: the scheduler belongs to a different optimizer.")
        if scheduler is not None and not host_driven(scheduler):
            self.scheduled.add("learning_rate")
            if getattr(scheduler, "cycle_momentum", False):
                self.scheduled |= {"momentum", "b1"}

    def read(self) -> Fed:
        """``((label, optax name, value), ...)`` as the parameter groups hold them now."""
        groups = self.optimizer.param_groups
        if len(groups) != self.groups:
            raise UnsupportedError(
                f"torchbridge: the optimizer has {len(groups)} parameter groups, but it had "
                f"{self.groups} when prepared (add_param_group after prepare). Add every "
                "group before torchbridge.prepare."
            )
        out = []
        for i, group in enumerate(groups):
            for key, names in _FED.items():
                if key not in group:
                    continue
                values = group[key] if len(names) > 1 else (group[key],)
                for name, value in zip(names, values, strict=True):
                    if name not in self.scheduled:
                        out.append((f"group{i}", name, float(value)))
        return tuple(out)

    def write(self, opt_state: Any, values: Fed) -> Any:
        """``opt_state`` with ``values`` in its hyperparameters (placed like the old ones)."""
        by_label: dict[str, dict[str, float]] = {}
        for label, name, value in values:
            by_label.setdefault(label, {})[name] = value
        return _write(opt_state, by_label, "group0")


def _write(node: Any, values: dict[str, dict[str, float]], label: str) -> Any:
    if isinstance(node, optax.MultiTransformState):
        inner = {k: _write(v, values, k) for k, v in node.inner_states.items()}
        return node._replace(inner_states=inner)
    if isinstance(node, optax.InjectStatefulHyperparamsState):
        hyper = dict(node.hyperparams)
        for name, value in values.get(label, {}).items():
            if name in hyper:
                old = hyper[name]
                hyper[name] = jax.device_put(np.asarray(value, old.dtype), old.sharding)
        return node._replace(hyperparams=hyper)
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return node._replace(**{f: _write(getattr(node, f), values, label) for f in node._fields})
    if isinstance(node, tuple):
        return tuple(_write(v, values, label) for v in node)
    return node
