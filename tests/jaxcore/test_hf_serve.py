"""Serving a Hugging Face directory: the server's logprobs equal transformers' log-softmax."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import torch

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.tokenizer import piece
from jaxcore.launch import free_port
from tests.jaxcore import hf_models as H

PROMPT = "def fib(n): return n"  # 20 byte tokens: longer than Mistral's window of 5


def _reference_logprobs(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """log p(ids[i] | ids[:i]) for i >= 1, from one full forward pass."""
    with torch.no_grad():
        logits = model(torch.as_tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return np.array([float(logp[i - 1, t]) for i, t in enumerate(ids) if i > 0])


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(H.CONFIGS))
def test_served_hf_directory_matches_transformers_logprobs(kind, tmp_path):
    model, directory = H.save_model(kind, tmp_path / kind)
    llm = LLM(str(directory), engine=ServingConfig(slots=2, max_len=64, prefill_buckets=(32,)))
    server = BackgroundServer(create_app(llm, model_name=kind))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        r = client.completions.create(
            model=kind, prompt=PROMPT, max_tokens=8, temperature=0, echo=True, logprobs=1
        )
    finally:
        server.stop()
        llm.close()
    lp = r.choices[0].logprobs
    ids = list(PROMPT.encode())
    with torch.no_grad():  # transformers' greedy continuation, one full forward per token
        for _ in range(8):
            ids.append(int(model(torch.as_tensor([ids])).logits[0, -1].argmax()))
    assert lp.tokens == [piece(llm.tokenizer.token_bytes(i)) for i in ids]
    assert lp.token_logprobs[0] is None
    # Prompt tokens come from the prefill, the 8 completion tokens from KV-cache decode
    # steps (sliding-window mask, biases and scaled rotary all on the decode path too).
    want = _reference_logprobs(model, ids)
    np.testing.assert_allclose(np.array(lp.token_logprobs[1:], float), want, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_jaxcore_serve_model_hf_dir_answers_with_transformers_logprobs(tmp_path):
    """The command line itself: ``jaxcore serve --model HF_DIR`` (Qwen2: q/k/v biases)."""
    model, directory = H.save_model("qwen2", tmp_path / "qwen2")
    port = free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "jaxcore.cli", "serve", "--model", str(directory)]
    args = ["--port", str(port), "--max-len", "32", "--slots", "2", "--log-level", "warning"]
    proc = subprocess.Popen(
        [*cmd, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 400  # the machine may be heavily loaded
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.5)
        body = json.dumps(
            {
                "model": str(directory),
                "prompt": PROMPT,
                "max_tokens": 4,
                "temperature": 0,
                "echo": True,
                "logprobs": 1,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            body,
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
    finally:
        proc.terminate()
        proc.wait(30)
    ids = list(PROMPT.encode())
    with torch.no_grad():
        for _ in range(4):
            ids.append(int(model(torch.as_tensor([ids])).logits[0, -1].argmax()))
    assert len(lp["token_logprobs"]) == len(ids) and lp["token_logprobs"][0] is None
    want = _reference_logprobs(model, ids)
    np.testing.assert_allclose(np.array(lp["token_logprobs"][1:], float), want, atol=1e-4, rtol=0)
