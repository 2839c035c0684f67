"""Scoring of the labelled license sets split by kind (license_stop44/45/45b.jsonl).

A set is a JSONL file: a header (groups, tune and held-out kinds) and one small repository
per line (``files``, the ``target`` file, the ``expected`` license type and ``first_id``).
File texts may hold ``@@ID|...@@`` markers that each set's ``expand`` fills in. askalono's
answers are replayed from a recorded JSON so the sets score fast and without askalono.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from data import license_text
from data.config import LicenseConfig
from data.license import LicenseStep
from data.records import FileRecord

KEEP = ("permissive", "no_license")  # what a build keeps; "excluded" is anything else
Outcome = tuple[str, tuple[str, ...]]


def outcome(case: dict, expand: Callable[[str], str]) -> Outcome:
    """(license type, ids) the license step gives the case's target file."""
    files = {p: expand(t) for p, t in case["files"].items()}
    recs = [FileRecord(repo="r", path=p, content=t, size=len(t)) for p, t in sorted(files.items())]
    out = {r.path: r for r in LicenseStep(LicenseConfig()).run(iter(recs))}
    rec = out[case["target"]]
    return rec.license_type, tuple(rec.license_ids)


def correct(case: dict, got: Outcome) -> bool:
    """Whether ``got`` is the case's expected type (and first id, where labelled)."""
    kind, ids = got
    want = case["expected"]
    ok = kind not in KEEP if want == "excluded" else kind == want
    return ok and (not case["first_id"] or (bool(ids) and ids[0] == case["first_id"]))


def score(cases: list[dict], split: str, expand: Callable[[str], str]) -> tuple[int, int, list]:
    """Hits, cases and the misses (described) of one split."""
    hits, misses = 0, []
    chosen = [c for c in cases if c["split"] == split]
    for c in chosen:
        got = outcome(c, expand)
        if correct(c, got):
            hits += 1
        else:
            misses.append(
                f"{c['kind']} {c['target']}: want {c['expected']} {c['first_id']} got {got}"
            )
    return hits, len(chosen), misses


def permissive_pr(
    cases: list[dict], split: str, expand: Callable[[str], str]
) -> tuple[float, float]:
    """Precision and recall of the "permissive" answer on one split."""
    tp = fp = fn = 0
    for c in cases:
        if c["split"] != split:
            continue
        got = outcome(c, expand)[0] == "permissive"
        gold = c["expected"] == "permissive"
        tp += got and gold
        fp += got and not gold
        fn += gold and not got
    return (tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0)


@contextlib.contextmanager
def recorded_askalono(path: Path) -> Iterator[None]:
    """askalono's recorded answers in the license step's cache, restored afterwards."""
    saved = dict(license_text._MATCHES)
    for key, (name, value) in json.loads(path.read_text()).items():
        license_text._MATCHES[key] = (name, value)
    try:
        yield
    finally:
        license_text._MATCHES.clear()
        license_text._MATCHES.update(saved)
