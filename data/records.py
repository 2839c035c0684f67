"""The record that flows through every step, and the statistics a step returns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class FileRecord:
    """One input file. Steps fill in fields; a dropped file keeps its stage and reason."""

    repo: str
    path: str
    commit: str = ""
    commit_date: str = ""
    authors: tuple[str, ...] = ()
    """``Name <email>`` of every commit author who touched the file (git sources only)."""
    content: str = ""
    size: int = 0
    encoding: str = "utf-8"
    stars: int = 0
    shard: int = 0
    index: int = 0
    language: str = ""
    vendored: bool = False
    generated: bool = False
    license_type: str = ""
    license_ids: tuple[str, ...] = ()
    license_source: str = ""
    """The file that decided the license (``LICENSE``, ``sub/COPYING``) or ``spdx-header``."""
    license_score: float = 0.0
    """The deciding match's score (askalono's similarity; 1.0 for SPDX lines)."""
    sha256: str = ""
    pii_counts: dict[str, int] = field(default_factory=dict)
    redactions: list[dict[str, Any]] = field(default_factory=list)
    signature: np.ndarray | None = None
    drop_stage: str = ""
    drop_reason: str = ""

    @property
    def dropped(self) -> bool:
        """Whether some step has dropped this file."""
        return bool(self.drop_stage)

    def drop(self, stage: str, reason: str) -> None:
        """Mark the file dropped by ``stage`` for ``reason`` (first drop wins)."""
        if not self.drop_stage:
            self.drop_stage = stage
            self.drop_reason = reason


@dataclass
class StageStats:
    """What one step did to the files it saw: counts, bytes, drop reasons and seconds."""

    name: str
    files_in: int = 0
    bytes_in: int = 0
    files_out: int = 0
    bytes_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    """Wall-clock seconds in this step (inflated when the machine is shared)."""
    cpu_seconds: float = 0.0
    """CPU seconds of the running thread in this step (``time.thread_time``)."""

    def count(self, key: str, n: int = 1) -> None:
        """Add ``n`` to a named counter."""
        self.counters[key] = self.counters.get(key, 0) + n

    def merged(self, other: StageStats) -> StageStats:
        """Return the sum of two statistics of the same step."""
        out = StageStats(self.name)
        for f in ("files_in", "bytes_in", "files_out", "bytes_out", "seconds", "cpu_seconds"):
            setattr(out, f, getattr(self, f) + getattr(other, f))
        for key in ("dropped", "counters"):
            merged = dict(getattr(self, key))
            for k, v in getattr(other, key).items():
                merged[k] = merged.get(k, 0) + v
            setattr(out, key, dict(sorted(merged.items())))
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StageStats:
        """Inverse of :meth:`to_dict`."""
        return cls(**d)


def merge_stats(all_stats: list[list[StageStats]]) -> list[StageStats]:
    """Merge per-shard statistics lists (same step order in each) into one list."""
    by_name: dict[str, StageStats] = {}
    for stats in all_stats:
        for s in stats:
            by_name[s.name] = by_name[s.name].merged(s) if s.name in by_name else s
    return list(by_name.values())
