"""License kinds from texts available offline (identify's vendored SPDX texts, installed
distributions' license files): copyleft texts, concatenated files, notices, unidentified."""

from __future__ import annotations

import pytest
from identify.vendor.licenses import LICENSES

from data.config import LicenseConfig
from data.license import LicenseStep, identify_text, license_matches
from data.license_text import split_parts
from data.records import FileRecord

TEXTS = dict(LICENSES)
MIT_TEXT = TEXTS["MIT"].replace("<year>", "2024").replace("<copyright holders>", "A. Author")


def _classify(files: dict[str, str], **cfg: object) -> dict[str, FileRecord]:
    recs = [FileRecord(repo="r", path=p, content=c, size=len(c)) for p, c in sorted(files.items())]
    out = list(LicenseStep(LicenseConfig(**cfg)).run(iter(recs)))
    return {r.path: r for r in out}


@pytest.mark.parametrize(
    "name",
    ["LGPL-2.1", "LGPL-3.0", "GPL-2.0", "GPL-3.0", "AGPL-3.0", "EPL-1.0", "EPL-2.0", "MPL-2.0"],
)
def test_copyleft_texts_recognised(name: str) -> None:
    ids = identify_text(TEXTS[name])
    assert ids and ids[0].startswith(name), ids


@pytest.mark.parametrize("name", ["LGPL-3.0", "GPL-3.0", "MPL-2.0"])
def test_copyleft_only_repository_excluded_by_default(name: str) -> None:
    by = _classify({"COPYING": TEXTS[name], "src/a.py": "x = 1\n"})
    rec = by["src/a.py"]
    assert rec.license_type == "non_permissive" and rec.drop_reason == "non_permissive"
    assert rec.license_source == "COPYING" and rec.license_ids[0].startswith(name)
    assert rec.license_score > 0  # the record says which file and what score decided


def test_concatenated_licenses_split_and_each_scored() -> None:
    bundle = "\n\n".join([MIT_TEXT, TEXTS["Apache-2.0"], TEXTS["LGPL-3.0"], TEXTS["BSD-3-Clause"]])
    assert len(bundle) > 20_000
    found = license_matches(bundle)
    assert [m.spdx for m in found][:2] == ["MIT", "Apache-2.0"]
    assert {"LGPL-3.0-only", "BSD-3-Clause"} <= {m.spdx for m in found}
    assert found[0].score >= 0.95 and len(split_parts(bundle)) >= 4
    by = _classify({"LICENSE": bundle, "m.py": "pass\n"})
    assert by["m.py"].license_type == "permissive" and by["m.py"].license_ids[0] == "MIT"


def test_mpl_notice_file_recognised() -> None:
    note = (
        "This Source Code Form is subject to the terms of the Mozilla Public\n"
        "License, v. 2.0. If a copy of the MPL was not distributed with this\n"
        "file, You can obtain one at https://mozilla.org/MPL/2.0/.\n"
    )
    assert identify_text(note) == ("MPL-2.0",)


def test_bsd3_with_several_copyright_lines() -> None:
    text = TEXTS["BSD-3-Clause"].replace(
        "Copyright (c) <year> <owner>.",
        "Copyright (c) 2001 A. One\nCopyright (c) 2009 B. Two\n"
        "Copyright (c) 2015-2024 The C Project Developers\nAll rights reserved.",
    )
    assert identify_text(text) == ("BSD-3-Clause",)


def test_license_looking_file_matching_nothing_is_unidentified_and_excluded() -> None:
    odd = (
        "THE FROBNICATOR LICENSE\n\nYou may frobnicate this software on Tuesdays only,\n"
        "provided that you send the authors a postcard.\n"
    )
    by = _classify({"LICENSE": odd, "main.py": "print(1)\n"})
    assert by["main.py"].license_type == "unidentified_license"
    assert by["main.py"].drop_reason == "unidentified_license"


def test_no_license_file_still_kept() -> None:
    by = _classify({"main.py": "print(1)\n"})
    assert by["main.py"].license_type == "no_license" and not by["main.py"].drop_stage


def test_license_step_streams_large_repositories() -> None:
    files = {f"src/f{i:03d}.py": f"x = {i}\n" * 2000 for i in range(50)}
    files["LICENSE"] = MIT_TEXT
    by = _classify(files, max_buffer_bytes=64 * 1024)  # most contents wait on disk
    assert all(r.license_ids == ("MIT",) for r in by.values())
    assert by["src/f049.py"].content == "x = 49\n" * 2000  # restored intact
