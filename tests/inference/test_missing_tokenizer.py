"""A Hugging Face folder without tokenizer files is served on raw UTF-8 bytes (ids 0-255);
for a model whose vocabulary is not bytes that is garbage in and out, so it warns."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from inference import LLM, ServingConfig


def _folder(tmp_path, vocab: int):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    folder = tmp_path / f"llama-{vocab}"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_folder_without_a_tokenizer_warns_when_its_vocabulary_is_not_bytes(tmp_path):
    folder = _folder(tmp_path, 1000)
    with pytest.warns(UserWarning, match=r"1000 ids.*no tokenizer.*tokenizer="):
        llm = LLM(str(folder), engine=ServingConfig(slots=1, max_len=32))
    llm.close()


def test_no_warning_for_a_byte_vocabulary_or_a_tokenizer_given(tmp_path):
    folder = _folder(tmp_path, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LLM(str(folder), engine=ServingConfig(slots=1, max_len=32)).close()
