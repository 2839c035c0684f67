"""`inference.LLM` driven as a vLLM user drives `LLM.generate` / `SamplingParams`, off the
tested path: token-id prompts (a list of ids, vLLM's ``{"prompt_token_ids": ids}``, a mix
with text in one call) for `generate` and `score` alike, stop strings that end inside a
token, seeds across batch compositions and callers, and a tokenizer given as a path or
an object. One tiny model with a BPE tokenizer that has merges, shared by every test."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from inference import LLM, SamplingParams, ServingConfig
from inference.llm import ClosedError
from inference.request import Request, RequestError
from inference.tokenizer import ByteTokenizer, load_tokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

# Multi-character tokens, so stop strings can end inside one; "é" is one token of 2 bytes.
MERGES = [("a", "b"), ("ab", "c"), ("\u00c3", "\u00a9"), ("\u0120", "t"), ("t", "h")]
CFG = TransformerConfig.tiny(
    d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, vocab_size=264, max_seq_len=16
)
# Pushes the random model towards the merged tokens (ids 256..260).
BIAS = {256 + i: 6.0 for i in range(len(MERGES))}


def _bpe_folder(folder):
    import tokenizers
    from tokenizers import models

    byte_level_tokenizer(folder)
    base = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = base.get_vocab()
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer, tok.decoder = base.pre_tokenizer, base.decoder
    tok.save(str(folder / "tokenizer.json"))
    return folder, tok


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    folder, tok = _bpe_folder(tmp_path_factory.mktemp("tok"))
    params = init_params(CFG, seed=3)
    llm = LLM(params, config=CFG, engine=ServingConfig(slots=3), tokenizer=folder)
    yield llm, folder, tok, params
    llm.close()


# ------------------------------------------------------------------ token-id prompts
def test_score_and_generate_take_token_ids_as_vllm_does(env):
    llm, *_ = env
    text = "abc the\u00e9"
    ids = llm.tokenizer.encode(text, add_special_tokens=True)
    assert any(t >= 256 for t in ids)  # merged tokens really are in the prompt
    want = llm.score(text)
    assert len(want) == len(ids) - 1
    # A list of ids, a NumPy array and vLLM's TokensPrompt dict all score those ids as is.
    for prompt in (ids, np.asarray(ids), {"prompt_token_ids": ids}):
        assert llm.score(prompt) == pytest.approx(want, abs=1e-6)
    out = llm.generate(text, max_tokens=4)
    for prompt in (ids, tuple(ids), {"prompt_token_ids": ids}):
        got = llm.generate(prompt, max_tokens=4)
        assert got.prompt_tokens == ids and got.tokens == out.tokens and got.text == out.text


def test_a_batch_may_mix_text_and_token_ids(env):
    llm, *_ = env
    texts = ["abc", "th\u00e9", "x"]
    ids = [llm.tokenizer.encode(t, add_special_tokens=True) for t in texts]
    alone = [llm.generate(t, max_tokens=3) for t in texts]
    mixed = llm.generate([texts[0], ids[1], {"prompt_token_ids": ids[2]}], max_tokens=3)
    assert [c.tokens for c in mixed] == [c.tokens for c in alone]
    assert [c.prompt_tokens for c in mixed] == ids
    # score takes a batch the same way and answers one list per prompt.
    scores = llm.score([texts[0], ids[1], {"prompt": texts[2]}])
    assert len(scores) == 3
    for got, text in zip(scores, texts, strict=True):
        assert got == pytest.approx(llm.score(text), abs=1e-6)
    assert llm.score([]) == [] and llm.generate([], max_tokens=2) == []
    # Any iterable of prompts is a batch, as list(prompts) reads it.
    assert [c.tokens for c in llm.generate(iter(texts), max_tokens=3)] == [c.tokens for c in alone]


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ([1, 2, CFG.vocab_size], r"token ids must be integers in \[0, 264\)"),
        ([[]], "prompt is empty"),
        ([], None),  # an empty batch: nothing to score, not an error
        (["ok", 7], r"str.*token ids"),
        ([1.0, 2.0], r"str.*token ids"),
        ([True, 2], r"str.*token ids"),
        ({"ids": [1]}, r"prompt_token_ids"),
        (b"abc", r"str.*token ids"),
        (None, r"str.*token ids"),
    ],
)
def test_a_prompt_that_is_neither_text_nor_ids_says_what_to_pass(env, prompt, match):
    llm, *_ = env
    for call in (llm.score, lambda p: llm.generate(p, max_tokens=1)):
        if match is None:
            assert call(prompt) == []
            continue
        with pytest.raises(RequestError, match=match):
            call(prompt)


# ------------------------------------------------------------------ sampling fields
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"n": 2}, r"'n'.*prompt 2 times.*seed"),
        ({"best_of": 3}, r"'best_of'.*prompt 3 times"),
        ({"max_token": 3}, r"'max_token'.*max_tokens"),
    ],
)
def test_an_unknown_sampling_field_says_what_to_do(env, fields, match):
    llm, *_ = env
    with pytest.raises(jc.ConfigError, match=match):
        llm.generate("abc", **fields)


def test_one_sampling_params_per_prompt_as_vllm_takes(env):
    llm, *_ = env
    each = [SamplingParams(max_tokens=4, temperature=1.0, seed=s) for s in (1, 2)]
    got = llm.generate(["abc", "abc"], each)
    assert [c.tokens for c in got] == [llm.generate("abc", p).tokens for p in each]
    assert got[0].tokens != got[1].tokens  # two seeds: two samples of one prompt
    assert [len(c.tokens) for c in llm.generate(["abc", [97]], each, max_tokens=1)] == [1, 1]
    with pytest.raises(jc.ConfigError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], each)
    with pytest.raises(jc.ConfigError, match="must be a SamplingParams"):
        llm.generate("abc", {"max_tokens": 2})


# ------------------------------------------------------------------ stop strings
@pytest.fixture(scope="module")
def unstopped(env):
    llm, *_ = env
    full = llm.generate("abc", max_tokens=10, logit_bias=BIAS)
    assert any(t >= 256 for t in full.tokens)  # multi-character tokens in the output
    return full


@settings(max_examples=12, deadline=None)
@given(data=st.data(), include=st.booleans())
def test_a_stop_string_ending_inside_a_token_cuts_the_text_there(env, unstopped, data, include):
    llm, *_ = env
    text = unstopped.text
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start : start + data.draw(st.integers(1, 4))]
    out = llm.generate(
        "abc", max_tokens=10, logit_bias=BIAS, stop=[stop], include_stop_str_in_output=include
    )
    at = text.find(stop)  # the oracle: str.find on the text generated without stops
    assert out.text == text[: at + (len(stop) if include else 0)]
    assert out.finish_reason == "stop" and out.tokens == unstopped.tokens[: len(out.tokens)]


def _feed(tokens, stop, tokenizer=None):
    """A request fed ``tokens`` one by one, as the scheduler feeds it."""
    r = Request([1], SamplingParams(max_tokens=len(tokens), stop=(stop,)), tokenizer or BYTES)
    none = np.zeros(0)
    for t in tokens:
        if r.finish_reason is not None:
            break
        r._add(t, 0.0, none, none)
    return r


BYTES = ByteTokenizer()
# "a", the first, second and third bytes of "\u20ac", and of "\u00e9".
PIECES = [0x61, 0xE2, 0x82, 0xAC, 0xC3, 0xA9]


def test_a_stop_string_does_not_match_a_character_still_being_decoded():
    # After C3 A9 C3 the text ends in U+FFFD for the incomplete second "\u00e9"; the next
    # byte completes it, so "\u00e9\ufffd" is never in the output and must not stop it.
    tokens = [0xA9, 0xC3, 0xA9, 0xC3, 0xA9, 0x61]
    assert BYTES.decode(tokens) == "\ufffd\u00e9\u00e9a"
    r = _feed(tokens, "\u00e9\ufffd")
    assert (r.text, r.finish_reason) == ("\ufffd\u00e9\u00e9a", "length")


@settings(max_examples=25, deadline=None)
@given(tokens=st.lists(st.sampled_from(PIECES), min_size=1, max_size=8), data=st.data())
def test_a_stop_string_cuts_the_final_text_at_its_first_match(tokens, data):
    final = BYTES.decode(tokens)
    start = data.draw(st.integers(0, len(final) - 1))
    stop = final[start : start + data.draw(st.integers(1, 3))]
    r = _feed(tokens, stop)
    # Only whole characters count: a trailing U+FFFD may be a character still arriving.
    whole = final.rstrip("\ufffd")
    if stop in whole:
        assert (r.text, r.finish_reason) == (final[: final.find(stop)], "stop")
    else:
        assert (r.text, r.finish_reason) == (final, "length")


# ------------------------------------------------------------------ seeds and callers
def test_a_seeded_request_is_the_same_whatever_runs_beside_it(env):
    llm, *_ = env
    kinds = {
        "greedy": (["abc", "the"], {}),
        "sampled": (["abc", "the"], {"temperature": 1.0, "seed": 11}),
        "top_k": (["x\u00e9"], {"temperature": 0.7, "top_k": 5, "seed": 11}),
    }

    def run(kind):
        prompts, fields = kinds[kind]
        return [c.tokens for c in llm.generate(prompts, max_tokens=6, **fields)]

    alone = {k: run(k) for k in kinds}
    assert alone["sampled"] != alone["greedy"]
    # The same seed twice in one batch draws the same tokens; no seed draws fresh ones.
    twice = llm.generate(["abc", "abc"], max_tokens=6, temperature=1.0, seed=11)
    assert twice[0].tokens == twice[1].tokens == alone["sampled"][0]
    # Three callers at once (greedy and sampled rows in the same dispatches).
    barrier, got = threading.Barrier(len(kinds)), {}

    def caller(kind):
        barrier.wait()
        got[kind] = run(kind)

    threads = [threading.Thread(target=caller, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == alone


def test_temperature_zero_picks_the_most_likely_token_whatever_the_seed(env):
    llm, *_ = env
    greedy = llm.generate("th\u00e9", max_tokens=6, logprobs=1)
    seeded = llm.generate("th\u00e9", max_tokens=6, logprobs=1, temperature=0.0, seed=9)
    assert seeded.tokens == greedy.tokens
    assert [alts[0][0] for alts in greedy.top_logprobs] == greedy.tokens


def test_close_from_another_thread_cancels_a_generate_stepping_by_hand(env):
    # Without start(), the caller steps the scheduler itself; close() there (as another
    # thread would, between two steps) must end its waiting requests cancelled, as close()
    # does with the scheduler thread, not run them all to the end.
    _, folder, _, params = env
    llm = LLM(params, config=CFG, engine=ServingConfig(slots=3), tokenizer=folder)
    step, steps = llm.scheduler.step, []

    def step_then_close():
        step()
        steps.append(1)
        if len(steps) == 1:
            llm.close()

    llm.scheduler.step = step_then_close
    out = llm.generate(["abc", "th", "x", "y", "z"], max_tokens=4)
    assert [c.finish_reason for c in out] == ["cancelled"] * 5 and len(steps) <= 3
    with pytest.raises(ClosedError):
        llm.generate("abc")


# ------------------------------------------------------------------ tokenizer sources
def test_a_tokenizer_path_folder_or_object_tokenizes_alike(env):
    # LLM(tokenizer=spec) loads spec with load_tokenizer; the fixture's LLM got the folder.
    llm, folder, tok, _ = env
    text = "abc the\u00e9 \U0001f600"
    want = llm.tokenizer.encode(text, add_special_tokens=True)
    assert want == tok.encode(text).ids and any(t >= 256 for t in want)
    for spec in (str(folder / "tokenizer.json"), str(folder), tok):
        other = load_tokenizer(spec)
        assert other.encode(text, add_special_tokens=True) == want
        assert other.decode(want) == llm.tokenizer.decode(want) == text
