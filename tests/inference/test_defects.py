"""Regression tests for defects real clients hit: the wake-before-done race, requests that
outlive their client, 429 on an idle server, unbounded bodies and metric labels, byte
offsets of non-ASCII text, error codes of bad prompts."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import urllib.request

import numpy as np
import openai
import pytest

from inference import LLM, QueueFullError, SamplingParams, Scheduler, ServingConfig
from inference.request import Request
from inference.server import BackgroundServer, _Watcher, create_app
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-defects"


@pytest.fixture(scope="module")
def served():
    llm = LLM(
        init_params(CFG, seed=5),
        config=CFG,
        engine=ServingConfig(slots=4, prefill_buckets=(16, 64), decode_steps=4),
        queue_size=4,
    )
    llm.engine.warmup()
    server = BackgroundServer(
        create_app(llm, model_name=NAME, max_tokens_limit=48, max_request_bytes=10_000)
    )
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client
    server.stop()
    llm.close()


class _LookedEvent(threading.Event):
    """A done-flag that reports when the event loop thread reads it after a wake-up."""

    def __init__(self, loop_thread: threading.Thread | None = None):
        super().__init__()
        self.looked = threading.Event()
        self.loop_thread = loop_thread

    def is_set(self) -> bool:
        value = super().is_set()
        if threading.current_thread() is self.loop_thread:
            self.looked.set()
        return value


def test_a_waiter_checking_between_the_callback_and_done_still_wakes():
    """Deterministic interleaving: the scheduler thread is held inside the final callback
    until the woken handler has read ``done``; with the old order (callback, then flag)
    the handler read False, slept again, and nothing ever woke it."""

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        watcher = _Watcher(loop)
        request = Request([1], SamplingParams(max_tokens=1), ByteTokenizer())
        flag = _LookedEvent(threading.current_thread())
        request._done = flag

        def on_update(r: Request, finished: bool) -> None:
            watcher(r, finished)
            if finished:  # the racy line: pause here until the handler has looked
                flag.looked.clear()
                assert flag.looked.wait(5), "the handler never checked"

        request.on_update = on_update

        def scheduler_thread() -> None:
            request._finish("length")
            request._notify()

        await asyncio.sleep(0)
        thread = threading.Thread(target=scheduler_thread)
        thread.start()
        try:
            await asyncio.wait_for(watcher.until_done([request]), timeout=3)
            return True
        except TimeoutError:
            return False
        finally:
            thread.join(10)

    assert asyncio.run(scenario()), "the handler slept through the end of its request"


class _Gate:
    """Holds every decode dispatch until opened (a deterministic slow model)."""

    def __init__(self, engine, monkeypatch):
        self.open = threading.Event()
        self.entered = threading.Event()
        real = engine.decode_async

        def gated(active, **kwargs):
            self.entered.set()
            self.open.wait(30)
            return real(active, **kwargs)

        monkeypatch.setattr(engine, "decode_async", gated)


def _raw_post(url: str, path: str, body: dict) -> socket.socket:
    """Send a POST and return the open socket without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    sock.sendall(head + data)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_frees_its_slot_within_a_second(served, monkeypatch, stream):
    llm, server, _ = served
    sched = llm.scheduler
    gate = _Gate(llm.engine, monkeypatch)
    cancelled_before = sched.stats["requests_cancelled"]
    body = {"model": NAME, "prompt": "abc", "max_tokens": 40, "ignore_eos": True, "stream": stream}
    sock = _raw_post(server.url, "/v1/completions", body)
    assert gate.entered.wait(10)
    (request,) = [r for r in sched.slots if r is not None]
    sock.close()
    deadline = time.perf_counter() + 1.0
    while not request.cancelled and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert request.cancelled, "the disconnect was not noticed within 1 s"
    gate.open.set()
    deadline = time.perf_counter() + 1.0
    while sched.active_slots() and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert sched.active_slots() == 0
    assert request.finish_reason == "cancelled" and len(request.output) < 40
    assert sched.stats["requests_cancelled"] == cancelled_before + 1


def test_more_prompts_than_the_queue_run_on_an_idle_server(served):
    _, _, client = served
    prompts = [f"p{i}" for i in range(7)]  # the queue holds 4
    r = client.completions.create(model=NAME, prompt=prompts, max_tokens=2, temperature=0)
    assert len(r.choices) == 7 and r.usage.completion_tokens == 14


def test_a_group_that_cannot_fit_behind_waiting_requests_is_refused():
    llm = LLM(init_params(CFG, seed=5), config=CFG, engine=ServingConfig(slots=1), queue_size=3)
    sched = llm.scheduler  # no thread: nothing leaves the queue
    sched.submit([1], SamplingParams(max_tokens=1))
    with pytest.raises(QueueFullError, match="1 of 3 waiting, 3 more"):
        sched.submit_many([([1], SamplingParams(max_tokens=1))] * 3)
    assert len(sched.submit_many([([1], SamplingParams(max_tokens=1))] * 2)) == 2


def _http(url: str, method: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        method, path, body=body, headers=headers, encode_chunked=not isinstance(body, bytes)
    )
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def test_request_size_limit_and_bounded_metric_labels(served):
    _, server, _ = served
    big = json.dumps({"model": NAME, "prompt": "x" * 20_000}).encode()
    code, payload = _http(
        server.url, "POST", "/v1/completions", big, {"Content-Type": "application/json"}
    )
    assert code == 413 and "limit of 10000 bytes" in payload["error"]["message"]

    def chunks():
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    code, payload = _http(
        server.url, "POST", "/v1/completions", chunks(), {"Content-Type": "application/json"}
    )
    assert code == 413 and payload["error"]["code"] == "request_too_large"
    for i in range(5):
        _http(server.url, "GET", f"/random/{i}", b"", {})
    with urllib.request.urlopen(server.url + "/metrics") as resp:
        text = resp.read().decode()
    paths = {
        line.split('path="')[1].split('"')[0] for line in text.splitlines() if 'path="' in line
    }
    assert "other" in paths and not any(p.startswith("/random") for p in paths)


def test_non_ascii_offsets_and_chat_bytes_round_trip(served):
    _llm, _, client = served
    text = "h\u00e9 \u65e5\u672c"
    r = client.completions.create(
        model=NAME, prompt=text, max_tokens=3, echo=True, logprobs=2, temperature=0
    )
    lp = r.choices[0].logprobs
    full = r.choices[0].text
    # Each byte token starts at the character that holds its first byte.
    raw = text.encode()
    want = [len(raw[:i].decode("utf-8", errors="ignore")) for i in range(len(raw))]
    assert lp.text_offset[: len(raw)] == want
    assert full.startswith(text)
    chat = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": text}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
    )
    content = chat.choices[0].logprobs.content
    ids = [int(b) for c in content for b in c.bytes]
    assert all(len(c.bytes) == 1 for c in content)  # byte tokens carry their own byte
    assert bytes(ids).decode("utf-8", errors="replace") == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 20 for c in content)
    assert all(np.isfinite(c.logprob) for c in content)


def test_bad_prompts_get_their_own_error_codes(served):
    _, server, _ = served
    cases = [
        ({"model": NAME, "prompt": "", "max_tokens": 1}, "invalid_prompt"),
        ({"model": NAME, "prompt": [5, 300], "max_tokens": 1}, "invalid_token_id"),
        ({"model": NAME, "prompt": "y" * 60, "max_tokens": 10}, "context_length_exceeded"),
    ]
    for body, code in cases:
        status, payload = _http(
            server.url,
            "POST",
            "/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 400 and payload["error"]["code"] == code, payload


def test_scheduler_histograms_count_every_request():
    llm = LLM(init_params(CFG, seed=5), config=CFG, engine=ServingConfig(slots=2))
    sched: Scheduler = llm.scheduler
    llm.generate(["a", "b", "c"], max_tokens=3)
    hist = sched.histograms["request_latency_seconds"]
    assert hist.count == 3 and hist.cumulative()[-1] == ("+Inf", 3)
    assert sched.histograms["time_to_first_token_seconds"].count == 3
