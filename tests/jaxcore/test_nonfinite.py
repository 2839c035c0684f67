"""The non-finite guard: injected NaN/inf in the loss or in one gradient leaf.

Faults are injected deterministically through the batch: ``factor`` multiplies the loss,
``poison`` turns the gradient of one parameter (``final_norm``) into NaN in the backward
pass (a custom VJP), leaving the loss finite.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import factory, host, make_batch

PARALLEL = dict(parallel=jc.ParallelConfig(fsdp=2), devices=jax.devices()[:2])


@jax.custom_vjp
def _poison_grad(x, flag):
    return x


def _poison_fwd(x, flag):
    return x, flag


def _poison_bwd(flag, g):
    return jnp.where(flag > 0, jnp.nan, 1.0) * g, jnp.zeros_like(flag)


_poison_grad.defvjp(_poison_fwd, _poison_bwd)


def faulty_loss(model, batch, rng):
    model.final_norm[...] = _poison_grad(model.final_norm[...], batch["poison"][0])
    loss, aux = lm_loss(model, {"tokens": batch["tokens"]}, rng)
    return loss * batch["factor"][0], aux


def batch(factor=1.0, poison=0.0, seed=0):
    return {
        **make_batch(4, seed),
        "factor": np.full((4,), factor, np.float32),
        "poison": np.full((4,), poison, np.float32),
    }


def _setup(**fields):
    engine = jc.Engine(**PARALLEL, **fields)
    plan = engine.plan(factory, optax.adamw(1e-2))
    return plan.init(), plan.train_step(faulty_loss)


def _equal(a, b) -> bool:
    return all(
        np.array_equal(x, y, equal_nan=True)
        for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b)), strict=True)
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("fault", ["nan_loss", "inf_loss", "nan_grad_leaf"])
def test_skip_keeps_the_state_bit_identical_and_counts(precision, fault):
    state, step = _setup(precision=precision)
    state, _ = step(state, batch())
    before = host((state.params, state.opt_state, state.model_state))
    bad = {
        "nan_loss": batch(factor=np.nan),
        "inf_loss": batch(factor=np.inf),
        "nan_grad_leaf": batch(poison=1.0),
    }[fault]
    state, m = step(state, bad)
    assert _equal((state.params, state.opt_state, state.model_state), before)
    assert int(m["skipped"]) == 1 and int(m["consecutive_skips"]) == 1
    assert int(state.step) == 2
    if fault == "nan_grad_leaf":
        assert np.isfinite(float(m["loss"])) and np.isnan(float(m["grad_norm"]))
    state, m = step(state, batch(seed=1))
    assert not _equal(state.params, before[0]), "a clean step updates again"
    assert int(m["skipped"]) == 1 and int(m["consecutive_skips"]) == 0
    step.check()


def test_raise_policy_raises_with_the_step():
    state, step = _setup(nonfinite="raise")
    state, _ = step(state, batch())
    good = host(state.params)
    state, _ = step(state, batch(factor=np.nan))  # step 2 is the bad one
    with pytest.raises(jc.TrainingDivergedError) as err:
        step.check()
    assert err.value.step == 2 and "step 2" in str(err.value)
    assert "nonfinite='skip'" in str(err.value)
    assert _equal(err.value.state.params, good)


def test_raise_surfaces_within_two_calls_without_check():
    state, step = _setup(nonfinite="raise")
    with pytest.raises(jc.TrainingDivergedError) as err:
        # Step 1 raises at its own call when its result is already ready (a quiet machine),
        # else at one of the next two: the poll never blocks. Either is within two calls.
        state, _ = step(state, batch(factor=np.nan))
        for seed in range(2):
            state, _ = step(state, batch(seed=seed))
    assert err.value.step == 1


def test_eleven_consecutive_nan_steps_raise_under_skip():
    state, step = _setup()  # skip, max_consecutive_skips=10
    for _ in range(10):
        state, m = step(state, batch(factor=np.nan))
    step.check()  # ten in a row are tolerated
    assert int(m["consecutive_skips"]) == 10
    state, m = step(state, batch(factor=np.nan))
    with pytest.raises(jc.TrainingDivergedError) as err:
        step.check()
    assert err.value.step == 11 and "11 consecutive" in str(err.value)
    assert int(m["skipped"]) == 11


@pytest.mark.parametrize("at_min_scale", [False, True])
def test_fp16_overflow_counts_only_at_the_minimum_scale(at_min_scale):
    # A gradient overflow with a finite loss is the loss scaler's business while the scale
    # can still shrink; at the minimum scale it is divergence like any other.
    scale = jc.LossScaleConfig(initial_scale=1.0 if at_min_scale else 2.0**16)
    state, step = _setup(precision="fp16", loss_scale=scale)
    for _ in range(11):
        state, m = step(state, batch(poison=1.0))
    assert int(m["skipped"]) == 11
    if at_min_scale:
        with pytest.raises(jc.TrainingDivergedError, match="11 consecutive"):
            step.check()
    else:
        step.check()
        assert int(m["consecutive_skips"]) == 0 and float(m["loss_scale"]) < 2.0**16


def test_ignore_applies_the_update():
    state, step = _setup(nonfinite="ignore")
    state, m = step(state, batch(factor=np.nan))
    assert "skipped" not in m
    assert np.isnan(host(state.params)["wq"]).all()
    step.check()  # nothing is monitored


def test_guard_counters_start_at_zero_in_the_state():
    state, _ = _setup()
    assert int(state.nonfinite.skipped) == 0 and int(state.nonfinite.consecutive) == 0


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (dict(nonfinite="warn"), ["nonfinite='warn'", "skip"]),
        (dict(max_consecutive_skips=-1), ["max_consecutive_skips=-1", ">= 0"]),
    ],
)
def test_bad_guard_settings(fields, words):
    with pytest.raises(jc.ConfigError) as err:
        jc.EngineConfig(**fields)
    for w in words:
        assert w in str(err.value)
