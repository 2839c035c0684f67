"""Byte-level text from the Python standard library's own source: real data everywhere."""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def stdlib_bytes(*, val_fraction: float = 0.05, limit_mb: float = 64.0) -> tuple[np.ndarray,
                                                                                  np.ndarray]:
    """The stdlib's ``.py`` files (sorted, so every machine reads them in one order) as
    uint8 arrays: the first ``1 - val_fraction`` for training, the rest for validation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total > limit_mb * 1e6:
            break
    if not chunks:
        raise FileNotFoundError(f"no .py files under {root}: is this a full Python install?")
    text = np.frombuffer(b"\n".join(chunks), dtype=np.uint8)
    cut = int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def window_batches(text: np.ndarray, batch: int, seq: int, *, seed: int,
                   count: int) -> Iterator[dict[str, np.ndarray]]:
    """``count`` batches of ``batch`` random windows of ``seq + 1`` bytes (deterministic)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        starts = rng.integers(0, len(text) - seq - 1, batch)
        idx = starts[:, None] + np.arange(seq + 1)[None, :]
        yield {"tokens": text[idx].astype(np.int32)}
