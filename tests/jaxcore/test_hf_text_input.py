"""`TextSource`: jc.Loader over text with a Hugging Face tokenizer (built here, no download)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tokenizers
import transformers

import jaxcore as jc
from jaxcore.text_input import TextSource

TEXTS = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(40)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A byte-level BPE trained on the texts, saved as a HF model folder would hold it."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(TEXTS, trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return d


def test_packed_batches_are_the_tokenized_documents_with_eos_between(tok_dir):
    tok = jc.load_tokenizer(tok_dir)
    assert tok.eos_id == 0
    source = TextSource(TEXTS, tok_dir)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    want = [reference(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert [list(source[i]) for i in range(len(TEXTS))] == want
    assert source.lengths.tolist() == [len(w) for w in want]

    cfg = jc.InputConfig(global_batch_size=4, seq_len=31, shuffle=False, eos_id=tok.eos_id)
    loader = jc.Loader(source, cfg)
    try:
        rows = np.concatenate([next(loader)["tokens"] for _ in range(3)]).reshape(-1)
    finally:
        loader.close()
    stream = [t for w in want for t in (*w, tok.eos_id)]
    np.testing.assert_array_equal(rows, stream[: rows.size])


def test_dict_documents_and_bad_elements(tok_dir):
    source = TextSource([{"text": "def f0(x):"}, {"text": "return"}], tok_dir)
    assert len(source) == 2 and source[0].dtype == np.int32
    with pytest.raises(jc.ConfigError, match="element 1 is int"):
        TextSource(["ok", 3], tok_dir)
