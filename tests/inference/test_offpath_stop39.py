"""OpenAI's ``logit_bias`` (refused before): ``{token_id: bias}``, each bias in [-100, 100]
added to the logits before sampling, for completions and chat, streamed or not, per
request in the batched engine. Oracle: transformers' greedy generation with the same
bias added by a logits processor; a banned token never appears in sampled output."""

from __future__ import annotations

import http.client
import json

import numpy as np
import openai
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import LLM, SamplingParams, ServingConfig
from inference.server import BackgroundServer, create_app
from tests.inference.test_offpath_stop36 import _tiny_llama

NAME = "tiny-stop39"
STEPS = 10


class _Bias(transformers.LogitsProcessor):
    """Adds ``bias`` to the scores, as OpenAI's logit_bias does."""

    def __init__(self, bias: dict[int, float]):
        self.bias = bias

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for t, v in self.bias.items():
            scores[:, t] += v
        return scores


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    model = _tiny_llama(folder)  # stop 36's random 2-layer Llama, byte tokenizer, chat template
    llm = LLM(str(folder), engine=ServingConfig(slots=4, decode_steps=4))
    server = BackgroundServer(create_app(llm, model_name=NAME))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield model, llm, server, client
    server.stop()
    llm.close()


def _reference(model, ids: list[int], bias: dict[int, float] | None = None) -> list[int]:
    procs = transformers.LogitsProcessorList([_Bias(bias)] if bias else [])
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            x, max_new_tokens=STEPS, do_sample=False, pad_token_id=0, logits_processor=procs
        )
    return out[0, len(ids) :].tolist()


def _bias_for(run: list[int]) -> dict[int, float]:
    """Ban the first two tokens of the unbiased run and nudge a third up."""
    return {run[0]: -100.0, run[1]: -100.0, (run[0] + 7) % 256: 3.5}


def _ids(text: str) -> list[int]:
    return list(text.encode())


def test_completion_logit_bias_greedy_matches_transformers(served):
    model, llm, _, client = served
    prompt = "hello"
    free = _reference(model, _ids(prompt))
    bias = _bias_for(free)
    want = _reference(model, _ids(prompt), bias)
    assert want != free  # the bias really changes the output
    sent = {str(k): v for k, v in bias.items()}
    r = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=STEPS, temperature=0, logit_bias=sent
    )
    assert r.choices[0].text == llm.tokenizer.decode(want)
    chunks = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=STEPS, temperature=0, logit_bias=sent, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_chat_logit_bias_greedy_matches_transformers_streamed_or_not(served):
    model, llm, _, client = served
    messages = [{"role": "user", "content": "fox"}]
    prompt = llm.tokenizer.encode(
        llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
        add_special_tokens=False,
    )
    free = _reference(model, prompt)
    bias = _bias_for(free)
    want = _reference(model, prompt, bias)
    assert want != free
    sent = {str(k): v for k, v in bias.items()}
    kw = dict(model=NAME, messages=messages, max_tokens=STEPS, temperature=0, logit_bias=sent)
    r = client.chat.completions.create(**kw)
    got = llm.tokenizer.decode(want)
    assert r.choices[0].message.content == got
    streamed = client.chat.completions.create(**kw, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == got


def test_logit_bias_is_per_request_in_one_batch(served):
    model, llm, _, _ = served
    prompt = _ids("hello")
    free = _reference(model, prompt)
    bias = _bias_for(free)
    want = _reference(model, prompt, bias)
    plain = SamplingParams(max_tokens=STEPS)
    biased = SamplingParams(max_tokens=STEPS, logit_bias=bias)
    handles = llm.scheduler.submit_many(
        [(prompt, plain), (prompt, biased), (prompt, plain), (prompt, biased)]
    )
    outs = [h.wait(120).output for h in handles]
    assert outs == [free, want, free, want]


@settings(max_examples=12, deadline=None)
@given(
    banned=st.sets(st.integers(0, 255), min_size=1, max_size=40),
    seed=st.integers(0, 2**32),
    temperature=st.floats(0.5, 2.0),
)
def test_a_banned_token_never_appears_when_sampling(served, banned, seed, temperature):
    _, llm, _, _ = served
    out = llm.generate(
        "the quick",
        max_tokens=24,
        temperature=temperature,
        seed=seed,
        logit_bias={t: -100 for t in banned},
    )
    assert not set(out.tokens) & banned


def test_plus_100_forces_a_token(served):
    _, llm, _, _ = served
    out = llm.generate("abc", max_tokens=8, temperature=1.5, seed=1, logit_bias={ord("z"): 100})
    assert out.tokens == [ord("z")] * 8


def _post(url: str, body: dict):
    host, rest = url.removeprefix("http://").split("/", 1)
    conn = http.client.HTTPConnection(host, timeout=60)
    conn.request("POST", "/" + rest, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("bias", "param", "words"),
    [
        ({"abc": 1}, "logit_bias", "not a token id"),
        ({"-3": 1}, "logit_bias", "not a token id"),
        ({"5": 101}, "logit_bias.5", "[-100, 100]"),
        ({"5": -100.5}, "logit_bias.5", "[-100, 100]"),
        ({"256": -100}, "logit_bias", "[0, 256)"),
        ({"5": "x"}, "logit_bias.5", "number"),
    ],
)
def test_bad_logit_bias_gets_a_400_naming_the_field(served, route, bias, param, words):
    _, _, server, _ = served
    body = {"model": NAME, "max_tokens": 2, "logit_bias": bias}
    body.update(
        {"prompt": "hi"}
        if "chat" not in route
        else {"messages": [{"role": "user", "content": "x"}]}
    )
    status, out = _post(server.url + route, body)
    assert status == 400, out
    assert out["error"]["param"] == param and words in out["error"]["message"], out


def test_sampling_params_refuse_bad_bias():
    import jaxcore as jc

    for bad in ({1: 100.5}, {-1: 1}, {1: float("nan")}, {"1": 1}):
        with pytest.raises(jc.ConfigError, match="logit_bias"):
            SamplingParams(logit_bias=bad)
    assert SamplingParams(logit_bias={3: 1, 1: -2}).logit_bias == ((1, -2.0), (3, 1.0))
    assert np.isfinite(SamplingParams(logit_bias={1: -100}).logit_bias[0][1])


def test_chat_store_false_and_metadata_are_accepted_store_true_refused(served):
    """OpenAI's ``store`` (default false) and ``metadata`` (tags of a stored completion):
    the client sends them when a user passes them; both were 'unknown parameter' 400s,
    although the protocol accepts every API field at its default."""
    _, _, _, client = served
    messages = [{"role": "user", "content": "hi"}]
    kw = dict(model=NAME, messages=messages, max_tokens=4, temperature=0)
    want = client.chat.completions.create(**kw).choices[0].message.content
    got = client.chat.completions.create(**kw, store=False, metadata={"run": "a"})
    assert got.choices[0].message.content == want
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**kw, store=True)
    assert e.value.body["param"] == "store" and "store=true" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**kw, metadata={"run": 3})
    assert e.value.body["param"] == "metadata.run"


def test_a_slot_reused_after_a_biased_request_carries_no_bias(served):
    """The bias lives in the slot's state: a cancelled biased request must not leave it
    behind for the next request in that slot (every slot is reused here)."""
    model, llm, _, _ = served
    prompt = _ids("hello")
    free = _reference(model, prompt)
    biased = SamplingParams(max_tokens=40, logit_bias=_bias_for(free), ignore_eos=True)
    handles = llm.scheduler.submit_many([(prompt, biased)] * 4)
    for h in handles:
        h.cancel()
    for h in handles:
        h.wait(120)
    outs = llm.scheduler.submit_many([(prompt, SamplingParams(max_tokens=STEPS))] * 4)
    assert [h.wait(120).output for h in outs] == [free] * 4


def test_biased_streams_cut_mid_way_free_their_slots_and_spare_the_rest(served):
    """Eight concurrent biased streams on four slots; half are closed after their first
    chunk. The rest still match transformers, and every slot and queue entry comes back."""
    import threading
    import time

    model, llm, _, client = served
    prompt = "hello"
    bias = _bias_for(_reference(model, _ids(prompt)))
    want = llm.tokenizer.decode(_reference(model, _ids(prompt), bias))
    sent = {str(k): v for k, v in bias.items()}
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            cut = i % 2 == 0
            stream = client.completions.create(
                model=NAME,
                prompt=prompt,
                temperature=0,
                logit_bias=sent,
                stream=True,
                max_tokens=48 if cut else STEPS,
                extra_body={"ignore_eos": True} if cut else None,
            )
            text = ""
            for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
                if cut:
                    break
            stream.close()
            if not cut:
                results[i] = text
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and results == {i: want for i in range(1, 8, 2)}
    deadline = time.time() + 30
    while llm.scheduler.active_slots() or llm.scheduler.queue_depth():
        assert time.time() < deadline, "slots or queue entries were not freed"
        time.sleep(0.05)
