"""Decontamination: drop files that contain benchmark prompts or solutions.

Needles and files are compared case-insensitively with all whitespace removed (as the
StarCoder decontamination did for HumanEval, MBPP, ...). The list is pluggable: strings in
the config, or files of one string per line / JSONL with a ``text`` field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from data.config import DecontamConfig
from data.records import FileRecord, StageStats
from data.step import Step

_WS = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Lower-case and remove all whitespace."""
    return _WS.sub("", text.lower())


def load_needles(config: DecontamConfig) -> list[str]:
    """Normalised, de-duplicated needles (shorter than ``min_length`` are dropped), sorted."""
    raw = list(config.strings)
    for f in config.files:
        for line in Path(f).read_text().splitlines():
            if not line.strip():
                continue
            if f.endswith(".jsonl"):
                obj = json.loads(line)
                raw.extend(
                    v
                    for k, v in obj.items()
                    if k in ("text", "prompt", "solution", "canonical_solution") and v
                )
            else:
                raw.append(line)
    needles = {normalize(s) for s in raw}
    return sorted(n for n in needles if len(n) >= config.min_length)


class DecontamStep(Step):
    """Drop files containing any needle."""

    name = "decontam"

    def __init__(self, config: DecontamConfig) -> None:
        self.needles = load_needles(config)
        # A first-characters prefilter keeps the per-file cost close to one regex scan.
        self._prefix = re.compile("|".join(sorted({re.escape(n[:8]) for n in self.needles})))

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        if not self.needles:
            return None
        text = normalize(record.content)
        if not self._prefix.search(text):
            return None
        for i, n in enumerate(self.needles):
            if n in text:
                stats.count(f"needle:{i}")
                return "benchmark_match"
        return None
