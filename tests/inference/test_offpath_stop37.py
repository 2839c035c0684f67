"""What a user of the OpenAI client found off the tested path: a ``top_k`` or ``min_tokens``
too big for int32 failed the generation (a 500), text holding a lone UTF-16 surrogate
(JSON's ``"\\ud800"``) crashed the tokenizer (a 500, even inside an error message), and a
``tool_choice`` that demands a tool call was silently ignored."""

from __future__ import annotations

import json

import openai
import pytest

from inference import LLM, ServingConfig
from inference.request import RequestError
from inference.server import BackgroundServer, create_app
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer, post_raw_json

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-stop37"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model behind the server, with a real `tokenizers` byte-level tokenizer."""
    folder = byte_level_tokenizer(tmp_path_factory.mktemp("tok"))
    llm = LLM(
        init_params(CFG, seed=3),
        config=CFG,
        tokenizer=str(folder),
        engine=ServingConfig(slots=2, prefill_buckets=(16, 64), decode_steps=4),
    )
    server = BackgroundServer(create_app(llm, model_name=NAME))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client
    server.stop()
    llm.close()


def test_a_top_k_past_the_vocabulary_samples_from_all_of_it(served):
    llm, _, client = served
    same = dict(prompt="abc", max_tokens=6, temperature=1.0, seed=11)
    want = client.completions.create(model=NAME, **same).choices[0].text
    huge = client.completions.create(model=NAME, extra_body={"top_k": 10**12}, **same)
    assert huge.choices[0].text == want
    out = llm.generate("abc", max_tokens=6, temperature=1.0, seed=11, top_k=2**40)
    assert out.tokens == llm.generate("abc", max_tokens=6, temperature=1.0, seed=11).tokens


def test_a_min_tokens_past_max_tokens_runs_to_max_tokens(served):
    llm, _, _ = served
    want = llm.generate("abc", max_tokens=5, min_tokens=5)
    out = llm.generate("abc", max_tokens=5, min_tokens=2**40)
    assert out.tokens == want.tokens and out.finish_reason == "length"


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", "\udfff"]}, "prompt.1"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, None),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ],
)
def test_text_with_a_lone_surrogate_gets_a_400_naming_the_field(served, route, body, param):
    _, server, _ = served
    raw = json.dumps({"model": NAME, "max_tokens": 2, **body})  # ASCII: "\ud800" escapes
    if route == "/tokenize":
        raw = json.dumps(body)
    status, answer = post_raw_json(server.url + route, raw)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == (param or "messages.0.content")
    assert "lone UTF-16 surrogate" in error["message"] and error["code"] == "invalid_text"


def test_generate_refuses_a_lone_surrogate_with_a_request_error(served):
    llm, _, _ = served
    with pytest.raises(RequestError, match="lone UTF-16 surrogate"):
        llm.generate("x\ud800", max_tokens=2)


def test_an_error_quoting_a_lone_surrogate_is_still_answered(served):
    _, server, _ = served
    status, answer = post_raw_json(
        server.url + "/v1/completions", '{"model": "\\ud800", "prompt": "a"}'
    )
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    assert "\ud800" in answer["error"]["message"]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "f"}}, "bogus"]
)
def test_a_tool_choice_that_needs_tools_is_refused(served, choice):
    _, _, client = served
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, tool_choice=choice)
    assert info.value.body["param"] == "tool_choice"
    assert "does not support tools" in info.value.body["message"]


@pytest.mark.parametrize("choice", ["none", "auto"])
def test_a_tool_choice_of_plain_text_still_answers(served, choice):
    _, _, client = served
    r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, tool_choice=choice)
    assert r.choices[0].finish_reason == "length"
