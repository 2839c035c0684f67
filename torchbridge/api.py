"""The one-call entry point and a loss helper for torch criteria.

engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), 1e-3))
step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import optax

import jaxcore as jc
from torchbridge.module import BoundModule, from_torch
from torchbridge.optim import to_optax
from torchbridge.sharding import linear_rules_on_conv1d


def prepare(
    engine: jc.Engine,
    module: Any,
    optimizer: Any,
    scheduler: Any | None = None,
    *,
    train: bool | None = None,
    schedule_steps: int | None = None,
) -> jc.TrainState:
    """Prepare a torch module and its optimizer (torch or optax) on ``engine``.

    A torch optimizer (and LR scheduler) is mapped to optax with the same update
    (`torchbridge.to_optax`); the module's current weights become the initial parameters.
    ``train`` is `from_torch`'s: ``True`` trains a module left in eval mode in train mode.
    ``schedule_steps`` is `to_optax`'s, for a ``LambdaLR`` whose horizon it cannot read.
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
        if scheduler is not None:
            raise jc.ConfigError(
                "prepare: a scheduler goes with a torch optimizer; for optax, pass a "
                "schedule as its learning rate."
            )
        tx = optimizer
    else:
        tx = to_optax(optimizer, module, scheduler, schedule_steps=schedule_steps)
    return engine.prepare(from_torch(module, train=train), tx)


def loss(
    criterion: Callable[..., Any], *, inputs: Any = 0, target: Any = 1
) -> Callable[[BoundModule, Any, jax.Array | None], tuple[jax.Array, dict]]:
    """An engine loss function from a torch criterion, e.g. ``nn.CrossEntropyLoss()``.

    ``batch[inputs]`` goes through the model and ``criterion(output, batch[target])``
    runs in torch ops on JAX; the step's key reaches the model's dropout.
    """

    def run(module, x, y):
        return criterion(module(x), y)

    def loss_fn(model: BoundModule, batch: Any, rng: jax.Array | None):
        value = model.call(run, batch[inputs], batch[target], rng=rng)
        return value, {}

    return loss_fn
