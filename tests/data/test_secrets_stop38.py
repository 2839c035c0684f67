"""Stop 38: secrets in realistic files (tests/data/labels_stop38.py), split by kind family.

The floors are the figures measured on the held-out families, which no change was tuned
on (recall 41/46, precision 41/41; asserted at one case less). The specific tests are the
kinds the tuning families showed missing: kubeadm bootstrap tokens (``abcdef.0123...``
was read as a dotted name), DSNs whose host is a template (``...:pw@{host}``), YAML block
scalars (``password: |``), and Twilio auth tokens next to their account SID.

Two held-out misses were fixed after the held-out figure above was taken (so the
held-out part no longer measures them unseen): ``.netrc`` with one token pair a line, and
docker's one-word ``identitytoken``; they are the last positives below."""

from __future__ import annotations

import labels_stop38 as labels
import pytest

from data.pii import PIIDetector, redact_text


def test_held_out_floors() -> None:
    r = labels.score(labels.split(labels.H))
    assert r["labels"] == 46 and r["tp"] >= 40, r["errors"]
    assert r["fp"] <= 1, r["errors"]


def test_tuning_figures() -> None:
    r = labels.score(labels.split(labels.T))
    assert r["labels"] == 70 and r["tp"] >= 69 and r["fp"] <= 1, r["errors"]


def test_split_is_by_family() -> None:
    tune = {c.family for c in labels.split(labels.T)}
    held = {c.family for c in labels.split(labels.H)}
    assert not tune & held and len(tune) == 14 and len(held) == 13


BOOT = "k3x9qe.7hd0vz2m4np8wq1c"
POSITIVES = [
    ("kubeconfig", f"users:\n- name: ci\n  user:\n    token: {BOOT}\n", BOOT),
    ("bootstrap env", f"KUBEADM_TOKEN={BOOT}\n", BOOT),
    (
        "f-string DSN",
        'url = f"mysql+pymysql://report:Kq7v#Lm2Zp9x@{host}:3306/reports"\n',
        "Kq7v#Lm2Zp9x",
    ),
    ("shell DSN", 'DB="postgres://app:Rt5n-Vb8Qw2z@${DB_HOST}/app"\n', "Rt5n-Vb8Qw2z"),
    ("yaml |", "auth:\n  password: |\n    Xw8!pQ2rLm5v\n  user: app\n", "Xw8!pQ2rLm5v"),
    (
        "yaml >",
        "worker:\n  apiToken: >\n    Nq1pCbaBiaxCptxoOST50982ZgMo\n",
        "Nq1pCbaBiaxCptxoOST50982ZgMo",
    ),
    (
        "yaml >- list item",
        "- name: api\n  secret_key: >-\n    DZUn9J2JICZoBQFECrrsC6DSHA/URT3Py3BP\n",
        "DZUn9J2JICZoBQFECrrsC6DSHA/URT3Py3BP",
    ),
    (
        "twilio ruby",
        "client = Twilio::REST::Client.new('AC2a9f5e0c8b7d6e5f4a3b2c1d0e9f8a7b', "
        "'9c1e7f3a5b2d4c6e8f0a1b3c5d7e9f2a')\n",
        "9c1e7f3a5b2d4c6e8f0a1b3c5d7e9f2a",
    ),
    (
        "twilio node",
        'const client = require("twilio")("AC2a9f5e0c8b7d6e5f4a3b2c1d0e9f8a7b", '
        '"4f8e2d6c0b9a7e5d3c1b2a4f6e8d0c9b");\n',
        "4f8e2d6c0b9a7e5d3c1b2a4f6e8d0c9b",
    ),
    (
        "netrc one pair a line",
        "machine api.heroku.com\n  login jane@fernhill.io\n  password 0a1b2c3d-4e5f\n",
        "0a1b2c3d-4e5f",
    ),
    ("netrc default", "default\nlogin anonymous\npassword Qx7!vR2pLm9w\n", "Qx7!vR2pLm9w"),
    (
        "docker identitytoken",
        '{"auths": {"r.io": {"identitytoken": "9f8e7d6c5b4a39281706f5e4d3c2b1a0"}}}\n',
        "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    ),
]
NEGATIVES = [
    ("dotted name", "auth:\n  token: settings.api_token\n  password: config.db.password\n"),
    ("f-string all refs", 'url = f"postgres://{user}:{password}@{host}/db"\n'),
    ("shell all refs", 'REDIS_URL="redis://:${REDIS_PASSWORD}@${REDIS_HOST}:6379"\n'),
    ("yaml prose", "password_help: |\n  Use at least twelve characters.\n"),
    ("yaml prose 2", "token: >\n  Paste the token shown on the settings page\n  here.\n"),
    ("yaml ref", "db:\n  password: |\n    ${DB_PASSWORD}\n"),
    ("yaml not a secret name", "description: |\n  Kq7vLm2Zp9xRt5nVb8Qw2zXw8pQ2rLm5v\n"),
    ("login prose", "The login form\npassword field is below.\n"),
    ("no netrc entry", "the default\nlogin screen\npassword field\n"),
    ("md5 without sid", 'ETAG = "9c1e7f3a5b2d4c6e8f0a1b3c5d7e9f2a"\n'),
]


@pytest.mark.parametrize(("what", "text", "value"), POSITIVES, ids=[p[0] for p in POSITIVES])
def test_fixed_kinds_are_redacted(what: str, text: str, value: str) -> None:
    out = redact_text(text)
    assert value not in out, out


@pytest.mark.parametrize(("what", "text"), NEGATIVES, ids=[n[0] for n in NEGATIVES])
def test_look_alikes_stay(what: str, text: str) -> None:
    assert redact_text(text) == text


def test_yaml_block_span_covers_wrapped_value() -> None:
    """A value wrapped over two block lines is one finding spanning both lines."""
    text = (
        "tls:\n  private_key: |\n    Qm9vdHN0cmFwOkt5N3ZMbTJa\n    cDl4UnQ1blZiOFF3MnpYdzhw\n"
        "next: 1\n"
    )
    (f,) = PIIDetector().find(text)
    assert text[f.start : f.end] == "Qm9vdHN0cmFwOkt5N3ZMbTJa\n    cDl4UnQ1blZiOFF3MnpYdzhw"
    assert f.value == "Qm9vdHN0cmFwOkt5N3ZMbTJacDl4UnQ1blZiOFF3MnpYdzhw"
