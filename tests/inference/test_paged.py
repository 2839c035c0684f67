"""The paged KV cache and prefix caching give the contiguous cache's tokens and log-probs;
shared prompt prefixes are computed once; pages come back on finish and on cancel."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_prompt_logprobs_bypass_the_cache_and_match(engines):
    contiguous, paged = engines
    prompt = list(range(40, 90))
    params = SamplingParams(max_tokens=3, prompt_logprobs=2)
    (a,) = run_to_completion(Scheduler(contiguous, ByteTokenizer()), [(prompt, params)])
    sched = Scheduler(paged, ByteTokenizer())
    run_to_completion(sched, [(prompt, SamplingParams(max_tokens=2))])  # warm the cache
    (b,) = run_to_completion(sched, [(prompt, params)])
    np.testing.assert_allclose(a.prompt_logprobs, b.prompt_logprobs, atol=1e-5)
    assert a.output == b.output


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
