"""Stop 41: licenses a manifest declares elsewhere (Cargo workspace inheritance, license
file pointers) and files that are damaged UTF-8 or in legacy encodings."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from identify.vendor.licenses import LICENSES

from data.config import IngestConfig, LicenseConfig
from data.ingest import IngestStep, RepoUnit, decode_bytes
from data.license import LicenseStep
from data.records import FileRecord

TEXTS = dict(LICENSES)
UTF8_REPLACED = "utf-8-replaced"  # the documented encoding of a file kept with U+FFFD
GPL = TEXTS["GPL-3.0"]
MIT = TEXTS["MIT"].replace("<year> <copyright holders>", "2024 A. Author")
CODE = "fn main() {}\n"


def _license(files: dict[str, str], target: str) -> FileRecord:
    files = {target: CODE, **files}
    recs = [FileRecord(repo="r", path=p, content=c, size=len(c)) for p, c in sorted(files.items())]
    return {r.path: r for r in LicenseStep(LicenseConfig()).run(iter(recs))}[target]


# ------------------------------------------------------------------ Cargo workspaces

ROOT_MIT_APACHE = (
    '[workspace]\nmembers = ["crates/*"]\n\n[workspace.package]\nlicense = "MIT OR Apache-2.0"\n'
)
ROOT_GPL = '[workspace]\nmembers = ["crates/*"]\n\n[workspace.package]\nlicense = "GPL-3.0-only"\n'


@pytest.mark.parametrize(
    "member",
    [
        '[package]\nname = "core"\nlicense.workspace = true\n',
        '[package]\nname = "core"\nlicense = { workspace = true }\n',
        '[package]\nname = "core"\n\n[package.license]\nworkspace = true\n',
    ],
)
@pytest.mark.parametrize(
    ("root", "kind"), [(ROOT_MIT_APACHE, "permissive"), (ROOT_GPL, "non_permissive")]
)
def test_cargo_member_inherits_the_workspace_license(member: str, root: str, kind: str) -> None:
    files = {"Cargo.toml": root, "crates/core/Cargo.toml": member}
    rec = _license(files, "crates/core/src/lib.rs")
    assert rec.license_type == kind
    assert rec.license_source == "crates/core/Cargo.toml"


def test_cargo_workspace_root_is_the_nearest_workspace_or_the_one_named() -> None:
    files = {
        # A nested workspace (its own [workspace]) is the root of the crates under it.
        "Cargo.toml": ROOT_MIT_APACHE,
        "tools/Cargo.toml": '[workspace]\n[workspace.package]\nlicense = "AGPL-3.0-only"\n',
        "tools/gen/Cargo.toml": '[package]\nname = "gen"\nlicense.workspace = true\n',
        # package.workspace names the root explicitly (Cargo's `workspace` key).
        "ext/sub/Cargo.toml": (
            '[package]\nname = "sub"\nworkspace = "../.."\nlicense.workspace = true\n'
        ),
    }
    assert _license(files, "tools/gen/src/main.rs").license_ids == ("AGPL-3.0-only",)
    named = _license(files, "ext/sub/src/lib.rs")
    assert named.license_type == "permissive" and set(named.license_ids) == {"MIT", "Apache-2.0"}


def test_cargo_workspace_license_covers_files_outside_members() -> None:
    rec = _license({"Cargo.toml": ROOT_GPL}, "scripts/release.py")
    assert rec.license_type == "non_permissive" and rec.license_source == "Cargo.toml"


def test_cargo_member_whose_workspace_declares_no_license_declares_nothing() -> None:
    files = {
        "LICENSE": MIT,
        "Cargo.toml": '[workspace]\nmembers = ["a"]\n',
        "a/Cargo.toml": '[package]\nname = "a"\nlicense.workspace = true\n',
    }
    rec = _license(files, "a/src/lib.rs")  # Cargo refuses it; the LICENSE file decides
    assert rec.license_type == "permissive" and rec.license_ids == ("MIT",)


def test_cargo_license_file_inherited_from_the_workspace() -> None:
    files = {
        "Cargo.toml": '[workspace]\n[workspace.package]\nlicense-file = "legal/terms.txt"\n',
        "legal/terms.txt": GPL,
        "crates/a/Cargo.toml": '[package]\nname = "a"\nlicense-file.workspace = true\n',
    }
    rec = _license(files, "crates/a/src/lib.rs")
    assert rec.license_type == "non_permissive" and rec.license_ids == ("GPL-3.0-only",)


# --------------------------------------------------------- manifests naming their file


@pytest.mark.parametrize(
    ("name", "manifest", "target"),
    [
        ("Cargo.toml", '[package]\nname = "x"\nlicense-file = "legal/terms.txt"\n', "terms.txt"),
        ("pyproject.toml", '[project]\nlicense = {file = "legal/terms.txt"}\n', "terms.txt"),
        ("setup.cfg", "[metadata]\nname = x\nlicense_file = legal/terms.txt\n", "terms.txt"),
        ("package.json", '{"license": "SEE LICENSE IN legal/terms.txt"}', "terms.txt"),
        # Lists of files shipped as licenses (a text naming no license counts only in a
        # file named like a license: the list may hold AUTHORS too).
        ("pyproject.toml", '[project]\nlicense-files = ["legal/*.txt"]\n', "LICENSE.txt"),
        (
            "setup.cfg",
            "[metadata]\nlicense_files =\n  legal/LICENSE.txt\n  AUTHORS\n",
            "LICENSE.txt",
        ),
    ],
)
def test_manifest_names_the_file_whose_text_decides(name: str, manifest: str, target: str) -> None:
    for body, kind, ids in (
        (GPL, "non_permissive", ("GPL-3.0-only",)),
        (MIT, "permissive", ("MIT",)),
        ("All rights reserved. Ask us before use.\n", "unidentified_license", ()),
    ):
        files = {name: manifest, f"legal/{target}": body, "AUTHORS": "A. Author <a@x.org>\n"}
        rec = _license(files, "src/main.rs")
        assert rec.license_type == kind, (name, kind)
        assert ids == () or rec.license_ids == ids
        assert rec.license_source == name


def test_listed_authors_file_is_no_license() -> None:
    files = {
        "pyproject.toml": '[project]\nlicense-files = ["LICENSES/*", "AUTHORS.md"]\n',
        "LICENSES/COPYING-MIT": MIT,
        "AUTHORS.md": "# Authors\n\n* A. Author\n",
    }
    rec = _license(files, "src/main.rs")
    assert rec.license_type == "permissive" and rec.license_ids == ("MIT",)


def test_manifest_file_pointer_out_of_the_repository_declares_nothing() -> None:
    files = {"Cargo.toml": '[package]\nlicense-file = "../../etc/passwd"\n', "LICENSE": MIT}
    assert _license(files, "src/main.rs").license_ids == ("MIT",)


def test_npm_workspace_member_has_no_inheritance_nearest_license_decides() -> None:
    files = {
        "package.json": '{"private": true, "workspaces": ["packages/*"], "license": "MIT"}',
        "packages/a/package.json": '{"name": "a"}',
    }
    rec = _license(files, "packages/a/index.js")
    assert rec.license_ids == ("MIT",) and rec.license_source == "package.json"


# ------------------------------------------------------------------------- encodings

LEGACY = [
    ("cp1251", "// Привет, мир! Съешь же ещё этих мягких французских булок.\nint x;\n"),
    ("cp1251", "// ООО «РОГА» и «КОПЫТА» — компания\nint x;\n"),
    ("cp1252", "# Élève à l'école, où est le garçon? Très bien, merci.\nx = 1\n"),
    ("cp1252", "// El niño comió piña en España; mañana será otro día.\nint x;\n"),
    ("latin_1", "# Café crème brûlée à la carte\n"),
    ("shift_jis", "// こんにちは世界、これは日本語のコメントです。\nint main(){}\n"),
    ("shift_jis", "# 日本語のテキスト。設定ファイルを読み込みます。\nimport os\n"),
    ("gbk", "// 读取配置文件失败，请检查路径。\nint main(){}\n"),
    ("euc_kr", "// 설정 파일을 읽을 수 없습니다.\nint main(){}\n"),
    ("big5", "// 讀取配置文件失敗，請檢查路徑。\n"),
]


@pytest.mark.parametrize(("encoding", "text"), LEGACY)
def test_legacy_encoded_files_decode_to_their_text(encoding: str, text: str) -> None:
    got = decode_bytes(text.encode(encoding))
    assert got is not None and got[0] == text, (encoding, got)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FileRecord]:
    repo = tmp_path_factory.mktemp("enc") / "r"
    repo.mkdir()
    for i, (enc, text) in enumerate(LEGACY):
        (repo / f"legacy{i}.txt").write_bytes(text.encode(enc))
    (repo / "wide.cs").write_bytes("\ufeff// Grüße 日本\r\n".encode("utf-16-le"))
    stray = "# Комментарий: привет мир\nx = 'значение'\n".encode() * 3 + b"# caf\xe9\n"
    (repo / "stray.py").write_bytes(stray)
    mixed = "# привет мир\n".encode() + "# Grüße aus Köln, schöne Straße\n".encode("cp1252")
    (repo / "mixed.py").write_bytes(mixed)
    recs = IngestStep(IngestConfig()).run(iter([RepoUnit("r", "dir", str(repo))]))
    return {r.path: r for r in recs}


def test_ingest_keeps_legacy_damaged_and_wide_files(ingested: dict[str, FileRecord]) -> None:
    for i, (_, text) in enumerate(LEGACY):
        rec = ingested[f"legacy{i}.txt"]
        assert rec.drop_reason == "" and rec.content == text, (rec.path, rec.encoding)
    assert ingested["wide.cs"].content == "// Grüße 日本\r\n"
    stray = ingested["stray.py"]
    assert stray.drop_reason == "" and stray.encoding == UTF8_REPLACED
    assert stray.content.endswith("# caf\ufffd\n") and "привет мир" in stray.content
    # Half UTF-8, half cp1252: one decoding garbles either half.
    assert ingested["mixed.py"].drop_reason == "invalid_utf8"


_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",), min_codepoint=1),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_TEXT, min_size=1, max_size=6), data=st.data())
def test_utf8_with_injected_bytes_keeps_its_text(parts: list[str], data) -> None:
    """Valid UTF-8 text with k stray bytes put between characters: when at least 90% of
    its non-ASCII units are well-formed, the text comes back with one U+FFFD per stray
    byte (Python's ``errors="replace"`` is the oracle); never as another code page."""
    text = "".join(parts)
    # Distinct cuts: a character between two stray bytes, so none pair up into valid UTF-8.
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), min_size=1, max_size=5)))
    bad = [data.draw(st.integers(0x80, 0xFF)) for _ in cuts]
    raw, expected, last = b"", "", 0
    for at, b in zip(cuts, bad, strict=True):
        raw += text[last:at].encode() + bytes([b])
        expected += text[last:at] + "\ufffd"
        last = at
    raw += text[last:].encode()
    expected += text[last:]
    good = sum(ord(c) > 0x7F for c in text)
    got = decode_bytes(raw)
    if good >= 9 * len(bad):
        assert got == (expected, UTF8_REPLACED)
        assert got[0] == raw.decode("utf-8", "replace")
    elif good >= len(bad):
        assert got is None  # mixed: dropped as invalid_utf8
    else:
        # Mostly legacy bytes: detection may decode it; it never yields the UTF-8 reading
        # with the good characters garbled into two or more code-page characters each.
        assert got is None or got[1] != UTF8_REPLACED


def test_damaged_utf8_with_a_bom_loses_the_bom_like_valid_utf8_sig() -> None:
    body = "# привет мир, значение\n".encode() * 2
    assert decode_bytes(b"\xef\xbb\xbf" + body + b"# caf\xe9\n") == (
        body.decode() + "# caf\ufffd\n",
        UTF8_REPLACED,
    )
