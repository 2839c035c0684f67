"""Tokenizers for serving: jaxcore's `load_tokenizer` (a ``tokenizer.json`` path or folder, a
``tokenizers`` or ``transformers`` object), a SentencePiece ``tokenizer.model`` converted by
transformers, or raw bytes without any file.

The byte-level fallback maps each UTF-8 byte to its own id (vocabulary 256), which matches
`TransformerConfig.tiny()` / ``small()``, so a model trained on raw bytes serves as is.
"""

from __future__ import annotations

import importlib.util
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


def _sentencepiece_folder(spec: str | Path) -> Path | None:
    """The folder of a SentencePiece-only tokenizer (``tokenizer.model``, no
    ``tokenizer.json``) that ``spec`` names, else ``None``."""
    path = Path(spec).expanduser()
    folder = path.parent if path.name == "tokenizer.model" else path
    if (folder / "tokenizer.model").is_file() and not (folder / "tokenizer.json").is_file():
        return folder
    return None


def _has_sentencepiece() -> bool:
    return importlib.util.find_spec("sentencepiece") is not None


def _from_sentencepiece(folder: Path) -> Tokenizer:
    """``transformers`` converts the SentencePiece model to a fast tokenizer (as
    ``AutoTokenizer`` does for such a checkpoint); that needs the ``sentencepiece``
    package, and without it this says so rather than serving bytes."""
    fix = (
        f"or save a tokenizer.json into {folder} once where it is installed "
        "(transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)), or "
        "pass tokenizer= a tokenizer.json (--tokenizer for the server)."
    )
    if not _has_sentencepiece():
        raise jc.ConfigError(
            f"tokenizer: {folder} has a SentencePiece tokenizer.model but no tokenizer.json, "
            "and converting it needs the sentencepiece package, which is not installed. "
            f"Install it (pip install sentencepiece protobuf), {fix}"
        )
    try:  # transformers (the serve/test extra) raises many kinds for an unreadable model
        from transformers import AutoTokenizer

        converted = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise jc.ConfigError(
            f"tokenizer: transformers could not convert {folder / 'tokenizer.model'} to a fast "
            f"tokenizer ({type(e).__name__}: {e}); check the file, {fix}"
        ) from e
    return jc.load_tokenizer(converted)


def load_tokenizer(spec: str | Path | Any | None = None) -> Tokenizer:
    """``None``: bytes; a ``str``/`Path` (always a path: a ``tokenizer.json`` or its
    folder, or a SentencePiece ``tokenizer.model`` or its folder, converted by
    transformers), a ``tokenizers``/``transformers`` tokenizer: `jaxcore.load_tokenizer`;
    an object that already has this interface is used as is."""
    if spec is None:
        return ByteTokenizer()
    if isinstance(spec, str | Path):
        folder = _sentencepiece_folder(spec)
        if folder is not None:
            return _from_sentencepiece(folder)
    if isinstance(spec, str | Path | FileTokenizer):
        return jc.load_tokenizer(spec)
    if all(hasattr(spec, a) for a in ("encode", "decode", "token_bytes", "eos_id")):
        return spec
    return jc.load_tokenizer(spec)
