"""StarCoder2's file filters (Lozhkov et al. 2024, section 3.2), thresholds configurable."""

from __future__ import annotations

import re

from data.config import FilterConfig
from data.records import FileRecord, StageStats
from data.step import Step

# Runs of encoded data (StarCoder2 section 3.2, "encoded data"): base64, hex bytes, \u escapes.
# Reference forms; the scans below use equivalent forms that ``re`` searches faster.
BASE64 = r"[a-zA-Z0-9+/\n=]{64,}"
HEX = r"(?:\b(?:0x|\\x)?[0-9a-fA-F]{2}(?:,|\b\s*)){8,}"
UNICODE = r"(?:\\u[0-9a-fA-F]{4}){8,}"
_BASE64 = re.compile(BASE64)
# HEX with its first byte unrolled so the pattern opens with a branch of literals and a
# class (``re`` then skips in C to candidate characters instead of trying every position);
# ``\b`` before the first byte becomes a lookbehind placed after its first character.
_H = "[0-9a-fA-F]"
_HEX = re.compile(
    rf"(?:0(?<!\w0)x{_H}{{2}}|\\(?<=\w\\)x{_H}{{2}}|{_H}(?<!\w.){_H})(?:,|(?!\w)\s*)"
    rf"(?:\b(?:0x|\\x)?{_H}{{2}}(?:,|\b\s*)){{7,}}"
)
_UNICODE = re.compile(r"\\u[0-9a-fA-F]{4}(?:\\u[0-9a-fA-F]{4}){7,}")  # literal prefix
_ALPHA = re.compile(r"[^\W\d_]+")  # runs of letters (str.isalpha), counted in C
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_ASCII_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
# Bytes of the base64 class -> "a", all else (non-ASCII UTF-8 bytes included) -> " ": a file
# without 64 "a"s in a row has no base64 run, found by one translate and one substring
# search (most files; the regex then never runs).
_B64_TABLE = bytes(
    0x61
    if bytes([b]) in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/\n="
    else 0x20
    for b in range(256)
)
_B64_RUN = b"a" * 64


def encoded_runs(text: str) -> tuple[int, int]:
    """(longest run, total characters) of base64/hex/unicode-escape data in ``text``."""
    longest = total = 0
    scans = [_HEX]
    if "\\u" in text:
        scans.append(_UNICODE)
    if _B64_RUN in text.encode("utf-8", "surrogatepass").translate(_B64_TABLE):
        scans.append(_BASE64)
    for rx in scans:
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


def alpha_count(text: str) -> int:
    """Number of alphabetic characters (``str.isalpha``) in ``text``.

    ASCII letters are counted by deleting them from the UTF-8 bytes (one C pass); only the
    non-ASCII runs, usually a small part of a file, go through the Unicode regex.
    """
    raw = text.encode("utf-8", "surrogatepass")
    n = len(raw) - len(raw.translate(None, _ASCII_LETTERS))
    if len(raw) != len(text):
        n += sum(map(len, _ALPHA.findall("".join(_NON_ASCII.findall(text)))))
    return n


class FilterStep(Step):
    """Long-line, alphabetic, generated, encoded-data and data-format filters."""

    name = "filters"

    def __init__(self, config: FilterConfig) -> None:
        self.config = config

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
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
            alpha = alpha_count(text)
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
