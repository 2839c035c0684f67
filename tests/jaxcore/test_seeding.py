"""`seed_everything` reproduces runs; the train state's key reproduces dropout on restart."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.seeding import process_key, seed_everything

from .helpers import CFG, SEQ, factory


def draws(seed, **kw):
    key = seed_everything(seed, **kw)
    return random.random(), float(np.random.rand()), float(jax.random.normal(key))


def test_same_seed_same_numbers_everywhere():
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    # One process: the per-process key is the key folded with process index 0.
    key = seed_everything(7, per_process=True)
    assert jnp.array_equal(
        jax.random.key_data(key), jax.random.key_data(jax.random.fold_in(jax.random.key(7), 0))
    )
    assert jnp.array_equal(
        jax.random.key_data(process_key(jax.random.key(3))),
        jax.random.key_data(jax.random.fold_in(jax.random.key(3), jax.process_index())),
    )


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_seed_is_a_config_error(bad):
    with pytest.raises(jc.ConfigError, match="seed"):
        seed_everything(bad)


def dropout_loss(model, batch, rng):
    """lm_loss on dropped-out logits: the loss depends on the step's key."""
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1])
    keep = jax.random.bernoulli(rng, 0.8, logits.shape)
    logits = jnp.where(keep, logits / 0.8, 0.0)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss, {}


def to_host(state):
    return jax.device_get(state.replace(rng=jax.random.key_data(state.rng)))


def to_device(engine, saved):
    restored = jax.device_put(saved, engine.state_shardings)
    return restored.replace(rng=jax.random.wrap_key_data(restored.rng))


@pytest.fixture(scope="module")
def setup():
    """One engine and step; initial states for seeds 1 and 2 kept on the host."""
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1], zero=0)
    initial = {s: to_host(engine.prepare(factory, optax.adamw(1e-3), seed=s)) for s in (1, 2)}
    return engine, engine.train_step(dropout_loss), initial


def run(setup, seed, steps=4, *, restart_at=None):
    engine, step, initial = setup
    seed_everything(seed)
    # Data from NumPy's global generator: seed_everything must fix it too.
    batches = [
        {"tokens": np.random.randint(0, CFG.vocab_size, (4, SEQ + 1)).astype(np.int32)}
        for _ in range(steps)
    ]
    state = to_device(engine, initial[seed])
    losses = []
    for i, b in enumerate(batches):
        if i == restart_at:
            # A "restart": the state goes to the host (as a checkpoint would) and back.
            saved = to_host(state)
            del state
            state = to_device(engine, saved)
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return losses


def test_two_runs_are_identical_and_restart_keeps_dropout(setup):
    first = run(setup, seed=1)
    assert run(setup, seed=1) == first
    assert run(setup, seed=2) != first
    assert run(setup, seed=1, restart_at=2) == first
    # The first step's loss depends only on the parameters and the state's key: with the
    # same parameters and another key, dropout (and so the loss) differs.
    engine, step, initial = setup
    b = {"tokens": np.zeros((4, SEQ + 1), np.int32)}
    _, same = step(to_device(engine, initial[1]), b)
    other_key = initial[1].replace(rng=np.asarray(jax.random.key_data(jax.random.key(99))))
    _, other = step(to_device(engine, other_key), b)
    _, again = step(to_device(engine, initial[1]), b)
    assert float(same["loss"]) == float(again["loss"])
    assert float(same["loss"]) != float(other["loss"])
