"""Scoring of the labelled secrets sets split by kind (secrets_stop44/45.jsonl).

A set is a JSONL file: a header (``tune_kinds``, ``heldout_kinds``) and one case per line
with ``kind``, ``split``, ``path``, ``text`` and the ``secrets`` labelled in it. Recall
counts a labelled value found only when every occurrence of it lies inside a key/password
finding; precision counts the findings that overlap a labelled value.
"""

from __future__ import annotations

import re

from data.pii import PIIDetector

DETECTOR = PIIDetector()


def secret_findings(text: str, path: str) -> list:
    """The detector's key and password findings in ``text`` (a file at ``path``)."""
    return [f for f in DETECTOR.find(text, path) if f.kind in ("key", "password")]


def score(cases: list[dict], split: str) -> dict:
    """Labels, true positives, findings, false positives and the errors of one split."""
    r = {"labels": 0, "tp": 0, "findings": 0, "fp": 0, "errors": []}
    for c in (c for c in cases if c["split"] == split):
        found = secret_findings(c["text"], c["path"])
        occ = {v: [m.span() for m in re.finditer(re.escape(v), c["text"])] for v in c["secrets"]}
        spans = [sp for v in c["secrets"] for sp in occ[v]]
        for v in c["secrets"]:
            r["labels"] += 1
            if all(any(f.start <= a and b <= f.end for f in found) for a, b in occ[v]):
                r["tp"] += 1
            else:
                r["errors"].append(("missed", c["kind"], c["path"], v))
        for f in found:
            r["findings"] += 1
            if not any(f.start < b and a < f.end for a, b in spans):
                r["fp"] += 1
                r["errors"].append(("false positive", c["kind"], c["path"], f.value))
    return r
