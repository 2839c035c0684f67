"""torch optimizers and LR schedulers as optax transformations with the same update rule.

`to_optax(optimizer, module, scheduler=None)` reads the hyperparameters out of a built
``torch.optim`` optimizer (so torch's defaults apply: AdamW's ``weight_decay`` is 0.01,
not optax's 1e-4) and builds the optax chain that computes the same update:

=========  ==============================================================================
torch      optax
=========  ==============================================================================
SGD        ``add_decayed_weights(wd)`` (L2 into the gradient), ``trace(momentum,
           nesterov)`` (torch's buffer starts at the first gradient, as optax's trace
           from zero does), ``scale(-lr)``
Adam       ``add_decayed_weights(wd)``, ``scale_by_adam(b1, b2, eps)``, ``scale(-lr)``
AdamW      ``scale_by_adam``, ``add_decayed_weights(wd)`` (decoupled), ``scale(-lr)``:
           ``p - lr * (adam + wd * p)`` is torch's ``p * (1 - lr * wd) - lr * adam``
=========  ==============================================================================

Learning rates (and, for OneCycleLR, the momentum / ``beta1``) are injected per step with
``optax.inject_hyperparams``. ``LambdaLR`` (what transformers' ``get_*_schedule_with_warmup``
return) is evaluated ahead into a per-step table. A scheduler is read as stepped once per
optimizer step (``scheduler.step()`` after each ``optimizer.step()``), the usual form;
its closed form below matches torch's recursive one. Parameter groups map to
``optax.multi_transform`` labels by parameter identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import optax

from torchbridge.errors import UnsupportedError
from torchbridge.module import DECAYED, ModuleSpec, nest

Schedule = Callable[[Any], Any]

_SGD_OK = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"}
_ADAM_OK = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"}
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


def _lambda_lr(scheduler: Any, group: int, offset: int, steps: int | None) -> Schedule:
    """torch's LambdaLR (``base_lr * lambda(step)``) as a table evaluated ahead.

    The lambda is ordinary Python (``if step < warmup:``, ``math.cos``), which JAX cannot
    trace on a step counter; evaluating it on the host for every step it will see keeps
    torch's values (rounded to float32, the update's precision).
    """
    fn = scheduler.lr_lambdas[group]
    count = _lambda_steps(fn, steps)
    base = float(scheduler.base_lrs[group])
    values = []
    for n in range(offset, offset + count):
        try:
            values.append(base * float(fn(n)))
        except Exception as e:
            raise UnsupportedError(
                f"torchbridge: LambdaLR's lambda raised {type(e).__name__}: {e} when evaluated "
                f"ahead at step {n}; it must be a pure function of the step number."
            ) from e
    table = jnp.asarray(values, jnp.float32)
    return lambda n: table[jnp.minimum(n, count - 1)]


def schedule_of(
    scheduler: Any, group: int, *, schedule_steps: int | None = None
) -> tuple[Schedule, Schedule | None]:
    """``(lr(count), beta1_or_momentum(count) or None)`` for one parameter group."""
    from torch.optim import lr_scheduler as S

    kind = type(scheduler).__name__
    supported = (S.StepLR, S.CosineAnnealingLR, S.LinearLR, S.OneCycleLR)
    if not (isinstance(scheduler, supported) or type(scheduler) is S.LambdaLR):
        raise UnsupportedError(
            f"torchbridge: LR scheduler {kind} is not supported; use StepLR, "
            "CosineAnnealingLR, LinearLR, OneCycleLR or LambdaLR, or pass prepare an optax "
            "optimizer whose learning rate is an optax schedule (optax.join_schedules "
            "chains several)."
        )
    if group >= len(scheduler.base_lrs):
        raise UnsupportedError(
            f"torchbridge: parameter group {group} was added to the optimizer after the "
            f"scheduler {kind} was built, so the scheduler has no learning rate for it. "
            "Call add_param_group before building the scheduler."
        )
    offset = scheduler.last_epoch  # steps already taken before prepare
    base = float(scheduler.base_lrs[group])

    if isinstance(scheduler, S.StepLR):
        size, gamma = scheduler.step_size, scheduler.gamma
        return lambda n: base * gamma ** ((n + offset) // size), None
    if isinstance(scheduler, S.CosineAnnealingLR):
        t_max, eta_min = scheduler.T_max, scheduler.eta_min
        return (
            lambda n: eta_min + (base - eta_min) * (1 + jnp.cos(jnp.pi * (n + offset) / t_max)) / 2
        ), None
    if isinstance(scheduler, S.LinearLR):
        start, end, total = scheduler.start_factor, scheduler.end_factor, scheduler.total_iters
        return (
            lambda n: base * (start + (end - start) * jnp.minimum(n + offset, total) / total)
        ), None
    if isinstance(scheduler, S.OneCycleLR):
        return _one_cycle(scheduler, group, offset)
    return _lambda_lr(scheduler, group, offset, schedule_steps), None


def _one_cycle(scheduler: Any, group: int, offset: int) -> tuple[Schedule, Schedule | None]:
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
            step = jnp.asarray(n + offset, jnp.float32)
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


def _sgd(learning_rate, momentum, weight_decay, *, nesterov, maximize):
    parts = [optax.scale(-1.0)] if maximize else []
    parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.trace(decay=momentum, nesterov=nesterov))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def _adam(learning_rate, b1, b2, eps, weight_decay, *, decoupled, maximize):
    parts = [optax.scale(-1.0)] if maximize else []
    if not decoupled:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.scale_by_adam(b1=b1, b2=b2, eps=eps))
    if decoupled:
        parts.append(optax.add_decayed_weights(weight_decay))
    parts.append(optax.scale_by_learning_rate(learning_rate))
    return optax.chain(*parts)


def _group_transform(
    optimizer: Any, group: dict, lr: Any, beta: Any
) -> optax.GradientTransformation:
    import torch

    kind = type(optimizer).__name__
    maximize = bool(group.get("maximize", False))
    if type(optimizer) is torch.optim.SGD:
        _check(kind, group, _SGD_OK)
        if group.get("dampening", 0):
            raise UnsupportedError(
                f"torchbridge: SGD dampening={group['dampening']} is not supported; use 0."
            )
        momentum = beta if beta is not None else float(group.get("momentum", 0.0))
        return optax.inject_hyperparams(_sgd, static_args=("nesterov", "maximize"))(
            learning_rate=lr,
            momentum=momentum,
            weight_decay=float(group["weight_decay"]),
            nesterov=bool(group.get("nesterov", False)),
            maximize=maximize,
        )
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        _check(kind, group, _ADAM_OK)
        if group.get("amsgrad"):
            raise UnsupportedError(
                f"torchbridge: {kind}(amsgrad=True) is not supported; use amsgrad=False, or "
                "pass prepare an optax transformation (optax.amsgrad)."
            )
        decoupled = type(optimizer) is torch.optim.AdamW or bool(
            group.get("decoupled_weight_decay", False)
        )
        b1, b2 = group["betas"]
        return optax.inject_hyperparams(_adam, static_args=("decoupled", "maximize"))(
            learning_rate=lr,
            b1=beta if beta is not None else float(b1),
            b2=float(b2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            decoupled=decoupled,
            maximize=maximize,
        )
    raise UnsupportedError(
        f"torchbridge: optimizer {kind} is not supported; use torch.optim.SGD, Adam or AdamW "
        "(or pass an optax transformation)."
    )


def to_optax(
    optimizer: Any,
    module: Any,
    scheduler: Any | None = None,
    *,
    schedule_steps: int | None = None,
) -> optax.GradientTransformation:
    """The optax transformation with the same update as ``optimizer`` (and ``scheduler``).

    ``module`` is the torch module whose parameters the optimizer holds; it maps each
    parameter group (its own lr, weight decay, betas) onto the bridged parameter tree
    through ``optax.multi_transform``. ``schedule_steps`` is how many steps a
    ``LambdaLR`` lambda is evaluated for when its horizon cannot be read from it.
    """
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedError(
            f"to_optax: got {type(optimizer).__name__}; pass a torch.optim optimizer."
        )
    if scheduler is not None and scheduler.optimizer is not optimizer:
        raise UnsupportedError("to_optax: the scheduler belongs to a different optimizer.")
    stateful = [k for st in optimizer.state.values() for k, v in st.items() if torch.is_tensor(v)]
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
    decayed: set[str] = set()
    transforms = {}
    for i, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in by_id:
                raise UnsupportedError(
                    f"to_optax: parameter group {i} holds a tensor that is not a parameter "
                    "of the module being prepared."
                )
            labels[by_id[id(p)]] = f"group{i}"
            if float(group.get("weight_decay", 0.0)):
                decayed.add(by_id[id(p)])
        lr, beta = (float(group["lr"]), None)
        if scheduler is not None:
            lr, beta = schedule_of(scheduler, i, schedule_steps=schedule_steps)
        transforms[f"group{i}"] = _group_transform(optimizer, group, lr, beta)
    DECAYED[module] = frozenset(decayed)
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
