"""Requests a demanding OpenAI client sends that the other server tests do not: explicit
``null`` parameters, out-of-vocabulary stop token ids, wrongly typed union fields,
``top_logprobs`` without ``logprobs``, and a generation that fails mid-stream."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-offpath"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served():
    llm = LLM(
        init_params(CFG, seed=6),
        config=CFG,
        engine=ServingConfig(slots=4, prefill_buckets=(16, 64), decode_steps=4),
    )
    llm.engine.warmup()
    server = BackgroundServer(create_app(llm, model_name=NAME, max_tokens_limit=48))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client
    server.stop()
    llm.close()


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("ids", [[256], [-1], [3, 10**6]])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stop_token_ids_outside_the_vocabulary_get_a_400(served, route, ids):
    """They were a 500 ("index 256 is out of bounds"), and -1 silently made token 255 a
    stop token (NumPy's negative index)."""
    _, server, _ = served
    body = {"model": NAME, "max_tokens": 3, "stop_token_ids": ids}
    body |= {"prompt": "hi"} if route == "/v1/completions" else {"messages": CHAT}
    code, payload = _post(server.url + route, body)
    assert code == 400, payload
    err = payload["error"]
    assert err["param"] == "stop_token_ids" and err["code"] == "invalid_stop_token_id"
    assert "[0, 256)" in err["message"]


def test_explicit_null_parameters_mean_their_defaults(served):
    """OpenAI's API declares these nullable, and the official client sends ``null`` for a
    parameter passed as None: they were refused with 400."""
    _, server, client = served
    nulls = dict(temperature=None, top_p=None, n=None, presence_penalty=None)
    want = client.completions.create(model=NAME, prompt="ab", max_tokens=5, seed=1)
    got = client.completions.create(
        model=NAME, prompt="ab", max_tokens=5, seed=1, frequency_penalty=None, **nulls
    )
    assert got.choices[0].text == want.choices[0].text
    chat = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=3, logprobs=None, top_logprobs=None, **nulls
    )
    assert chat.choices[0].finish_reason == "length"
    code, payload = _post(
        server.url + "/v1/completions",
        {"model": NAME, "prompt": "ab", "max_tokens": 2, "echo": None, "stream": None},
    )
    assert code == 200, payload
    # Required fields stay required.
    code, payload = _post(server.url + "/v1/completions", {"model": NAME, "prompt": None})
    assert code == 400 and payload["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("route", "body", "param", "words"),
    [
        ("/v1/completions", {"prompt": 5}, "prompt", "str, list[str], list[int]"),
        ("/v1/completions", {"prompt": "a", "stop": 5}, "stop", "str, list[str]"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]},
            "messages.0.content.0.type",
            "'text'",
        ),
    ],
)
def test_errors_of_union_fields_name_the_field(served, route, body, param, words):
    """pydantic's union member tags leaked into ``param`` ("prompt.str") and the message
    was the first member's ("Input should be a valid string" for an image part)."""
    _, server, _ = served
    code, payload = _post(server.url + route, {"model": NAME, **body})
    assert code == 400
    assert payload["error"]["param"] == param, payload
    assert words in payload["error"]["message"], payload


def test_chat_top_logprobs_without_logprobs_is_refused(served):
    _, _, client = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=2, top_logprobs=3)
    assert e.value.body["param"] == "top_logprobs"
    assert "logprobs=true" in e.value.body["message"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_generation_that_fails_mid_stream_ends_with_an_error_event(served, monkeypatch, chat):
    """The stream was cut (the client saw a connection error, not the reason)."""
    llm, _, client = served

    def broken(*args, **kwargs):
        raise RuntimeError("injected prefill failure")

    with monkeypatch.context() as m:
        m.setattr(llm.engine, "prefill_async", broken)
        if chat:
            stream = client.chat.completions.create(
                model=NAME, messages=CHAT, max_tokens=3, stream=True
            )
        else:
            stream = client.completions.create(model=NAME, prompt="ab", max_tokens=3, stream=True)
        with pytest.raises(openai.APIError) as e:
            list(stream)
    assert not isinstance(e.value, openai.APIConnectionError)
    assert "injected prefill failure" in e.value.message
    # The server keeps serving.
    r = client.completions.create(model=NAME, prompt="ab", max_tokens=2, stream=True)
    assert [c.choices[0].finish_reason for c in r if c.choices][-1] == "length"


def test_a_chat_limit_error_names_the_field_the_client_sent(served):
    """``max_completion_tokens`` above the limit was reported as ``max_tokens``."""
    _, server, _ = served
    body = {"model": NAME, "messages": CHAT, "max_completion_tokens": 1000}
    code, payload = _post(server.url + "/v1/chat/completions", body)
    assert code == 400 and payload["error"]["param"] == "max_completion_tokens"
    assert "max_completion_tokens=1000" in payload["error"]["message"]
    assert "limit of 48" in payload["error"]["message"]


def _byte_fallback_tokenizer():
    """A SentencePiece-style tokenizer (Llama 2, Mistral): characters outside the vocabulary
    are ``<0xNN>`` byte tokens, and an incomplete group decodes to one U+FFFD per byte."""
    import tokenizers
    from tokenizers import decoders, models

    from inference.tokenizer import load_tokenizer

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}, "a": 257, "b": 258}
    tok = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>")
    )
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return load_tokenizer(tok)


def test_streamed_text_of_byte_fallback_characters_equals_the_final_text():
    """Two of the three bytes of a character decode to two U+FFFD; only the last was held
    back, so the stream sent a U+FFFD that the finished text does not have."""
    import numpy as np

    from inference import SamplingParams
    from inference.request import Request

    tok = _byte_fallback_tokenizer()
    ids = [257, *(b + 1 for b in "\u65e5\U0001f600".encode()), 258]  # a, 日, 😀, b
    r = Request([257], SamplingParams(max_tokens=len(ids)), tok)
    sent = ""
    for t in ids:
        r._add(t, 0.0, np.zeros(0, np.int32), np.zeros(0, np.float32))
        sent += r.text[len(sent) : r.stable_len]  # what the server streams
    assert r.finish_reason == "length"
    assert r.text == "a\u65e5\U0001f600b"
    assert sent == r.text


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_with_stream_is_refused_not_dropped(served, route):
    """A stream carried no prompt_logprobs at all, with a 200 (vLLM refuses it too)."""
    _, server, _ = served
    body = {"model": NAME, "max_tokens": 2, "prompt_logprobs": 1, "stream": True}
    body |= {"prompt": "abcd"} if route == "/v1/completions" else {"messages": CHAT}
    code, payload = _post(server.url + route, body)
    assert code == 400, payload
    assert payload["error"]["param"] == "prompt_logprobs"
    assert "stream" in payload["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
            "unknown parameter",
        ),
    ],
)
def test_stream_options_that_would_be_ignored_are_refused(served, extra, param, words):
    """Both were a silent 200: no usage chunk without a stream, unknown options dropped."""
    _, server, _ = served
    body = {"model": NAME, "prompt": "ab", "max_tokens": 2, **extra}
    code, payload = _post(server.url + "/v1/completions", body)
    assert code == 400, payload
    assert payload["error"]["param"] == param and words in payload["error"]["message"]


def test_a_model_name_with_slashes_can_be_retrieved(served):
    """``jaxcore serve`` names the model after its path ("org/model", "ckpt/model.safetensors")
    by default; ``/v1/models/{name}`` answered a bare 404 for every such name."""
    llm, _, _ = served
    name = "org/tiny-offpath"
    server = BackgroundServer(create_app(llm, model_name=name))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve(name).id == name
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve("org/other")
        assert e.value.body["code"] == "model_not_found"
        with urllib.request.urlopen(server.url + "/metrics") as r:
            assert 'path="/v1/models/{name}",status="200"' in r.read().decode()
    finally:
        server.stop()
