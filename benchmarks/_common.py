"""Shared benchmark plumbing: alternating timing, a printed table, results JSON."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def time_alternating(
    fns: dict[str, Callable[[], None]], *, rounds: int, steps: int
) -> dict[str, float]:
    """Median seconds per call of each function, run in turns so drifting machine load
    hits every variant alike (the machines are shared: only ratios from one run count)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            samples[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(s) for name, s in samples.items()}


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print(f"\n{title}")
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        **payload,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path


def stdlib_batch(batch: int, seq: int, seed: int = 0) -> dict:
    """One packed batch of the stdlib's source bytes as NumPy arrays (real text)."""
    import jaxcore as jc

    loader = jc.Loader(
        jc.stdlib_source(), jc.InputConfig(global_batch_size=batch, seq_len=seq, seed=seed)
    )
    try:
        return next(loader)
    finally:
        loader.close()
