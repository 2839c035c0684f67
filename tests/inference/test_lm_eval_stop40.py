"""The server as lm-evaluation-harness drives it, replayed without lm-eval installed.

``lm_eval_stop40/requests.json`` holds request bodies lm-eval 0.4.13 sent to ``python -m
inference`` (logged by a proxy; see its ``_source``): multiple-choice and rolling
loglikelihood batches (``echo``, ``logprobs=1``, ``max_tokens=1``, token-id prompts of up
to 255 tokens), ``generate_until`` batches with the task's ``until`` list, and
``local-chat-completions`` requests. Each is replayed against a tiny random Llama
checkpoint saved with ``save_pretrained`` and checked against transformers on the same
folder: every echoed log-prob and lm-eval's ``is_greedy``, greedy text cut at the first
stop string. Also vLLM's ``/tokenizer_info``, which lm-eval probes (with ``/tokenize``) to
use the server's tokenizer (``--enable-tokenizer-info-endpoint``, off by default as in
vLLM); without it ``local-completions`` loads ``model=`` as a Hub tokenizer name."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from inference import LLM, ServingConfig
from inference.server import BackgroundServer, _parser, create_app
from tests.inference.helpers import post_raw_json

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FIXTURE = Path(__file__).parent / "lm_eval_stop40"
NAME = "tiny-eval"
REQUESTS = json.loads((FIXTURE / "requests.json").read_text())["requests"]


def _checkpoint(folder: Path):
    """The Llama the requests were captured against (vocabulary of the fixture's BPE
    tokenizer, 256 positions), random weights sharp enough that greedy picks are clear."""
    config = transformers.LlamaConfig(
        vocab_size=480,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.05 * noise if "norm" in name else 0.3 * noise)
    model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / f, folder / f)
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    model = _checkpoint(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    llm = LLM(str(folder), engine=ServingConfig(slots=4, prefill_buckets=(64, 256), decode_steps=8))
    server = BackgroundServer(create_app(llm, model_name=NAME, tokenizer_info=True))
    plain = BackgroundServer(create_app(llm, model_name=NAME))  # vLLM's default: no route
    yield model, tok, server, plain
    plain.stop()
    server.stop()
    llm.close()


def _post(server, path: str, body: dict) -> dict:
    status, out = post_raw_json(server.url + path, json.dumps(body))
    assert status == 200, out
    return out


def _log_softmax(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def _greedy_text(model, tok, ids: list[int], max_tokens: int, stop: list[str]) -> str:
    """transformers' greedy text (EOS ends it), cut at the first stop string as lm-eval's
    ``hf`` model cuts it."""
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_tokens,
            do_sample=False,
        )
    text = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def _replayed(kind: str) -> list[dict]:
    out = [r for r in REQUESTS if r["what"].startswith(kind)]
    assert out, kind
    return out


def test_lm_eval_loglikelihood_requests_score_like_transformers(served):
    model, _, server, _ = served
    for req in _replayed("multiple_choice") + _replayed("loglikelihood_rolling"):
        body = req["body"]
        out = _post(server, req["path"], body)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        assert len(choices) == len(body["prompt"])
        for ids, choice in zip(body["prompt"], choices, strict=True):
            lp = choice["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids) + 1, req["what"]
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            ref = _log_softmax(model, ids)
            want = [ref[j - 1, ids[j]] for j in range(1, len(ids))]
            np.testing.assert_allclose(lp["token_logprobs"][1:-1], want, atol=2e-4, rtol=0)
            # lm-eval's is_greedy: the chosen token's log-prob is the top one's.
            tops = [max(t.values()) for t in lp["top_logprobs"][1:]]
            np.testing.assert_allclose(tops, ref.max(-1), atol=2e-4, rtol=0)
            assert lp["tokens"][-1] is not None and abs(lp["token_logprobs"][-1] - tops[-1]) < 1e-6


def test_lm_eval_generate_until_requests_match_transformers_greedy(served):
    model, tok, server, _ = served
    for req in _replayed("generate_until (token-id prompts)"):
        body = req["body"]
        assert len(body["stop"]) == 5 and body["temperature"] == 0
        out = _post(server, req["path"], body)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        for ids, choice in zip(body["prompt"], choices, strict=True):
            want = _greedy_text(model, tok, ids, body["max_tokens"], body["stop"])
            assert choice["text"] == want, (ids, body["stop"])


def test_lm_eval_chat_requests_match_transformers_chat_template_greedy(served):
    model, tok, server, _ = served
    for req in _replayed("generate_until, local-chat-completions"):
        body = req["body"]
        out = _post(server, req["path"], body)
        # transformers renders the template (its BOS included) and adds no second BOS.
        ids = tok.apply_chat_template(body["messages"], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        want = _greedy_text(model, tok, ids, body["max_tokens"], body["stop"])
        assert out["choices"][0]["message"]["content"] == want


def test_tokenizer_info_lets_lm_eval_use_the_servers_tokenizer(served):
    """What lm-eval's ``check_remote_tokenizer_support`` and ``RemoteTokenizer`` read."""
    _, tok, server, plain = served
    with urllib.request.urlopen(server.url + "/tokenizer_info", timeout=30) as r:
        assert r.status == 200
        info = json.loads(r.read())
    assert info["eos_token"] == tok.eos_token == "</s>"
    assert info["bos_token"] == tok.bos_token and info["pad_token"] == tok.pad_token
    assert info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == 256
    for text in ("test", info["bos_token"], "Question: x\nAnswer: y"):
        got = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
        assert got["tokens"] == tok(text, add_special_tokens=False).input_ids
    # RemoteTokenizer's bos_token_id / eos_token_id: the first id of each token's text.
    for text, tid in ((info["bos_token"], tok.bos_token_id), (info["eos_token"], 1)):
        got = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
        assert got["tokens"] == [tid]
    with pytest.raises(urllib.error.HTTPError) as e:  # off unless asked for, as in vLLM
        urllib.request.urlopen(plain.url + "/tokenizer_info", timeout=30)
    assert e.value.code == 404
    args = _parser().parse_args(["--model", "m", "--enable-tokenizer-info-endpoint"])
    assert args.enable_tokenizer_info_endpoint
    assert not _parser().parse_args(["--model", "m"]).enable_tokenizer_info_endpoint
