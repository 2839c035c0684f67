"""PII: precision/recall on the labelled set; consistent replacement; hashed log."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path

from data.config import PII_TYPES, PIIConfig
from data.pii import PIIDetector, evaluate, luhn_ok

CASES = [
    json.loads(x) for x in Path(__file__).with_name("pii_labelled.jsonl").read_text().splitlines()
]


def test_labelled_set_is_large_enough() -> None:
    positives = [p for c in CASES for p in c["pii"]]
    negatives = [c for c in CASES if not c["pii"]]
    assert len(positives) >= 200 and len(negatives) >= 200
    assert {p["type"] for p in positives} >= {
        "email",
        "ip",
        "key",
        "password",
        "credit_card",
        "phone",
    }


def test_precision_recall_targets() -> None:
    report = evaluate(CASES, PIIDetector(PIIConfig(types=PII_TYPES)))  # phones opted in
    errors = report.pop("_errors")
    print(
        "PII precision/recall:",
        {k: (round(v["precision"], 3), round(v["recall"], 3)) for k, v in report.items()},
    )
    for kind in ("email", "ip", "key"):
        assert report[kind]["recall"] >= 0.95, (kind, errors)
        assert report[kind]["precision"] >= 0.90, (kind, errors)
    for kind in ("password", "credit_card", "phone"):
        assert report[kind]["recall"] >= 0.8 and report[kind]["precision"] >= 0.8, (kind, errors)


def test_redaction_consistent_and_log_has_no_values() -> None:
    text = (
        'a = "93.184.216.34"\nb = "93.184.216.34"\nc = "151.101.1.69"\n'
        'v6 = "2a03:2880:f12f:83:face:b00c::25de"\n'
        'mail = "jane.roe@acme-corp.io"  # and again jane.roe@acme-corp.io\n'
        'KEY = "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"\npassword = "Tr0ub4dor&3"\n'
    )
    key = b"k" * 32
    out, log = PIIDetector().redact(text, secret=key)
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
        assert hashlib.sha256(secret.encode()).hexdigest()[:16] not in blob  # no bare hash
        assert hmac.new(key, secret.encode(), hashlib.sha256).hexdigest() in blob
    # Another build's key gives other digests: the log cannot be joined across builds.
    other = {e["hmac"] for e in PIIDetector().redact(text, secret=b"x" * 32)[1]}
    assert other.isdisjoint(e["hmac"] for e in log)
    first = log[0]
    assert text[first["start"] : first["end"]] == "93.184.216.34"


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")


def test_redact_command_matches_the_stage_and_reads_env() -> None:
    text = (
        "DB_PASSWORD=Maple42!river\nmail = 'jane.roe@acme-corp.io'\n"
        '"integrity": "sha512-ZGVhZGJlZWZkZWFkYmVlZmRlYWRiZWVmZGVhZGJlZWY="\n'
    )
    cmd = [sys.executable, "-m", "data", "redact"]
    out = subprocess.run(cmd, input=text, capture_output=True, text=True, check=True).stdout
    assert out == PIIDetector().redact(text)[0]
    assert "DB_PASSWORD=<PASSWORD>" in out and "<EMAIL>" in out  # the label survives
    env = dict(os.environ, PII_PATH="web/package-lock.json", PII_LANG="JSON")
    locked = subprocess.run(
        cmd, input=text, capture_output=True, text=True, check=True, env=env
    ).stdout
    assert locked == PIIDetector().redact(text, path="web/package-lock.json")[0]
    assert "sha512-ZGVh" in locked


def test_import_pii_does_not_load_the_pipeline() -> None:
    code = (
        "import sys, data.pii; bad = [m for m in ('data.pipeline', 'pyarrow', 'tokenizers',"
        " 'jaxcore') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"


def test_phones_are_off_by_default() -> None:
    text = "c            299 792 458          m s^-1\ncall (555) 234-5678 or +1 415 555 2671\n"
    assert all(f.kind != "phone" for f in PIIDetector().find(text))
    assert any(f.kind == "phone" for f in PIIDetector(PIIConfig(types=PII_TYPES)).find(text))
