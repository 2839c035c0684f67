"""Serving a Hugging Face directory: the server's logprobs equal transformers' log-softmax."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.tokenizer import piece
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
