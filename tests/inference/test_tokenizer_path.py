"""A tokenizer given as a path (``LLM(tokenizer="...")``, ``--tokenizer``) is loaded from
that path, never used as a tokenizer object itself; and one bad request cannot stop the
scheduler thread."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from inference import LLM, SamplingParams, ServingConfig
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

CFG = TransformerConfig.tiny(max_seq_len=32)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=3)


def test_a_str_tokenizer_is_a_path(tmp_path, params):
    folder = byte_level_tokenizer(tmp_path / "tok")
    for spec in (str(folder), str(folder / "tokenizer.json"), folder):
        llm = LLM(params, config=CFG, engine=ServingConfig(slots=2), tokenizer=spec)
        assert llm.tokenizer.encode("h\u00e9") == list("h\u00e9".encode())
        out = llm.generate("ab", max_tokens=3)
        assert len(out.tokens) == 3 and isinstance(out.text, str)
    with pytest.raises(jc.ConfigError, match=r"nowhere/tokenizer\.json"):
        LLM(params, config=CFG, tokenizer=str(tmp_path / "nowhere/tokenizer.json"))


def test_a_failing_request_leaves_the_scheduler_running(params, monkeypatch):
    llm = LLM(params, config=CFG, engine=ServingConfig(slots=2)).start()
    try:
        bad = llm.scheduler.submit([1, 2], SamplingParams(max_tokens=4))
        calls = {"n": 0}
        real = llm.tokenizer.decode

        def broken(ids):  # the first decode blows up, as a str "tokenizer" did
            calls["n"] += 1
            if calls["n"] == 1:
                raise TypeError("decode failed")
            return real(ids)

        monkeypatch.setattr(llm.tokenizer, "decode", broken)
        with pytest.raises(TypeError, match="decode failed"):
            bad.wait(30)
        good = llm.scheduler.submit([1, 2], SamplingParams(max_tokens=4)).wait(30)
        assert len(good.output) == 4
        assert llm.scheduler._thread.is_alive()
    finally:
        llm.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 300), max_size=40))
def test_byte_decode_fast_path_equals_the_filtering_reference(ids):
    want = bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
    assert ByteTokenizer().decode(ids) == want
