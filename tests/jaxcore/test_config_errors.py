"""User mistakes raise jaxcore errors whose messages name the field and the fix."""

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import factory, make_batch


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(data=3), ["data=3", "8 devices"]),
        (dict(fsdp=3, tensor=-1), ["does not divide", "8"]),
        (dict(data=-1, fsdp=-1), ["data, fsdp", "at most one"]),
        (dict(tensor=0), ["tensor=0", "positive"]),
    ],
)
def test_mesh_that_does_not_match_the_devices(kwargs, words):
    with pytest.raises(jc.ConfigError) as err:
        jc.Engine(parallel=jc.ParallelConfig(**kwargs))
    for w in words:
        assert w in str(err.value)


def test_minus_one_fills_the_rest():
    assert jc.ParallelConfig(tensor=2).resolve(8).fsdp == 4
    engine = jc.Engine(parallel=jc.ParallelConfig(data=2, fsdp=-1, tensor=2))
    assert dict(engine.mesh.shape) == {"data": 2, "pipeline": 1, "fsdp": 2, "tensor": 2}


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(remat="sometimes"), ["remat='sometimes'", "dots_saveable"]),
        (dict(precision="fp8"), ["precision='fp8'", "bf16"]),
        (dict(zero=4), ["zero=4", "0, 1, 2, 3"]),
        (dict(grad_accum=0), ["grad_accum=0", ">= 1"]),
        (dict(clip_grad_norm=-1.0), ["clip_grad_norm", "positive"]),
        (dict(rules=(("embed", "fsdp_typo"),)), ["fsdp_typo", "mesh axes"]),
    ],
)
def test_bad_engine_fields(kwargs, words):
    with pytest.raises(jc.ConfigError) as err:
        jc.Engine(**kwargs)
    for w in words:
        assert w in str(err.value)


@pytest.fixture(scope="module")
def prepared():
    engine = jc.Engine(parallel=jc.ParallelConfig(data=2, fsdp=4), grad_accum=2)
    return engine, engine.prepare(factory, optax.sgd(0.1))


def test_batch_that_does_not_divide_the_data_axes(prepared):
    engine, state = prepared
    step = engine.train_step(lm_loss)
    with pytest.raises(jc.BatchError) as err:
        step(state, make_batch(12, 0))
    msg = str(err.value)
    assert "batch[tokens]" in msg and "12" in msg and "multiple of 16" in msg


def test_batch_without_leading_axis(prepared):
    engine, _ = prepared
    with pytest.raises(jc.BatchError, match="scalar"):
        engine.shard_batch({"tokens": np.int32(3)})


def test_steps_before_prepare():
    with pytest.raises(jc.ConfigError, match="prepare"):
        jc.Engine().train_step(lm_loss)


def test_optimizer_that_is_not_optax():
    with pytest.raises(jc.ConfigError, match="optax"):
        jc.Engine().prepare(factory, object())


def test_factory_with_wrong_signature():
    with pytest.raises(jc.ConfigError, match="factory"):
        jc.Engine().prepare(lambda: None, optax.sgd(0.1))


def test_lm_loss_names_missing_key():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    state = engine.prepare(factory, optax.sgd(0.1))
    with pytest.raises(jc.BatchError, match="'tokens'"):
        engine.train_step(lm_loss)(state, {"ids": make_batch(8, 0)["tokens"]})
