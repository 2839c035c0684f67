"""The paged KV cache and prefix caching give the contiguous cache's tokens and log-probs;
shared prompt prefixes are computed once; pages come back on finish and on cancel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import SamplingParams, Scheduler, ServingConfig
from inference.batching import run_to_completion
from inference.engine import SlotEngine
from inference.paging import PagePool
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=640)
PREFIX = 512


@pytest.fixture(scope="module")
def engines():
    params = init_params(CFG, seed=9)
    common = dict(slots=4, prefill_buckets=(16, 64, 640), decode_steps=4)
    contiguous = SlotEngine(CFG, params, ServingConfig(**common))
    paged = SlotEngine(CFG, params, ServingConfig(**common, kv_cache="paged", page_size=16))
    return contiguous, paged


def _work(rng, prefix):
    out = []
    for i in range(6):
        suffix = rng.integers(0, 256, int(rng.integers(3, 40))).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(4, 20)), ignore_eos=True)
        if i % 3 == 2:
            params = SamplingParams(max_tokens=10, temperature=0.9, seed=i, top_p=0.9)
        out.append((prefix + suffix, params))
    return out


def test_paged_and_prefix_cached_equal_contiguous_and_share_the_prefix(engines):
    contiguous, paged = engines
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 256, PREFIX).tolist()
    work = _work(rng, prefix)
    want = run_to_completion(Scheduler(contiguous, ByteTokenizer()), work)
    sched = Scheduler(paged, ByteTokenizer())
    got = run_to_completion(sched, work)
    for a, b in zip(want, got, strict=True):
        assert a.output == b.output
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    # The 512-token prefix (32 full pages) was computed once, for the first request.
    suffixes = sum(len(p) - PREFIX for p, _ in work)
    assert sched.stats["prefill_tokens_computed_total"] == PREFIX + suffixes
    assert sched.stats["prefix_cache_hit_tokens_total"] == PREFIX * (len(work) - 1)
    assert sched.pool.hit_rate() == pytest.approx(PREFIX * 5 / sum(len(p) for p, _ in work))
    assert sched.pool.free_pages() == sched.pool.total  # every page back (cached ones idle)


def test_prompt_logprobs_go_through_the_prefix_cache_and_match(engines):
    contiguous, paged = engines
    prompt = list(range(40, 90))  # 50 tokens: 3 full pages of 16
    params = SamplingParams(max_tokens=3, prompt_logprobs=5)
    (a,) = run_to_completion(Scheduler(contiguous, ByteTokenizer()), [(prompt, params)])
    sched = Scheduler(paged, ByteTokenizer())
    run_to_completion(sched, [(prompt, SamplingParams(max_tokens=2))])  # warm the cache
    computed = sched.stats["prefill_tokens_computed_total"]
    (b,) = run_to_completion(sched, [(prompt, params)])
    # 47 positions came from the cache; the last cached one (46) was recomputed in a
    # copy of its page, since its logits score token 47.
    assert sched.stats["prefill_tokens_computed_total"] - computed == 50 - 47
    assert sched.pool.copies == 1
    np.testing.assert_allclose(a.prompt_logprobs, b.prompt_logprobs, atol=1e-5)
    assert a.prompt_ranks == b.prompt_ranks
    for x, y in zip(a.prompt_top_logprobs, b.prompt_top_logprobs, strict=True):
        assert [i for i, _ in x] == [i for i, _ in y]
        np.testing.assert_allclose([v for _, v in x], [v for _, v in y], atol=1e-5)
    assert a.output == b.output
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_copy_on_write_at_the_first_divergent_block(engines):
    contiguous, paged = engines
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 56).tolist()  # pages 0-2 full, then 8 more prompt tokens
    b = a[:40] + rng.integers(0, 256, 21).tolist()  # diverges 8 tokens into page 2
    c = [*a[:40], (a[40] + 1) % 256, *a[41:]]  # diverges at the same place, one token
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    work = [(a, params), (b, params), (c, params), (a, params)]
    want = run_to_completion(Scheduler(contiguous, ByteTokenizer()), work)
    sched = Scheduler(paged, ByteTokenizer())
    got = run_to_completion(sched, work)  # all four at once: a still decodes while b copies
    for x, y in zip(want, got, strict=True):
        assert x.output == y.output
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    # a ran in full; b and c reused 2 shared pages + 8 copied positions of a's page 2; the
    # second a reused a's 3 full pages and copied page 3's 7 of 8 prompt positions.
    assert sched.stats["prefill_tokens_computed_total"] == 56 + (61 - 40) + (56 - 40) + 1
    assert sched.pool.copies == 3
    assert sched.pool.free_pages() == sched.pool.total


def test_a_shared_page_is_never_written():
    pool = PagePool(16, 4, 8, prefix_caching=True)
    a = pool.reserve([1, 2, 3, 4, 5, 6, 7, 8, 9], 12, use_cache=True)
    b = pool.reserve([1, 2, 3, 4, 5, 6, 0, 0, 0], 12, use_cache=True)
    assert b.cached_tokens == 6 and b.pages[0] == a.pages[0]
    assert b.copy == (a.pages[1], b.pages[1]) and b.pages[1] not in a.pages
    pool.release(a)
    pool.release(b)
    assert pool.free_pages() == pool.total


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), min_size=1, max_size=12))
def test_pool_property_cached_positions_hold_the_prompt_and_shared_pages_stay_read_only(
    prompts,
):
    """A host model of the device pages: after each reservation's copy, every cached
    position holds the prompt's token; the prefill then writes only pages no other live
    request holds."""
    ps = 4
    pool = PagePool(24, ps, 5, prefix_caching=True)
    content = {p: [None] * ps for p in range(24)}
    live: list = []
    for i, prompt in enumerate(prompts):
        total = len(prompt) + 3
        r = pool.reserve(prompt, total, use_cache=True)
        while r is None and live:  # admission waits for running requests to finish
            pool.release(live.pop(0))
            r = pool.reserve(prompt, total, use_cache=True)
        assert r is not None  # with nothing running, any request of <= pages_per_slot fits
        if r.copy is not None:
            content[r.copy[1]] = list(content[r.copy[0]])
        assert 0 <= r.cached_tokens < len(prompt)
        for t in range(r.cached_tokens):
            assert content[r.table[t // ps]][t % ps] == prompt[t]
        others = {p for o in live for p in o.pages}
        for t in range(r.cached_tokens, total):
            page = r.table[t // ps]
            assert page not in others
            content[page][t % ps] = prompt[t] if t < len(prompt) else ("gen", i)
        live.append(r)
        if i % 3 == 2:
            pool.release(live.pop(0))
    for r in live:
        pool.release(r)
    assert pool.free_pages() == pool.total


def test_pages_are_freed_on_cancel_and_admission_waits_for_pages(engines):
    _, paged = engines
    sched = Scheduler(paged, ByteTokenizer())
    pool = sched.pool
    a = sched.submit([1, 2, 3], SamplingParams(max_tokens=600, ignore_eos=True))
    sched.step()
    sched.step()
    assert pool.free_pages() < pool.total
    a.cancel()
    while sched.busy():
        sched.step()
    assert a.finish_reason == "cancelled" and pool.free_pages() == pool.total


def test_the_pool_evicts_the_least_recently_released_block():
    pool = PagePool(4, 2, 4, prefix_caching=True)  # 3 usable pages of 2 positions
    a = pool.reserve([1, 2, 3], 4, use_cache=True)
    assert a.cached_tokens == 0 and len(a.pages) == 2
    b = pool.reserve([1, 2, 9], 4, use_cache=True)  # not enough pages while a runs
    assert b is None or b.cached_tokens == 2
    pool.release(a)
    if b is not None:
        pool.release(b)
    c = pool.reserve([1, 2, 5], 3, use_cache=True)
    assert c.cached_tokens == 2 and c.pages[0] == a.table[0]
    pool.release(c)
    d = pool.reserve([7, 7, 7, 7, 7, 7], 6, use_cache=True)  # needs all 3: evicts [1, 2]
    assert d is not None and d.cached_tokens == 0
    pool.release(d)
    assert pool.reserve([1, 2, 5], 3, use_cache=True).cached_tokens == 0
