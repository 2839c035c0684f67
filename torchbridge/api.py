"""The one-call entry point and a loss helper for torch criteria.

engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), 1e-3))
step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import optax

import jaxcore as jc
from torchbridge.errors import UnsupportedError
from torchbridge.module import BoundModule, bridge, environment, guard_grad_scaler, to_numpy
from torchbridge.optim import HostHyperparams, SchedulePosition, host_driven, to_optax
from torchbridge.sharding import linear_rules_on_conv1d
from torchbridge.step import TorchPlan


def prepare(
    engine: jc.Engine,
    module: Any,
    optimizer: Any,
    scheduler: Any | None = None,
    *,
    train: bool | None = None,
    schedule_steps: int | None = None,
    clip_grad_value: float | None = None,
) -> jc.TrainState:
    """Prepare a torch module and its optimizer (torch or optax) on ``engine``.

    A torch optimizer (and LR scheduler) is mapped to optax with the same update
    (`torchbridge.to_optax`); the module's current weights become the initial parameters.
    ``train`` is `from_torch`'s: ``True`` trains a module left in eval mode in train mode.
    A ``ReduceLROnPlateau`` is stepped by the loop (``scheduler.step(metric)``), which sets
    ``group["lr"]`` for the next step, as in torch.
    ``schedule_steps`` and ``clip_grad_value`` are `to_optax`'s (a ``LambdaLR`` horizon;
    ``torch.nn.utils.clip_grad_value_``, which has no ``.grad`` to clip in a bridged loop).
    The torch optimizer's ``state_dict`` / ``load_state_dict`` then raise: its moments live
    in the `TrainState` (save and resume with ``jaxcore.Checkpointer``); so do
    ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` on the module's parameters
    between steps (`_guard_clipping`: there is no ``.grad`` to clip).
    The engine's train steps then follow the torch loop's host changes between steps:
    ``param_groups`` values (``group["lr"] = ...``), ``requires_grad_`` and
    ``optimizer.zero_grad(set_to_none=False)`` (see `torchbridge.step`). The module keeps
    its weights from before training: its ``state_dict()`` and eager calls warn once steps
    have run, until ``model.load_state_dict(torchbridge.state_dict(state))`` copies the
    trained ones in.
    """
    misnamed = linear_rules_on_conv1d(module, tuple(engine.config.param_rules))
    if misnamed:
        warnings.warn(
            f"torchbridge: {misnamed[:3]} are Conv1D layers (weight (in, out)) but the "
            "engine's param_rules name them as nn.Linear (out, in), which splits the wrong "
            "dimension over 'tensor'. Build the engine with "
            "param_rules=torchbridge.tensor_parallel_rules(model).",
            stacklevel=2,
        )
    if isinstance(optimizer, optax.GradientTransformation):
        if clip_grad_value is not None:
            raise jc.ConfigError(
                "prepare: clip_grad_value goes with a torch optimizer; for optax, chain "
                "optax.clip(v) before it."
            )
        if scheduler is not None:
            raise jc.ConfigError(
                "prepare: a scheduler goes with a torch optimizer; for optax, pass a "
                "schedule as its learning rate."
            )
        tx, hyperparams = optimizer, None
    else:
        scheduled = None if host_driven(scheduler) else scheduler
        position = None if scheduled is None else SchedulePosition(scheduled)
        tx = to_optax(
            optimizer,
            module,
            scheduled,
            schedule_steps=schedule_steps,
            clip_grad_value=clip_grad_value,
            position=position,
        )
        hyperparams = HostHyperparams(optimizer, scheduler, position)
        _refuse_state_dicts(optimizer)
        optimizer.zero_grad = functools.partial(_zero_grad, hyperparams)
    _guard_clipping(module)
    guard_grad_scaler()
    model = bridge(module, train=train)
    plan = TorchPlan.of(engine.plan(model.adapter(), tx), model, hyperparams)
    engine.last_plan = plan
    return plan.init()


def _state_dict_refused(name: str, *args: Any, **kwargs: Any) -> Any:
    raise UnsupportedError(
        f"torchbridge: optimizer.{name}() on a prepared optimizer: the bridged run's "
        "optimizer moments (and weights) live in the TrainState, not in the torch objects, "
        "so this would save or load none of them. Save and resume with jaxcore.Checkpointer "
        "(exact), and get the weights with torchbridge.state_dict(state)."
    )


def _refuse_state_dicts(optimizer: Any) -> None:
    """Make a prepared torch optimizer's (empty) state dicts raise instead of misleading."""
    for name in ("state_dict", "load_state_dict"):
        setattr(optimizer, name, functools.partial(_state_dict_refused, name))


# Parameters of prepared modules, by id (a weak reference checks it is still the same one;
# tensors compare elementwise, so they cannot be members of a WeakSet).
_PREPARED: dict[int, weakref.ref] = {}
_CLIPS = (("clip_grad_norm_", "norm"), ("clip_grad_norm", "norm"), ("clip_grad_value_", "value"))


def _guard_clipping(module: Any) -> None:
    """Make ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` raise on this module.

    A bridged step computes the gradients and applies the update inside one jitted call, so
    between two steps the parameters have no ``.grad``: torch's clip would return a norm of
    0 and clip nothing, silently. Taking the call as "clip the next steps" cannot be torch's
    either: the step that already ran was unclipped, and the returned norm would not be the
    norm of any gradient torch would have computed there. So the call raises, naming the
    setting that clips inside the step. Only a call on a prepared module's parameters none
    of which has a ``.grad`` raises; any other (an eager torch loop) is torch's own.
    """
    import torch.nn.utils
    import torch.nn.utils.clip_grad

    for p in module.parameters():
        key = id(p)
        _PREPARED[key] = weakref.ref(p, functools.partial(_forget, key))
    for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
        for name, kind in _CLIPS:
            original = getattr(owner, name, None)
            if original is not None and not getattr(original, "_torchbridge_guard", False):
                setattr(owner, name, _clip_guard(name, kind, original))


def _forget(key: int, _: Any) -> None:
    _PREPARED.pop(key, None)


def _clip_guard(name: str, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    @functools.wraps(original)
    def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        prepared = any((ref := _PREPARED.get(id(p))) is not None and ref() is p for p in params)
        if prepared and all(p.grad is None for p in params):
            raise UnsupportedError(_clip_message(name, kind, original, args, kwargs))
        return original(params, *args, **kwargs)

    clip._torchbridge_guard = True  # type: ignore[attr-defined]
    return clip


def _clip_message(
    name: str, kind: str, original: Callable[..., Any], args: tuple, kwargs: dict
) -> str:
    import inspect

    bound = inspect.signature(original).bind_partial(None, *args, **kwargs).arguments
    head = (
        f"torchbridge: torch.nn.utils.{name} on a prepared module's parameters would clip "
        "nothing: the bridged step computes and applies the gradients in one jitted call, "
        "so no .grad exists between steps. "
    )
    if kind == "value":
        v = bound.get("clip_value")
        return head + f"Pass torchbridge.prepare(..., clip_grad_value={v}) instead."
    max_norm, norm_type = bound.get("max_norm"), float(bound.get("norm_type", 2.0))
    fix = f"Build the engine with jc.Engine(clip_grad_norm={max_norm}) instead"
    if norm_type != 2.0:
        return head + (
            f"norm_type={norm_type} is not supported: the engine clips by the global L2 "
            f"norm ({fix}, which is norm_type=2)."
        )
    return head + (
        f"{fix} (torch's L2 formula, max_norm / (norm + 1e-6)); the norm before clipping "
        "is metrics['grad_norm']."
    )


def _zero_grad(hyperparams: HostHyperparams, set_to_none: bool = True) -> None:
    """A prepared optimizer's ``zero_grad``: torch's, and its ``set_to_none`` recorded.

    With ``set_to_none=False`` torch keeps a zeroed ``.grad`` on every parameter that had
    one, so its optimizer still steps those (momentum, weight decay) when they are frozen
    or unread later; the bridged step follows (`torchbridge.step`).
    """
    type(hyperparams.optimizer).zero_grad(hyperparams.optimizer, set_to_none)
    hyperparams.keeps_grads = not set_to_none


def loss(
    criterion: Callable[..., Any], *, inputs: Any = 0, target: Any = 1
) -> Callable[[BoundModule, Any, jax.Array | None], tuple[jax.Array, dict]]:
    """An engine loss function from a torch criterion, e.g. ``nn.CrossEntropyLoss()``.

    ``batch[inputs]`` goes through the model and ``criterion(output, batch[target])``
    runs in torch ops on JAX; the step's key reaches the model's dropout.
    """

    def run(module, x, y):
        own = _criterion_tensors(criterion)
        if not own:
            return criterion(module(x), y)
        from torch.nn.utils import stateless

        # The criterion's own tensors (CrossEntropyLoss(weight=...), BCEWithLogitsLoss's
        # pos_weight) as the step's constants: torch CPU tensors cannot mix with the
        # module's JAX ones (torchax's "mixed math between XLATensor and torch.Tensor").
        with stateless._reparametrize_module(criterion, environment().j2t_iso(own)):
            return criterion(module(x), y)

    def loss_fn(model: BoundModule, batch: Any, rng: jax.Array | None):
        try:
            x, y = batch[inputs], batch[target]
        except (KeyError, IndexError, TypeError) as e:
            keys = sorted(batch) if isinstance(batch, dict) else f"a {type(batch).__name__}"
            raise jc.BatchError(
                f"torchbridge.loss(inputs={inputs!r}, target={target!r}): the batch has no "
                f"such entries (it is {keys}); name its keys, e.g. "
                "torchbridge.loss(criterion, inputs='x', target='y') for a dict batch, or "
                "write a loss function that unpacks it."
            ) from e
        value = model.call(run, x, y, rng=rng)
        return value, {}

    return loss_fn


def _criterion_tensors(criterion: Any) -> dict[str, Any]:
    """A torch criterion module's parameters and buffers, as JAX arrays (none: ``{}``)."""
    import itertools

    import torch

    if not isinstance(criterion, torch.nn.Module):
        return {}
    own = itertools.chain(criterion.named_parameters(), criterion.named_buffers())
    return {name: jax.numpy.asarray(to_numpy(t)) for name, t in own}
