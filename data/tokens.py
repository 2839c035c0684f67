"""Tokenizer training (byte-level BPE, ``tokenizers``) and tokenized ArrayRecord shards.

Each ArrayRecord record is one document's token ids as little-endian ``uint32`` bytes,
ending with the end-of-text id; ``index.json`` lists the shards, their record and token
counts, and the tokenizer's hash. :func:`open_dataset` returns a Grain ``MapDataset``
over them, which ``jaxcore``'s input pipeline (or any Grain user) reads directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.config import TokenizeConfig
from data.errors import BuildError, DataConfigError


def _documents(version_dir: Path, shards: list[str] | None = None) -> Iterator[str]:
    if shards is None:
        shards = [
            s["path"] for s in json.loads((version_dir / "manifest.json").read_text())["shards"]
        ]
    for shard in shards:
        for batch in pq.ParquetFile(version_dir / shard).iter_batches(256, columns=["content"]):
            yield from batch.column(0).to_pylist()


@contextlib.contextmanager
def _write_errors(path: Path) -> Iterator[None]:
    """ArrayRecord and tokenizers report a failed write (a full disk, a folder made
    read-only) as RuntimeError / Exception, not OSError: say what failed and the fix in one
    line instead of a traceback."""
    try:
        yield
    except OSError:
        raise  # the CLI words these itself
    except Exception as e:
        raise BuildError(
            f"writing {path} failed: {e}. Fix: free space or fix permissions there, then "
            "rerun the same command: finished shards are kept"
        ) from None


def train_tokenizer(
    texts: Iterator[str], vocab_size: int, min_frequency: int = 2, eos_token: str = "<|endoftext|>"
) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style pre-tokenisation)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eos_token],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(config: TokenizeConfig) -> Tokenizer:
    """The configured ``tokenize.tokenizer``, checked to hold ``tokenize.eos_token`` (the
    build calls this before curating, so a wrong path fails at once, not after hours)."""
    try:
        tok = Tokenizer.from_file(config.tokenizer)
    except Exception as e:  # tokenizers raises plain Exception for a bad or missing file
        raise DataConfigError(
            "tokenize.tokenizer",
            f"cannot load {config.tokenizer} ({e})",
            "give the path of a tokenizers JSON file (Tokenizer.save), or leave it empty "
            "to train one",
        ) from None
    if tok.token_to_id(config.eos_token) is None:
        raise DataConfigError(
            "tokenize.eos_token",
            f"the tokenizer {config.tokenizer} has no {config.eos_token!r} token",
            "set tokenize.eos_token to its end-of-text token",
        )
    return tok


def tokenize_snapshot(
    version_dir: str | Path,
    config: TokenizeConfig,
    parquet: list[str] | None = None,
    out_dir: str = "tokens",
) -> dict[str, Any]:
    """Train (or load) the tokenizer and write ArrayRecord shards + index into
    ``version_dir/out_dir`` (one folder name: `open_dataset` finds the shards from it).

    ``parquet`` are the Parquet shards' paths relative to ``version_dir`` (default: the
    manifest's); the build passes them and tokenizes before its manifest exists, so a
    crash mid-way leaves no finished-looking snapshot. ``jaxcore run`` passes one
    ``out_dir`` per tokenizer setting, so runs sharing a version never rewrite each
    other's shards."""
    from array_record.python.array_record_module import ArrayRecordWriter

    if "/" in out_dir or out_dir in ("", ".", ".."):
        raise ValueError(f"out_dir must be one folder name inside the version, not {out_dir!r}")
    version_dir = Path(version_dir)
    out = version_dir / out_dir
    out.mkdir(parents=True, exist_ok=True)
    if config.tokenizer:
        tok = load_tokenizer(config)
    else:
        tok = train_tokenizer(
            _documents(version_dir, parquet),
            config.vocab_size,
            config.min_frequency,
            config.eos_token,
        )
    tok_path = out / "tokenizer.json"
    eos = tok.token_to_id(config.eos_token)
    if eos is None:
        raise DataConfigError(
            "tokenize.eos_token",
            f"the tokenizer has no {config.eos_token!r} token",
            "set tokenize.eos_token to its end-of-text token",
        )
    with _write_errors(out):
        tok.save(str(tok_path))
    writers = []
    shards = []
    for i in range(config.num_shards):
        path = out / f"tokens-{i:05d}-of-{config.num_shards:05d}.array_record"
        with _write_errors(path):
            writers.append(ArrayRecordWriter(str(path), "group_size:1"))
        shards.append({"path": path.relative_to(version_dir).as_posix(), "records": 0, "tokens": 0})
    batch: list[str] = []
    n = 0

    def flush() -> None:
        nonlocal n
        for enc in tok.encode_batch(batch):
            ids = np.asarray([*enc.ids, eos], dtype="<u4")
            s = n % config.num_shards  # round robin: deterministic and balanced
            with _write_errors(version_dir / shards[s]["path"]):
                writers[s].write(ids.tobytes())
            shards[s]["records"] += 1
            shards[s]["tokens"] += len(ids)
            n += 1
        batch.clear()

    from data.pipeline import crash_point

    for text in _documents(version_dir, parquet):
        batch.append(text)
        if len(batch) >= 256:
            flush()
    flush()
    crash_point("tokens-unindexed")
    for w, shard in zip(writers, shards, strict=True):
        with _write_errors(version_dir / shard["path"]):
            w.close()
    index = {
        "format": "uint32-le token ids per record, eos-terminated",
        "tokenizer": f"{out_dir}/tokenizer.json",
        "tokenizer_sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
        "vocab_size": tok.get_vocab_size(),
        "eos_id": eos,
        "shards": shards,
        "records": n,
        "tokens": sum(s["tokens"] for s in shards),
    }
    tmp = out / "index.json.tmp"
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / "index.json")
    return index


def open_dataset(index_path: str | Path):
    """A Grain ``MapDataset`` of token-id arrays (``np.uint32``) from a tokens index."""
    import grain

    index_path = Path(index_path)
    index = json.loads(index_path.read_text())
    if not index.get("records"):
        # Grain's source over empty shards failed at the first read with a
        # ZeroDivisionError from its record index.
        raise BuildError(
            f"{index_path}: the build tokenized no records (every file was dropped), so "
            "there is nothing to read. See `jaxcore data stats` on the version for what "
            "each stage dropped, and widen the sources or the filters."
        )
    root = index_path.parent.parent
    paths = [str(root / s["path"]) for s in index["shards"]]
    source = grain.sources.ArrayRecordDataSource(paths)
    return grain.MapDataset.source(source).map(lambda b: np.frombuffer(b, dtype="<u4"))
