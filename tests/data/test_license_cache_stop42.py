"""askalono answers are shared between license texts that differ only in copyright lines.

pyaskalono 0.2 loads its license store on every `identify` call (~0.14 s), so the license
step scored ~7 files/s: every repository's MIT LICENSE was a new text. askalono itself is
the oracle here: each variant's shared answer must equal what askalono says for it.
"""

from __future__ import annotations

import collections

import askalono
import pytest
from conftest import MIT
from hypothesis import given, settings
from hypothesis import strategies as st

import data.license_text as license_text

ASKALONO_IDENTIFY = askalono.identify

BODY = MIT.split("\n", 3)[3]  # MIT less its title and copyright line
HOLDERS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ABC.,-", min_size=1, max_size=30)
PREFIXES = (
    "Copyright (c) {y} {h}",
    "Copyright {y} {h}",
    "  Copyright {y} {h}",
    "COPYRIGHT \u00a9 {y} {h}",
    "Copyright (C) {y}-2026 {h}. All rights reserved.",
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """askalono.identify's calls, with an empty answer cache."""
    seen: list[str] = []

    def counted(text: str):
        seen.append(text)
        return ASKALONO_IDENTIFY(text)

    monkeypatch.setattr(license_text.askalono, "identify", counted)
    monkeypatch.setattr(license_text, "_MATCHES", collections.OrderedDict())
    return seen


def _oracle(text: str) -> tuple[str, float]:
    res = ASKALONO_IDENTIFY(text)  # not counted in `calls`
    return res.name, float(res.score)


@settings(max_examples=6, deadline=None)
@given(
    holders=st.lists(HOLDERS, min_size=1, max_size=3),
    years=st.lists(st.integers(1990, 2026), min_size=1, max_size=3),
    style=st.integers(0, len(PREFIXES) - 1),
)
def test_copyright_variants_share_askalono_s_own_answer(holders, years, style) -> None:
    lines = [PREFIXES[style].format(y=y, h=h) for y, h in zip(years, holders, strict=False)]
    text = "MIT License\n\n" + "\n".join(lines) + "\n\n" + BODY
    license_text._MATCHES.clear()
    assert license_text.askalono_match(MIT) == _oracle(MIT)
    assert license_text.askalono_match(text) == _oracle(text)  # served from MIT's entry


def test_one_askalono_call_per_distinct_text(calls: list[str]) -> None:
    variants = [MIT.replace("2024 Example Authors", who) for who in ("2019 A", "2021 B C")]
    variants.append(MIT.replace("Copyright (c) 2024", "  Copyright 2001-2024"))
    for text in (MIT, *variants):
        assert license_text.askalono_match(text) == ("MIT", pytest.approx(_oracle(MIT)[1]))
    assert len(calls) == 1

    # askalono keeps a "(c) 2019 A" line (the score drops to 0.991): another key.
    short = MIT.replace("Copyright (c) 2024", "(c) 2024")
    assert license_text.askalono_match(short) == _oracle(short) != _oracle(MIT)
    assert len(calls) == 2
    commented = MIT.replace("Copyright (c) 2024", "# Copyright 1990 A\n# Copyright (c) 2024")
    assert license_text.askalono_match(commented) == _oracle(commented)  # 0.991 too
    assert len(calls) == 3

    # Rewrapped, MIT's "COPYRIGHT HOLDERS BE LIABLE" starts a line: still the text's own
    # wording (the same words are the same key; other words another key).
    wrapped = MIT.replace("THE\nAUTHORS OR COPYRIGHT", "THE AUTHORS OR\nCOPYRIGHT")
    assert wrapped != MIT and license_text.askalono_match(wrapped)[0] == "MIT"
    assert len(calls) == 3
    license_text.askalono_match(wrapped.replace("HOLDERS BE", "HOLDERS NEVER BE"))
    assert len(calls) == 4


def test_pixar_named_only_in_a_copyright_line_keeps_its_own_answer(calls: list[str]) -> None:
    # The Pixar rule reads the whole text: a copyright line naming Pixar is another key.
    plain = MIT.replace("Example Authors", "Someone")
    pixar = MIT.replace("Example Authors", "Pixar")
    license_text.askalono_match(plain)
    license_text.askalono_match(pixar)
    assert len(calls) == 2
