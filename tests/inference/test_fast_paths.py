"""The decode fast paths: the greedy dispatch equals the full one, the scheduler picks it
only when every running request allows it, and no dispatch is made past every limit."""

from __future__ import annotations

import numpy as np
import pytest

from inference import SamplingParams, Scheduler, ServingConfig
from inference.batching import run_to_completion
from inference.engine import SlotEngine, SlotSettings, fetch_prefill
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64)


@pytest.fixture(scope="module")
def engine():
    config = ServingConfig(slots=3, prefill_buckets=(16,), decode_steps=4)
    return SlotEngine(CFG, init_params(CFG, seed=3), config)


def _decode_after_prefill(engine: SlotEngine, greedy: bool):
    engine.state = engine.empty_state()
    rng = np.random.default_rng(0)
    for slot in range(3):
        prompt = rng.integers(0, 256, 5 + 3 * slot).tolist()
        # Slot 1 bans its likely stop tokens for 6 draws: min_tokens applies on both paths.
        settings = SlotSettings(
            key=np.zeros(2, np.uint32),
            max_tokens=20,
            min_tokens=6 if slot == 1 else 0,
            stop_ids=tuple(range(0, 256, 2)) if slot == 1 else (),
        )
        fetch_prefill(engine.prefill_async(slot, prompt, settings))
    return [engine.decode(np.array([True, True, False]), greedy=greedy) for _ in range(2)]


def test_the_greedy_dispatch_gives_the_full_dispatchs_tokens_and_logprobs(engine):
    full = _decode_after_prefill(engine, greedy=False)
    fast = _decode_after_prefill(engine, greedy=True)
    for a, b in zip(full, fast, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.emitted, b.emitted)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
        assert b.top_ids.shape[-1] == 0  # no alternatives on the fast path
    assert not full[0].emitted[:, 2].any()  # the inactive slot never advanced
    assert (full[0].tokens[:, 1] % 2 == 1).all()  # min_tokens banned the even stop ids


def _recorded(engine, monkeypatch) -> list[bool]:
    calls: list[bool] = []
    real = engine.decode_async

    def record(active, *, greedy=False):
        calls.append(greedy)
        return real(active, greedy=greedy)

    monkeypatch.setattr(engine, "decode_async", record)
    return calls


def test_the_scheduler_takes_the_greedy_path_only_when_every_request_allows_it(engine, monkeypatch):
    calls = _recorded(engine, monkeypatch)
    sched = Scheduler(engine, ByteTokenizer())
    run_to_completion(sched, [([1, 2, 3], SamplingParams(max_tokens=6, logprobs=0))])
    assert calls and all(calls)  # the chosen token's log-prob alone needs no full path
    for special in (
        SamplingParams(max_tokens=6, temperature=0.8, seed=1),
        SamplingParams(max_tokens=6, logprobs=2),
        SamplingParams(max_tokens=6, repetition_penalty=1.3),
        SamplingParams(max_tokens=6, frequency_penalty=0.5),
    ):
        calls.clear()
        plain = SamplingParams(max_tokens=6)
        run_to_completion(sched, [([1, 2, 3], plain), ([4, 5], special)])
        assert calls and not any(calls), special


@pytest.mark.parametrize("max_tokens, dispatches", [(1, 0), (5, 1), (9, 2), (10, 3)])
def test_no_decode_dispatch_is_made_past_every_requests_limit(engine, max_tokens, dispatches):
    # The prefill draws token 1; each dispatch adds decode_steps = 4.
    sched = Scheduler(engine, ByteTokenizer())
    (out,) = run_to_completion(sched, [([7, 8, 9], SamplingParams(max_tokens=max_tokens))])
    assert len(out.output) == max_tokens
    assert sched.stats["decode_dispatches_total"] == dispatches
