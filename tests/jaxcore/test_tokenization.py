"""`jaxcore.load_tokenizer`: paths (never a str as a tokenizer), tokenizers and transformers
objects, exact token bytes, and chat templates rendered exactly as transformers does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.tokenization import Tokenizer, load_tokenizer

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant') }}{% endif %}"
    "{% if loop.index0 == 0 and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{{ {'n': messages | length} | tojson }}"
)
MESSAGES = [
    {"role": "user", "content": "  Héllo <b>there</b>  "},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "日本語?"},
]
CORPUS = ["hello world, héllo wörld", "日本語のテキスト", "def f(x):\n    return x + 1"] * 20


def _byte_level_bpe():
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    _byte_level_bpe().save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_paths_objects_and_errors(saved, tmp_path):
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    by_dir = load_tokenizer(str(saved))
    by_file = load_tokenizer(saved / "tokenizer.json")
    by_obj = load_tokenizer(tokenizers.Tokenizer.from_file(str(saved / "tokenizer.json")))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(saved / "tokenizer.json"), eos_token="</s>")
    by_hf = load_tokenizer(hf)
    text = "héllo 日本語"
    for tok in (by_dir, by_file, by_obj, by_hf):
        assert isinstance(tok, Tokenizer)
        assert tok.decode(tok.encode(text)) == text
        assert tok.eos_id == by_dir.backend.token_to_id("</s>")
    assert by_dir.bos_id == 0 and by_dir.chat_template == CHATML and by_obj.chat_template is None
    assert by_dir.vocab_size == by_dir.backend.get_vocab_size(with_added_tokens=True) > 256
    # A str is a path, even one that does not exist: the error names it.
    missing = str(tmp_path / "nope" / "tokenizer.json")
    with pytest.raises(jc.ConfigError, match=r"nope/tokenizer\.json does not exist"):
        load_tokenizer(missing)
    with pytest.raises(jc.ConfigError, match=r"holds no tokenizer\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(jc.ConfigError, match="not a tokenizers JSON file"):
        load_tokenizer(tmp_path)
    with pytest.raises(jc.ConfigError, match="got int"):
        load_tokenizer(3)
    with pytest.raises(jc.ConfigError, match="no chat_template"):
        by_obj.apply_chat_template(MESSAGES)


def test_chat_template_renders_as_transformers_does(saved, tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = load_tokenizer(saved)
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(saved / "tokenizer.json"),
        bos_token="<s>",
        eos_token="</s>",
        chat_template=CHATML,
    )
    for gen in (True, False):
        want = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert tok.apply_chat_template(MESSAGES, add_generation_prompt=gen) == want
    assert load_tokenizer(hf).apply_chat_template(MESSAGES) == hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must be"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(jinja2.exceptions.SecurityError):  # the sandbox holds
        tok.apply_chat_template(MESSAGES, chat_template="{{ ''.__class__.__mro__ }}")
    # The list form and a chat_template.jinja file beside the tokenizer.
    folder = tmp_path / "listed"
    folder.mkdir()
    (folder / "tokenizer.json").write_text((saved / "tokenizer.json").read_text())
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "D"}]
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert load_tokenizer(folder).apply_chat_template(MESSAGES) == "D"
    (folder / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert load_tokenizer(folder).apply_chat_template(MESSAGES) == "J3"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_token_bytes_concatenate_to_the_utf8_text(text):
    tok = _TOK
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


_TOK = Tokenizer(_byte_level_bpe())


def test_token_bytes_of_byte_fallback_and_metaspace_tokens():
    import tokenizers
    from tokenizers import models

    vocab = {"<unk>": 0, "\u2581h\u00e9": 1, "<0xE6>": 2, "<0x97>": 3, "<0xA5>": 4, "</s>": 5}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.add_special_tokens(["</s>"])
    tok = Tokenizer(backend)
    assert tok.token_bytes(1) == " h\u00e9".encode()
    assert b"".join(tok.token_bytes(i) for i in (2, 3, 4)) == "日".encode()
    assert tok.token_bytes(5) == b"</s>" and tok.eos_id == 5
    with pytest.raises(jc.ConfigError, match=r"id 99 is not in the vocabulary"):
        tok.token_bytes(99)


def test_a_hub_name_is_not_downloaded_and_the_error_says_how_to_fetch_it():
    with pytest.raises(jc.ConfigError, match=r"Hub name.*snapshot_download\('org/model'\)"):
        jc.load_tokenizer("org/model")
