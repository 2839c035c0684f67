"""One tokenizer face for training data, evaluation and serving: `load_tokenizer(spec)`.

``spec`` is a path (a ``tokenizer.json`` file, or a folder holding one beside
``tokenizer_config.json`` / ``special_tokens_map.json`` / ``chat_template.jinja``), a
``tokenizers.Tokenizer``, or a ``transformers`` fast tokenizer. A ``str`` is always a path,
never a tokenizer object. The result is a `Tokenizer` with ``encode``/``decode``, the exact
bytes of each token (for OpenAI ``text_offset`` and ``bytes``), the special-token ids and
`Tokenizer.apply_chat_template`, which renders the model's Jinja chat template the way
``transformers``' ``apply_chat_template`` does: a sandboxed environment with
``trim_blocks``/``lstrip_blocks``, ``messages``, ``add_generation_prompt``, the special
tokens as variables, and ``raise_exception`` / ``strftime_now`` / a JSON ``tojson``.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxcore.errors import ConfigError, hub_name_hint

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Files of tokenizers that transformers converts to a fast one (sentencepiece, GPT-2 BPE,
# WordPiece); tokenizers alone cannot read them the way transformers' converters do.
_SLOW_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "spiece.model")
_EOS_GUESSES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: printable stand-in character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def _token_content(value: Any) -> str | None:
    """``"</s>"`` or ``{"content": "</s>", ...}`` (both appear in tokenizer_config.json)."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson HTML-escapes; chat templates expect plain JSON (as transformers).
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template)


class Tokenizer:
    """A ``tokenizers`` tokenizer plus what its config files say (special tokens, template).

    Attributes:
        vocab_size: ids in the vocabulary, added tokens included.
        bos_id, eos_id, pad_id: special-token ids (``None`` when the tokenizer has none).
        chat_template: the Jinja chat template (``None`` when the model ships none).
        source: where it came from, for error messages.
    """

    def __init__(
        self,
        backend: Any,
        *,
        config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        source: str = "<tokenizer>",
    ):
        self.backend = backend
        self.source = source
        config = dict(config or {})
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            content = _token_content(config.get(key))
            if content is not None:
                self.special_tokens[key] = content
        if "eos_token" not in self.special_tokens:
            guess = next((t for t in _EOS_GUESSES if backend.token_to_id(t) is not None), None)
            if guess is not None:
                self.special_tokens["eos_token"] = guess
        self.bos_id = self._id("bos_token")
        self.eos_id = self._id("eos_token")
        self.pad_id = self._id("pad_token")
        template = config.get("chat_template") if chat_template is None else chat_template
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        self.chat_template: str | None = template or None
        self._byte_level = self._uses_byte_level()
        self._added = {t.content for t in backend.get_added_tokens_decoder().values()}

    def _id(self, key: str) -> int | None:
        token = self.special_tokens.get(key)
        return None if token is None else self.backend.token_to_id(token)

    def _uses_byte_level(self) -> bool:
        decoder = json.loads(self.backend.to_str()).get("decoder") or {}
        kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
        return "ByteLevel" in kinds

    # ----------------------------------------------------------------- text <-> ids
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds what the post-processor says (BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; an incomplete UTF-8 character at the end decodes to U+FFFD."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes token ``token_id`` adds to the text (byte-level and ``<0xNN>``
        byte-fallback tokens give their raw byte, which may be part of one character)."""
        token = self.backend.id_to_token(int(token_id))
        if token is None:
            raise ConfigError(
                f"tokenizer {self.source}: id {token_id} is not in the vocabulary "
                f"(size {self.vocab_size})."
            )
        if token in self._added or token in self.special_tokens.values():
            return token.encode("utf-8")
        if self._byte_level:
            table = _byte_decoder()
            if all(c in table for c in token):
                return bytes(table[c] for c in token)
        match = _BYTE_TOKEN.fullmatch(token)
        if match:
            return bytes([int(match.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")

    # ----------------------------------------------------------------- chat
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (as ``transformers`` does).

        Raises `ConfigError` when the tokenizer has no template and none is given.
        """
        template = chat_template or self.chat_template
        if template is None:
            raise ConfigError(
                f"tokenizer {self.source} has no chat_template (tokenizer_config.json holds "
                "none); pass chat_template= or use a plain prompt."
            )
        variables = {**self.special_tokens, **kwargs}
        return _compile(template).render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **variables,
        )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"tokenizer: {path} is not a readable {what} JSON file ({e}).") from e
    if not isinstance(data, dict):
        raise ConfigError(f"tokenizer: {path} must hold a JSON object ({what}).")
    return data


def _from_folder(folder: Path, tokenizer_json: Path) -> Tokenizer:
    import tokenizers

    try:
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # tokenizers raises a bare Exception for bad files
        raise ConfigError(
            f"tokenizer: {tokenizer_json} is not a tokenizers JSON file ({e}); pass the "
            "tokenizer.json a Hugging Face fast tokenizer saves."
        ) from e
    config: dict[str, Any] = {}
    special_map = folder / "special_tokens_map.json"
    if special_map.is_file():
        config.update(_read_json(special_map, "special_tokens_map"))
    tok_config = folder / "tokenizer_config.json"
    if tok_config.is_file():
        config.update(_read_json(tok_config, "tokenizer_config"))
    template = None
    jinja_file = folder / "chat_template.jinja"  # newer transformers save it on its own
    if jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    return Tokenizer(backend, config=config, chat_template=template, source=str(tokenizer_json))


def load_tokenizer(spec: str | Path | Any) -> Tokenizer:
    """A `Tokenizer` from a path, a ``tokenizers.Tokenizer`` or a ``transformers`` fast tokenizer.

    A ``str`` or `Path` names a ``tokenizer.json`` file or a folder holding one; the
    folder's ``tokenizer_config.json`` and ``special_tokens_map.json`` give the special
    tokens and the chat template.
    """
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, str | Path):
        path = Path(spec).expanduser()
        if path.is_dir():
            file = path / "tokenizer.json"
            if not file.is_file():
                slow = [n for n in _SLOW_FILES if (path / n).is_file()]
                convert = (
                    f" It holds {' + '.join(slow)} (a slow tokenizer's files): load it with "
                    f"transformers.AutoTokenizer.from_pretrained({str(path)!r}) (or, without a "
                    "tokenizer_config.json, the model's class: GPT2TokenizerFast, "
                    "LlamaTokenizerFast, ...) and pass that object or its save_pretrained folder."
                    if slow
                    else ""
                )
                raise ConfigError(
                    f"tokenizer: the folder {path} holds no tokenizer.json; pass a folder saved "
                    "by a Hugging Face fast tokenizer (save_pretrained) or the file itself."
                    f"{convert}"
                )
            return _from_folder(path, file)
        if path.is_file():
            return _from_folder(path.parent, path)
        raise ConfigError(
            f"tokenizer: {path} does not exist; pass a tokenizer.json file or a folder "
            "holding one (with tokenizer_config.json for special tokens and the chat "
            f"template).{hub_name_hint(spec)}"
        )
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - tokenizers ships with transformers
        tokenizers = None
    if tokenizers is not None and isinstance(spec, tokenizers.Tokenizer):
        return Tokenizer(spec, source=f"<{type(spec).__name__}>")
    backend = getattr(spec, "backend_tokenizer", None)
    if backend is not None:  # a transformers PreTrainedTokenizerFast
        config = {
            key: getattr(spec, key, None)
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        return Tokenizer(
            backend,
            config={k: str(v) for k, v in config.items() if v is not None},
            chat_template=getattr(spec, "chat_template", None),
            source=f"<{type(spec).__name__}>",
        )
    raise ConfigError(
        f"tokenizer: got {type(spec).__name__}; pass a path to tokenizer.json (or its folder), "
        "a tokenizers.Tokenizer, or a transformers fast tokenizer (one with backend_tokenizer)."
    )
