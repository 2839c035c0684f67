"""Text documents as token sources for `jc.Loader`, through a Hugging Face tokenizer.

`TextSource(texts, tokenizer)` is a random-access Grain source: element ``i`` is the
token ids of ``texts[i]`` (a string, or a dict with a ``"text"`` field; ``field=`` names
another, as a Parquet or JSONL column), tokenized on access with `jaxcore.load_tokenizer`'s
tokenizer (a ``tokenizer.json``, a HF model folder, a ``tokenizers.Tokenizer`` or a
``transformers`` fast tokenizer). Packing needs each
document's length: they are computed once, up front, by tokenizing in batches
(``encode_batch`` runs on all cores). Pass ``InputConfig(eos_id=tok.eos_id)`` to separate
packed documents with the model's end-of-text token, as its pre-training did.

    tok = jc.load_tokenizer("path/to/hf_dir")
    loader = jc.Loader(jc.TextSource(texts, tok), jc.InputConfig(global_batch_size=8,
                       seq_len=512, eos_id=tok.eos_id), engine.batch_sharding)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxcore.errors import ConfigError
from jaxcore.tokenization import Tokenizer, load_tokenizer


def _field_hint(element: dict) -> str:
    """Which of a record's keys could be its text (those holding a str), as advice."""
    keys = sorted(k for k, v in element.items() if isinstance(v, str))
    if not keys:
        return ""
    named = repr(keys[0]) if len(keys) == 1 else f"one of {keys}"
    return f" Name the text field: TextSource(..., field={named})."


def _text_of(element: Any, index: int, field: str = "text") -> str:
    if isinstance(element, dict):
        if field not in element:
            raise ConfigError(
                f"TextSource: element {index} is a dict with keys {sorted(element)} and no "
                f"{field!r}; each document must be a str or a dict with a {field!r} str."
                f"{_field_hint(element)}"
            )
        element = element[field]
    if isinstance(element, bytes):
        raise ConfigError(
            f"TextSource: element {index} is bytes; decode the documents to str first "
            "(data.decode('utf-8', errors='replace'), or the file's encoding)."
        )
    if not isinstance(element, str):
        raise ConfigError(
            f"TextSource: element {index} is {type(element).__name__}; each document must be "
            f"a str or a dict with a {field!r} str."
        )
    return element


def _check_texts(texts: Any) -> None:
    """Refuse a str, bytes or path as the documents (a str is a sequence: it would silently
    become one document per character), and a stream (it has no ``len`` for the lengths)."""
    if isinstance(texts, str | bytes | os.PathLike):
        raise ConfigError(
            f"TextSource(texts={texts!r:.80}): texts is one {type(texts).__name__}, not a "
            "sequence of documents (a str would become one document per character). Read "
            "the file first, e.g. a JSONL: [json.loads(line)['text'] for line in open(path)], "
            "or grain.sources.ArrayRecordDataSource / a list of dicts."
        )
    if not (hasattr(texts, "__len__") and hasattr(texts, "__getitem__")):
        raise ConfigError(
            f"TextSource(texts=<{type(texts).__name__}>): texts must be random access (len and "
            "texts[i]), as a list, a grain.MapDataset or a Grain data source. Read a stream "
            "into a list, or tokenize it in the stream (ds.map(lambda r: "
            "np.asarray(tok.encode(r['text'])))) and pass that grain.IterDataset to jc.Loader."
        )


def _not_utf8(texts: Sequence[str], first: int) -> ConfigError | None:
    """The error for the first text the tokenizer cannot take: a lone surrogate (what
    ``errors="surrogateescape"`` makes of non-UTF-8 bytes) has no UTF-8 form."""
    for offset, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return ConfigError(
                f"TextSource: element {first + offset} is not valid Unicode text: "
                f"{text[e.start : e.end]!r} at character {e.start} has no UTF-8 form "
                "(non-UTF-8 bytes decoded with errors='surrogateescape'?). Decode the "
                "bytes with errors='replace' (or fix the encoding) before tokenizing."
            )
    return None


class TextSource:
    """Random-access token documents from texts and a tokenizer (see the module docstring).

    Attributes:
        lengths: tokens per document (what packing uses to cut rows without a pass).
    """

    def __init__(
        self,
        texts: Sequence[Any],
        tokenizer: Tokenizer | Any,
        *,
        add_special_tokens: bool = False,
        batch_size: int = 256,
        field: str = "text",
    ):
        _check_texts(texts)
        self.texts = texts
        self.tokenizer = load_tokenizer(tokenizer)
        self.add_special_tokens = add_special_tokens
        self.field = field
        lengths = []
        for start in range(0, len(texts), batch_size):
            chunk = [
                _text_of(texts[i], i, field)
                for i in range(start, min(start + batch_size, len(texts)))
            ]
            try:
                encoded = self.tokenizer.backend.encode_batch(
                    chunk, add_special_tokens=add_special_tokens
                )
            except TypeError as e:
                raise (_not_utf8(chunk, start) or e) from e
            lengths += [len(e.ids) for e in encoded]
        self.lengths = np.asarray(lengths, np.int64)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> np.ndarray:
        text = _text_of(self.texts[index], index, self.field)
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens)
        return np.asarray(ids, np.int32)

    def __repr__(self) -> str:
        return f"TextSource({len(self.texts)} documents, tokenizer={self.tokenizer.source})"
