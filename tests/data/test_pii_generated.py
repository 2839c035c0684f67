"""PII on the generated evaluation set: tuned part and held-out part, printed separately.

``pii_eval_gen.py`` was written before the rules it scores (rule families x syntaxes x
~40 languages, hard negatives for every rule); its held-out part has syntaxes and value
generators the tuning part lacks. The goals are the issue's: EMAIL 0.95/0.98, IP
0.95/0.98, KEY 0.95/0.95, PASSWORD 0.90/0.90, overall 0.95/0.95 (precision/recall).
"""

from __future__ import annotations

import pytest
from pii_eval_gen import FAMILIES, HARD_NEGATIVES, cases

from data.pii import evaluate

KINDS = frozenset({"email", "ip", "key", "password"})
GOALS = {
    "email": (0.95, 0.98),
    "ip": (0.95, 0.98),
    "key": (0.95, 0.95),
    "password": (0.90, 0.90),
    "overall": (0.95, 0.95),
}


def _score(split: str) -> dict[str, tuple[float, float]]:
    report = evaluate(cases(split), kinds=KINDS)
    errors = report.pop("_errors")
    tp = sum(v["tp"] for v in report.values())
    fp = sum(v["fp"] for v in report.values())
    fn = sum(v["fn"] for v in report.values())
    out = {k: (v["precision"], v["recall"]) for k, v in report.items()}
    out["overall"] = (tp / (tp + fp), tp / (tp + fn))
    print(f"{split}: " + ", ".join(f"{k} P {p:.3f} R {r:.3f}" for k, (p, r) in out.items()))
    for e in errors[:20]:
        print("  ", e)
    return out


def test_generated_set_covers_every_kind_and_language() -> None:
    every = cases("tune") + cases("heldout")
    langs = {c["lang"] for c in every}
    assert len(langs) >= 40, sorted(langs)
    assert {c["pii"][0]["type"] for c in every if c["pii"]} == KINDS
    assert all(p["value"] in c["text"] for c in every for p in c["pii"])
    held = cases("heldout")
    for fam in [*FAMILIES, *HARD_NEGATIVES]:  # every family has held-out syntaxes
        assert any(c["family"] == fam for c in held), fam
    assert not {c["text"] for c in held} & {c["text"] for c in cases("tune")}


@pytest.mark.parametrize("split", ["tune", "heldout"])
def test_generated_precision_recall(split: str) -> None:
    scores = _score(split)
    if split == "tune":
        return  # printed for comparison; the goals apply to the held-out part
    for kind, (p_goal, r_goal) in GOALS.items():
        p, r = scores[kind]
        assert p >= p_goal and r >= r_goal, (kind, p, r)
