"""`inference.LLM` off the tested path: prompts are tokenized as transformers and the
server tokenize them (special tokens such as BOS included), and a prompt that is not text
gets an error that says so."""

from __future__ import annotations

import json

import pytest

from inference import LLM, ServingConfig
from inference.request import RequestError
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from tests.inference.helpers import byte_level_tokenizer

# 256 byte tokens plus "<s>" (id 256), padded as HF models pad their vocabulary.
CFG = TransformerConfig.tiny(vocab_size=264, max_seq_len=32)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import tokenizers
    from tokenizers import processors

    folder = byte_level_tokenizer(tmp_path_factory.mktemp("tok"))
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    # A Llama-style post-processor: every encoded text starts with BOS.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": None})
    )
    model = LLM(
        init_params(CFG, seed=4), config=CFG, engine=ServingConfig(slots=2), tokenizer=folder
    )
    yield model, folder
    model.close()


def test_generate_and_score_add_bos_as_transformers_and_the_server_do(llm):
    transformers = pytest.importorskip("transformers")
    model, folder = llm
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    text = "h\u00e9llo"
    want = hf(text).input_ids  # transformers' default: special tokens added
    assert want[0] == 256
    # The server's /v1/completions encodes a prompt the same way (add_special_tokens=True).
    assert model.tokenizer.encode(text, add_special_tokens=True) == want
    out = model.generate(text, max_tokens=4)
    assert out.prompt_tokens == want
    (batched,) = model.generate([text], max_tokens=4)
    assert batched.prompt_tokens == want and batched.tokens == out.tokens
    # Every token of the text is scored, the first one given BOS.
    assert len(model.score(text)) == len(want) - 1


@pytest.mark.parametrize("prompt", [[1.0, 2.0], None, b"bytes", ["ok", 7]])
def test_a_prompt_that_is_not_text_says_what_to_pass(llm, prompt):
    model, _ = llm
    with pytest.raises(RequestError, match=r"str.*list of str") as info:
        model.generate(prompt, max_tokens=2)
    assert info.value.param == "prompt"


def test_a_config_given_with_a_hugging_face_folder_is_not_silently_dropped(tmp_path, monkeypatch):
    import jaxcore as jc
    import jaxcore.hf

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    params = init_params(CFG, seed=4)
    monkeypatch.setattr(jaxcore.hf, "load", lambda path: (CFG, params))
    assert LLM(tmp_path, config=CFG, engine=ServingConfig(slots=1)).config == CFG  # the same
    other = TransformerConfig.tiny(vocab_size=264, max_seq_len=16)
    with pytest.raises(jc.ConfigError, match=r"config\.json.*max_len"):
        LLM(tmp_path, config=other, engine=ServingConfig(slots=1))


def test_asked_for_alternatives_come_back_in_the_completion(llm):
    model, _ = llm
    out = model.generate("abc", max_tokens=4, logprobs=3, prompt_logprobs=2)
    assert [len(a) for a in out.top_logprobs] == [3] * 4
    for token, lp, alternatives in zip(out.tokens, out.logprobs, out.top_logprobs, strict=True):
        assert alternatives[0][0] == token and alternatives[0][1] == pytest.approx(lp, abs=1e-6)
    assert [len(a) for a in out.prompt_top_logprobs] == [2] * (len(out.prompt_tokens) - 1)
    assert model.generate("abc", max_tokens=2).top_logprobs == []  # none asked, none given
