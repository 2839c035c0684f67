"""PII: precision/recall on the labelled set; consistent replacement; hashed log."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from data.pii import PIIDetector, evaluate, luhn_ok

CASES = [json.loads(x) for x in Path(__file__).with_name("pii_labelled.jsonl").read_text()
         .splitlines()]


def test_labelled_set_is_large_enough() -> None:
    positives = [p for c in CASES for p in c["pii"]]
    negatives = [c for c in CASES if not c["pii"]]
    assert len(positives) >= 200 and len(negatives) >= 200
    assert {p["type"] for p in positives} >= {"email", "ip", "key", "password", "credit_card",
                                              "phone"}


def test_precision_recall_targets() -> None:
    report = evaluate(CASES)
    errors = report.pop("_errors")
    print("PII precision/recall:", {k: (round(v["precision"], 3), round(v["recall"], 3))
                                    for k, v in report.items()})
    for kind in ("email", "ip", "key"):
        assert report[kind]["recall"] >= 0.95, (kind, errors)
        assert report[kind]["precision"] >= 0.90, (kind, errors)
    for kind in ("password", "credit_card", "phone"):
        assert report[kind]["recall"] >= 0.8 and report[kind]["precision"] >= 0.8, (kind, errors)


def test_redaction_consistent_and_log_has_no_values() -> None:
    text = ('a = "93.184.216.34"\nb = "93.184.216.34"\nc = "151.101.1.69"\n'
            'v6 = "2a03:2880:f12f:83:face:b00c::25de"\n'
            'mail = "jane.roe@acme-corp.io"  # and again jane.roe@acme-corp.io\n'
            'KEY = "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"\npassword = "Tr0ub4dor&3"\n')
    out, log = PIIDetector().redact(text)
    assert "93.184.216.34" not in out and "jane.roe" not in out and "ghp_" not in out
    lines = out.splitlines()
    ip_a = lines[0].split('"')[1]
    assert ip_a == lines[1].split('"')[1] != lines[2].split('"')[1]
    assert ip_a.startswith("10.")
    assert lines[3].split('"')[1].startswith("fd00:")
    assert out.count("<EMAIL>") == 2 and "<KEY>" in out and "<PASSWORD>" in out
    assert {e["type"] for e in log} == {"ip", "email", "key", "password"}
    blob = json.dumps(log)
    for secret in ("93.184.216.34", "jane.roe@acme-corp.io", "Tr0ub4dor&3"):
        assert secret not in blob
        assert hashlib.sha256(secret.encode()).hexdigest()[:16] in blob
    first = log[0]
    assert text[first["start"]:first["end"]] == "93.184.216.34"


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
