"""Segment ids: examples packed into one row attend only within themselves, so each one's
logits equal those of the example run alone (positions restarting per example), on the
CPU kernel, on XLA's generic lowering (the GPU/TPU path), with a sliding window, with the
CPU kernel's query blocks, and through a pipelined, sharded training step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from jaxcore.models import transformer as transformer_module


def _pack(lengths: list[int], row: int, seed: int = 0):
    """Random examples of ``lengths`` laid end to end in one row of ``row`` tokens; the
    rest is padding (segment 0). Returns (examples, tokens, positions, segments)."""
    rng = np.random.default_rng(seed)
    examples = [rng.integers(1, 256, n).astype(np.int32) for n in lengths]
    tokens = np.zeros(row, np.int32)
    positions = np.zeros(row, np.int32)
    segments = np.zeros(row, np.int32)
    at = 0
    for i, ex in enumerate(examples, 1):
        tokens[at : at + len(ex)] = ex
        positions[at : at + len(ex)] = np.arange(len(ex))
        segments[at : at + len(ex)] = i
        at += len(ex)
    positions[at:] = np.arange(row - at)
    return examples, tokens[None], positions[None], segments[None]


CASES = {
    "three examples": (dict(), [7, 11, 5], 24),
    "sliding window": (dict(sliding_window=4), [9, 6, 8], 24),
    "query blocks (256 tokens)": (dict(), [100, 37, 90, 29], 256),
}


@pytest.mark.parametrize("kernel", ["heads_first", "xla"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_packed_example_gets_the_logits_it_gets_alone(case, kernel, monkeypatch):
    overrides, lengths, row = CASES[case]
    monkeypatch.setattr(transformer_module, "attention_implementation", lambda d, t: kernel)
    model = Transformer(TransformerConfig.tiny(**overrides), rngs=nnx.Rngs(0))
    examples, tokens, positions, segments = _pack(lengths, row)

    packed = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments)))
    crossed = np.asarray(model(jnp.asarray(tokens), jnp.asarray(positions)))

    at = 0
    for ex in examples:
        alone = np.asarray(model(jnp.asarray(ex[None])))[0]
        np.testing.assert_allclose(packed[0, at : at + len(ex)], alone, rtol=2e-5, atol=2e-5)
        at += len(ex)
    # Without segment ids the later examples see the earlier ones (the old behaviour).
    second = slice(lengths[0], lengths[0] + lengths[1])
    assert np.abs(crossed[0, second] - packed[0, second]).max() > 1e-3


def test_a_packed_rows_loss_is_the_token_weighted_mean_of_its_examples_alone():
    model = Transformer(TransformerConfig.tiny(), rngs=nnx.Rngs(1))
    examples, tokens, positions, segments = _pack([6, 10, 4], 24, seed=3)
    batch = {"tokens": tokens, "positions": positions, "segments": segments}
    loss, aux = lm_loss(model, jax.tree.map(jnp.asarray, batch), None)
    alone = [lm_loss(model, {"tokens": jnp.asarray(ex[None])}, None) for ex in examples]
    weights = np.array([float(a["weight"]) for _, a in alone])
    assert float(aux["weight"]) == weights.sum() == sum(len(ex) - 1 for ex in examples)
    want = sum(float(x) * w for (x, _), w in zip(alone, weights, strict=True)) / weights.sum()
    assert float(loss) == pytest.approx(want, rel=1e-5)
    with pytest.raises(jc.BatchError, match="needs both 'segments'"):
        lm_loss(model, {"tokens": tokens, "segments": segments}, None)


CFG = TransformerConfig.tiny(n_layers=4, max_seq_len=64)


def _batches() -> list[dict[str, np.ndarray]]:
    out = []
    for s in range(2):
        rows = [_pack([5, 9, 3], 17, seed=16 * s + r)[1:] for r in range(16)]
        tokens, positions, segments = (np.concatenate(a) for a in zip(*rows, strict=True))
        out.append({"tokens": tokens, "positions": positions, "segments": segments})
    return out


def _losses(engine: jc.Engine) -> np.ndarray:
    state = engine.prepare(lambda rngs: Transformer(CFG, rngs=rngs), optax.adamw(1e-2))
    step = engine.train_step(lm_loss)
    losses = []
    for b in _batches():
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return np.array(losses)


@pytest.mark.slow
def test_segments_travel_with_the_microbatches_of_a_sharded_pipeline():
    single = _losses(jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1]))
    piped = _losses(
        jc.Engine(
            parallel=jc.ParallelConfig(pipeline=2, fsdp=2, tensor=2),
            devices=jax.devices()[:8],
            microbatches=4,
        )
    )
    np.testing.assert_allclose(piped, single, rtol=1e-5)
    # The segment ids reach the model: the same tokens without them give other losses.
    batches = _batches()
    for b in batches:
        del b["segments"], b["positions"]
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    state = engine.prepare(lambda rngs: Transformer(CFG, rngs=rngs), optax.adamw(1e-2))
    _, metrics = engine.train_step(lm_loss)(state, batches[0])
    assert abs(float(metrics["loss"]) - single[0]) > 1e-4
