"""Secret syntaxes listed as missed after stop 35's held-out set: Kotlin ``"k" to "v"``
pairs, TOML/INI ``bearer = "..."``, PowerShell ``ConvertTo-SecureString "x"
-AsPlainText``. Each with look-alikes that must stay."""

from __future__ import annotations

import pytest

from data.pii import redact_text

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI5ODc2NSJ9.Qx7Lm2pZ9vRt4WbN8cKd"

POSITIVES = [
    (
        "Kotlin",
        "Config.kt",
        'mapOf("user" to "admin", "password" to "Tr0ub4dor&3x")',
        "Tr0ub4dor&3x",
    ),
    (
        "Kotlin",
        "Env.kt",
        'val env = mapOf("API_TOKEN" to "Vq83LmZ92xKp47RtBn6W")',
        "Vq83LmZ92xKp47RtBn6W",
    ),
    ("TOML", "config.toml", f'[auth]\nbearer = "{JWT}"\n', JWT),
    ("INI", "client.ini", f"[api]\nbearer_token={JWT}\n", JWT),
    (
        "PowerShell",
        "deploy.ps1",
        '$pw = ConvertTo-SecureString "Qw3rty!9Zx" -AsPlainText -Force\n',
        "Qw3rty!9Zx",
    ),
    (
        "PowerShell",
        "deploy.ps1",
        "$s = ConvertTo-SecureString -String 'Lk8@vBn2Mq' -AsPlainText -Force\n",
        "Lk8@vBn2Mq",
    ),
]
NEGATIVES = [
    ("Kotlin", "Modes.kt", 'val m = mapOf("mode" to "fast", "retries" to "3")'),
    ("Kotlin", "Auth.kt", 'val creds = mapOf("password" to passwordFromVault)'),
    ("YAML", "openapi.yaml", "bearerAuth:\n  type: http\n  scheme: bearer\n  bearerFormat: JWT\n"),
    (
        "PowerShell",
        "deploy.ps1",
        "$pw = ConvertTo-SecureString $env:DB_PASSWORD -AsPlainText -Force\n",
    ),
    ("Markdown", "README.md", "Use `ConvertTo-SecureString` with `-AsPlainText` for testing.\n"),
]


@pytest.mark.parametrize(("lang", "path", "text", "value"), POSITIVES)
def test_secret_is_redacted(lang, path, text, value):
    assert value not in redact_text(text, lang=lang, path=path)


@pytest.mark.parametrize(("lang", "path", "text"), NEGATIVES)
def test_look_alike_is_left_alone(lang, path, text):
    assert redact_text(text, lang=lang, path=path) == text
