"""Tokenizers for serving: jaxcore's `load_tokenizer` (a ``tokenizer.json`` path or folder, a
``tokenizers`` or ``transformers`` object), or raw bytes without any file.

The byte-level fallback maps each UTF-8 byte to its own id (vocabulary 256), which matches
`TransformerConfig.tiny()` / ``small()``, so a model trained on raw bytes serves as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import jaxcore as jc
from jaxcore.tokenization import Tokenizer as FileTokenizer


class Tokenizer(Protocol):
    """What the engine and the server need from a tokenizer."""

    vocab_size: int
    eos_id: int | None
    chat_template: str | None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: id ``b`` is byte ``b``; no special tokens, no chat template."""

    vocab_size = 256
    eos_id: int | None = None
    bos_id: int | None = None
    pad_id: int | None = None
    chat_template: str | None = None

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # An incomplete multi-byte character at the end decodes to U+FFFD; streaming holds
        # it back until the rest of the character arrives.
        try:  # one C call; ids outside a byte (special ids of a model) are dropped
            raw = bytes(ids)
        except (ValueError, TypeError):
            raw = bytes(i for i in ids if 0 <= i < 256)
        return raw.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        raise jc.ConfigError("the byte-level tokenizer has no chat template.")


def piece(token: bytes) -> str:
    """A token as OpenAI's ``logprobs.tokens`` show it: its text, or ``bytes:\\xNN...`` when
    its bytes are not whole UTF-8 characters."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in token)


def load_tokenizer(spec: str | Path | Any | None = None) -> Tokenizer:
    """``None``: bytes; a ``str``/`Path` (always a path: a ``tokenizer.json`` or its
    folder), a ``tokenizers``/``transformers`` tokenizer: `jaxcore.load_tokenizer`; an
    object that already has this interface is used as is."""
    if spec is None:
        return ByteTokenizer()
    if isinstance(spec, str | Path | FileTokenizer):
        return jc.load_tokenizer(spec)
    if all(hasattr(spec, a) for a in ("encode", "decode", "token_bytes", "eos_id")):
        return spec
    return jc.load_tokenizer(spec)
