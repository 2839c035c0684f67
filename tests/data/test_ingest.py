"""Ingest of directories, git repositories and untrusted archives."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile
from pathlib import Path

from conftest import git, ingest_all, make_repo

from data.config import SourceConfig


def test_git_repo_default_branch_latest_commit(tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    first = make_repo(repo, {"a.py": "print('v1')\n", "b.txt": "hello\n"}, branch="trunk")
    (repo / "a.py").write_text("print('v2')\n")
    git(repo, "commit", "-qam", "v2", date="2024-05-06T07:08:09+00:00")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "c.py").write_text("print('feature only')\n")
    git(repo, "add", "c.py")
    git(repo, "commit", "-qm", "feature")
    git(repo, "checkout", "-q", "trunk")
    os.symlink("a.py", repo / "link.py")
    git(repo, "add", "link.py")
    git(repo, "commit", "-qm", "link", date="2024-05-07T00:00:00+00:00")
    head = git(repo, "rev-parse", "HEAD")
    recs, stats = ingest_all([SourceConfig(type="git", path=str(repo))])
    by_path = {r.path: r for r in recs}
    assert set(by_path) == {"a.py", "b.txt", "link.py"}
    assert by_path["a.py"].content == "print('v2')\n" and by_path["a.py"].commit == head != first
    assert by_path["a.py"].commit_date.startswith("2024-05-07")
    assert by_path["a.py"].repo == "proj"
    assert by_path["link.py"].drop_reason == "symlink"
    assert stats.files_in == 3 and stats.files_out == 2


def test_directory_binary_size_encoding_symlink(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "ok.py").write_text("x = 1\n")
    (root / "bin.dat").write_bytes(b"abc\x00def")
    (root / "big.txt").write_text("y" * 5000)
    french = (
        "# Ce module gère les entrées. Il était une fois un café où l'on préparait "
        "la crème brûlée à la française, et déjà les élèves étaient là.\n"
    ) * 8
    (root / "latin.txt").write_bytes(french.encode("latin-1"))
    os.symlink("/etc/passwd", root / "escape")
    recs, _ = ingest_all([SourceConfig(type="dir", path=str(root))], max_file_bytes=4096)
    r = {x.path: x for x in recs}
    assert r["ok.py"].content == "x = 1\n" and not r["ok.py"].drop_stage
    assert r["bin.dat"].drop_reason == "binary"
    assert r["big.txt"].drop_reason == "too_large"
    assert r["escape"].drop_reason == "symlink"
    assert r["latin.txt"].encoding not in ("utf-8", "utf-8-sig")
    assert r["latin.txt"].content == french


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> None:
    with tarfile.open(path, mode) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)


def _info(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, target: str = ""):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    ti.linkname = target
    return ti, (data if kind == tarfile.REGTYPE else None)


def test_malicious_archives(tmp_path: Path) -> None:
    arch = tmp_path / "archives"
    arch.mkdir()
    _tar(
        arch / "evil.tar.gz",
        [
            _info("repo/ok.py", b"print('fine')\n"),
            _info("../../etc/cron.d/evil", b"* * * * * root rm -rf /\n"),
            _info("/abs/path.py", b"x = 1\n"),
            _info("repo/link", kind=tarfile.SYMTYPE, target="../../../../etc/shadow"),
            _info("repo/hard", kind=tarfile.LNKTYPE, target="/etc/passwd"),
            _info("repo/fifo", kind=tarfile.FIFOTYPE),
        ],
        mode="w:gz",
    )
    # A zip bomb: 50 MB of zeros compresses to ~50 KB; the per-file bound stops it.
    with zipfile.ZipFile(arch / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("bomb/zeros.txt", b"0" * 50_000_000)
        zf.writestr("bomb/../../escape.py", b"x = 2\n")
        zf.writestr("bomb/fine.py", b"y = 3\n")
    # A corrupt archive: a truncated gzip stream after one good member.
    good = io.BytesIO()
    _tar(
        tmp_path / "t.tar", [_info("c/a.py", b"a = 1\n" * 2000), _info("c/b.py", b"b = 2\n" * 2000)]
    )
    data = gzip.compress((tmp_path / "t.tar").read_bytes())
    (arch / "corrupt.tar.gz").write_bytes(data[: len(data) // 2])
    (arch / "garbage.zip").write_bytes(b"PK\x03\x04 not really a zip" + bytes(100))
    del good
    recs, stats = ingest_all(
        [SourceConfig(type="archive", path=str(arch), layout="repos")],
        max_file_bytes=1_000_000,
        max_archive_bytes=10_000_000,
    )
    by = {(r.repo, r.path): r for r in recs}
    assert by[("evil", "repo/ok.py")].content == "print('fine')\n"
    assert by[("evil", "../../etc/cron.d/evil")].drop_reason == "unsafe_path"
    assert by[("evil", "/abs/path.py")].drop_reason == "unsafe_path"
    assert by[("evil", "repo/link")].drop_reason == "symlink"
    assert by[("evil", "repo/hard")].drop_reason == "symlink"
    assert by[("evil", "repo/fifo")].drop_reason == "special_file"
    assert by[("bomb", "bomb/zeros.txt")].drop_reason in ("too_large", "compression_ratio_exceeded")
    assert by[("bomb", "bomb/../../escape.py")].drop_reason == "unsafe_path"
    assert by[("bomb", "bomb/fine.py")].content == "y = 3\n"
    assert by[("corrupt", "")].drop_reason.startswith("corrupt_archive")
    assert by[("garbage", "")].drop_reason.startswith("corrupt_archive")
    assert stats.counters["corrupt_archives"] == 2
    # Nothing was written outside the tree (archives are never extracted to disk).
    assert not (tmp_path / "etc").exists() and not (tmp_path.parent / "escape.py").exists()


def test_archive_total_budget(tmp_path: Path) -> None:
    members = [_info(f"r/f{i}.txt", b"z" * 4000) for i in range(10)]
    _tar(tmp_path / "many.tar", members)
    recs, _ = ingest_all(
        [SourceConfig(type="archive", path=str(tmp_path / "many.tar"))], max_archive_bytes=10_000
    )
    kept = [r for r in recs if not r.drop_stage]
    assert len(kept) == 2
    assert recs[-1].drop_reason == "archive_budget_exceeded"


def test_utf16_and_utf32_files_with_a_bom_are_text_not_binary(tmp_path: Path) -> None:
    """Windows tools (PowerShell, Visual Studio) write source as UTF-16 with a BOM: every
    ASCII character carries a NUL byte, which alone used to drop the file as binary."""
    root = tmp_path / "d"
    root.mkdir()
    code = 'Write-Host "héllo wörld"\r\n$x = 1 # 日本\r\n'
    (root / "le.ps1").write_bytes(code.encode("utf-16"))  # BOM + little-endian here
    (root / "be.cs").write_bytes(b"\xfe\xff" + code.encode("utf-16-be"))
    (root / "w32.txt").write_bytes(b"\xff\xfe\x00\x00" + code.encode("utf-32-le"))
    (root / "fake.bin").write_bytes(b"\xff\xfe" + b"\x00\x00" * 8 + bytes(range(1, 40)))
    (root / "odd.bin").write_bytes(b"\xff\xfe" + b"a\x00b")  # odd length: not UTF-16
    recs, _ = ingest_all([SourceConfig(type="dir", path=str(root))])
    r = {x.path: x for x in recs}
    for name in ("le.ps1", "be.cs", "w32.txt"):
        assert not r[name].drop_stage, (name, r[name].drop_reason)
        assert r[name].content == code, name
    assert r["le.ps1"].encoding == "utf-16-le" and r["be.cs"].encoding == "utf-16-be"
    assert r["w32.txt"].encoding == "utf-32-le"
    assert r["fake.bin"].drop_reason == "binary"  # decodes, but to NUL characters
    assert r["odd.bin"].drop_stage
