"""StarCoder2's file filters (Lozhkov et al. 2024, section 3.2), thresholds configurable."""

from __future__ import annotations

import re

from data.config import FilterConfig
from data.records import FileRecord, StepStats
from data.step import Step

# Runs of encoded data (StarCoder2 section 3.2, "encoded data"): base64, hex bytes, \u escapes.
_BASE64 = re.compile(r"[a-zA-Z0-9+/\n=]{64,}")
_HEX = re.compile(r"(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}")
_UNICODE = re.compile(r"(?:\\u[0-9a-fA-F]{4}){8,}")
_ALPHA = re.compile(r"[^\W\d_]+")  # runs of letters (str.isalpha), counted in C


def encoded_runs(text: str) -> tuple[int, int]:
    """(longest run, total characters) of base64/hex/unicode-escape data in ``text``."""
    longest = total = 0
    for rx in (_BASE64, _HEX, _UNICODE):
        for m in rx.finditer(text):
            n = m.end() - m.start()
            # A base64 run must contain both letters and digits to count (not prose).
            if rx is _BASE64:
                s = m.group(0)
                if not (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
                    continue
            total += n
            longest = max(longest, n)
    return longest, total


class FilterStep(Step):
    """Long-line, alphabetic, generated, encoded-data and data-format filters."""

    name = "filters"

    def __init__(self, config: FilterConfig) -> None:
        self.config = config

    def process(self, record: FileRecord, stats: StepStats) -> str | None:
        c = self.config
        text = record.content
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > c.max_lines:
            return "too_many_lines"
        exempt = record.language in c.exempt_languages
        if not exempt and text:
            longest = max(map(len, text.splitlines()), default=0)
            if len(text) / max(lines, 1) > c.max_avg_line_length:
                return "long_average_line"
            if longest > c.max_line_length:
                return "long_line"
            alpha = sum(map(len, _ALPHA.findall(text)))
            if alpha < c.min_alpha_fraction * len(text):
                return "low_alphabetic"
        if c.drop_generated and record.generated:
            return "generated"
        if text:
            longest_run, total_run = encoded_runs(text)
            if longest_run > c.max_encoded_length or total_run > c.max_encoded_fraction * len(text):
                return "encoded_data"
        if record.language in c.data_languages and lines > c.data_max_lines:
            return "data_format_too_long"
        return None
