"""Optimizers as users write them: parameter groups, masks and frozen parameters.

Each trains under ZeRO 0-3 and with tensor parallelism and must match a plain
single-device optax loop to the SGD tolerance of `test_parity.py`; frozen parameters stay
bit-identical and hold no optimizer state.
"""

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.sharding import path_str

from .helpers import engine_run, factory, host, make_batch, max_rel_diff, reference_run

BATCHES = [make_batch(16, seed) for seed in range(3)]


def _group(path: str) -> str:
    if "norm" in path:
        return "frozen"
    return "embeddings" if path in ("embed", "lm_head") else "blocks"


def _labels(params):
    return jax.tree_util.tree_map_with_path(lambda p, _: _group(path_str(p)), params)


def _decayed(params):
    return jax.tree_util.tree_map_with_path(lambda p, _: "norm" not in path_str(p), params)


SGD = optax.sgd(0.1, momentum=0.9)
OPTIMIZERS = {
    # Two optimizers for two groups, and set_to_zero for the frozen norms.
    "multi_transform": (
        optax.multi_transform(
            {
                "embeddings": optax.sgd(0.05),
                "blocks": optax.sgd(0.1, momentum=0.9),
                "frozen": optax.set_to_zero(),
            },
            _labels,
        ),
        ("attn_norm", "mlp_norm", "final_norm"),
    ),
    # Weight decay on all but the norms, the usual use of optax.masked.
    "masked": (optax.chain(optax.masked(optax.add_decayed_weights(0.05), _decayed), SGD), ()),
}
# trainable= freezes embed and the norms; the reference spells the same with set_to_zero.
TRAINABLE = lambda path: path != "embed" and "norm" not in path
TRAINABLE_FROZEN = ("embed", "attn_norm", "mlp_norm", "final_norm")
TRAINABLE_REFERENCE = optax.multi_transform(
    {"train": SGD, "freeze": optax.set_to_zero()},
    lambda params: jax.tree_util.tree_map_with_path(
        lambda p, _: "train" if TRAINABLE(path_str(p)) else "freeze", params
    ),
)

LAYOUTS = {
    "fsdp=8 zero0": (dict(parallel=jc.ParallelConfig(fsdp=8), zero=0)),
    "fsdp=8 zero1": (dict(parallel=jc.ParallelConfig(fsdp=8), zero=1)),
    "fsdp=8 zero2": (dict(parallel=jc.ParallelConfig(fsdp=8), zero=2)),
    "fsdp=8 zero3": (dict(parallel=jc.ParallelConfig(fsdp=8), zero=3)),
    "fsdp=4,tensor=2": (dict(parallel=jc.ParallelConfig(fsdp=4, tensor=2), zero=3)),
}
KINDS = ["multi_transform", "masked", "trainable"]


@pytest.fixture(scope="module")
def references():
    cache = {}

    def get(kind):
        if kind not in cache:
            tx = TRAINABLE_REFERENCE if kind == "trainable" else OPTIMIZERS[kind][0]
            engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
            init = jax.device_get(engine.prepare(factory, SGD).params)
            cache[kind] = (init, *reference_run(init, BATCHES, tx))
        return cache[kind]

    return get


def _opt_leaf_names(opt_state) -> list[str]:
    """The last key of every optimizer-state leaf's path (the parameter it belongs to)."""
    flat = jax.tree_util.tree_flatten_with_path(opt_state)[0]
    return [path_str(p).rsplit("/", 1)[-1] for p, _ in flat]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", KINDS)
def test_optimizer_matches_single_device_reference(kind, layout, references):
    ref_init, ref_losses, ref_params = references(kind)
    engine = jc.Engine(**LAYOUTS[layout])
    if kind == "trainable":
        plan = engine.plan(factory, SGD, trainable=TRAINABLE)
        frozen = TRAINABLE_FROZEN
        state = plan.init()
        init = host(state.params)
        step = plan.train_step(jc.models.lm_loss)
        losses = []
        for b in BATCHES:
            state, metrics = step(state, b)
            losses.append(float(metrics["loss"]))
        losses, params = np.array(losses), host(state.params)
    else:
        tx, frozen = OPTIMIZERS[kind]
        losses, params, init, state = engine_run(engine, BATCHES, tx)
        plan = engine.last_plan
    assert max_rel_diff(init, ref_init) == 0.0
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert max_rel_diff(params, ref_params) < 1e-5
    for name in frozen:
        np.testing.assert_array_equal(params[name], init[name], err_msg=name)
        assert name not in _opt_leaf_names(state.opt_state), f"{name} has optimizer state"
    # Parameter-shaped slots are laid out like the plan's optimizer shardings (ZeRO).
    flat_opt = jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
    checked = 0
    for path, leaf in flat_opt:
        name = path_str(path).rsplit("/", 1)[-1]
        if name in params and leaf.shape == params[name].shape:
            assert leaf.sharding.spec == plan.shardings.opt[name].spec, path_str(path)
            checked += 1
    assert checked > 0


def test_frozen_parameters_take_no_optimizer_memory():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)
    adam = optax.adamw(1e-3)
    full = engine.plan(factory, adam).abstract()
    frozen = engine.plan(factory, adam, trainable=TRAINABLE).abstract()
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
    params = full.params
    frozen_size = sum(params[n].size for n in TRAINABLE_FROZEN)
    # Adam keeps two slots per trainable parameter: exactly the frozen ones' are gone.
    assert size(full.opt_state) - size(frozen.opt_state) == 2 * frozen_size


def test_trainable_that_freezes_everything_is_an_error():
    with pytest.raises(jc.ConfigError, match="froze every parameter"):
        jc.Engine().plan(factory, SGD, trainable=lambda path: False)
