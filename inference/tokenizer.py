"""Tokenizers for serving: a `tokenizers` JSON file, or raw bytes without any file.

The byte-level fallback maps each UTF-8 byte to its own id (vocabulary 256), which matches
`TransformerConfig.tiny()` / ``small()``, so a model trained on raw bytes serves as is.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import jaxcore as jc

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    """What the engine and the server need from a tokenizer."""

    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def piece(self, token_id: int) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: id ``b`` is byte ``b``; no special tokens."""

    vocab_size = 256
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # An incomplete multi-byte character at the end decodes to U+FFFD; streaming holds
        # it back until the rest of the character arrives.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> str:
        """The token as OpenAI's ``logprobs.tokens`` show it (``bytes:\\xNN`` for non-ASCII)."""
        return chr(token_id) if token_id < 128 else f"bytes:\\x{token_id:02x}"


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from its ``tokenizer.json``."""

    def __init__(self, path: str | Path, *, eos_token: str | None = None):
        import tokenizers

        self._tok = tokenizers.Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = None
        for name in (eos_token, "</s>", "<|endoftext|>", "<eos>", "[EOS]"):
            if name is not None and self._tok.token_to_id(name) is not None:
                self.eos_id = self._tok.token_to_id(name)
                break

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def piece(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)


def load_tokenizer(path: str | Path | Tokenizer | None = None) -> Tokenizer:
    """A tokenizer from ``path`` (a ``tokenizer.json`` or a folder holding one), else bytes.

    A ``str`` is always a path: it has an ``encode`` method too, which once made it pass
    for a tokenizer object.
    """
    if path is None:
        return ByteTokenizer()
    if not isinstance(path, str | Path):
        return path
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise jc.ConfigError(
            f"tokenizer: {path} does not exist; pass a tokenizers JSON file (tokenizer.json) "
            "or None for the byte-level tokenizer."
        )
    return HFTokenizer(path)
