"""Stop 44: license detection on repository kinds no earlier set had.

``tests/data/license_stop44.jsonl``: 109 repositories (a dict of path -> text, the
target file, the license type it should get and, where it matters, its first SPDX id),
written by hand before the license step was run on them, in 18 kinds: license texts
re-wrapped at 40/60/100 columns, indented or CRLF; Markdown (headings, bullets, bold);
HTML pages (``<p>``, ``<ol>``, ``<br>``); a license in ``docs/`` only; COPYING +
COPYING.LESSER/.LIB pairs; two licenses in one file (with and without a "dual-licensed
... at your option" preamble) and LICENSE-MIT + LICENSE-APACHE; SPDX tags and GNU/Apache
notices in Lisp ``;;``, Haskell/SQL ``--``, Lua ``--[[ ]]``, Fortran ``!``, VB ``'``,
MATLAB ``%``, batch ``REM``; SPDX forms ``GPL-2.0+``, ``LGPL-2.1``, parentheses,
``WITH``, lower case; gemspec, .cabal, hpack, R DESCRIPTION, pom.xml, .nuspec and mix.exs
license fields; CC licenses for docs (CC-BY-4.0 permissive, CC-BY-SA / CC-BY-NC not);
BSL-1.0, NCSA, UPL-1.0, PostgreSQL, MIT-0, Artistic-2.0 texts; short header notices
("Released under the MIT license", ``| MIT License |``); proprietary notices and
``LicenseRef-`` tags; "see LICENSE" pointers with no license file; negatives (a page
discussing licenses, a license checker's source, a changelog, dependency lists and
third-party license files beside the project's own). ``@@ID|t1|t2@@`` in a file stands for
identify's vendored text of ID after the transforms ``TRANSFORMS`` names.

The split is BY KIND, fixed before any detector output was seen: the kinds grouped
(mostly permissive, mostly non-permissive, negatives/no-license), each group's sorted
kind names shuffled with ``random.Random(44)``, the first half (rounded up) ``tune``, the
rest ``heldout`` (9 + 9 kinds, 56 + 53 cases; :func:`test_split_is_the_seeded_rule`).

Measured before any change: tune 49/56 (permissive P 1.00 / R 0.77), **held-out 33/53
(P 0.89 / R 0.62)**. Fixed from tune misses only (HTML license pages read as text; a
license file opening with a choice "either ... or ... at your option" / "dual-licensed"
declares the OR of its texts, each text read even when the longest scores high as a
whole; short header notices "Licensed/Released under the MIT License", ``| MIT License
|``, ``@license MIT``, BSD-n-Clause, ISC, BSL, zlib): tune 56/56; held-out measured after,
**unchanged, 33/53** (its misses had been printed with the first measurement, not tuned
on; the tune kinds did not carry over). Then, from the held-out misses (so this figure is
optimistic): other ecosystems' manifests (gemspec, Cabal/hpack, R DESCRIPTION with its
``GPL (>= 2)``/``MIT + file LICENSE`` and CRAN's YEAR/COPYRIGHT HOLDER stub, Maven, NuGet,
Mix) and the license names they write; ``LicenseRef-`` ids kept (non-permissive) and
proprietary header notices; dependency license lists named like license files
(``LICENSE-3rdparty.csv``, ``LICENSE-THIRD-PARTY``) ranked like NOTICE; Creative Commons
notices: held-out 52/53 (P 1.00 / R 0.96). Left: the PostgreSQL text as identify vendors
it (askalono: Cornell-Lossless-JPEG 0.82, no part >= 0.8).

askalono (``pyaskalono`` 0.2) reloads its store on every call (0.14-0.5 s here); its
answers for this set's texts are recorded in ``license_stop44_askalono.json`` and put in
the step's cache for this module (a text the code splits differently is still scored
live); :func:`test_recorded_askalono_answers_are_askalonos` checks recorded answers
against askalono itself.
"""

from __future__ import annotations

import hashlib
import html
import json
import random
import re
import textwrap
from pathlib import Path

import license_scoring as scoring
import pytest
from identify.vendor.licenses import LICENSES
from labelled_sets import load_cases

from data import license_text

SET = Path(__file__).with_name("license_stop44.jsonl")
TEXTS = dict(LICENSES)


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def _wrap(text: str, width: int) -> str:
    # Numbered items keep their own paragraph; every paragraph refilled at ``width``.
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width) for p in _paragraphs(text))


def _html(text: str, item: str = "p") -> str:
    body = "\n".join(
        f"<{item}>{html.escape(' '.join(p.split()))}</{item}>" for p in _paragraphs(text)
    )
    if item == "li":
        body = f"<ol>\n{body}\n</ol>"
    head = "<!DOCTYPE html>\n<html><head><title>License</title></head>\n"
    return f"{head}<body>\n{body}\n</body></html>\n"


TRANSFORMS = {
    "wrap40": lambda t: _wrap(t, 40),
    "wrap60": lambda t: _wrap(t, 60),
    "wrap100": lambda t: _wrap(t, 100),
    "indent4": lambda t: "\n".join(("    " + line).rstrip() for line in t.split("\n")),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    # Markdown: the first line a heading, numbered conditions as bullets, capitals in bold,
    # Apache's numbered section titles as headings.
    "md_title": lambda t: "# " + t.lstrip(),
    "md_bullets": lambda t: re.sub(r"(?m)^\s*\d+\.\s+", "- ", t),
    "md_star_bullets": lambda t: re.sub(r"(?m)^\s*\d+\.\s+", "* ", t),
    "bold_caps": lambda t: "\n\n".join(
        f"**{p.strip()}**" if p.upper() == p and re.search(r"[A-Z]{4}", p) else p
        for p in t.split("\n\n")
    ),
    "md_sections": lambda t: re.sub(r"(?m)^\s*(\d+\.\s+[A-Z][^.\n]{0,60}\.)", r"## \1", t),
    "html": _html,
    "html_ol": lambda t: _html(t, "li"),
    "html_br": lambda t: (
        "<html><body>\n"
        + "<br>\n".join(html.escape(line) for line in t.split("\n"))
        + "\n</body></html>\n"
    ),
}


def expand(text: str) -> str:
    """``@@ID|t1|t2@@`` -> identify's vendored text of ID, filled and transformed."""

    def one(m: re.Match) -> str:
        spdx, *steps = m.group(1).split("|")
        out = TEXTS[spdx].replace("[year]", "2024").replace("[fullname]", "Example Org")
        for step in steps:
            out = TRANSFORMS[step](out)
        return out

    return re.sub(r"@@([^@]+)@@", one, text)


HEADER, CASES = load_cases(SET)
correct = scoring.correct


def outcome(case: dict) -> scoring.Outcome:
    return scoring.outcome(case, expand)


def score(split: str) -> tuple[int, int, list[str]]:
    return scoring.score(CASES, split, expand)


def permissive_pr(split: str) -> tuple[float, float]:
    return scoring.permissive_pr(CASES, split, expand)


FLOORS = {"tune": 56, "heldout": 52}  # measured (see the docstring)
RECORDED = Path(__file__).with_name("license_stop44_askalono.json")


@pytest.fixture(scope="module", autouse=True)
def _askalono_answers():
    """askalono's recorded answers in the step's cache (restored afterwards)."""
    with scoring.recorded_askalono(RECORDED):
        yield


@pytest.fixture(scope="module")
def outcomes(_askalono_answers) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {i: outcome(c) for i, c in enumerate(CASES)}


def test_split_is_the_seeded_rule() -> None:
    groups = HEADER["groups"]
    tune, held = [], []
    for kinds in groups.values():
        ks = sorted(kinds)
        random.Random(44).shuffle(ks)
        n = (len(ks) + 1) // 2
        tune += ks[:n]
        held += ks[n:]
    assert (tune, held) == (HEADER["tune_kinds"], HEADER["heldout_kinds"])
    for c in CASES:
        assert c["split"] == ("tune" if c["kind"] in tune else "heldout"), c["kind"]
    assert (sum(c["split"] == "tune" for c in CASES), len(CASES)) == (56, 109)


@pytest.mark.parametrize("kind", HEADER["tune_kinds"])
def test_tune_kind_fully(kind: str, outcomes) -> None:
    misses = [
        f"{c['target']}: want {c['expected']} {c['first_id']} got {outcomes[i]}"
        for i, c in enumerate(CASES)
        if c["kind"] == kind and not correct(c, outcomes[i])
    ]
    assert not misses, misses


@pytest.mark.parametrize("kind", HEADER["heldout_kinds"])
def test_heldout_kind(kind: str, outcomes) -> None:
    """Every held-out kind but the PostgreSQL text askalono does not know (one miss)."""
    misses = [
        f"{c['target']}: want {c['expected']} {c['first_id']} got {outcomes[i]}"
        for i, c in enumerate(CASES)
        if c["kind"] == kind and not correct(c, outcomes[i])
    ]
    allowed = 1 if kind == "rare_permissive_texts" else 0
    assert len(misses) <= allowed, misses


@pytest.mark.parametrize("split", ["tune", "heldout"])
def test_floor(split: str, outcomes) -> None:
    hits = sum(correct(c, outcomes[i]) for i, c in enumerate(CASES) if c["split"] == split)
    assert hits >= FLOORS[split]


def test_recorded_askalono_answers_are_askalonos() -> None:
    """Two recorded answers (the MIT text as the set writes it, and the HTML Apache page
    read as text) against askalono itself: the recording is askalono's, not made up."""
    recorded = json.loads(RECORDED.read_text())
    for text in (expand("@@MIT@@"), license_text.html_to_text(expand("@@Apache-2.0|html_br@@"))):
        body = " ".join(license_text.COPYRIGHT_LINE.sub("", text.strip()).split())
        key = hashlib.sha1(f"{'pixar' in text.lower()}|{body}".encode()).hexdigest()
        name, score = license_text._identify(text.strip())
        assert key in recorded and recorded[key][0] == name
        assert abs(recorded[key][1] - score) < 1e-5


def test_short_notice_needs_a_grant_not_a_mention() -> None:
    assert license_text.header_notice_id("# Released under the MIT license\nx = 1\n") == "MIT"
    assert (
        license_text.header_notice_id("# Unlike the MIT license, GPL is copyleft.\nx = 1\n") is None
    )
    assert license_text.header_notice_id("# Licensed under the MIT-0 license\nx = 1\n") is None
    # Only the leading comments count: a docstring-free module's string is no notice.
    assert license_text.header_notice_id('x = "Released under the MIT license"\n') is None


def test_gnu_versions_choice_is_no_choice_of_texts() -> None:
    gnu = (
        "This program is free software: you can redistribute it and/or modify it under the\n"
        "terms of the GNU General Public License as published by the Free Software\n"
        "Foundation, either version 3 of the License, or (at your option) any later version."
    )
    assert not license_text._choice_preamble(gnu + "\n\nMIT License\n")
    assert license_text._choice_preamble("Dual-licensed under MIT or Apache-2.0.\n\nMIT License\n")


@pytest.mark.parametrize("value", ["LICENSE", "(license)"])
def test_manifest_value_naming_no_license_is_unidentified_not_none(value: str) -> None:
    """A manifest license that is only the word "license" reduced to an empty name, which
    parsed as the license id ``'None'``; it names no license."""
    case = {
        "files": {"package.json": json.dumps({"name": "x", "license": value}), "index.js": "x\n"},
        "target": "index.js",
    }
    assert outcome(case) == ("unidentified_license", ("unidentified_license",))
