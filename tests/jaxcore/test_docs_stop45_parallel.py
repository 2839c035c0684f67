"""README "Parallelism is configuration", off its path: parameter rules that do nothing,
a rules table that misses a name the model uses, indivisible heads, remat names, and a
second parameter group with odd accumulation through the 3-D pipeline layout against a
plain single-device float32 optax loop. One tiny model shared by every test."""

import logging

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore import remat
from jaxcore import sharding as shd
from jaxcore.models import Transformer, TransformerConfig, lm_loss

from .helpers import reference_run

CFG = TransformerConfig.tiny(d_model=32, d_ff=64, max_seq_len=16)
P = jc.ParallelConfig
SHARDING_LOG = "jaxcore.sharding"


def factory(rngs: nnx.Rngs) -> Transformer:
    return Transformer(CFG, rngs=rngs)


@pytest.fixture
def caplog(caplog, monkeypatch):
    """Warnings are logged once per process; each test here sees its own afresh."""
    monkeypatch.setattr(shd, "_warned", set())
    return caplog


def _plan(caplog, **kw) -> jc.TrainPlan:
    """A plan (no compile) with the sharding module's warnings captured afresh."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SHARDING_LOG):
        return jc.Engine(parallel=P(fsdp=4, tensor=2), **kw).plan(factory, optax.sgd(0.1))


def _specs(plan: jc.TrainPlan) -> dict[str, tuple]:
    return {k: tuple(v.spec) for k, v in plan.shardings.params.items()}


def test_a_param_rule_that_matches_nothing_is_named_in_a_warning(caplog):
    # A path written without the model's layout (the reference model's paths are flat:
    # "wq", not "blocks/0/attn/wq") matched nothing and was dropped without a word.
    plan = _plan(caplog, param_rules=[(r"blocks/.*/wq", (None, "embed", "heads", None))])
    assert _specs(plan)["wq"] == (None, "fsdp", "tensor", None)  # the model's own names
    text = caplog.text
    assert "'blocks/.*/wq'" in text and "matches no parameter" in text
    assert "fullmatch" in text and "'wq'" in text  # how paths look, to fix the regex


def test_a_param_rule_shadowed_by_an_earlier_one_is_named_too(caplog):
    plan = _plan(
        caplog,
        param_rules=[
            (r"w[qkv]", (None, "embed", None, None)),
            (r"wq", (None, None, "heads", None)),  # every path it matches is taken above
        ],
    )
    assert _specs(plan)["wq"] == (None, "fsdp", None, None)
    assert "'wq'" in caplog.text and "earlier rule" in caplog.text
    assert "'w[qkv]'" not in caplog.text


def test_rules_that_all_match_say_nothing(caplog):
    plan = _plan(caplog, param_rules=[(r"wq", (None, "embed", "heads", None))])
    assert _specs(plan)["wq"] == (None, "fsdp", "tensor", None)
    assert caplog.text == ""


def test_a_shared_rules_table_names_no_pattern_it_does_not_use(caplog):
    # torchbridge's Megatron table is written for many architectures: most of its patterns
    # (fused qkv, biases) match nothing in any one model, and the README passes it as is.
    torchbridge = pytest.importorskip("torchbridge")
    _plan(caplog, param_rules=torchbridge.TENSOR_PARALLEL_RULES)
    assert "matches no parameter" not in caplog.text


def test_a_rules_table_missing_a_name_the_model_uses_is_named_with_the_close_one(caplog):
    # ("mpl", "tensor") for ("mlp", "tensor"): the MLP weights silently stayed whole on
    # the tensor axis, so tensor parallelism did nothing for them.
    rules = [("mpl", t) if n == "mlp" else (n, t) for n, t in jc.DEFAULT_RULES]
    plan = _plan(caplog, rules=rules)
    assert _specs(plan)["w_up"] == (None, "fsdp", None)  # still planned: a warning
    text = caplog.text
    assert "'mlp'" in text and "w_up" in text and "'mpl'" in text
    assert "(name, None)" in text  # how to say "replicated on purpose"


def test_heads_that_do_not_divide_the_tensor_axis_are_replicated_with_a_warning(caplog):
    cfg = TransformerConfig.tiny(d_model=48, n_heads=3, n_kv_heads=3, d_ff=64, max_seq_len=16)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SHARDING_LOG):
        plan = jc.Engine(parallel=P(fsdp=4, tensor=2)).plan(
            lambda rngs: Transformer(cfg, rngs=rngs), optax.sgd(0.1)
        )
    specs = _specs(plan)
    assert specs["wq"] == (None, "fsdp", None, None) and specs["w_up"][2] == "tensor"
    assert "wq: dimension 2 (heads, size 3) does not divide" in caplog.text
    # Another model in the same process whose heads do not divide either is named too
    # (the warning was once per parameter name, whatever its size).
    cfg5 = TransformerConfig.tiny(d_model=40, n_heads=5, n_kv_heads=5, d_ff=64, max_seq_len=16)
    with caplog.at_level(logging.WARNING, logger=SHARDING_LOG):
        jc.Engine(parallel=P(fsdp=4, tensor=2)).plan(
            lambda rngs: Transformer(cfg5, rngs=rngs), optax.sgd(0.1)
        )
    assert "wq: dimension 2 (heads, size 5) does not divide" in caplog.text


@pytest.mark.parametrize("name", remat.POLICY_NAMES)
def test_every_documented_remat_policy_is_accepted(name):
    assert jc.Engine(parallel=P(fsdp=8), remat=name).config.remat == name


@pytest.mark.parametrize("name", ["dots-saveable", "Full", "nothing_saveable"])
def test_a_mistyped_remat_policy_names_the_valid_ones(name):
    with pytest.raises(jc.ConfigError, match=r"remat=.*dots_with_no_batch_dims_saveable"):
        jc.Engine(remat=name)


def test_a_rule_for_a_mesh_axis_the_mesh_lacks_names_the_axes():
    with pytest.raises(jc.ConfigError, match=r"unknown mesh axes \['tensr'\].*'tensor'"):
        jc.Engine(rules=[("mlp", "tensr"), *jc.DEFAULT_RULES])


# ------------------------------------------------------------------- numbers


def _labels(params):
    return {k: "head" if k == "lm_head" else "body" for k in params}


def _groups() -> optax.GradientTransformation:
    """Two groups at learning rates 10x apart (SGD: round-off is not amplified)."""
    return optax.multi_transform(
        {"head": optax.sgd(0.5, momentum=0.9), "body": optax.sgd(0.05)}, _labels
    )


def _odd_batches() -> list[dict[str, np.ndarray]]:
    """24 rows (3 microbatches of 8) whose real-token counts differ a lot between them."""
    out = []
    lengths = np.where(np.arange(24) % 5 == 0, 17, 3 + np.arange(24) % 4)
    mask = (np.arange(17)[None, :] < lengths[:, None]).astype(np.int32)
    for seed in range(3):
        tokens = np.random.default_rng(seed).integers(0, 256, (24, 17)).astype(np.int32)
        out.append({"tokens": tokens, "mask": mask})
    return out


@pytest.mark.slow  # ~6.5 CPU-s: three compiles (init, pipelined step, reference)
def test_groups_with_odd_accumulation_through_the_3d_pipeline_match_one_device():
    """pipeline=2 x fsdp=2 x tensor=2, 4 microbatches x grad_accum=3, two learning rates."""
    batches = _odd_batches()
    engine = jc.Engine(
        parallel=P(pipeline=2, fsdp=2, tensor=2), microbatches=4, grad_accum=3, zero=3
    )
    state = engine.prepare(factory, _groups())
    init = jax.device_get(state.params)
    step = engine.train_step(lm_loss)
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    assert float(metrics["pipeline_bubble"]) == pytest.approx(1 / 13)  # (S-1)/(M+S-1), M=12
    ref_losses, ref_params = reference_run(init, batches, _groups(), model=factory)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    params = jax.device_get(state.params)
    for k in ref_params:
        moved = np.max(np.abs(ref_params[k] - init[k]))
        assert moved > 0, k
        # Within float32 round-off of the weights (a few ulps), whatever the update's size.
        np.testing.assert_allclose(params[k], ref_params[k], rtol=0, atol=4e-7, err_msg=k)
    assert {np.dtype(x.dtype) for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}


def test_a_rules_dict_is_refused_with_the_list_form():
    # A dict iterated as its keys: "rules[0]='mlp'" said nothing about the dict.
    with pytest.raises(
        jc.ConfigError, match=r"is a dict: pass an ordered.*first match wins.*items\(\)"
    ):
        jc.Engine(rules={"mlp": "tensor"})


def test_a_misspelt_name_in_logical_sharding_is_named(caplog):
    # ("batch", "kv_head"): the KV cache's heads silently stayed whole on the tensor axis.
    mesh = jc.Engine(parallel=P(fsdp=4, tensor=2)).mesh
    with caplog.at_level(logging.WARNING, logger=SHARDING_LOG):
        spec = jc.logical_sharding(mesh, jc.DEFAULT_RULES, ("batch", "kv_head")).spec
    assert tuple(spec) == ("fsdp", None)
    assert "'kv_head'" in caplog.text and "'kv_heads'" in caplog.text


_MESH_AXES = ("data", "pipeline", "fsdp", "tensor")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    targets=st.lists(
        st.one_of(
            st.none(),
            st.sampled_from(_MESH_AXES),
            st.lists(st.sampled_from(_MESH_AXES), min_size=1, max_size=2, unique=True).map(tuple),
        ),
        min_size=4,
        max_size=4,
    ),
    dims=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d", None]), st.sampled_from([1, 2, 3, 4, 6, 8])),
        min_size=1,
        max_size=4,
    ),
    layout=st.sampled_from([(2, 1, 2, 2), (1, 2, 4, 1), (1, 1, 8, 1), (2, 2, 1, 2)]),
)
def test_every_spec_uses_a_mesh_axis_once_and_divides_its_dimension(targets, dims, layout):
    """For any rules table, names and shape: a mesh axis at most once per array, every
    sharded dimension a multiple of its shards, and a name's first fitting rule wins."""
    mesh = _meshes(layout)
    rules = (*zip("abcd", targets, strict=True), ("a", "fsdp"), ("b", ("tensor",)))
    names = tuple(n for n, _ in dims)
    shape = tuple(s for _, s in dims)
    spec = shd.logical_to_spec(names, shape, mesh, rules)
    used: list[str] = []
    for name, size, entry in zip(names, shape, spec, strict=True):
        axes_ = () if entry is None else (entry,) if isinstance(entry, str) else entry
        ways = int(np.prod([mesh.shape[a] for a in axes_])) if axes_ else 1
        assert size % ways == 0
        assert all(mesh.shape[a] > 1 for a in axes_)
        # The README's reading: the first rule for the name whose (non-trivial) mesh axes
        # are still free in this array and divide the dimension.
        fitting = []
        for rule_name, target in rules:
            want = () if target is None else (target,) if isinstance(target, str) else target
            want = tuple(a for a in want if mesh.shape[a] > 1)
            free = want and not set(want) & set(used)
            if name is not None and rule_name == name and free:
                fitting += [want] if size % int(np.prod([mesh.shape[a] for a in want])) == 0 else []
        assert axes_ == (fitting[0] if fitting else ())
        used += axes_
    assert len(used) == len(set(used))


_MESH_CACHE: dict = {}


def _meshes(layout):
    if layout not in _MESH_CACHE:
        data, pipeline, fsdp, tensor = layout
        _MESH_CACHE[layout] = jc.Engine(
            parallel=P(data=data, pipeline=pipeline, fsdp=fsdp, tensor=tensor)
        ).mesh
    return _MESH_CACHE[layout]


def test_a_param_rule_with_the_wrong_number_of_names_is_named_as_the_rule(caplog):
    # The error named only the parameter ("wq: 2 logical axis names..."), as if the model's
    # own names were wrong; the reference model stacks its layers, so wq is 4-d.
    with pytest.raises(
        jc.ConfigError, match=r"param_rules\[1\] \('wq'\).*2 names.*\(2, 32, 4, 8\)"
    ):
        _plan(caplog, param_rules=[("nothing", (None,)), ("wq", ("embed", "heads"))])
