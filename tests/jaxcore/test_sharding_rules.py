"""The logical-axis rules table, ZeRO plans, regex and automatic rules."""

import logging

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxcore as jc
from jaxcore import sharding as shd

MESH = jc.build_mesh(jc.ParallelConfig(data=2, fsdp=2, tensor=2))


def spec(names, shape, rules=shd.DEFAULT_RULES, **kw):
    return shd.logical_to_spec(names, shape, MESH, rules, **kw)


def test_first_matching_rule_wins_and_mesh_axes_are_used_once():
    rules = (("embed", "tensor"), ("embed", "fsdp"), ("mlp", "tensor"))
    # embed takes tensor; mlp's only rule wants tensor again, so mlp stays replicated.
    assert spec(("embed", "mlp"), (8, 8), rules) == P("tensor", None)
    assert spec(("mlp", "embed"), (8, 8), rules) == P("tensor", "fsdp")


def test_batch_over_two_mesh_axes_and_size_one_axes_dropped():
    # batch takes data and fsdp, so embed (which wants fsdp) stays replicated.
    assert spec(("batch", "length", "embed"), (8, 4, 8)) == P(("data", "fsdp"), None, None)
    assert spec(("batch", "length"), (8, 4)) == P(("data", "fsdp"), None)
    # pipeline has size 1 on this mesh: "layers" is not written into the spec.
    assert spec(("layers", "embed"), (4, 8)) == P(None, "fsdp")


def test_indivisible_dimension_is_replicated_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxcore.sharding"):
        assert spec(("heads", "embed"), (3, 8), where="odd/param") == P(None, "fsdp")
    assert "odd/param" in caplog.text and "does not divide" in caplog.text


def test_zero_stages_decide_what_is_sharded_over_fsdp():
    params = {"w": jax.ShapeDtypeStruct((8, 16), np.float32)}
    names = {"w": ("embed", "mlp")}
    specs = {z: shd.plan(params, names, MESH, shd.DEFAULT_RULES, z) for z in range(4)}
    get = lambda tree: tree["w"].spec
    assert [get(specs[z].params) for z in range(4)] == [P(None, "tensor")] * 3 + [
        P("fsdp", "tensor")
    ]
    assert [get(specs[z].grads) for z in range(4)] == [P(None, "tensor")] * 2 + [
        P("fsdp", "tensor")
    ] * 2
    assert [get(specs[z].opt) for z in range(4)] == [P(None, "tensor")] + [P("fsdp", "tensor")] * 3


def test_regex_rules_name_parameters_and_auto_rule_covers_the_rest():
    params = {
        "q_proj": {"weight": jax.ShapeDtypeStruct((8, 6), np.float32)},
        "norm": {"weight": jax.ShapeDtypeStruct((6,), np.float32)},
        "odd": jax.ShapeDtypeStruct((3, 5, 4), np.float32),
    }
    names = shd.name_params(params, None, [(r".*q_proj/weight", ("heads", "embed"))])
    assert names["q_proj"]["weight"] == ("heads", "embed") and names["norm"]["weight"] is None
    plan = shd.plan(params, names, MESH, shd.DEFAULT_RULES, 3)
    assert plan.params["q_proj"]["weight"].spec == P("tensor", "fsdp")
    assert plan.params["norm"]["weight"].spec == P("fsdp")  # auto: largest divisible dim
    assert plan.params["odd"].spec == P(None, None, "fsdp")
    assert shd.plan(params, names, MESH, shd.DEFAULT_RULES, 0).params["norm"]["weight"].spec == P(
        None
    )
