"""Limits and bookkeeping the off-path probe noticed: non-finite and lax-typed numbers in
request bodies, an unbounded number of sequences per request, KV pages invisible in
/metrics, a made-up ``max_tokens`` in a chat error, and prefill failures in no counter."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from inference import LLM, ServingConfig
from inference.server import (
    DEFAULT_MAX_SEQUENCES_PER_REQUEST,
    BackgroundServer,
    _parser,
    create_app,
)
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import post_raw_json

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-limits"
CHAT = [{"role": "user", "content": "hi"}]
MAX_SEQUENCES = 8


@pytest.fixture(scope="module")
def served():
    llm = LLM(
        init_params(CFG, seed=7),
        config=CFG,
        engine=ServingConfig(
            slots=4, prefill_buckets=(16, 64), decode_steps=4, kv_cache="paged", page_size=8
        ),
    )
    llm.engine.warmup()
    app = create_app(llm, model_name=NAME, max_sequences_per_request=MAX_SEQUENCES)
    server = BackgroundServer(app)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client
    server.stop()
    llm.close()


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN"])
@pytest.mark.parametrize(
    "field", ["repetition_penalty", "temperature", "top_p", "presence_penalty"]
)
def test_non_finite_sampling_parameters_are_refused(served, field, value):
    """``Infinity`` (raw JSON, which Python's parser takes) was accepted and gave degenerate
    output; ``NaN`` was refused as "must be <= 2", a bound it does not break."""
    _, server, _ = served
    raw = f'{{"model": "{NAME}", "prompt": "ab", "max_tokens": 2, "{field}": {value}}}'
    code, payload = post_raw_json(server.url + "/v1/completions", raw)
    assert code == 400, payload
    err = payload["error"]
    assert err["param"] == field
    assert "must be a finite number" in err["message"], err
    assert value in err["message"], err


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("/v1/completions", "max_tokens", "true"),
        ("/v1/completions", "logprobs", "true"),
        ("/v1/completions", "n", "false"),
        ("/v1/completions", "seed", '"7"'),
        ("/v1/completions", "seed", "1.5"),
        ("/v1/completions", "stop_token_ids", "[true]"),
        ("/v1/chat/completions", "max_tokens", "true"),
        ("/v1/chat/completions", "top_k", "true"),
        ("/v1/chat/completions", "top_logprobs", "true"),
    ],
)
def test_integer_fields_refuse_booleans_strings_and_fractions(served, route, field, value):
    """pydantic's lax mode took ``true`` as 1 and ``"7"`` as 7 (OpenAI refuses both)."""
    _, server, _ = served
    where = '"prompt": "ab"' if route == "/v1/completions" else f'"messages": {json.dumps(CHAT)}'
    extra = ', "logprobs": true' if field == "top_logprobs" else ""
    raw = f'{{"model": "{NAME}", {where}{extra}, "{field}": {value}}}'
    code, payload = post_raw_json(server.url + route, raw)
    assert code == 400, payload
    err = payload["error"]
    assert err["param"].split(".")[0] == field, err
    assert "integer" in err["message"], err


def test_a_prompt_of_booleans_is_not_token_ids(served):
    _, server, _ = served
    code, payload = post_raw_json(
        server.url + "/v1/completions", f'{{"model": "{NAME}", "prompt": [true, false]}}'
    )
    assert code == 400, payload
    assert payload["error"]["param"].startswith("prompt"), payload


def test_an_integral_float_is_taken_as_an_integer(served):
    """``1e3`` is a JSON number that Python parses as a float: integral ones are accepted."""
    _, server, _ = served
    raw = f'{{"model": "{NAME}", "prompt": "ab", "max_tokens": 2.0, "seed": 1e3}}'
    code, payload = post_raw_json(server.url + "/v1/completions", raw)
    assert code == 200, payload
    assert payload["usage"]["completion_tokens"] == 2


def test_a_request_over_the_sequence_limit_is_refused(served):
    """40 prompts x n=16 ran as 640 sequences from one request."""
    llm, server, _ = served
    before = llm.scheduler.stats["requests_total"]
    body = {"model": NAME, "prompt": ["ab"] * 3, "n": 3, "max_tokens": 1}
    code, payload = post_raw_json(server.url + "/v1/completions", json.dumps(body))
    assert code == 400, payload
    err = payload["error"]
    assert "9 sequences" in err["message"] and f"limit is {MAX_SEQUENCES}" in err["message"]
    assert "--max-sequences-per-request" in err["message"]
    assert err["code"] == "too_many_sequences"
    assert llm.scheduler.stats["requests_total"] == before  # nothing was queued
    body = {"model": NAME, "prompt": "ab", "max_tokens": 1, "n": 2, "best_of": 9}
    code, payload = post_raw_json(server.url + "/v1/completions", json.dumps(body))
    assert code == 400 and payload["error"]["code"] == "too_many_sequences", payload
    body = {"model": NAME, "prompt": ["ab"] * 2, "n": 4, "max_tokens": 1}  # exactly 8
    code, payload = post_raw_json(server.url + "/v1/completions", json.dumps(body))
    assert code == 200 and len(payload["choices"]) == 8, payload


def test_the_sequence_limit_is_a_cli_option_with_a_default(served):
    llm, _, _ = served
    args = _parser().parse_args(["--model", "tiny", "--max-sequences-per-request", "32"])
    assert args.max_sequences_per_request == 32
    default = _parser().parse_args(["--model", "tiny"]).max_sequences_per_request
    assert default == DEFAULT_MAX_SEQUENCES_PER_REQUEST == 256
    server = BackgroundServer(create_app(llm, model_name=NAME))
    try:
        body = {"model": NAME, "prompt": ["ab"] * 20, "n": 16, "max_tokens": 1}
        code, payload = post_raw_json(server.url + "/v1/completions", json.dumps(body))
        assert code == 400, payload
        assert "320 sequences" in payload["error"]["message"]
        assert f"limit is {DEFAULT_MAX_SEQUENCES_PER_REQUEST}" in payload["error"]["message"]
    finally:
        server.stop()


def test_kv_page_gauges_show_pages_come_back_after_disconnects(served):
    """/metrics had no free-page gauge, so a page leak was invisible from outside."""
    llm, server, client = served
    m = _metrics(server.url)
    total = llm.scheduler.pool.total
    assert m["jaxcore_inference_kv_pages_total"] == total
    assert m["jaxcore_inference_kv_pages_free"] == llm.scheduler.pool.free_pages()
    for i in range(6):
        stream = client.completions.create(
            model=NAME,
            prompt=f"disconnect {i}",
            max_tokens=40,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        next(iter(stream))
        stream.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = _metrics(server.url)
        if m["jaxcore_inference_kv_pages_free"] == total:
            break
        time.sleep(0.05)
    assert m["jaxcore_inference_kv_pages_free"] == total
    assert m["jaxcore_inference_active_slots"] == 0


def test_a_chat_prompt_too_long_for_the_context_says_so(served):
    """With no max_tokens, the error said "max_tokens is 1", a value the client never sent."""
    _, _, client = served
    long = [{"role": "user", "content": "x" * 100}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=long)
    err = e.value.body
    assert "max_tokens" not in err["message"], err
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert f"context is {CFG.max_seq_len} tokens" in err["message"]
    assert "the prompt has 1" in err["message"]  # 100 bytes + the template's tags


def test_a_request_whose_prefill_fails_is_counted(served, monkeypatch):
    """It counted in requests_total but in no finished or failed counter."""
    llm, server, client = served
    stats = llm.scheduler.stats
    total, finished = stats["requests_total"], stats["requests_finished"]
    failed = stats.get("requests_failed", 0)

    def broken(*args, **kwargs):
        raise RuntimeError("injected prefill failure")

    with monkeypatch.context() as m:
        m.setattr(llm.engine, "prefill_async", broken)
        with pytest.raises(openai.InternalServerError):
            client.completions.create(model=NAME, prompt="ab", max_tokens=2, n=2)
    assert stats["requests_total"] == total + 2
    assert stats["requests_failed"] == failed + 2
    assert stats["requests_finished"] == finished
    assert _metrics(server.url)["jaxcore_inference_requests_failed"] == failed + 2
    assert llm.scheduler.pool.free_pages() == llm.scheduler.pool.total  # none leaked


@pytest.mark.parametrize("name", ["temperature", "repetition_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_sampling_params_refuse_non_finite_numbers(name, value):
    """The Python API took ``temperature=inf`` and ``repetition_penalty=inf``."""
    import jaxcore as jc
    from inference import SamplingParams

    with pytest.raises(jc.ConfigError, match="must be a finite number"):
        SamplingParams(**{name: value})
