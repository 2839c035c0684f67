"""License kinds from texts available offline: LGPL, MPL; unidentified files excluded."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from data.config import LicenseConfig
from data.license import LicenseStep, identify_text
from data.records import FileRecord

SITE = Path(sysconfig.get_paths()["purelib"])


def _text(pattern: str) -> str:
    found = sorted(SITE.glob(pattern))
    if not found:
        pytest.skip(f"no installed file matches {pattern}")
    return found[0].read_text(errors="replace")


def _classify(files: dict[str, str]) -> dict[str, FileRecord]:
    recs = [FileRecord(repo="r", path=p, content=c, size=len(c)) for p, c in sorted(files.items())]
    out = list(LicenseStep(LicenseConfig()).run(iter(recs)))
    return {r.path: r for r in out}


def test_copyleft_only_repository_excluded_by_default() -> None:
    # askalono alone does not reach 0.8 on this LGPL-3.0 text; it must not become
    # no_license (kept): the repository is excluded either way.
    lgpl = _text("psycopg-*.dist-info/licenses/LICENSE.txt")
    by = _classify({"LICENSE": lgpl, "src/a.py": "x = 1\n"})
    assert by["src/a.py"].license_type in ("non_permissive", "unidentified_license")
    assert by["src/a.py"].drop_stage == "license"
    assert by["src/a.py"].license_source == "LICENSE"  # the record says which file decided


def test_mpl_text_recognised() -> None:
    mpl = _text("hypothesis-*.dist-info/licenses/LICENSE.txt")
    assert "MPL-2.0" in identify_text(mpl)


def test_license_looking_file_matching_nothing_is_unidentified_and_excluded() -> None:
    odd = ("THE FROBNICATOR LICENSE\n\nYou may frobnicate this software on Tuesdays only,\n"
           "provided that you send the authors a postcard.\n")
    by = _classify({"LICENSE": odd, "main.py": "print(1)\n"})
    assert by["main.py"].license_type == "unidentified_license"
    assert by["main.py"].drop_reason == "unidentified_license"


def test_no_license_file_still_kept() -> None:
    by = _classify({"main.py": "print(1)\n"})
    assert by["main.py"].license_type == "no_license" and not by["main.py"].drop_stage
