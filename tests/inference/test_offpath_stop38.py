"""The server driven as lm-evaluation-harness's ``local-completions`` drives it, and as
OpenAI's legacy API and vLLM answer: loglikelihood requests (``echo``, ``logprobs``,
``max_tokens`` 0 or 1, prompts as token-id lists) score like transformers; ``generate_until``
sends a task's whole ``until`` list plus the EOS string (more than 4 stops, refused before);
a body not declared JSON is refused as vLLM refuses it; and completion ``top_logprobs``
always hold the chosen token (``logprobs=0`` gave ``{}``)."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

from inference import LLM, ServingConfig
from inference.hf import to_hf_llama
from inference.server import BackgroundServer, create_app
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-stop38"
SEED = 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model behind the server, with a real `tokenizers` byte-level tokenizer."""
    folder = byte_level_tokenizer(tmp_path_factory.mktemp("tok"))
    llm = LLM(
        init_params(CFG, seed=SEED),
        config=CFG,
        tokenizer=str(folder),
        engine=ServingConfig(slots=4, prefill_buckets=(16, 64), decode_steps=4),
    )
    server = BackgroundServer(create_app(llm, model_name=NAME))
    yield llm, server
    server.stop()
    llm.close()


def _post(url: str, body: dict, content_type: str | None = "application/json"):
    """POST ``body`` with exactly this Content-Type (none at all for None); the status
    and the decoded answer."""
    host, rest = url.removeprefix("http://").split("/", 1)
    conn = http.client.HTTPConnection(host, timeout=60)
    headers = {"Content-Type": content_type} if content_type else {}
    conn.request("POST", "/" + rest, body=json.dumps(body).encode(), headers=headers)
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def _reference_logprobs(ids: list[int]) -> np.ndarray:
    """transformers' log-softmax of the same weights over ``ids``: (len(ids), vocab)."""
    import torch

    model = to_hf_llama(CFG, init_params(CFG, seed=SEED))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def test_lm_eval_loglikelihood_requests_score_like_transformers(served):
    _, server = served
    contexts = [list(b"The cat sat on the"), list(b"One two")]
    continuations = [list(b" mat"), list(b" three")]
    inputs = [c + x for c, x in zip(contexts, continuations, strict=True)]
    for max_tokens in (1, 0):  # lm-eval sends 1 (and drops the last entry); 0 scores only
        status, out = _post(
            server.url + "/v1/completions",
            {
                "model": NAME,
                "prompt": inputs,
                "temperature": 0,
                "max_tokens": max_tokens,
                "logprobs": 1,
                "seed": 1234,
                "echo": True,
            },
        )
        assert status == 200, out
        choices = sorted(out["choices"], key=lambda c: c["index"])
        for ids, ctxlen, choice in zip(inputs, map(len, contexts), choices, strict=True):
            lp = choice["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids) + max_tokens
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            ref = _reference_logprobs(ids)
            want = [ref[j - 1, ids[j]] for j in range(ctxlen, len(ids))]
            got = lp["token_logprobs"][ctxlen : len(ids)]
            np.testing.assert_allclose(got, want, atol=1e-4)
            for j, top in enumerate(lp["top_logprobs"][ctxlen : len(ids)], start=ctxlen):
                assert abs(max(top.values()) - ref[j - 1].max()) < 1e-4  # lm-eval's is_greedy
            assert lp["text_offset"] == list(range(len(ids) + max_tokens))


def test_lm_eval_generate_until_sends_more_than_four_stops(served):
    llm, server = served
    prompt = list(b"def f(x):")
    free = llm.generate(bytes(prompt).decode(), max_tokens=12, temperature=0).text
    cut = 5
    stop = free[cut : cut + 2]
    # A task's `until` list (HumanEval's has five) plus the EOS string lm-eval appends.
    until = ["\nclass", "\ndef", "\n#", "\nif", stop, "<|endoftext|>"]
    until = [u for u in until if u == stop or u not in free]
    assert len(until) > 4
    status, out = _post(
        server.url + "/v1/completions",
        {
            "prompt": [prompt],
            "model": NAME,
            "max_tokens": 12,
            "temperature": 0,
            "stop": until,
            "seed": 1234,
        },
    )
    assert status == 200, out
    choice = out["choices"][0]
    first = free.find(stop)
    assert choice["text"] == free[:first] and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop


def test_an_empty_stop_string_is_refused_naming_it(served):
    _, server = served
    body = {"model": NAME, "prompt": "abc", "max_tokens": 2, "stop": ["a", "b", ""]}
    status, out = _post(server.url + "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == "stop.2"
    assert "empty string" in out["error"]["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_not_declared_json_is_refused_as_vllm_does(served, content_type, route):
    _, server = served
    body = {"model": NAME, "prompt": "abc", "max_tokens": 2}
    if route == "/v1/chat/completions":
        body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, out = _post(server.url + route, body, content_type)
    assert status == 400, out
    error = out["error"]
    assert error["code"] == "unsupported_media_type"
    assert "Content-Type: application/json" in error["message"]
    assert (content_type or "no Content-Type") in error["message"]


def test_json_with_a_charset_is_still_json(served):
    _, server = served
    body = {"model": NAME, "prompt": "abc", "max_tokens": 2}
    status, out = _post(server.url + "/v1/completions", body, "Application/JSON; charset=utf-8")
    assert status == 200 and len(out["choices"]) == 1


def _completion_logprobs(server, **body) -> dict:
    status, out = _post(server.url + "/v1/completions", {"model": NAME, "prompt": "hello", **body})
    assert status == 200, out
    return out["choices"][0]["logprobs"]


def test_logprobs_zero_reports_the_chosen_token_in_top_logprobs(served):
    _, server = served
    lp = _completion_logprobs(server, logprobs=0, max_tokens=4, temperature=0)
    assert len(lp["token_logprobs"]) == 4
    assert lp["top_logprobs"] == [
        {t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"], strict=True)
    ]
    echoed = _completion_logprobs(server, logprobs=0, max_tokens=1, echo=True, temperature=0)
    assert echoed["top_logprobs"][0] is None
    assert echoed["top_logprobs"][1:] == [
        {t: v} for t, v in zip(echoed["tokens"][1:], echoed["token_logprobs"][1:], strict=True)
    ]


def test_a_sampled_token_outside_the_top_is_still_in_its_top_logprobs(served):
    _, server = served
    lp = _completion_logprobs(server, logprobs=1, max_tokens=10, temperature=2.0, seed=3)
    outside = 0
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert top[token] == value and 1 <= len(top) <= 2
        outside += len(top) == 2
    assert outside > 0  # the check above saw a token that was not the most likely
    echoed = _completion_logprobs(server, logprobs=1, max_tokens=0, echo=True)
    for token, value, top in zip(
        echoed["tokens"][1:], echoed["token_logprobs"][1:], echoed["top_logprobs"][1:], strict=True
    ):
        assert top[token] == value and 1 <= len(top) <= 2
