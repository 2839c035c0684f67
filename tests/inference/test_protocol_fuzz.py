"""Fuzzing the OpenAI endpoints: whatever JSON a client sends, the server answers with a
result or a 4xx error naming the problem, never a 500 or a cut connection.

Bodies start from a valid request and get random values, of random types, for the
fields both endpoints know (strings, booleans, huge and negative numbers, floats for
integers, lists, objects, nulls), plus the odd unknown field.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-fuzz"

small = st.integers(0, 5)
unit = st.floats(0.01, 1.0)
# A plausible value for each field (the endpoints' own ranges); junk comes from `values`.
VALID = {
    "temperature": st.floats(0.0, 2.0),
    "top_p": unit,
    "top_k": st.integers(-1, 10),
    "n": st.integers(1, 3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": st.one_of(
        st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=4)
    ),
    "seed": st.integers(-(2**31), 2**31),
    "presence_penalty": st.floats(-2.0, 2.0),
    "frequency_penalty": st.floats(-2.0, 2.0),
    "user": st.text(max_size=5),
    "ignore_eos": st.booleans(),
    "min_tokens": small,
    "stop_token_ids": st.lists(st.integers(0, 255), max_size=3),
    "include_stop_str_in_output": st.booleans(),
    "repetition_penalty": st.floats(0.5, 2.0),
    "prompt_logprobs": small,
    "max_tokens": st.integers(1, 10),
    "logprobs": st.one_of(st.booleans(), small),
    "echo": st.booleans(),
    "best_of": st.integers(1, 3),
    "max_completion_tokens": st.integers(1, 10),
    "top_logprobs": small,
    "response_format": st.just({"type": "text"}),
    "add_generation_prompt": st.booleans(),
    "suffix": st.just(""),
    "logit_bias": st.just({}),
    "bogus_field": st.just(1),
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 5, 20, 21, 48, 49, 10**6, 2**64]),
    st.sampled_from([-1.5, 0.0, 0.5, 1.0, 1.5, 2.0, 1e3, 1e308]),
    st.sampled_from(["", "a", "3", "\n", "é", "\x00", "include_usage", "text", "json_object"]),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.sampled_from(["include_usage", "type", "5", "x"]), scalars, max_size=2),
)
prompts = st.one_of(
    st.text(max_size=12),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), min_size=1, max_size=2),
    st.lists(st.integers(-2, 300), min_size=1, max_size=6),
    st.lists(st.lists(st.integers(0, 255), min_size=1, max_size=4), min_size=1, max_size=2),
    scalars,
)
chat_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=8)}
    ),
    min_size=1,
    max_size=3,
)
messages = st.one_of(
    chat_messages,
    chat_messages,
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
            optional={"content": st.one_of(st.text(max_size=8), values)},
        ),
        max_size=3,
    ),
    values,
)


@pytest.fixture(scope="module")
def server():
    llm = LLM(
        init_params(CFG, seed=6),
        config=CFG,
        engine=ServingConfig(slots=4, prefill_buckets=(16, 64), decode_steps=4),
    )
    llm.engine.warmup()
    srv = BackgroundServer(create_app(llm, model_name=NAME, max_tokens_limit=48))
    yield srv
    srv.stop()
    llm.close()


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _check(code: int, raw: bytes, body: dict) -> None:
    assert code in (200, 400, 413, 422, 429), (code, raw[:300], body)
    if code != 200:
        err = json.loads(raw)["error"]
        assert err["message"], (raw, body)
        return
    if body.get("stream") is True:
        events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", (raw[-300:], body)
        for e in events[:-1]:
            assert "error" not in json.loads(e), (e, body)
    else:
        assert json.loads(raw)["choices"], body


@st.composite
def extra_fields(draw) -> dict:
    """Mostly plausible values, one junk value in three."""
    names = draw(st.lists(st.sampled_from(sorted(VALID)), max_size=6, unique=True))
    junk = st.integers(0, 2).map(lambda i: i == 0)
    return {k: draw(values) if draw(junk) else draw(VALID[k]) for k in names}


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(prompt=prompts, extra=extra_fields())
def test_any_completion_body_gets_an_answer_or_a_4xx(server, prompt, extra):
    body = {"model": NAME, "prompt": prompt, "max_tokens": 3} | extra
    _check(*_post(server.url + "/v1/completions", body), body)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(msgs=messages, extra=extra_fields())
def test_any_chat_body_gets_an_answer_or_a_4xx(server, msgs, extra):
    body = {"model": NAME, "messages": msgs, "max_tokens": 3} | extra
    _check(*_post(server.url + "/v1/chat/completions", body), body)
