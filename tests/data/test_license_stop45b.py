"""Stop 45b: an independent second set of license kinds no earlier set had.

``tests/data/license_stop45b.jsonl``: 89 repositories (a dict of path -> text, the target
file, the license type it should get and, where it matters, its first SPDX id), written
by hand before the license step was run on them, in 13 kinds none of
``labels_stop37.py``, ``labels_stop40.py``, ``license_stop44.jsonl`` or
``license_stop45.jsonl`` has: license files with a non-English line before (or an
unofficial translation after) the English text; Windows CRLF, old-Mac CR, form feeds and
a DOS ``^Z`` in license files and headers; text extracted from PDF/RTF (hyphenated line
ends, page-number lines, ``fi``/``fl`` ligatures, curly quotes, an RTF ``LICENSE.rtf``);
a ``COPYRIGHT`` file as the only license file (a text, a GNU notice, Rust's "Copyrights
in the ... project" dual statement, a bare "All rights reserved"); Go/Chromium BSD-3
texts (``* Redistributions`` bullets, Google named in clause 3, a PATENTS file, a
third-party notice section, ``third_party/`` and ``vendor/`` folders); Julia
``Project.toml`` (no license field), Cabal/hpack ``license-file:`` only, R's usethis pair
(the CRAN stub ``LICENSE`` beside a full ``LICENSE.md``); Python core metadata
(``PKG-INFO`` ``License:``/``License-Expression:``, ``License ::`` trove classifiers in
``pyproject.toml``/``setup.cfg``); Perl (``META.json`` ``perl_5``/``mit``/``gpl_3``,
``META.yml`` ``perl``, ``Makefile.PL`` ``LICENSE =>``, ``dist.ini``, the Software::License
"same terms as the Perl 5 programming language" file); Maven ``<name>`` variants; npm
``UNLICENSED`` against a license file, ``SEE LICENSE IN`` a EULA, composer
``proprietary``; dual ``COPYING`` + ``COPYING.MIT``/``.GPL``/``.LGPL`` files with a choice
(or an AND) statement; headers with a non-English line first; look-alike negatives.
``@@ID|t1|t2@@`` in a file stands for identify's vendored text of ID after the
transforms ``TRANSFORMS`` names (``holder:NAME`` sets the holder).

Labels follow data/README.md's policy: the nearest folder's license covers a file, a
file's own header decides for it, license files rank before manifests and manifests
before READMEs, a choice is permissive when one option is (Perl's terms are
``Artistic-1.0-Perl OR GPL-1.0-or-later``, and Artistic-1.0-Perl is on the allow-list),
anything the allow-list lacks (copyleft, proprietary, unidentified) is excluded by
default; where the policy is silent, the license a reader of the repository would name.

The split is BY KIND, fixed before any detector output was seen: the kinds grouped
(mostly permissive texts, manifests, structure), each group's sorted kind names shuffled
with ``random.Random(4545)``, the first half (rounded up) ``tune``, the rest ``heldout``
(7 + 6 kinds, 48 + 41 cases; :func:`test_split_is_the_seeded_rule`).

Measured before any change: tune 47/48 (a Maven ``<licenses>`` list, ``MIT License``
beside ``Apache 2``, read as ``unidentified_license``), **held-out 26/41 (permissive P
0.95 / R 0.64)**: every text-shape kind (CRLF, hyphenation, RTF, ligatures, non-English
lines, Go/Chromium, ``COPYRIGHT`` files) was right, every Python core metadata and CPAN
case missed. (One label was corrected after that run, by the policy, not the output's
convenience: a ``COPYRIGHT`` file holding only "All rights reserved" is ``no_license``,
as copyright notices are no license files; it was written as excluded, 25/41.) Fixed
from the tune miss only (a list of names is mapped name by name): tune 48/48, held-out
measured after, **unchanged, 26/41**. Then, from the held-out misses (so optimistic):
``PKG-INFO`` ``License-Expression``/``License``/classifiers, trove classifiers in
``pyproject.toml``/``setup.cfg`` without a license field, CPAN ``META.json``/``META.yml``/
``Makefile.PL``/``dist.ini`` and the Perl 5 terms in a license file: held-out 40/41 (P
0.97 / R 1.00). Left: a ``COPYING`` that says parts are GPL-2.0 and the rest MIT reads as
the choice its two sibling license files offer.

askalono (``pyaskalono`` 0.2) reloads its store on every call; its answers for this set's
texts are recorded in ``license_stop45b_askalono.json`` and put in the step's cache for
this module (a text the code splits differently is still scored live);
:func:`test_recorded_askalono_answers_are_askalonos` checks two against askalono itself.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import license_scoring as scoring
import pytest
from identify.vendor.licenses import LICENSES
from labelled_sets import load_cases

from data import license_text

SET = Path(__file__).with_name("license_stop45b.jsonl")
RECORDED = Path(__file__).with_name("license_stop45b_askalono.json")
TEXTS = dict(LICENSES)


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def _hyphenate(text: str, width: int = 64) -> str:
    """PDF-extracted text: lines cut at ``width`` inside words, with a hyphen."""
    out = []
    for p in _paragraphs(text):
        words, line, lines = " ".join(p.split()).split(" "), "", []
        for w in words:
            if line and len(line) + 1 + len(w) > width:
                room = width - len(line) - 2
                if len(w) >= 8 and room >= 3 and w.isalpha():
                    lines.append(f"{line} {w[:room]}-")
                    line = w[room:]
                    continue
                lines.append(line)
                line = w
            else:
                line = f"{line} {w}" if line else w
        lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _pagenum(text: str) -> str:
    """Page-number lines and a form feed every ~20 lines, as pdftotext writes them."""
    lines, out, page = text.split("\n"), [], 1
    for i, line in enumerate(lines, 1):
        out.append(line)
        if i % 20 == 0:
            out += ["", f"Page {page}", "\f"]
            page += 1
    return "\n".join(out)


def _rtf(text: str) -> str:
    body = "\\par\n".join(
        p.replace("\\", "\\\\").replace("{", "\\{").replace("}", "\\}").replace("\n", " ")
        for p in _paragraphs(text)
    )
    return "{\\rtf1\\ansi\\deff0{\\fonttbl{\\f0 Calibri;}}\\f0\\fs22\n" + body + "\\par\n}\n"


TRANSFORMS = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "cr_only": lambda t: t.replace("\n", "\r"),
    # Form feeds between paragraphs, as GNU's and Apache's plain-text files have them.
    "formfeed": lambda t: re.sub(r"\n\n(?=[A-Z0-9])", "\n\f\n", t, count=8),
    "hyphenate": _hyphenate,
    "pagenum": _pagenum,
    "rtf": _rtf,
    "ligature": lambda t: t.replace("fi", "\ufb01").replace("fl", "\ufb02"),
    "smartquotes": lambda t: re.sub(r'"([^"]*)"', "\u201c\\1\u201d", t).replace("'", "\u2019"),
    "go_style": lambda t: (
        re.sub(r"(?m)^\d\. ", "   * ", t.split("\n", 1)[1].lstrip())
        .replace("the copyright holder nor", "Google Inc. nor")
        .replace("   list of", "     list of")
    ),
    "drop_title": lambda t: t.split("\n", 1)[1].lstrip(),
    "drop_copyright": lambda t: re.sub(r"(?m)^Copyright .*\n\s*", "", t, count=1),
    "apache_filled": lambda t: t.replace("[yyyy]", "2024").replace(
        "[name of copyright owner]", "Example Org"
    ),
}


def expand(text: str) -> str:
    """``@@ID|t1|t2@@`` -> identify's vendored text of ID, transformed in order."""

    def one(m: re.Match) -> str:
        spdx, *steps = m.group(1).split("|")
        holder = "Example Org"
        for step in steps:
            if step.startswith("holder:"):
                holder = step.split(":", 1)[1]
        out = TEXTS[spdx].replace("[year]", "2024").replace("[fullname]", holder)
        for step in steps:
            if not step.startswith("holder:"):
                out = TRANSFORMS[step](out)
        return out

    return re.sub(r"@@(.+?)@@", one, text)


HEADER, CASES = load_cases(SET)
correct = scoring.correct


def outcome(case: dict) -> scoring.Outcome:
    return scoring.outcome(case, expand)


def score(split: str) -> tuple[int, int, list[str]]:
    return scoring.score(CASES, split, expand)


def permissive_pr(split: str) -> tuple[float, float]:
    return scoring.permissive_pr(CASES, split, expand)


FLOORS = {"tune": 48, "heldout": 40}  # measured after the fixes (see the docstring)


@pytest.fixture(scope="module", autouse=True)
def _askalono_answers():
    """askalono's recorded answers in the step's cache (restored afterwards)."""
    with scoring.recorded_askalono(RECORDED):
        yield


@pytest.fixture(scope="module")
def outcomes(_askalono_answers) -> dict[int, tuple[str, tuple[str, ...]]]:
    return {i: outcome(c) for i, c in enumerate(CASES)}


def test_split_is_the_seeded_rule() -> None:
    tune, held = [], []
    for kinds in HEADER["groups"].values():
        ks = sorted(kinds)
        random.Random(4545).shuffle(ks)
        n = (len(ks) + 1) // 2
        tune += ks[:n]
        held += ks[n:]
    assert (tune, held) == (HEADER["tune_kinds"], HEADER["heldout_kinds"])
    for c in CASES:
        assert c["split"] == ("tune" if c["kind"] in tune else "heldout"), c["kind"]
    assert (sum(c["split"] == "tune" for c in CASES), len(CASES)) == (48, 89)


@pytest.mark.parametrize("kind", HEADER["tune_kinds"])
def test_tune_kind(kind: str, outcomes) -> None:
    misses = [
        f"{c['target']}: want {c['expected']} {c['first_id']} got {outcomes[i]}"
        for i, c in enumerate(CASES)
        if c["kind"] == kind and not correct(c, outcomes[i])
    ]
    assert not misses, misses


@pytest.mark.parametrize("split", ["tune", "heldout"])
def test_floor(split: str, outcomes) -> None:
    hits = sum(correct(c, outcomes[i]) for i, c in enumerate(CASES) if c["split"] == split)
    assert hits >= FLOORS[split]


def test_recorded_askalono_answers_are_askalonos() -> None:
    """Two recorded answers (the MIT text hyphenated as PDF extraction leaves it, the
    same text as RTF) against askalono itself: the recording is askalono's."""
    recorded = json.loads(RECORDED.read_text())
    for text in (expand("@@MIT|hyphenate@@"), expand("@@MIT|rtf@@")):
        body = " ".join(license_text.COPYRIGHT_LINE.sub("", text.strip()).split())
        key = hashlib.sha1(f"{'pixar' in text.lower()}|{body}".encode()).hexdigest()
        name, score = license_text._identify(text.strip())
        assert key in recorded and recorded[key][0] == name == "MIT"
        assert abs(recorded[key][1] - score) < 1e-5


def test_declared_name_lists_and_metadata_fields() -> None:
    """The manifest readers this set's tune and held-out misses led to."""
    from data.license import (
        _choice_of_names,
        _classifier_licenses,
        _core_metadata_licenses,
        _perl_licenses,
        declared_matches,
    )

    # Maven's names joined as a choice, each mapped on its own; one unknown name: none.
    assert _choice_of_names("(MIT License) OR (Apache 2)") == "(MIT) OR (Apache-2.0)"
    assert _choice_of_names("(MIT License) OR (Our Own Terms)") == ""
    assert {m.spdx for m in declared_matches(["(MIT License) OR (Apache 2)"])} == {
        "MIT",
        "Apache-2.0",
    }
    # CPAN: perl_5 is Perl's own choice; unknown / open_source name no license.
    perl = "Artistic-1.0-Perl OR GPL-1.0-or-later"
    assert _perl_licenses("META.json", '{"license": ["perl_5"]}') == (perl,)
    assert _perl_licenses("META.json", '{"license": ["unknown"]}') == ()
    assert _perl_licenses("META.yml", "license: [mit, apache_2_0]\n") == ("(MIT) OR (Apache-2.0)",)
    assert _perl_licenses("Makefile.PL", "WriteMakefile(LICENSE => 'gpl_3');") == ("GPL-3.0-only",)
    # Trove classifiers: vague ones (BSD License, OSI Approved) name nothing.
    assert _classifier_licenses(["License :: OSI Approved :: BSD License"]) == ()
    assert _classifier_licenses(
        ["License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)"]
    ) == ("GPL-3.0-or-later",)
    # PKG-INFO: License-Expression first; a whole license text in License is no name.
    pkg = (
        "Name: x\nLicense: Permission is hereby granted, free of charge\n"
        "Classifier: License :: OSI Approved :: MIT License\n"
    )
    assert _core_metadata_licenses(pkg) == ("MIT",)
    assert _core_metadata_licenses("Name: x\nLicense-Expression: 0BSD\nLicense: MIT\n") == ("0BSD",)
    # The description after the headers (PKG-INFO's body) declares nothing.
    assert _core_metadata_licenses("Name: x\n\nLicense: MIT\n") == ()
