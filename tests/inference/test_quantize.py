"""int8 weights on a trained tiny model: memory, greedy agreement and perplexity."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from inference import ServingConfig
from inference.engine import SlotEngine, SlotSettings
from inference.quantize import weight_bytes
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from tests.inference.helpers import stdlib_text

CFG = TransformerConfig.tiny(max_seq_len=128)
SEQ = 64
STEPS = 300


@pytest.fixture(scope="module")
def trained():
    """The tiny model trained on standard-library source bytes, and held-out windows."""
    train = np.frombuffer(stdlib_text(0, 40), np.uint8).astype(np.int32)
    held = np.frombuffer(stdlib_text(60, 4), np.uint8).astype(np.int32)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1], seed=0)
    state = engine.prepare(
        lambda rngs: Transformer(CFG, rngs=rngs),
        optax.adamw(optax.cosine_decay_schedule(3e-3, STEPS)),
    )
    step = engine.train_step(lm_loss)
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        starts = rng.integers(0, len(train) - SEQ - 1, 8)
        state, metrics = step(state, {"tokens": np.stack([train[s : s + SEQ + 1] for s in starts])})
    print("fixture loss", float(metrics["loss"]))
    assert float(metrics["loss"]) < 2.5, "the fixture model did not learn"
    starts = np.linspace(0, len(held) - SEQ - 1, 24).astype(int)
    windows = [held[s : s + SEQ].tolist() for s in starts]
    return jax.device_get(state.params), windows


def _evaluate(engine: SlotEngine, windows):
    """Top-1 predictions and the mean negative log-likelihood over the windows."""
    tops, nll = [], []
    for w in windows:
        out = engine.prefill(0, w, SlotSettings(key=np.zeros(2, np.uint32)))
        tops.append(out.prompt_top_ids[:, 0])
        nll.append(-out.prompt_logprobs)
    return np.concatenate(tops), float(np.mean(np.concatenate(nll)))


@pytest.mark.slow
def test_int8_memory_agreement_and_perplexity(trained):
    params, windows = trained
    buckets = (SEQ,)
    fp32 = SlotEngine(CFG, params, ServingConfig(slots=1, prefill_buckets=buckets))
    int8 = SlotEngine(CFG, params, ServingConfig(slots=1, prefill_buckets=buckets, quantize="int8"))
    smooth = SlotEngine(
        CFG,
        params,
        ServingConfig(slots=1, prefill_buckets=buckets, quantize="int8-smooth"),
        calibration=[np.asarray(windows[:4])],
    )
    bf16_bytes = fp32.float_bytes // 2
    assert int8.weight_bytes < 0.30 * fp32.float_bytes
    assert int8.weight_bytes < 0.55 * bf16_bytes
    assert int8.weights["blocks"][0]["wq"].q.dtype == np.int8

    top_f, nll_f = _evaluate(fp32, windows)
    for engine in (int8, smooth):
        top_q, nll_q = _evaluate(engine, windows)
        agreement = float(np.mean(top_q == top_f))
        ppl_increase = np.exp(nll_q) / np.exp(nll_f) - 1
        print(
            f"{engine.config.quantize}: agreement {agreement:.4f}, ppl {np.exp(nll_f):.3f} -> "
            f"{np.exp(nll_q):.3f} (+{100 * ppl_increase:.2f}%), "
            f"bytes {engine.weight_bytes} / {fp32.float_bytes}"
        )
        assert agreement > 0.95
        assert ppl_increase < 0.05


def test_smoothing_keeps_the_float_model(trained):
    """SmoothQuant's folded scales leave the float function unchanged."""
    from inference.quantize import calibrate, smooth_weights
    from inference.weights import build_model
    from jaxcore.models.decoding import decoding_weights, prefill

    params, windows = trained
    weights = decoding_weights(build_model(CFG, params))
    tokens = np.asarray(windows[:2])
    stats = calibrate(CFG, weights, [tokens])
    smoothed = jax.jit(lambda w, s: smooth_weights(w, s, alpha=0.5, n_kv_heads=CFG.n_kv_heads))(
        weights, stats
    )
    run = jax.jit(lambda w, t: prefill(CFG, w, t)[0])
    np.testing.assert_allclose(run(smoothed, tokens), run(weights, tokens), atol=2e-4, rtol=1e-4)
    assert weight_bytes(smoothed) == weight_bytes(weights)
