"""Compression off the tested path: resume mid-schedule, the non-finite skip, targets
that match nothing, qkv-bias models through shrink and serving, mismatched distillation
vocabularies, odd report inputs, and int8 rounding against a plain numpy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jaxcore as jc
from jaxcore import compression as cz
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from tests.jaxcore.helpers import CFG, factory, host, make_batch


@pytest.fixture(scope="module")
def engine():
    return jc.Engine(parallel=jc.ParallelConfig(fsdp=8))


def _count(opt_state) -> int:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, cz.PruningState))
    return int(next(n for n in nodes if isinstance(n, cz.PruningState)).count)


def test_resume_mid_schedule_gives_the_same_masks_and_weights(engine, tmp_path):
    sched = cz.SparsitySchedule(final=0.75, initial=0.25, begin_step=2, num_updates=3, frequency=2)
    tx = cz.magnitude_pruning(optax.adamw(1e-2, weight_decay=0.1), sched)
    plan = engine.plan(factory, tx)
    step = plan.train_step(lm_loss)
    state = plan.init(0)
    for i in range(5):  # stop between the mask updates at counts 4 and 6
        state, _ = step(state, make_batch(8, i))
    saver = jc.Checkpointer(directory=tmp_path, plan=plan)
    saver.save(state, force=True)
    saver.close()
    masks_at_save = host(cz.find_masks(state.opt_state))
    for i in range(5, 10):
        state, _ = step(state, make_batch(8, i))
    resumed, _ = jc.Checkpointer(directory=tmp_path, plan=plan).restore_or_init(plan)
    assert _count(resumed.opt_state) == 5
    for a, b in zip(
        jax.tree.leaves(host(cz.find_masks(resumed.opt_state))),
        jax.tree.leaves(masks_at_save),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    for i in range(5, 10):
        resumed, _ = step(resumed, make_batch(8, i))
    for a, b in zip(
        jax.tree.leaves(host(resumed.params)), jax.tree.leaves(host(state.params)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert cz.sparsity_report(host(resumed.params))["w_up"] == [0.75, 0.75]


def test_a_skipped_step_does_not_advance_the_schedule():
    # The schedule counts applied updates: a non-finite step keeps the whole optimizer
    # state, the count included, so the mask update it would have made happens next step.
    eng = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), grad_accum=2)
    tx = cz.magnitude_pruning(optax.adamw(1e-2), cz.SparsitySchedule.one_shot(0.5, at_step=1))
    state = eng.prepare(factory, tx)
    state, _ = eng.train_step(lm_loss)(state, make_batch(16, 0))

    def nan_loss(model, batch, rng):
        loss, aux = lm_loss(model, batch, rng)
        return loss * jnp.nan, aux

    state, metrics = eng.train_step(nan_loss)(state, make_batch(16, 1))
    assert int(metrics["skipped"]) == 1 and int(state.step) == 2
    assert _count(state.opt_state) == 1
    assert cz.sparsity_report(host(state.params))["wq"] == [0.0, 0.0]
    state, _ = eng.train_step(lm_loss)(state, make_batch(16, 2))
    assert cz.sparsity_report(host(state.params))["wq"] == [0.5, 0.5]


def test_targets_that_match_nothing_are_refused():
    tx = cz.magnitude_pruning(optax.sgd(0.1), cz.SparsitySchedule.one_shot(0.5), targets="w_qkv")
    params = {"wq": jnp.ones((2, 4, 4)), "embed": jnp.ones((8, 4))}
    with pytest.raises(jc.ConfigError, match=r"matches no parameter.*\['embed', 'wq'\]"):
        tx.init(params)


def test_vectors_pruned_per_layer_are_refused():
    # final_norm (d,) with stacked=True: each "layer" holds one weight, so none is pruned.
    tx = cz.magnitude_pruning(
        optax.sgd(0.1), cz.SparsitySchedule.one_shot(0.5), targets="embed|final_norm"
    )
    params = {"embed": jnp.ones((8, 4)), "final_norm": jnp.ones((4,))}
    with pytest.raises(jc.ConfigError, match=r"final_norm.*stacked=False"):
        tx.init(params)
    flat = cz.magnitude_pruning(
        optax.sgd(0.1), cz.SparsitySchedule.one_shot(0.5), targets="final_norm", stacked=False
    )
    params = {"final_norm": jnp.arange(1.0, 5.0)}
    updates, _ = flat.update(params, flat.init(params), params)
    assert cz.sparsity_report(
        optax.apply_updates(params, updates), targets="final_norm", stacked=False
    ) == {"final_norm": [0.5]}


BIAS = TransformerConfig.tiny(
    n_heads=8, n_kv_heads=4, head_dim=8, d_ff=96, max_seq_len=32, init_std=0.2, qkv_bias=True
)


def _forward(cfg, params, tokens):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)(tokens)


@pytest.mark.parametrize("by", ["query", "kv_group"])
def test_qkv_bias_model_shrinks_to_the_masked_function_and_serves(by):
    import inference

    params = nnx.to_pure_dict(nnx.state(Transformer(BIAS, rngs=nnx.Rngs(0)), nnx.Param))
    params = {k: v + 0.1 if k in ("bq", "bk", "bv") else v for k, v in params.items()}
    structure = cz.select(BIAS, cz.unit_scores(params), heads=0.5, neurons=0.5, by=by)
    small_cfg, small = cz.shrink(params, BIAS, structure)
    assert small["bq"].shape == (2, 4, 8)
    assert small["bk"].shape == small["bv"].shape == (2, small_cfg.n_kv_heads, 8)
    masked = cz.mask_structure(params, BIAS, structure)
    text = "def f(x):\n    return x + 1"
    ids = jnp.asarray([list(text.encode())], jnp.int32)
    want = np.asarray(_forward(BIAS, masked, ids))
    np.testing.assert_allclose(np.asarray(_forward(small_cfg, small, ids)), want, atol=1e-4)
    served = np.asarray(inference.LLM(small, config=small_cfg).score(text))
    logp = jax.nn.log_softmax(want[0, :-1], axis=-1)
    np.testing.assert_allclose(
        served, np.take_along_axis(logp, np.asarray(ids)[0, 1:, None], axis=-1)[:, 0], atol=1e-4
    )


def test_kv_group_pruning_with_one_kv_head_says_to_prune_by_query():
    cfg = TransformerConfig.tiny(n_heads=4, n_kv_heads=1, head_dim=8, d_ff=32)
    scores = {"heads": np.ones((2, 4)), "kv_heads": np.ones((2, 1)), "neurons": np.ones((2, 32))}
    with pytest.raises(jc.ConfigError, match=r"one kv head.*by='query'"):
        cz.select(cfg, scores, heads=0.5, by="kv_group")
    assert cz.select(cfg, scores, heads=0.5, by="query").heads.shape == (2, 2)


def test_distillation_across_vocabularies_is_refused(engine):
    student = TransformerConfig.tiny(vocab_size=128, max_seq_len=32)
    pair = cz.distill_pair(lambda r: Transformer(student, rngs=r), factory)
    plan = engine.plan(pair, optax.adamw(1e-3), trainable=cz.student_only)
    step = plan.train_step(cz.distill_loss())
    tokens = np.random.default_rng(0).integers(0, 128, (8, 17)).astype(np.int32)
    with pytest.raises(jc.ConfigError, match="student predicts 128 tokens and the teacher 256"):
        step(plan.init(0), {"tokens": tokens})


def test_method_report_refuses_params_of_another_model_and_bad_lengths():
    params = nnx.to_pure_dict(nnx.state(factory(nnx.Rngs(0)), nnx.Param))
    kw = {"ppl_before": 2.0, "ppl_after": 2.0}
    with pytest.raises(jc.ConfigError, match="seq_len=0"):
        cz.method_report("base", CFG, params, seq_len=0, **kw)
    other = TransformerConfig.tiny(vocab_size=128)
    with pytest.raises(jc.ConfigError, match="do not match the config"):
        cz.method_report("base", other, params, seq_len=16, **kw)
    with pytest.raises(jc.ConfigError, match="params\\['student'\\]"):
        cz.method_report("base", CFG, {"student": params}, seq_len=16, **kw)
    assert cz.method_report("base", CFG, params, seq_len=16, **kw).params == sum(
        v.size for v in jax.tree.leaves(params)
    )


def _numpy_scale(w: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The int8 format's scale in plain numpy (float32, correctly rounded division)."""
    absmax = np.max(np.abs(w), axis=axes, keepdims=True)
    return np.where(absmax > 0, absmax / np.float32(127.0), np.float32(1.0)).astype(np.float32)


_quantize = jax.jit(cz.int8_quantize, static_argnums=1)


@settings(max_examples=60, deadline=None)
@given(
    w=hnp.arrays(np.float32, (4, 6), elements=st.floats(-1e3, 1e3, allow_nan=False, width=32)),
    axes=st.sampled_from(((0,), (1,), (0, 1))),
    ties=st.booleans(),
)
def test_int8_rounding_matches_numpy(w, axes, ties):
    # XLA on CPU flushes subnormals to zero (numpy does not): keep absmax / 127 normal.
    w[np.abs(w) < 1e-30] = 0.0
    if ties:  # scale 1 and exact halves: round half to even, as numpy does
        w[0, :] = np.array([127, 0.5, 1.5, -2.5, 0, -1], np.float32)
    q, scale = map(np.asarray, _quantize(w, axes))
    ref_scale = _numpy_scale(w, axes)
    # XLA divides by the constant 127 through its reciprocal: the scale may sit one ulp
    # from numpy's correctly rounded quotient (inference computes it the same way).
    np.testing.assert_array_max_ulp(scale, ref_scale, maxulp=1)
    ref_q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    np.testing.assert_array_equal(q, ref_q)
