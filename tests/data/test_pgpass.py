"""PostgreSQL password files (``.pgpass``, ``pgpass.conf``): ``host:port:db:user:password``
lines carry the password in the fifth field with no keyword near it, so only the file's
name tells the detector to look there (they were kept verbatim)."""

from __future__ import annotations

import pytest

from data.pii import redact_text

PGPASS = (
    "# hostname:port:database:username:password\n"
    "db.internal:5432:orders:app_user:Wq7!pLm2#zR9\n"
    "*:*:*:backup:pa\\:ss\\\\word-44\n"
    "\n"
    "localhost:5433:*:postgres:hunter2hunter2\n"
)


@pytest.mark.parametrize("path", ["home/ci/.pgpass", "AppData/postgresql/pgpass.conf"])
def test_passwords_in_a_pgpass_file_are_redacted(path):
    out = redact_text(PGPASS, path=path)
    assert "Wq7!pLm2#zR9" not in out and "hunter2hunter2" not in out and "word-44" not in out
    assert "db.internal:5432:orders:app_user:<PASSWORD>\n" in out
    assert "*:*:*:backup:<PASSWORD>\n" in out  # escaped ':' and '\' stay inside the field
    assert out.startswith("# hostname:port:database:username:password\n")  # comment kept


def test_colon_separated_text_elsewhere_is_left_alone():
    text = "a:b:c:d:e\nrow:1:2:3:value\n"
    assert redact_text(text, path="data/table.txt") == text
