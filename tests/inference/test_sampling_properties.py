"""Property tests of the sampler against transformers' logits warpers (the oracle).

For any logits, temperature, top-k and top-p, every token `sample_tokens` draws must be in
the support that transformers' ``TemperatureLogitsWarper -> TopKLogitsWarper ->
TopPLogitsWarper`` leaves (the order vLLM applies them in too), and a support of one token
must be drawn every time. One deliberate difference: where tokens tie with the last token
of the nucleus, transformers keeps the ones that sort first (lower ids) and the sampler
keeps all of them, so the choice does not depend on vocabulary order; the oracle's support
is widened by those ties.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.sampling import penalize, sample_tokens

VOCAB = 12
DRAWS = 256

_sample = jax.jit(sample_tokens)


def reference_support(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """Token ids transformers' warpers leave finite, in the order generate applies them."""
    warpers = [transformers.TemperatureLogitsWarper(temperature)]
    if top_k > 0:
        warpers.append(transformers.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(transformers.TopPLogitsWarper(top_p))
    scores = torch.tensor(logits[None, :], dtype=torch.float32)
    for warp in warpers:
        scores = warp(None, scores)
    kept = np.isfinite(scores[0].numpy())
    scaled = logits / np.float32(temperature)
    ties = scaled == scaled[kept].min()  # tied with the nucleus' last token
    return set(np.flatnonzero(kept | ties).tolist())


# Logits on a coarse grid, so ties (the case where top-k keeps more than k) are common.
logit_lists = st.lists(st.integers(-20, 20).map(lambda i: i / 4), min_size=VOCAB, max_size=VOCAB)


@settings(max_examples=60, deadline=None)
@given(
    logits=logit_lists,
    temperature=st.floats(0.05, 3.0),
    top_k=st.integers(0, VOCAB + 2),
    top_p=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_sampled_tokens_stay_in_the_warpers_support(logits, temperature, top_k, top_p, seed):
    x = np.asarray(logits, np.float32)
    support = reference_support(x, temperature, top_k, top_p)
    keys = jax.random.split(jax.random.key(seed), DRAWS)
    rows = lambda v, dtype: jnp.full((DRAWS,), v, dtype)
    drawn = _sample(
        jnp.broadcast_to(jnp.asarray(x), (DRAWS, VOCAB)),
        keys,
        rows(temperature, jnp.float32),
        rows(top_k, jnp.int32),
        rows(top_p, jnp.float32),
    )
    drawn = set(np.asarray(drawn).tolist())
    assert drawn <= support, (drawn - support, support)
    if len(support) == 1:
        assert drawn == support


@pytest.mark.parametrize("top_k, top_p", [(1, 1.0), (0, 1e-6), (3, 1e-6)])
def test_a_support_of_one_is_the_argmax(top_k, top_p):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(DRAWS, VOCAB)), jnp.float32)
    keys = jax.random.split(jax.random.key(1), DRAWS)
    full = lambda v, dtype: jnp.full((DRAWS,), v, dtype)
    drawn = _sample(
        x, keys, full(1.0, jnp.float32), full(top_k, jnp.int32), full(top_p, jnp.float32)
    )
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(jnp.argmax(x, axis=-1)))


@settings(max_examples=60, deadline=None)
@given(
    logits=logit_lists,
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
    output=st.lists(st.integers(0, VOCAB - 1), max_size=8),
    repetition=st.floats(0.1, 3.0),
    presence=st.floats(-2.0, 2.0),
    frequency=st.floats(-2.0, 2.0),
)
def test_penalties_match_transformers_and_openais_formula(
    logits, prompt, output, repetition, presence, frequency
):
    """Repetition as transformers' processor over prompt + output; presence and frequency
    as OpenAI's formula over the generated tokens only."""
    x = np.asarray(logits, np.float32)
    seen = np.zeros(VOCAB, bool)
    seen[prompt + output] = True
    counts = np.bincount(np.asarray(output, int), minlength=VOCAB).astype(np.float32)
    got = penalize(
        jnp.asarray(x)[None],
        jnp.asarray(seen)[None],
        jnp.asarray(counts)[None],
        jnp.asarray([repetition], jnp.float32),
        jnp.asarray([presence], jnp.float32),
        jnp.asarray([frequency], jnp.float32),
    )[0]
    hf = transformers.RepetitionPenaltyLogitsProcessor(repetition)
    want = hf(torch.tensor([prompt + output]), torch.tensor(x[None]))[0].numpy()
    want = want - frequency * counts - presence * (counts > 0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
