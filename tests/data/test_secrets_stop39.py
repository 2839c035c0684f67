"""Stop 39: secrets in file kinds no earlier set had (tests/data/labels_stop39.py).

Measured before any change (the held-out families never looked at while fixing the tuning
ones): tuning recall 21/26, precision 21/21; **held-out recall 22/24, precision 22/23**.
The tuning misses were fixed first (a 20-hex Pusher secret under a ``*_SECRET`` name,
WordPress salts holding spaces, backticks or a ``*_SALT`` name, a PuTTY ``.ppk``'s private
lines, ``analyticsKey``-style names); then the three held-out ones (New Relic's ``NRAK-``
keys, Rails' ``config/master.key``, the ``${NAME:?message}`` false positive), so the
held-out part now measures them seen. On 88 MB of installed packages (a corpus of
negatives) the detector's findings were the same 89 before and after.
"""

from __future__ import annotations

import labels_stop39 as labels
import pytest

from data.pii import PIIDetector


def test_tuning_and_held_out_figures() -> None:
    tune = labels.score(labels.split(labels.T))
    held = labels.score(labels.split(labels.H))
    assert tune["labels"] == 26 and tune["tp"] == 26 and tune["fp"] == 0, tune["errors"]
    assert held["labels"] == 24 and held["tp"] == 24 and held["fp"] == 0, held["errors"]


def _found(text: str, path: str = "x") -> list[str]:
    return [text[f.start : f.end] for f in PIIDetector().find(text, path)]


SALT = "E:/mY8$l1ec,1a{_[+W/q)<Cp*4`z%D|Eq*l}!Q$JB#y swvUPKwfpB-iCgn+on6"
POSITIVES = [
    ("pusher secret", "PUSHER_APP_SECRET=7c1f0a9e3b5d2c4e6f80\n", "7c1f0a9e3b5d2c4e6f80"),
    ("wp salt with a space and a backtick", f"define( 'AUTH_KEY', '{SALT}' );\n", SALT),
    ("wp nonce salt", f"define('NONCE_SALT', '{SALT}');\n", SALT),
    ("swift key name", 'static let analyticsKey = "Y4JeMggqLBqjKuMtZCxBPJiUQ6q3"\n', None),
    ("new relic", 'key = "NRAK-UYSJSMLN6V9KPRHIL7WIW72PT4R"\n', "NRAK-UYSJSMLN6V9KPRHIL7WIW72PT4R"),
]


@pytest.mark.parametrize("what,text,value", POSITIVES, ids=[p[0] for p in POSITIVES])
def test_kinds_found(what: str, text: str, value: str | None) -> None:
    value = value or text.split('"')[1]
    assert value in _found(text)


def test_putty_private_lines_are_a_key_and_the_public_lines_are_not() -> None:
    text = (
        "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: ci\n"
        "Public-Lines: 1\nAAAAC3NzaC1lZDI1NTE5AAAAIJ3m\n"
        "Private-Lines: 2\nAAAAIHb3RzUjG8hQ4pWfz2Kx\nVk7Lq9mT1cYbN0aQ==\n"
        "Private-MAC: 9f0e\n"
    )
    assert _found(text, "deploy.ppk") == ["AAAAIHb3RzUjG8hQ4pWfz2Kx\nVk7Lq9mT1cYbN0aQ=="]


def test_rails_master_key_file() -> None:
    key = "aff3cd37c9baf269253571a8914387f7"
    assert _found(key + "\n", "app/config/master.key") == [key]
    assert _found(key + "\n", "config/credentials/production.key") == [key]
    assert _found(key + "\n", "notes/checksum.txt") == []  # 32 hex alone: an id elsewhere


NEGATIVES = [
    "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it in .env}\n",
    "DB_PASSWORD=${DB_PASSWORD:+configured}\n",
    'salt = "autotune-best-config-v2"\n',  # a namespace, not a random salt
    'summary_activation: Pass `"tanh"` for a tanh activation\n',  # a Markdown code span
    'partitionKey = "tenantIdAndRegion2024"\n',
    "self._key: _BoundaryOrderKey = (1, 2)\n",
    '"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="\n',
    'primaryKey = "order_id_v2"\n',
    'publicKey = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE7u3M9a"\n',
    'cacheKey = "v2:user:profile"\n',
    'message = "this is a long sentence with spaces, words and commas in it"\n',
]


@pytest.mark.parametrize("text", NEGATIVES)
def test_look_alikes_are_left_alone(text: str) -> None:
    assert _found(text) == []


def test_a_shell_default_is_still_a_value() -> None:
    found = _found("DB_PASSWORD=${DB_PASSWORD:-Kq7v#Lm2Zp9x}\n")
    assert len(found) == 1 and "Kq7v#Lm2Zp9x" in found[0]  # redacted with its ":-"'s dash
