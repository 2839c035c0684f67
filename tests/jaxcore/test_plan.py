"""TrainPlan: an immutable value; steps keep their plan; layouts come from the rules table."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss

from .helpers import factory, host, make_batch

SGD = optax.sgd(0.1)
DEFAULT = jc.DEFAULT_RULES


def _with_rule(name, target):
    return ((name, target), *(r for r in DEFAULT if r[0] != name))


def test_plan_is_frozen_and_abstract_matches_init():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2), zero=3)
    plan = engine.plan(factory, optax.adamw(1e-3))
    assert engine.last_plan is plan and engine.model is plan.adapter
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.optimizer = SGD
    abstract = plan.abstract()
    state = plan.init()
    flat_a, tree_a = jax.tree.flatten(abstract)
    flat_s, tree_s = jax.tree.flatten(state)
    assert tree_a == tree_s
    for a, s in zip(flat_a, flat_s, strict=True):
        assert (a.shape, a.dtype) == (s.shape, s.dtype)
        assert a.sharding == s.sharding


def test_step_keeps_its_plan_after_another_plan_is_made():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=2), devices=jax.devices()[:2])
    plan_a = engine.plan(factory, SGD)
    state = plan_a.init()
    step = engine.train_step(lm_loss)  # built from last_plan, which is plan_a
    evaluate = plan_a.eval_step(lm_loss)
    batch = make_batch(4, 0)
    before = evaluate(state, batch)

    other = TransformerConfig.tiny(n_layers=1, d_model=32, max_seq_len=64)
    engine.plan(lambda rngs: Transformer(other, rngs=rngs), SGD)
    assert engine.last_plan is not plan_a
    state, metrics = step(state, batch)  # still plan_a's model: plan_a's state fits it
    # The train step's loss (before its update) is the eval step's loss on that state.
    np.testing.assert_allclose(float(metrics["loss"]), float(before["loss"]), rtol=1e-6)
    assert host(state.params)["wq"].shape == (2, 64, 4, 16)


def test_changing_the_batch_rule_moves_the_batch_sharding():
    parallel = jc.ParallelConfig(data=2, fsdp=4)
    default = jc.Engine(parallel=parallel)
    assert default.batch_sharding.spec == P(("data", "fsdp"))
    moved = jc.Engine(parallel=parallel, rules=_with_rule("batch", "data"))
    assert moved.batch_sharding.spec == P("data")
    plan = moved.plan(factory, SGD)
    assert plan.batch_sharding.spec == P("data")
    # Two rows now split over data=2 alone; the default table needs a multiple of 8.
    batch = plan.shard_batch(make_batch(2, 0))
    assert batch["tokens"].sharding.spec == P("data")
    with pytest.raises(jc.BatchError, match="multiple of 8"):
        default.shard_batch(make_batch(2, 0))


def test_kv_cache_sharding_follows_the_kv_heads_rule():
    mesh = jc.build_mesh(jc.ParallelConfig(fsdp=4, tensor=2))
    names = ("layers", "batch", "kv_heads", "length", "head_dim")
    shape = (2, 8, 2, 64, 16)
    assert jc.logical_sharding(mesh, DEFAULT, names, shape).spec == P(
        None, "fsdp", "tensor", None, None
    )
    off = _with_rule("kv_heads", None)
    assert jc.logical_sharding(mesh, off, names, shape).spec == P(None, "fsdp", None, None, None)
    assert jc.batch_spec(mesh, _with_rule("batch", "tensor")) == P("tensor")


def test_multi_transform_plans_through_prepare():
    # Used to crash at optax.tree_map_params with a pytree-structure error.
    tx = optax.multi_transform(
        {"a": optax.adam(1e-3), "b": optax.sgd(0.1)},
        lambda params: {k: "a" if k.startswith("w") else "b" for k in params},
    )
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=1)
    abstract = engine.plan(factory, tx).abstract()
    inner = abstract.opt_state.inner_states["a"].inner_state[0]
    assert inner.mu["wq"].sharding.spec == engine.last_plan.shardings.opt["wq"].spec
    assert "fsdp" in tuple(inner.mu["wq"].sharding.spec)


def test_engine_before_any_plan():
    engine = jc.Engine()
    assert engine.last_plan is None and engine.model is None and engine.state_shardings is None
    with pytest.raises(jc.ConfigError, match="prepare"):
        engine.bind(None)


def test_init_with_seed_or_key():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    plan = engine.plan(lambda rngs: Transformer(TransformerConfig.tiny(n_layers=1), rngs=rngs), SGD)
    a = host(plan.init(3).params)
    b = host(plan.init(jax.random.key(3)).params)
    np.testing.assert_array_equal(a["wq"], b["wq"])
    assert not np.array_equal(a["wq"], host(plan.init(4).params)["wq"])
