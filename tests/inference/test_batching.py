"""Continuous batching: batched outputs equal solo outputs, no recompiles, backpressure."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from inference import QueueFullError, RequestError, SamplingParams, Scheduler, ServingConfig
from inference.batching import run_to_completion
from inference.engine import SlotEngine
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import count_compiles

CFG = TransformerConfig.tiny(max_seq_len=128)


@pytest.fixture(scope="module")
def engine():
    eng = SlotEngine(
        CFG, init_params(CFG, seed=1), ServingConfig(slots=8, prefill_buckets=(16, 32, 64))
    )
    eng.warmup()
    return eng


def _requests(n: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(256) for _ in range(rng.randrange(1, 60))]
        params = SamplingParams(max_tokens=rng.randrange(1, 40))
        if i % 4 == 3:  # some sampled rows, seeded, so their text is reproducible too
            params = SamplingParams(
                max_tokens=params.max_tokens, temperature=0.9, top_k=40, top_p=0.9, seed=i
            )
        out.append((prompt, params))
    return out


def test_32_staggered_requests_equal_solo_runs_without_recompiling(engine):
    tok = ByteTokenizer()
    work = _requests(32)
    solo_sched = Scheduler(engine, tok)
    solo = [run_to_completion(solo_sched, [w])[0].output for w in work]

    sched = Scheduler(engine, tok).start()
    compiled_before = engine.compile_count()
    rng = random.Random(1)
    with count_compiles() as compiles:
        handles = []
        for prompt, params in work:  # arrivals spread over time, while others decode
            handles.append(sched.submit(prompt, params))
            time.sleep(rng.uniform(0, 0.01))
        batched = [h.wait(timeout=120).output for h in handles]
    sched.stop()
    assert batched == solo
    assert compiles.count == 0
    assert engine.compile_count() == compiled_before == len(engine.buckets) + 2  # 2 decodes
    assert sched.stats["decode_steps_total"] < sum(len(o) for o in solo)  # steps were shared
    for (_, params), out in zip(work, solo, strict=True):
        assert len(out) == params.max_tokens


def test_stop_strings_stop_tokens_and_streaming_text(engine):
    tok = ByteTokenizer()
    sched = Scheduler(engine, tok)
    prompt = tok.encode("def f(x):")
    (free,) = run_to_completion(sched, [(prompt, SamplingParams(max_tokens=30))])
    text = free.text
    assert len(free.output) == 30
    # A stop string taken from the middle of the free-running text cuts it there.
    stop = text[10:12] if "\ufffd" not in text[10:12] else text[3:4]
    (stopped,) = run_to_completion(sched, [(prompt, SamplingParams(max_tokens=30, stop=(stop,)))])
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.find(stop)]
    # A stop token ends generation before it.
    (by_token,) = run_to_completion(
        sched, [(prompt, SamplingParams(max_tokens=30, stop_token_ids=(free.output[5],)))]
    )
    assert by_token.output == free.output[: free.output.index(free.output[5])]
    assert by_token.finish_reason == "stop"


def test_sampling_is_seeded_and_top_k_1_is_greedy(engine):
    sched = Scheduler(engine, ByteTokenizer())
    prompt = [1, 2, 3]
    greedy, k1, s1, s2, s3 = run_to_completion(
        sched,
        [
            (prompt, SamplingParams(max_tokens=12)),
            (prompt, SamplingParams(max_tokens=12, temperature=1.0, top_k=1, seed=5)),
            (prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=7)),
            (prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=7)),
            (prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=8)),
        ],
    )
    assert k1.output == greedy.output
    assert s1.output == s2.output
    assert s1.output != s3.output
    # Per-token log-probs are the model's own (finite, <= 0).
    assert all(lp <= 0 for lp in s1.logprobs) and np.isfinite(s1.logprobs).all()


def test_backpressure_cancellation_and_validation(engine):
    sched = Scheduler(engine, ByteTokenizer(), queue_size=2)
    a = sched.submit([1], SamplingParams(max_tokens=50))
    b = sched.submit([2], SamplingParams(max_tokens=50))
    with pytest.raises(QueueFullError, match="queue is full"):
        sched.submit([3], SamplingParams(max_tokens=5))
    assert sched.stats["requests_rejected"] == 1
    b.cancel()
    sched.step()
    sched.step()
    a.cancel()
    sched.step()
    assert a.finish_reason == "cancelled" and b.finish_reason == "cancelled"
    assert 0 < len(a.output) < 50 and b.output == []
    assert sched.active_slots() == 0
    with pytest.raises(RequestError, match="context is 128 tokens"):
        sched.submit([1] * 100, SamplingParams(max_tokens=40))
    with pytest.raises(RequestError, match="empty"):
        sched.submit([], SamplingParams())


def test_scheduler_thread_serves_concurrent_callers(engine):
    sched = Scheduler(engine, ByteTokenizer()).start()
    results: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        results[i] = sched.submit([i + 1, 7], SamplingParams(max_tokens=8)).wait(60).output

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sched.stop()
    assert sorted(results) == list(range(12)) and all(len(v) == 8 for v in results.values())
