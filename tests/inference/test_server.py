"""The OpenAI-compatible server: the official client, echo/logprobs scoring, concurrency,
streaming, and OpenAI-style errors for malformed requests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import openai
import pytest

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.weights import build_model, init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-test"


@pytest.fixture(scope="module")
def served():
    params = init_params(CFG, seed=4)
    llm = LLM(params, config=CFG, engine=ServingConfig(slots=8, prefill_buckets=(16, 64)))
    llm.engine.warmup()
    server = BackgroundServer(create_app(llm, model_name=NAME, max_tokens_limit=48))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client, params
    server.stop()
    llm.close()


def _post(url: str, body: bytes | dict, method: str = "POST") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_openai_client_completes_chats_and_streams(served):
    llm, _, client, _ = served
    want = llm.generate("def add(a, b):", max_tokens=12).text
    r = client.completions.create(model=NAME, prompt="def add(a, b):", max_tokens=12, temperature=0)
    assert r.choices[0].text == want
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=NAME, prompt="def add(a, b):", max_tokens=12, temperature=0, stream=True
        )
    )
    assert streamed == want

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    chat = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0
    )
    assert chat.choices[0].message.role == "assistant"
    content = chat.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=NAME,
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    assert [m.id for m in client.models.list().data] == [NAME]


def test_echo_logprobs_equal_the_models_own_scoring(served):
    _, _, client, params = served
    text = "import os\nprint(os.getcwd())"
    r = client.completions.create(
        model=NAME, prompt=text, max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text == text
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(text)
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)[None]
    logits = jax.jit(lambda t: build_model(CFG, params)(t))(ids)
    want = np.asarray(jax.nn.log_softmax(logits[0, :-1]))[np.arange(ids.shape[1] - 1), ids[0, 1:]]
    np.testing.assert_allclose(lp.token_logprobs[1:], want, atol=1e-5)
    # The top alternative is the model's argmax; its log-prob is the max.
    top = np.asarray(jax.nn.log_softmax(logits[0, :-1])).max(axis=-1)
    np.testing.assert_allclose([max(d.values()) for d in lp.top_logprobs[1:]], top, atol=1e-5)
    # lm-eval-harness style: echo with one generated token keeps the same prompt scores.
    r1 = client.completions.create(
        model=NAME, prompt=text, max_tokens=1, echo=True, logprobs=0, temperature=0
    )
    np.testing.assert_allclose(
        r1.choices[0].logprobs.token_logprobs[1 : len(text)], want, atol=1e-5
    )


def test_fifty_concurrent_clients_all_succeed(served):
    llm, _, client, _ = served
    prompts = [f"x{i} = {i} * " for i in range(50)]
    want = [c.text for c in llm.generate(prompts, max_tokens=8)]
    steps_before = llm.scheduler.stats["decode_steps_total"]

    def ask(p: str) -> str:
        return (
            client.completions.create(model=NAME, prompt=p, max_tokens=8, temperature=0)
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(50) as pool:
        got = list(pool.map(ask, prompts))
    assert got == want
    # Requests were batched together: far fewer decode steps than 50 x 7.
    assert llm.scheduler.stats["decode_steps_total"] - steps_before < 50 * 7 / 2


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        ({"prompt": "hi"}, 400, "model", "missing required parameter"),
        (
            {"model": NAME, "prompt": "hi", "temprature": 0.5},
            400,
            "temprature",
            "unknown parameter",
        ),
        ({"model": NAME, "prompt": "hi", "max_tokens": 49}, 400, "max_tokens", "limit of 48"),
        (
            {"model": NAME, "prompt": "y" * 60, "max_tokens": 10},
            400,
            "prompt",
            "context is 64 tokens",
        ),
        (
            {"model": NAME, "prompt": "hi", "temperature": "hot"},
            400,
            "temperature",
            "invalid value",
        ),
        ({"model": NAME, "prompt": "hi", "n": 17}, 400, "n", "invalid value"),
        ({"model": NAME, "prompt": "hi", "n": 3, "best_of": 2}, 400, "best_of", "must be >= n"),
        ({"model": NAME, "prompt": "hi", "logprobs": 21}, 400, "logprobs", "invalid value"),
        ({"model": NAME, "prompt": "", "max_tokens": 2}, 400, "prompt", "prompt is empty"),
        ({"model": NAME, "prompt": [1, 999]}, 400, "prompt", "must be integers in [0, 256)"),
        ({"model": NAME, "prompt": "hi", "frobnicate": 1}, 400, "frobnicate", "unknown"),
        ({"model": "gpt-9", "prompt": "hi"}, 404, "model", "does not exist"),
    ],
)
def test_malformed_completion_requests_get_openai_errors(served, body, status, param, words):
    _, server, _, _ = served
    code, payload = _post(server.url + "/v1/completions", body)
    assert code == status
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and words in err["message"]


def test_chat_errors_unknown_routes_and_health_after_bad_input(served):
    _, server, client, _ = served
    code, payload = _post(server.url + "/v1/chat/completions", {"model": NAME, "messages": []})
    assert code == 400 and payload["error"]["param"] == "messages"
    code, payload = _post(
        server.url + "/v1/chat/completions",
        {"model": NAME, "messages": [{"role": "robot", "content": "x"}]},
    )
    assert code == 400 and payload["error"]["type"] == "invalid_request_error"
    code, payload = _post(server.url + "/v1/nothing", {})
    assert code == 404 and "error" in payload
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="hi", max_tokens=1000)
    assert e.value.status_code == 400
    with urllib.request.urlopen(server.url + "/health") as r:
        assert json.loads(r.read()) == {"status": "ok"}
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    assert "# TYPE jaxcore_inference_generation_tokens_total counter" in text
    assert 'jaxcore_inference_http_requests_total{path="/v1/completions",status="400"}' in text


@pytest.mark.slow
def test_cli_serves_a_registry_model_with_a_tokenizer_path(tmp_path):
    folder = byte_level_tokenizer(tmp_path / "tok")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inference",
            "--model",
            "tiny",
            "--port",
            str(port),
            "--max-len",
            "16",
            "--slots",
            "2",
            "--tokenizer",
            str(folder),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 400  # the machine may be heavily loaded
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.time() < deadline, "the server did not come up"
                time.sleep(0.3)
        code, body = _post(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": "tiny", "prompt": "ab", "max_tokens": 3},
        )
        assert code == 200 and body["usage"]["completion_tokens"] == 3
        code, body = _post(f"http://127.0.0.1:{port}/tokenize", {"prompt": "h\u00e9"})
        assert code == 200 and body["tokens"] == list("h\u00e9".encode())
    finally:
        proc.terminate()
        proc.wait(30)
