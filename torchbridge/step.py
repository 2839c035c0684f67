"""The plan and train step `torchbridge.prepare` leaves on the engine: torch's host side.

A torch training loop changes the run between steps on the host: ``group["lr"] = ...``
(manual warmup), ``p.requires_grad_(False)``. `TorchTrainStep` applies those before each
call of the jitted step, which itself is jaxcore's unchanged:

- the optimizer's ``param_groups`` values go into the optax state's injected
  hyperparameters (`torchbridge.optim.HostHyperparams`), a traced input;
- a change in which parameters are frozen retraces the step once, so the frozen ones get
  no gradient and the optimizer skips them (`torchbridge.optim.skip_without_grad`), as
  torch skips a ``.grad`` of None. After ``optimizer.zero_grad(set_to_none=False)``, a
  parameter that had a gradient keeps a zeroed one, and torch's optimizer still steps it
  (momentum, weight decay): the step follows whichever the loop's last call asked for;
- so does ``model.eval()`` / ``model.train()``: training steps run in the module's mode
  (dropout off after ``eval()``), as torch's would, unless ``prepare(train=...)`` fixed it.

Batches may hold torch tensors (a ``DataLoader``'s own batches, a ``BatchEncoding``): they
become NumPy first. ``labels`` is not held to the engine's token-id contract (2-d integer
ids): a torch head's target may be class ids ``(batch,)`` or floats (regression); and
token ids may have more than two dimensions, ``(batch, ..., length)`` (multiple choice).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxcore.batch_checks import BatchChecker
from jaxcore.plan import TrainPlan
from jaxcore.state import TrainState
from jaxcore.step import LossFn, TrainStep
from torchbridge.data import numpy_tree
from torchbridge.errors import UnsupportedError
from torchbridge.module import TorchModel
from torchbridge.optim import Fed, HostHyperparams, optimizer_count


@dataclasses.dataclass(frozen=True, eq=False)
class TorchPlan(TrainPlan):
    """A `TrainPlan` for a bridged torch module; its train steps are `TorchTrainStep`s.

    Attributes:
        torch_model: the bridged module.
        hyperparams: the torch optimizer's values fed per step (``None``: an optax one).
    """

    torch_model: TorchModel | None = dataclasses.field(default=None, repr=False)
    hyperparams: HostHyperparams | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def of(cls, plan: TrainPlan, model: TorchModel, hyperparams: HostHyperparams | None):
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(TrainPlan)}
        contract = fields["checker"].contract
        token_keys = tuple(k for k in contract.token_keys if k != "labels")
        fields["checker"] = BatchChecker(
            dataclasses.replace(contract, token_keys=token_keys, tokens_2d=False)
        )
        return cls(**fields, torch_model=model, hyperparams=hyperparams)

    def train_step(self, loss_fn: LossFn) -> TrainStep:
        """`TrainPlan.train_step`, with the torch optimizer's and module's host changes."""
        return TorchTrainStep(self, loss_fn)

    def shard_batch(self, batch: Any) -> Any:
        """`TrainPlan.shard_batch`, taking torch tensors and ``BatchEncoding``s too."""
        return super().shard_batch(numpy_tree(batch))

    def _as_global(self, batch: Any, checker: BatchChecker) -> Any:
        return super()._as_global(numpy_tree(batch), checker)


class TorchTrainStep(TrainStep):
    """A `TrainStep` that first applies what the torch loop changed on the host."""

    def __init__(self, plan: TorchPlan, loss_fn: LossFn):
        super().__init__(plan, loss_fn)
        self._fed: Fed = ()
        self._host: tuple = ()  # frozen parameters and modes before this call
        self._traced: tuple | None = None  # those, and the skipped ones, at the last trace

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        out = super().__call__(state, batch)
        model = self.plan.torch_model
        self._traced = (*self._host, model.skipped())
        model.stepped()
        hyper = self.plan.hyperparams
        if hyper is not None:
            # torch's schedulers warn "lr_scheduler.step() before optimizer.step()" unless
            # the optimizer's step ran; this step is that optimizer step.
            hyper.optimizer._opt_called = True
            if hyper.position is not None:
                hyper.position.steps += 1
        return out

    def before_step(self, state: TrainState, *, own: bool) -> TrainState:
        """Retrace if the module's modes or frozen parameters changed; feed param_groups."""
        self._check_host_changes()
        hyper = self.plan.hyperparams
        if hyper is None:
            return state
        position = hyper.position
        if position is not None and not own:  # prepare or a restore: where torch stands
            if position.resync(optimizer_count(state.opt_state) or 0):
                self.jitted.clear_cache()
        elif position is not None:
            position.check()  # a loop stepping the prepared scheduler per epoch
        values = hyper.read()
        # Only what changed since the last call, unless the state is not this step's own
        # output (a restored or re-prepared one): then every value.
        changed = tuple(v for v in values if v not in self._fed) if own else values
        self._fed = values
        if not changed:
            return state
        return state.replace(opt_state=hyper.write(state.opt_state, changed))

    def _check_host_changes(self) -> None:
        """Retrace when ``requires_grad``, the train/eval modes or the skipped parameters
        (``zero_grad(set_to_none=False)`` keeps a ``.grad``) changed since the trace."""
        model = self.plan.torch_model
        frozen = model.frozen_now()
        if frozen and self.plan.hyperparams is None:
            raise UnsupportedError(
                f"torchbridge: parameters {sorted(frozen)[:5]} were frozen "
                "(requires_grad_(False)) after prepare, and the optax optimizer given to "
                "prepare would still update them (weight decay, momentum). Freeze them "
                "before torchbridge.prepare, or prepare with the torch optimizer."
            )
        hyper = self.plan.hyperparams
        model.carry = model.had_grad if hyper is not None and hyper.keeps_grads else frozenset()
        self._host = (frozen, tuple(m.training for m in model.module.modules()))
        if self._traced is not None and self._traced != (*self._host, model.skipped()):
            self.jitted.clear_cache()
