"""Stop 43: secrets in syntaxes no earlier set had (``tests/data/secrets_stop43.jsonl``).

The set (114 cases: 87 labelled values, 34 hard negatives) was written before the detector
was run on it and split by kind, 13 kinds each, before any output was seen (the kinds are
in the file's header line). Measured before any change: tune recall 38/42, precision 38/38;
**held-out recall 42/45, precision 42/43**. Fixed from tune misses only: a flag's value as
the next item of an argv list (``["redis-server", "--requirepass", "x"]``), a field named
just ``Key`` holding a random token (``stripe.Client{Key: "..."}``), unattend.xml's
``<Password><Value>x</Value>``, ``sk-proj-`` keys without OpenAI's ``T3BlbkFJ`` marker.
After: tune 42/42, 42/42; held-out (never looked at while fixing) unchanged, 42/45, 42/43.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.pii import PIIDetector

SET = Path(__file__).with_name("secrets_stop43.jsonl")


def _cases() -> tuple[dict, list[dict]]:
    lines = SET.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:] if line.strip()]


HEADER, CASES = _cases()


def _secret_findings(text: str, path: str) -> list:
    return [f for f in PIIDetector().find(text, path) if f.kind in ("key", "password")]


def score(split: str) -> dict:
    """Recall: labelled values inside a key/password finding; precision: such findings
    that overlap a labelled value (a finding on a negative counts against it)."""
    r = {"labels": 0, "tp": 0, "findings": 0, "fp": 0, "errors": []}
    for c in (c for c in CASES if c["split"] == split):
        found = _secret_findings(c["text"], c["path"])
        spans = [(c["text"].index(v), c["text"].index(v) + len(v)) for v in c["secrets"]]
        for (a, b), v in zip(spans, c["secrets"], strict=True):
            r["labels"] += 1
            if any(f.start <= a and b <= f.end for f in found):
                r["tp"] += 1
            else:
                r["errors"].append(("missed", c["kind"], c["path"], v))
        for f in found:
            r["findings"] += 1
            if not any(f.start < b and a < f.end for a, b in spans):
                r["fp"] += 1
                r["errors"].append(("false positive", c["kind"], c["path"], f.value))
    return r


def test_split_is_by_kind_and_recorded() -> None:
    tune, held = set(HEADER["tune_kinds"]), set(HEADER["heldout_kinds"])
    assert tune and held and not tune & held
    for c in CASES:
        assert c["kind"] in (tune if c["split"] == "tune" else held)


def test_tune_floor() -> None:
    r = score("tune")
    assert (r["labels"], r["tp"], r["findings"], r["fp"]) == (42, 42, 42, 0), r["errors"]


def test_heldout_floor() -> None:
    # Left missed (not tuned on): a Codecov token that is a bare UUID, a password fed by a
    # here-string to --passwd-on-stdin, a Discord webhook URL's token; the false positive
    # is a test fixture's password="wrong".
    r = score("heldout")
    assert r["labels"] == 45 and r["tp"] >= 42 and r["fp"] <= 1, r["errors"]


FIXED = [
    (
        "docker-compose.yml",
        '    command: ["redis-server", "--requirepass", "Hn4kW9zQ2pLx"]\n',
        "Hn4kW9zQ2pLx",
    ),
    (
        "run.py",
        'subprocess.run(["mysql", "-u", "root", "--password", "Wd7Lq3Zx9Km2"])\n',
        "Wd7Lq3Zx9Km2",
    ),
    (
        "client.go",
        'c := stripe.Client{Key: "Qz8Wm3Lk6Xr2Vn9Bt5Hp4Jc"}\n',
        "Qz8Wm3Lk6Xr2Vn9Bt5Hp4Jc",
    ),
    (
        "unattend.xml",
        "<Password>\n  <Value>Pq7Wz3Lm9Xk5</Value>\n  <PlainText>true</PlainText>\n</Password>\n",
        "Pq7Wz3Lm9Xk5",
    ),
    (
        "unattend.xml",
        "<AdministratorPassword>\n  <PlainText>false</PlainText>\n"
        "  <Value>UABhAHMAcwB3AG8AcgBkAA==</Value>\n",
        "UABhAHMAcwB3AG8AcgBkAA==",
    ),
    (
        "nb.py",
        "# sk-proj-Qw8Lz3Xm6Kr2Tn9Vb5Hp4Jc7Yd1Fg0As2Eu6Ri3Op8Kl_Zx-Cv7Bn4Mq\n",
        "sk-proj-Qw8Lz3Xm6Kr2Tn9Vb5Hp4Jc7Yd1Fg0As2Eu6Ri3Op8Kl_Zx-Cv7Bn4Mq",
    ),
]
# Tune-split cases that the changes fixed: each must stay detected.
FIXED += [
    (c["path"], c["text"], v)
    for c in CASES
    if c["split"] == "tune"
    for v in c["secrets"]
    if v
    in (
        "Hn4kW9zQ2pLx",
        "Qz8Wm3Lk6Xr2Vn9Bt5Hp4Jc",
        "Pq7Wz3Lm9Xk5",
        "sk-proj-Qw8Lz3Xm6Kr2Tn9Vb5Hp4Jc7Yd1Fg0As2Eu6Ri3Op8Kl_Zx-Cv7Bn4Mq",
    )
]


@pytest.mark.parametrize(("path", "text", "value"), FIXED)
def test_fixed_kinds_found(path: str, text: str, value: str) -> None:
    assert value in [f.value for f in _secret_findings(text, path)]


LOOK_ALIKES = [
    ("compose.yml", 'command: ["redis-server", "--requirepass", "${REDIS_PASSWORD}"]\n'),
    ("run.py", 'args = ["--token", "$TOKEN", "--password-file", "/etc/pw"]\n'),
    ("cache.js", 'const entry = {key: "user-profile-v2-cache-9"};\n'),
    ("cache.go", 'item := Item{Key: "3f9a7c1e5b2d8046a1c3e5f7b9d0a2c4"}\n'),
    ("i18n.ts", 'const t = {key: "SettingsPageTitleLabel"};\n'),
    ("unattend.xml", "<Password>\n  <Value>*SENSITIVE*DATA*DELETED*</Value>\n</Password>\n"),
    ("unattend.xml", "<Timeout>\n  <Value>30000</Value>\n</Timeout>\n"),
    (
        "README.md",
        'export OPENAI_API_KEY="sk-proj-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"\n',
    ),
]


@pytest.mark.parametrize(("path", "text"), LOOK_ALIKES)
def test_look_alikes_stay(path: str, text: str) -> None:
    assert _secret_findings(text, path) == []
