"""PII on a held-out set of real text (not used to tune the detector), and scan equivalence.

``pii_heldout.jsonl`` holds lines and PEM blocks read from installed packages and CPython's
test suite, labelled by hand for emails, IP addresses and keys; its first line states the
labelling rules. The scan tests check that the prefilters added for speed never change
what is found: each fast scan agrees with its reference form.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from data import filters
from data.pii import _known_key_patterns, _provider_patterns, analyse_key_pattern, evaluate

LINES = Path(__file__).with_name("pii_heldout.jsonl").read_text().splitlines()
RULES = json.loads(LINES[0])["_rules"]
CASES = [json.loads(x) for x in LINES[1:]]
KINDS = frozenset({"email", "ip", "key"})


def test_heldout_set_is_large_real_and_documented() -> None:
    positives = [p for c in CASES for p in c["pii"]]
    negatives = [c for c in CASES if not c["pii"]]
    assert len(positives) >= 200 and len(negatives) >= 200
    assert {p["type"] for p in positives} == KINDS
    assert all(c["source"] for c in CASES) and len(RULES) >= 5
    for case in CASES:  # every labelled value occurs in its text
        assert all(p["value"] in case["text"] for p in case["pii"]), case


def test_heldout_precision_recall_targets() -> None:
    report = evaluate(CASES, kinds=KINDS)
    errors = report.pop("_errors")
    print(
        "held-out PII precision/recall:",
        {k: (round(v["precision"], 3), round(v["recall"], 3)) for k, v in report.items()},
    )
    for kind in sorted(KINDS):
        assert report[kind]["recall"] >= 0.95, (kind, errors)
        assert report[kind]["precision"] >= 0.90, (kind, errors)


def _reference_runs(text: str) -> tuple[int, int]:
    longest = total = 0
    for i, rx in enumerate(map(re.compile, (filters.BASE64, filters.HEX, filters.UNICODE))):
        for m in rx.finditer(text):
            s = m.group(0)
            if i == 0 and not (any(c.isdigit() for c in s) and any(c.isalpha() for c in s)):
                continue
            total += len(s)
            longest = max(longest, len(s))
    return longest, total


def test_fast_filter_scans_equal_reference_forms() -> None:
    rng = random.Random(0)
    atoms = [
        "0x",
        "\\x",
        "\\u",
        "ab",
        "0f",
        "FF",
        ", ",
        ",",
        " ",
        "\n",
        "\t",
        "z",
        "g1",
        "é",
        "\u00a0",
        "=",
        "+",
        "/",
        "Q",
        "9",
        "x",
        "_",
        "ß",
        "\u2003",
        "Ab3",
        "ſ",
    ]
    alpha = re.compile(r"[^\W\d_]+")
    for _ in range(3000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 100)))
        if rng.random() < 0.3:
            text += ", ".join(f"0x{rng.randint(0, 255):02x}" for _ in range(rng.randint(5, 12)))
        if rng.random() < 0.3:
            text = (
                "".join(f"\\u{rng.randint(0, 65535):04x}" for _ in range(rng.randint(6, 10))) + text
            )
        if rng.random() < 0.2:
            text += "".join(rng.choice("ab0123456789XYZ+/=\n") for _ in range(rng.randint(50, 90)))
        assert filters.encoded_runs(text) == _reference_runs(text), repr(text)
        assert filters.alpha_count(text) == sum(map(len, alpha.findall(text))), repr(text)


def test_key_gates_are_necessary_conditions() -> None:
    every = _known_key_patterns() + _provider_patterns()
    gated = [kp for kp in every if kp.literals or kp.gate]
    assert len(gated) >= len(every) - 2  # nearly every key pattern gets a cheap gate
    samples = [
        "AKIAABCDEFGHIJKLMNOP",
        "sk_live_" + "a1" * 12,
        "ghp_" + "A1b2" * 9,
        "glpat-" + "x" * 20,
        "AC" + "0a" * 16,
        "SK" + "1b" * 16,
        "M" + "a" * 23 + "." + "b" * 6 + "." + "c" * 27,
        "1234567890:" + "A" * 35,
        "Aws_Key = 'abcdefghijabcdefghijabcdefghijabcdefghij'",
        "xoxb-123-abc",
        'AwS token: "' + "Ab1/" * 10 + '"',
        "eyJhbGciOi.eyJzdWIiOi.sig",
        "https://HOOKS.slack.com/services/TABC/BDEF/xyz",
        "abcdef0123456789" * 2 + "-us12",
        "s." + "Ab3" * 8,
        "whsec_" + "Z9" * 16,
        "github_pat_" + "a" * 82,
        "shpat_" + "0f" * 16,
        "hvs." + "x" * 95,
        "rk_prod_" + "q1" * 8,
    ]
    for text in samples:
        for kp in every:
            if kp.pattern.search(text):
                assert kp.may_match(text, text.casefold()), (kp.pattern.pattern, text)
    # A back-reference keeps the pattern's tail from becoming a gate regex of its own.
    back = analyse_key_pattern(re.compile(r"(\d+):\1"))
    assert back.gate is None and back.may_match("12:12", "12:12")
    tail = analyse_key_pattern(re.compile(r"\d{8,10}:[0-9A-Za-z_-]{35}"))
    assert tail.gate is not None and not tail.may_match("a: b", "a: b")
