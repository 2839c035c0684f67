"""Compression driven from the README section "Compression", off its tested path: masks
against a NumPy top-k reference (ties), odd head counts and GQA through select/shrink,
inputs of another model (scores, gradients, params, structures), schedule step types,
and QAT's forward against the served int8 decoding path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore import compression as cz
from jaxcore.models import Transformer, TransformerConfig, prefill

# Odd head count, one kv head (GQA g=3); and GQA with two groups of three.
H3K1 = TransformerConfig.tiny(
    d_model=16, n_heads=3, n_kv_heads=1, head_dim=4, d_ff=12, max_seq_len=16, init_std=0.2
)
H6K2 = TransformerConfig.tiny(
    d_model=16, n_heads=6, n_kv_heads=2, head_dim=4, d_ff=12, max_seq_len=16, init_std=0.2
)


def _params(cfg, seed=0):
    """Random float32 params of ``cfg``'s Transformer from its shapes (no init program)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(
        lambda: nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param))
    )
    return {k: (0.2 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in shapes.items()}


@pytest.fixture(scope="module")
def models():
    return {"h3k1": (H3K1, _params(H3K1)), "h6k2": (H6K2, _params(H6K2))}


def _scores(cfg, seed=0):
    rng = np.random.default_rng(seed)
    L, _, H, K, _, F, _ = cfg.dims
    return {
        "heads": rng.random((L, H)),
        "kv_heads": rng.random((L, K)),
        "neurons": rng.random((L, F)),
    }


def _model(cfg, params):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)


# ------------------------------------------------------------------ masks vs NumPy
_mask = jax.jit(cz.magnitude_mask, static_argnames="stacked")


def _numpy_mask(w: np.ndarray, k: int) -> np.ndarray:
    """Reference: prune the k smallest |w| of each row; ties go to the lower index."""
    keep = np.ones(w.shape, bool)
    for r, row in enumerate(w):
        order = sorted(range(row.size), key=lambda i: (abs(float(row[i])), i))
        keep[r, order[:k]] = False
    return keep


@settings(max_examples=20, deadline=None)
@given(
    pct=st.integers(0, 99),
    values=st.lists(st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, -2.0, 3.0]), min_size=24),
)
def test_mask_is_the_numpy_top_k_with_ties_by_position(pct, values):
    # Few distinct magnitudes (with signs and -0.0): most rows are ties.
    w = np.asarray(values[:24], np.float32).reshape(2, 12)
    sparsity = cz.SparsitySchedule.one_shot(pct / 100).sparsity(0)
    k = pct * 12 // 100  # floor(s * n), the documented count
    np.testing.assert_array_equal(np.asarray(_mask(w, sparsity, stacked=True)), _numpy_mask(w, k))


def test_sparsity_bounds_and_step_types_are_config_errors():
    for bad in (1.0, 1.5, -0.1, float("nan"), "0.5"):
        with pytest.raises(jc.ConfigError, match="final"):
            cz.SparsitySchedule(final=bad)
    # A float step count would silently shift the schedule (offset % 1.5 is never 0 at
    # some updates); a step is an int.
    for name in ("begin_step", "num_updates", "frequency"):
        with pytest.raises(jc.ConfigError, match=f"{name}=1.5.*int"):
            cz.SparsitySchedule(final=0.5, **{name: 1.5})
    assert float(cz.SparsitySchedule.one_shot(0).sparsity(5)) == 0.0
    # The README's gradual schedule without num_updates was one-shot to `final`, its
    # initial dropped without a word.
    with pytest.raises(jc.ConfigError, match=r"initial=0\.1, num_updates=0.*one-shot"):
        cz.SparsitySchedule(final=0.5, initial=0.1, begin_step=100, frequency=50)


# --------------------------------------------------------------- structured, odd heads
def test_odd_heads_one_kv_head_shrink_to_the_masked_function(models):
    cfg, params = models["h3k1"]
    structure = cz.select(cfg, _scores(cfg), heads=0.34, neurons=0.5)
    small_cfg = structure.config(cfg)
    assert (small_cfg.n_heads, small_cfg.n_kv_heads, small_cfg.d_ff) == (2, 1, 6)

    @jax.jit  # one program: op by op, each slice and mask would compile on its own
    def both(params, tokens):
        shrunk_cfg, small = cz.shrink(params, cfg, structure)
        masked = cz.mask_structure(params, cfg, structure)
        return _model(shrunk_cfg, small)(tokens), _model(cfg, masked)(tokens)

    small, masked = both(params, jnp.arange(8)[None])
    np.testing.assert_allclose(small, masked, atol=1e-5)


def test_grouped_heads_keep_the_best_per_group():
    # g = 3 query heads per kv head: by="query" keeps the 2 best of each group, by
    # "kv_group" the best group (query scores summed, plus its kv head's).
    scores = _scores(H6K2)
    scores["heads"][0] = [3, 1, 2, 0.5, 9, 8]
    scores["kv_heads"][0] = [0, 10]
    s = cz.select(H6K2, scores, heads=1 / 3)
    assert s.heads[0].tolist() == [0, 2, 4, 5] and s.kv_heads[0].tolist() == [0, 1]
    s = cz.select(H6K2, scores, heads=0.5, by="kv_group")
    assert s.heads[0].tolist() == [3, 4, 5] and s.kv_heads[0].tolist() == [1]
    with pytest.raises(jc.ConfigError, match=r"keeping 3 of 6 .* 2 kv groups"):
        cz.select(H6K2, scores, heads=0.5)


def test_pruning_every_head_says_so():
    with pytest.raises(jc.ConfigError, match=r"heads=0\.9.*every query head"):
        cz.select(H3K1, _scores(H3K1), heads=0.9)


def test_inputs_of_another_model_are_config_errors(models):
    (c3, p3), (c6, p6) = models["h3k1"], models["h6k2"]
    s6 = cz.select(c6, _scores(c6), heads=1 / 3)
    # The 3-head model's params with the 6-head model's structure: indices 4 and 5 do
    # not exist. It used to return NaN-filled weights (an out-of-range gather fills NaN).
    with pytest.raises(jc.ConfigError, match=r"shrink: params\['wq'\] has shape"):
        cz.shrink(p3, c6, s6)
    with pytest.raises(jc.ConfigError, match=r"mask_structure: params\['wq'\] has shape"):
        cz.mask_structure(p3, c6, s6)
    with pytest.raises(jc.ConfigError, match=r"shrink: the structure keeps heads"):
        cz.shrink(p3, c3, s6)
    with pytest.raises(jc.ConfigError, match=r"select: scores\['heads'\] has shape \(2, 3\)"):
        cz.select(c6, _scores(c3), heads=1 / 3)  # was NumPy's reshape ValueError
    with pytest.raises(jc.ConfigError, match=r"unit_scores: grads\[0\]\['wq'\] has shape"):
        cz.unit_scores(p6, method="taylor", grads=[p3])  # was a broadcasting TypeError


# ------------------------------------------------------------------- QAT vs served int8
def test_qat_forward_is_the_served_int8_forward(models):
    """The model `qat_loss` hands the loss computes the logits the inference int8 path
    serves for the same float weights (the README's "QAT ... for the inference int8
    format"): decoding weights quantized by `inference.quantize`, its matmul hook."""
    quantize = pytest.importorskip("inference.quantize")
    cfg, params = models["h3k1"]
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9)))

    @jax.jit
    def both(params, tokens):
        seen = {}

        def capture(model, batch, rng):
            seen["logits"] = model(batch)
            return jnp.zeros(()), {}

        cz.qat_loss(capture)(_model(cfg, params), tokens, None)
        weights = quantize.quantize_weights(cz.decoding_weights_of(params, cfg))
        served, _ = prefill(cfg, weights, tokens, matmul=quantize.quantized_matmul)
        fake = cz.fake_quantize_params(params)
        moved = {k: jnp.max(jnp.abs(fake[k] - params[k])) for k in cz.CONTRACTED_AXES}
        return seen["logits"], served, moved

    qat, served, moved = both(params, tokens)
    np.testing.assert_allclose(qat, served, atol=1e-5, rtol=0)
    # The QAT model is not the float one: every matmul weight moved onto the int8 grid.
    assert all(float(v) > 0 for v in moved.values()), moved


# ------------------------------------------------------------ distillation token limits
def test_a_pair_is_checked_against_the_shorter_context_and_the_vocabulary():
    """A teacher built for 8 positions used to score 16-token windows without a word (the
    engine checked a single model's limits, not a pair's), and ids past the vocabulary
    went unchecked too; a pair now gets the checks its models would."""
    student = TransformerConfig.tiny(
        d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16, max_seq_len=16
    )
    teacher = TransformerConfig.tiny(d_model=32, n_layers=1, d_ff=16, max_seq_len=8)
    pair = cz.distill_pair(
        lambda r: Transformer(student, rngs=r), lambda r: Transformer(teacher, rngs=r)
    )
    plan = jc.Engine(parallel=jc.ParallelConfig(fsdp=8)).plan(
        pair, optax.sgd(0.1), trainable=cz.student_only
    )
    tokens = np.zeros((8, 17), np.int32)
    with pytest.raises(jc.BatchError, match="max_seq_len is 8"):
        plan.shard_batch({"tokens": tokens})
    with pytest.raises(jc.BatchError, match="256"):
        plan.shard_batch({"tokens": tokens[:, :9] + 300})
    assert plan.shard_batch({"tokens": tokens[:, :9]})["tokens"].shape == (8, 9)


def test_packed_batches_distill_as_their_examples(models):
    """`distill_loss` on a packed row (two examples, `segments` and `positions`) equals it
    on the two examples as rows of their own, as `lm_loss` reads packed rows. It used to
    ignore both keys: each model attended across the examples, and the first example's
    last token was trained to predict the second's first."""
    cfg, student = models["h3k1"]
    teacher = _params(cfg, seed=1)
    rng = np.random.default_rng(3)
    docs = rng.integers(0, cfg.vocab_size, (2, 6)).astype(np.int32)
    packed = {
        "tokens": docs.reshape(1, 12),
        "segments": np.repeat([[1, 2]], 6, axis=1),
        "positions": np.tile(np.arange(6), 2)[None],
    }
    loss = cz.distill_loss(temperature=2.0, alpha=0.5)

    @jax.jit
    def both(student, teacher, packed, rows):
        pair = cz.DistillPair(_model(cfg, student), _model(cfg, teacher))
        return loss(pair, packed, None)[1], loss(pair, rows, None)[1]

    got, want = both(student, teacher, packed, {"tokens": docs})
    assert float(got["weight"]) == float(want["weight"]) == 10.0
    np.testing.assert_allclose([got["kl"], got["ce"]], [want["kl"], want["ce"]], rtol=1e-5)
