"""The eval step runs a model in evaluation mode: dropout off, BatchNorm from its running
statistics, as ``model.eval()`` does in plain Flax NNX (and ``module.eval()`` in torch).

It ran the model as built, in training mode: the eval loss of a model with dropout and
BatchNorm was a dropout sample normalised by the eval batch's own statistics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore as jc


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.fc2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.drop(nnx.relu(self.bn(self.fc1(x)))))


def loss_fn(model, batch, rng):
    del rng
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


@pytest.fixture(scope="module")
def trained():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)
    state = engine.prepare(Net, optax.adamw(1e-2))
    step = engine.train_step(loss_fn)
    rng = np.random.default_rng(0)
    batch = {
        "x": rng.normal(2.0, 3.0, size=(16, 6)).astype(np.float32),
        "y": rng.integers(0, 3, 16).astype(np.int32),
    }
    for _ in range(3):
        state, _ = step(state, batch)
    return engine, state, batch


def _plain_eval_loss(state, batch) -> float:
    """The oracle: a plain NNX model on one device with the state's arrays, in eval mode."""
    model = Net(nnx.Rngs(0))
    _, params, rest = nnx.split(model, nnx.Param, ...)
    one_device = lambda t: jax.device_put(t, jax.devices()[0])
    nnx.replace_by_pure_dict(params, one_device(state.params))
    nnx.replace_by_pure_dict(rest, one_device(state.model_state))
    nnx.update(model, params, rest)
    model.eval()
    return float(loss_fn(model, jax.tree.map(jnp.asarray, batch), None)[0])


def test_eval_step_uses_running_statistics_and_no_dropout(trained):
    engine, state, batch = trained
    assert np.abs(np.asarray(state.model_state["bn"]["mean"])).max() > 0.05  # stats moved
    got = float(engine.eval_step(loss_fn)(state, batch)["loss"])
    assert got == pytest.approx(_plain_eval_loss(state, batch), rel=1e-5)


def test_training_steps_still_train_in_training_mode(trained):
    """Eval mode is the eval step's alone: the train step keeps dropout and batch stats."""
    engine, state, batch = trained
    before = np.asarray(state.model_state["bn"]["mean"])
    state, metrics = engine.train_step(loss_fn)(state, batch)
    assert not np.allclose(np.asarray(state.model_state["bn"]["mean"]), before)
    assert float(metrics["loss"]) != pytest.approx(_plain_eval_loss(state, batch), rel=1e-3)


def test_bind_for_evaluation_gives_a_model_in_eval_mode(trained):
    engine, state, _ = trained
    model = engine.last_plan.bind(state, evaluation=True)
    assert model.drop.deterministic and model.bn.use_running_average
    model = engine.last_plan.bind(state)
    assert not model.drop.deterministic and not model.bn.use_running_average
