"""Shared pieces of the inference tests: byte-level text, a compile counter, a reference."""

from __future__ import annotations

import contextlib
import json
import sysconfig
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def stdlib_text(start: int, count: int) -> bytes:
    """Bytes of ``count`` Python standard-library modules (sorted, from index ``start``)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 2000)
    return b"\n".join(p.read_bytes() for p in files[start : start + count])


class CompileCounter:
    """Counts XLA backend compiles while active (jax.monitoring events)."""

    def __init__(self) -> None:
        self.count = 0
        self.active = False

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if self.active and event == COMPILE_EVENT:
            self.count += 1


_counter = CompileCounter()
jax.monitoring.register_event_duration_secs_listener(_counter)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCounter]:
    _counter.count, _counter.active = 0, True
    try:
        yield _counter
    finally:
        _counter.active = False


def reference_greedy(model_fn, prompt: list[int], steps: int, pad_to: int):
    """Greedy decoding by recomputing the whole (right-padded) forward pass every step.

    ``model_fn(tokens (1, pad_to)) -> logits``; causal attention makes the padding inert.
    Returns the tokens and the logits row used for each choice.
    """
    seq = list(prompt)
    tokens, rows = [], []
    for _ in range(steps):
        padded = np.zeros((1, pad_to), np.int32)
        padded[0, : len(seq)] = seq
        row = np.asarray(model_fn(padded))[0, len(seq) - 1]
        tok = int(np.argmax(row))
        tokens.append(tok)
        rows.append(row)
        seq.append(tok)
    return tokens, np.stack(rows)


def byte_level_tokenizer(folder: Path, *, chat_template: str | None = None) -> Path:
    """Write a byte-level BPE ``tokenizer.json`` with no merges (256 ids, one per byte),
    so it fits `TransformerConfig.tiny()`; plus ``tokenizer_config.json`` with the
    template. Returns the folder."""
    import json

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    # GPT-2's byte -> printable character table, so that id b is byte b.
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in keep]
    chars = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(shifted)}
    vocab = {chars[b]: b for b in range(256)}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": None}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def post_raw_json(url: str, raw: str) -> tuple[int, dict]:
    """POST a JSON text as written (escapes and odd numbers reach the server unchanged);
    the status and the decoded answer, error statuses included."""
    req = urllib.request.Request(
        url, data=raw.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
