"""License detection against installed packages' metadata, directory scoping, policy."""

from __future__ import annotations

from pathlib import Path

from conftest import MIT

from data.config import LicenseConfig
from data.license import (
    LicenseStep,
    classify_expression,
    identify_text,
    package_license_agreement,
    permissive_ids,
)
from data.records import FileRecord


def test_agreement_with_declared_spdx_ids(site_packages: Path) -> None:
    report = package_license_agreement(site_packages)
    bad = [(r["package"], r["declared"], r["detected"]) for r in report["rows"] if not r["agree"]]
    print(
        f"license agreement {report['agreement']:.3f} (first license) / "
        f"{report['agreement_any']:.3f} (any) on {report['packages']} packages; "
        f"disagreements: {bad}"
    )
    assert report["packages"] >= 30
    assert report["agreement"] >= 0.90


def test_classification_policy() -> None:
    allowed = permissive_ids()
    for spdx in ("MIT", "Apache-2.0", "BSD-3-Clause", "ISC", "BlueOak-1.0.0", "Unlicense", "0BSD"):
        assert spdx in allowed
    for spdx in ("GPL-3.0-only", "AGPL-3.0-only", "SSPL-1.0", "CC-BY-NC-4.0"):
        assert spdx not in allowed
    assert classify_expression("MIT OR GPL-2.0-only") == "permissive"
    assert classify_expression("MIT AND GPL-2.0-only") == "non_permissive"
    assert classify_expression("Apache-2.0 WITH LLVM-exception") == "permissive"
    assert classify_expression("not a license") == "non_permissive"
    assert identify_text(MIT) == ("MIT",)


def _run(records: list[FileRecord], **kw) -> list[FileRecord]:
    return list(LicenseStep(LicenseConfig(**kw)).run(records))


def test_directory_scope_spdx_headers_and_drop(tmp_path: Path) -> None:
    from conftest import _gpl_text

    recs = [
        FileRecord(repo="r", path="LICENSE", content=MIT),
        FileRecord(repo="r", path="a.py", content="x = 1\n"),
        FileRecord(repo="r", path="vendor/gpl/COPYING", content=_gpl_text()),
        FileRecord(repo="r", path="vendor/gpl/lib.c", content="int x;\n"),
        FileRecord(repo="r", path="vendor/gpl/sub/deep.c", content="int y;\n"),
        FileRecord(
            repo="r",
            path="vendor/gpl/mit_file.c",
            content="// SPDX-License-Identifier: MIT\nint z;\n",
        ),
        FileRecord(repo="s", path="main.go", content="package main\n"),
        FileRecord(repo="t", path="README.md", content="# T\n\n## License\n\nApache-2.0\n"),
        FileRecord(repo="t", path="t.py", content="pass\n"),
    ]
    out = {(r.repo, r.path): r for r in _run(recs)}
    assert out[("r", "a.py")].license_ids == ("MIT",)
    assert out[("r", "a.py")].license_type == "permissive"
    assert out[("r", "vendor/gpl/lib.c")].license_type == "non_permissive"
    assert out[("r", "vendor/gpl/sub/deep.c")].drop_reason == "non_permissive"
    assert out[("r", "vendor/gpl/mit_file.c")].license_source == "spdx-header"
    assert out[("r", "vendor/gpl/mit_file.c")].license_type == "permissive"
    assert out[("s", "main.go")].license_type == "no_license"
    assert not out[("s", "main.go")].drop_stage
    assert out[("t", "t.py")].license_ids == ("Apache-2.0",)
    strict = {
        (r.repo, r.path): r
        for r in _run(
            [FileRecord(repo="s", path="main.go", content="package main\n")], keep=("permissive",)
        )
    }
    assert strict[("s", "main.go")].drop_reason == "no_license"
