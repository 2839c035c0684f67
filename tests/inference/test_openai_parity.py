"""OpenAI / vLLM parameter parity through the official ``openai`` client: n, best_of,
top_logprobs up to 20, prompt_logprobs, min_tokens, stop_token_ids,
include_stop_str_in_output, penalties, /tokenize and /detokenize, the model's chat
template, max_model_len, histograms; joined stream chunks equal the whole response."""

from __future__ import annotations

import json
import urllib.request

import jax
import numpy as np
import openai
import pytest

from inference import LLM, SamplingParams, ServingConfig
from inference.server import BackgroundServer, create_app
from inference.weights import build_model, init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

CFG = TransformerConfig.tiny(max_seq_len=64)
NAME = "tiny-parity"
TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[ASSISTANT] {% endif %}"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = byte_level_tokenizer(tmp_path_factory.mktemp("tok"), chat_template=TEMPLATE)
    params = init_params(CFG, seed=7)
    llm = LLM(
        params,
        config=CFG,
        engine=ServingConfig(slots=8, prefill_buckets=(32, 64), decode_steps=4),
        tokenizer=str(folder),
    )
    llm.engine.warmup()
    server = BackgroundServer(create_app(llm, model_name=NAME, max_tokens_limit=48))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield llm, server, client, params
    server.stop()
    llm.close()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _join_completion_stream(chunks) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for c in chunks:
        for ch in c.choices:
            o = out.setdefault(
                ch.index,
                {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "offsets": []},
            )
            o["text"] += ch.text
            if ch.logprobs is not None:
                o["tokens"] += ch.logprobs.tokens
                o["token_logprobs"] += ch.logprobs.token_logprobs
                o["top_logprobs"] += ch.logprobs.top_logprobs
                o["offsets"] += ch.logprobs.text_offset
            if ch.finish_reason is not None:
                o["finish_reason"] = ch.finish_reason
    return out


def test_joined_stream_chunks_equal_the_response_with_logprobs_echo_and_n(served):
    _, _, client, _ = served
    kwargs = dict(
        model=NAME,
        prompt="d\u00e9f f(x):",
        max_tokens=10,
        temperature=0.9,
        seed=11,
        n=2,
        logprobs=3,
        echo=True,
    )
    whole = client.completions.create(**kwargs)
    joined = _join_completion_stream(client.completions.create(**kwargs, stream=True))
    assert sorted(joined) == [0, 1]
    for choice in whole.choices:
        got = joined[choice.index]
        assert got["text"] == choice.text
        assert got["tokens"] == choice.logprobs.tokens
        assert got["token_logprobs"] == choice.logprobs.token_logprobs
        assert got["top_logprobs"] == choice.logprobs.top_logprobs
        assert got["offsets"] == choice.logprobs.text_offset
        assert got["finish_reason"] == choice.finish_reason
    assert whole.choices[0].text != whole.choices[1].text  # two samples, not one twice

    messages = [{"role": "user", "content": "Say h\u00e9llo"}]
    chat_kwargs = dict(
        model=NAME, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=20
    )
    chat = client.chat.completions.create(**chat_kwargs)
    chunks = list(client.chat.completions.create(**chat_kwargs, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    content = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert text == chat.choices[0].message.content
    assert [e.model_dump() for e in content] == [
        e.model_dump() for e in chat.choices[0].logprobs.content
    ]
    assert len(content[0].top_logprobs) == 20


def test_n_and_best_of_pick_the_most_likely_samples(served):
    _, _, client, _ = served
    base = dict(model=NAME, prompt="x = ", max_tokens=6, temperature=1.0, seed=3, logprobs=0)
    four = client.completions.create(**base, n=4)
    best = client.completions.create(**base, n=2, best_of=4)

    def score(c):
        return sum(c.logprobs.token_logprobs)

    want = sorted(four.choices, key=score, reverse=True)[:2]
    assert [c.text for c in best.choices] == [c.text for c in want]
    assert best.usage.completion_tokens == four.usage.completion_tokens  # best_of bills all 4
    assert best.usage.prompt_tokens == four.usage.prompt_tokens == 4


def test_min_tokens_stop_token_ids_and_include_stop_str(served):
    llm, _, client, _ = served
    free = llm.generate("abc", max_tokens=20, ignore_eos=True)
    stop_id = free.tokens[2]
    early = client.completions.create(
        model=NAME,
        prompt="abc",
        max_tokens=20,
        temperature=0,
        extra_body={"stop_token_ids": [stop_id]},
    )
    assert len(early.usage.model_dump()) and early.usage.completion_tokens == free.tokens.index(
        stop_id
    )
    assert early.choices[0].finish_reason == "stop"
    held = client.completions.create(
        model=NAME,
        prompt="abc",
        max_tokens=20,
        temperature=0,
        logprobs=0,
        extra_body={"stop_token_ids": [stop_id], "min_tokens": 6},
    )
    toks = held.choices[0].logprobs.tokens
    assert len(toks) >= 6 and chr(stop_id) not in toks[:6]
    stop = free.text[4:6]
    with_stop = client.completions.create(
        model=NAME,
        prompt="abc",
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert with_stop.choices[0].text == free.text[: free.text.find(stop) + len(stop)]


def _penalized_reference(params, prompt, steps, rep, pres, freq):
    """Greedy decoding with vLLM's penalties, recomputing the whole forward pass."""
    model_fn = jax.jit(lambda t: build_model(CFG, params)(t))
    seq, out = list(prompt), []
    for _ in range(steps):
        padded = np.zeros((1, 64), np.int32)
        padded[0, : len(seq)] = seq
        logits = np.asarray(model_fn(padded))[0, len(seq) - 1].astype(np.float64)
        counts = np.bincount(out, minlength=CFG.vocab_size)
        seen = np.zeros(CFG.vocab_size, bool)
        seen[seq] = True
        logits = np.where(seen, np.where(logits > 0, logits / rep, logits * rep), logits)
        logits = logits - freq * counts - pres * (counts > 0)
        tok = int(np.argmax(logits))
        out.append(tok)
        seq.append(tok)
    return out


def test_penalties_match_a_reference_and_go_through_the_server(served):
    llm, _, client, params = served
    prompt = list(b"aaaa bbbb aaaa")
    want = _penalized_reference(params, prompt, 10, rep=1.5, pres=-1.5, freq=-0.5)
    got = llm.generate(
        "aaaa bbbb aaaa",
        max_tokens=10,
        ignore_eos=True,
        repetition_penalty=1.5,
        presence_penalty=-1.5,
        frequency_penalty=-0.5,
    )
    assert got.tokens == want
    plain = llm.generate("aaaa bbbb aaaa", max_tokens=10, ignore_eos=True)
    assert plain.tokens != want  # the penalties changed something
    r = client.completions.create(
        model=NAME,
        prompt="aaaa bbbb aaaa",
        max_tokens=10,
        temperature=0,
        presence_penalty=-1.5,
        frequency_penalty=-0.5,
        extra_body={"repetition_penalty": 1.5},
    )
    assert r.choices[0].text == got.text


def test_prompt_logprobs_tokenize_models_metrics_and_chat_template(served):
    llm, server, client, _ = served
    text = "print(1)"
    r = client.completions.create(
        model=NAME,
        prompt=text,
        max_tokens=1,
        temperature=0,
        echo=True,
        logprobs=2,
        extra_body={"prompt_logprobs": 2},
    )
    plp = r.choices[0].model_extra["prompt_logprobs"]
    ids = list(text.encode())
    assert plp[0] is None and len(plp) == len(ids)
    echoed = r.choices[0].logprobs.token_logprobs[1 : len(ids)]
    for j, entry in enumerate(plp[1:]):
        mine = entry[str(ids[j + 1])]
        assert mine["logprob"] == pytest.approx(echoed[j], abs=1e-6)
        assert mine["rank"] >= 1 and len(entry) in (2, 3)
    # /tokenize, /detokenize (vLLM) and the model card.
    tok = _post(server.url + "/tokenize", {"model": NAME, "prompt": "h\u00e9"})
    assert tok["tokens"] == list("h\u00e9".encode()) and tok["max_model_len"] == 64
    assert _post(server.url + "/detokenize", {"tokens": tok["tokens"]})["prompt"] == "h\u00e9"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    rendered = llm.tokenizer.apply_chat_template(messages)
    assert rendered == "[SYSTEM] S\n[USER] U\n[ASSISTANT] "
    chat_ids = _post(server.url + "/tokenize", {"messages": messages})["tokens"]
    assert chat_ids == list(rendered.encode())
    chat = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=4, temperature=0
    )
    assert chat.usage.prompt_tokens == len(chat_ids)
    assert chat.choices[0].message.content == llm.generate(rendered, max_tokens=4).text
    card = client.models.list().data[0]
    assert card.id == NAME and card.model_extra["max_model_len"] == 64
    with urllib.request.urlopen(server.url + "/metrics") as m:
        metrics = m.read().decode()
    assert "# TYPE jaxcore_inference_time_to_first_token_seconds histogram" in metrics
    assert 'jaxcore_inference_request_latency_seconds_bucket{le="+Inf"}' in metrics


def test_decode_steps_do_not_change_outputs():
    params = init_params(CFG, seed=7)
    work = [
        ("abc", SamplingParams(max_tokens=13, ignore_eos=True)),
        ("xyz", SamplingParams(max_tokens=9, temperature=0.8, seed=4)),
        ("qq", SamplingParams(max_tokens=11, repetition_penalty=1.3, frequency_penalty=0.5)),
        ("m", SamplingParams(max_tokens=5, min_tokens=3, stop_token_ids=(32, 101))),
    ]
    outs = []
    for steps in (1, 5):
        llm = LLM(params, config=CFG, engine=ServingConfig(slots=2, decode_steps=steps))
        outs.append([llm.generate(p, s) for p, s in work])
    for a, b in zip(*outs, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
