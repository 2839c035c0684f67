"""Loading and scoring the PII and language sets split by kind (``*_stop44/45.jsonl``).

A set is a JSONL file: a header (tune and held-out kinds) and one case per line with its
``kind`` and ``split``. The secrets and license sets have their own scorers
(`secrets_scoring`, `license_scoring`), which load the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from data.language import detect_language
from data.pii import PIIDetector

PII_SCORED = ("email", "ip", "name", "credit_card")
DETECTOR = PIIDetector()


def load_cases(path: Path) -> tuple[dict, list[dict]]:
    """The set's header and its cases."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:] if line.strip()]


def _spans(text: str, value: str) -> list[tuple[int, int]]:
    out, i = [], text.find(value)
    while i >= 0:
        out.append((i, i + len(value)))
        i = text.find(value, i + 1)
    return out


def pii_score(cases: list[dict], split: str) -> dict:
    """Recall: labelled values whose every occurrence lies inside a finding of their type;
    precision: scored findings that overlap a labelled value (``unscored`` types aside)."""
    r = {"labels": 0, "tp": 0, "findings": 0, "fp": 0, "errors": []}
    for c in (c for c in cases if c["split"] == split):
        found = [
            f
            for f in DETECTOR.find(c["text"], c["path"])
            if f.kind in PII_SCORED and f.kind not in c.get("unscored", ())
        ]
        labelled = []
        for kind, value in c["pii"]:
            spans = _spans(c["text"], value)
            labelled += spans
            r["labels"] += 1
            if all(
                any(f.kind == kind and f.start <= a and b <= f.end for f in found) for a, b in spans
            ):
                r["tp"] += 1
            else:
                r["errors"].append(("missed", c["kind"], kind, value))
        for f in found:
            r["findings"] += 1
            if not any(f.start < b and a < f.end for a, b in labelled):
                r["fp"] += 1
                r["errors"].append(("false positive", c["kind"], f.kind, f.value))
    return r


def language_score(cases: list[dict], split: str) -> tuple[int, int, list[str]]:
    """(correct, total, errors) of `detect_language` on one split."""
    ok, n, errors = 0, 0, []
    for c in (c for c in cases if c["split"] == split):
        got = detect_language(c["path"], c["text"])[0]
        n += 1
        if got == c["language"]:
            ok += 1
        else:
            errors.append(f"{c['kind']} {c['path']}: expected {c['language']!r}, got {got!r}")
    return ok, n, errors
