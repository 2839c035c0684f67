"""Tokenizer training (byte-level BPE, ``tokenizers``) and tokenized ArrayRecord shards.

Each ArrayRecord record is one document's token ids as little-endian ``uint32`` bytes,
ending with the end-of-text id; ``index.json`` lists the shards, their record and token
counts, and the tokenizer's hash. :func:`open_dataset` returns a Grain ``MapDataset``
over them, which ``jaxcore``'s input pipeline (or any Grain user) reads directly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.config import TokenizeConfig


def _documents(version_dir: Path) -> Iterator[str]:
    manifest = json.loads((version_dir / "manifest.json").read_text())
    for shard in manifest["shards"]:
        for batch in pq.ParquetFile(version_dir / shard["path"]).iter_batches(
            256, columns=["content"]
        ):
            yield from batch.column(0).to_pylist()


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


def tokenize_snapshot(version_dir: str | Path, config: TokenizeConfig) -> dict[str, Any]:
    """Train (or load) the tokenizer and write ``tokens/`` ArrayRecord shards + index."""
    from array_record.python.array_record_module import ArrayRecordWriter

    version_dir = Path(version_dir)
    out = version_dir / "tokens"
    out.mkdir(parents=True, exist_ok=True)
    if config.tokenizer:
        tok = Tokenizer.from_file(config.tokenizer)
    else:
        tok = train_tokenizer(
            _documents(version_dir), config.vocab_size, config.min_frequency, config.eos_token
        )
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))
    eos = tok.token_to_id(config.eos_token)
    if eos is None:
        raise ValueError(f"tokenizer has no {config.eos_token!r} token (tokenize.eos_token)")
    writers = []
    shards = []
    for i in range(config.num_shards):
        path = out / f"tokens-{i:05d}-of-{config.num_shards:05d}.array_record"
        writers.append(ArrayRecordWriter(str(path), "group_size:1"))
        shards.append({"path": path.relative_to(version_dir).as_posix(), "records": 0, "tokens": 0})
    batch: list[str] = []
    n = 0

    def flush() -> None:
        nonlocal n
        for enc in tok.encode_batch(batch):
            ids = np.asarray([*enc.ids, eos], dtype="<u4")
            s = n % config.num_shards  # round robin: deterministic and balanced
            writers[s].write(ids.tobytes())
            shards[s]["records"] += 1
            shards[s]["tokens"] += len(ids)
            n += 1
        batch.clear()

    for text in _documents(version_dir):
        batch.append(text)
        if len(batch) >= 256:
            flush()
    flush()
    for w in writers:
        w.close()
    index = {
        "format": "uint32-le token ids per record, eos-terminated",
        "tokenizer": "tokens/tokenizer.json",
        "tokenizer_sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
        "vocab_size": tok.get_vocab_size(),
        "eos_id": eos,
        "shards": shards,
        "records": n,
        "tokens": sum(s["tokens"] for s in shards),
    }
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def open_dataset(index_path: str | Path):
    """A Grain ``MapDataset`` of token-id arrays (``np.uint32``) from a tokens index."""
    import grain

    index_path = Path(index_path)
    index = json.loads(index_path.read_text())
    root = index_path.parent.parent
    paths = [str(root / s["path"]) for s in index["shards"]]
    source = grain.sources.ArrayRecordDataSource(paths)
    return grain.MapDataset.source(source).map(lambda b: np.frombuffer(b, dtype="<u4"))
