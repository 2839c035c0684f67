"""Off-path probes: messy trees, inputs that change between shards, concurrent builds."""

from __future__ import annotations

import fcntl
import io
import os
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ingest_all, make_repo

from data import build
from data.config import BuildConfig, SourceConfig, config_from_dict
from data.errors import BuildError
from data.pipeline import stage1_shard


def _rows(vdir: Path, kind: str) -> list[dict]:
    return [
        r for f in sorted((vdir / kind).glob("*.parquet")) for r in pq.read_table(f).to_pylist()
    ]


def _cfg(root: Path, **extra) -> BuildConfig:
    raw = {
        "sources": [{"type": "dir", "path": str(root / "repos"), "layout": "repos"}],
        "output_dir": str(root / "out"),
        "version": "v1",
        "num_shards": 2,
        "workers": 1,
        "progress": False,
        **extra,
    }
    return config_from_dict(raw)


def test_undecodable_file_names_are_dropped_not_fatal(tmp_path: Path) -> None:
    """A file name that is not UTF-8 (dir, git, tar) must not crash the Parquet writer."""
    bad = b"bad\xffname.py"
    d = tmp_path / "repos" / "d"
    d.mkdir(parents=True)
    (d / "ok.py").write_text("def ok():\n    return 1\n")
    with open(os.path.join(os.fsencode(d), bad), "wb") as fh:
        fh.write(b"def f():\n    return 2\n")
    g = tmp_path / "g"
    make_repo(g, {"ok.py": "def ok():\n    return 1\n"})
    with open(os.path.join(os.fsencode(g), bad), "wb") as fh:
        fh.write(b"def f():\n    return 2\n")
    import subprocess

    subprocess.run(["git", "-C", str(g), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(g), "-c", "user.name=t", "-c", "user.email=t@e.x", "commit", "-qm", "b"],
        check=True,
    )
    t = tmp_path / "t.tar"
    with tarfile.open(t, "w", encoding="utf-8", errors="surrogateescape") as tf:
        data = b"def f():\n    return 3\n"
        ti = tarfile.TarInfo(os.fsdecode(bad))
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    recs, _ = ingest_all(
        [
            SourceConfig(type="dir", path=str(d)),
            SourceConfig(type="git", path=str(g)),
            SourceConfig(type="archive", path=str(t)),
        ]
    )
    weird = [r for r in recs if "name.py" in r.path]
    assert len(weird) == 3
    for r in weird:
        assert r.path == "bad\\xffname.py", r.path
        assert r.path.encode("utf-8")  # writable to Parquet
        assert r.drop_reason == "undecodable_path"
    # The whole build runs and accounts for the file in the drop table.
    cfg = _cfg(tmp_path)
    build(cfg)
    drops = {(r["repo"], r["path"]): r["reason"] for r in _rows(cfg.version_dir, "drops")}
    assert drops[("d", "bad\\xffname.py")] == "undecodable_path"
    assert {r["path"] for r in _rows(cfg.version_dir, "shards")} == {"ok.py"}


def test_unlistable_directory_is_a_drop_row(tmp_path: Path, monkeypatch) -> None:
    """A sub-directory that cannot be listed must not vanish from the accounting."""
    d = tmp_path / "d"
    (d / "locked").mkdir(parents=True)
    (d / "locked" / "inner.py").write_text("x = 1\n")
    (d / "ok.py").write_text("y = 2\n")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    recs, stats = ingest_all([SourceConfig(type="dir", path=str(d))])
    by = {r.path: r for r in recs}
    assert by["ok.py"].drop_stage == ""
    assert by["locked"].drop_reason == "unreadable"
    assert stats.dropped == {"unreadable": 1}


def test_resume_after_inputs_changed_keeps_the_first_plan(tmp_path: Path) -> None:
    """Shards planned from sizes: a resumed build must not re-plan (lost + duplicated repos)."""
    repos = tmp_path / "repos"
    (repos / "a").mkdir(parents=True)
    (repos / "b").mkdir(parents=True)
    (repos / "a" / "a.py").write_text("def a():\n    return 'a'\n" * 40)
    (repos / "b" / "b.py").write_text("def b():\n    return 'b'\n" * 5)
    cfg = _cfg(tmp_path)
    build_dir = cfg.version_dir
    build_dir.mkdir(parents=True)
    # A first run finished shard 0 and was killed; then b grew past a.
    stage1_shard(cfg.to_dict(), 0)
    (repos / "b" / "b2.py").write_text("def c():\n    return 'c'\n" * 200)
    manifest = build(cfg)
    seen = [(r["repo"], r["path"]) for r in _rows(build_dir, "shards")]
    seen += [(r["repo"], r["path"]) for r in _rows(build_dir, "drops")]
    assert sorted(seen) == sorted(set(seen)), "a record appears twice"
    assert ("a", "a.py") in seen and ("b", "b.py") in seen
    assert manifest["inputs"]["files"] == len(seen)


def test_resume_with_a_changed_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repos" / "a").mkdir(parents=True)
    (tmp_path / "repos" / "a" / "a.py").write_text("def a():\n    return 'a'\n")
    build(_cfg(tmp_path))
    (tmp_path / "out" / "v1" / "manifest.json").unlink()  # as if killed before the end
    with pytest.raises(BuildError, match=r"different config.*new version"):
        build(_cfg(tmp_path, num_shards=3))
    build(_cfg(tmp_path, workers=2))  # run-only settings may change on resume


def test_concurrent_build_into_same_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repos" / "a").mkdir(parents=True)
    (tmp_path / "repos" / "a" / "a.py").write_text("def a():\n    return 'a'\n")
    cfg = _cfg(tmp_path)
    cfg.version_dir.mkdir(parents=True)
    # Another build holds the version's lock (as `build` does while it runs).
    with open(cfg.version_dir / ".lock", "a+") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BuildError, match=r"another build.*wait"):
            build(cfg)
    assert not (cfg.version_dir / "_work").exists()
    build(cfg)  # the lock is released: the build runs
    assert (cfg.version_dir / "manifest.json").exists()


def _two_repos(root: Path) -> BuildConfig:
    for name in ("a", "b"):
        (root / "repos" / name).mkdir(parents=True)
        (root / "repos" / name / f"{name}.py").write_text(f"def {name}():\n    return 1\n" * 9)
        (root / "repos" / name / "bin.dat").write_bytes(b"\x00" * 9)
    return _cfg(root)


def _published(vdir: Path) -> dict[str, bytes]:
    names = ("shards", "drops", "pii_log")
    out = {
        p.relative_to(vdir).as_posix(): p.read_bytes() for n in names for p in (vdir / n).glob("*")
    }
    for n in ("manifest.json", "checksums.sha256"):
        out[n] = (vdir / n).read_bytes()
    return out


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:100])


def test_truncated_intermediate_file_is_redone_on_rerun(tmp_path: Path) -> None:
    cfg = _two_repos(tmp_path)
    build(cfg)
    before = _published(cfg.version_dir)
    work = cfg.version_dir / "_work"
    # A damaged stage-1 file whose marker survived; its stage-3 shard still to be written.
    _truncate(work / "stage1" / "kept-00001.parquet")
    (work / "stage3" / "00001.done").unlink()
    build(cfg)
    assert _published(cfg.version_dir) == before


def test_truncated_output_shard_is_rewritten_on_rerun(tmp_path: Path) -> None:
    cfg = _two_repos(tmp_path)
    build(cfg)
    before = _published(cfg.version_dir)
    _truncate(cfg.version_dir / "shards" / "part-00000.parquet")
    build(cfg)  # the marker says done, but the published file is damaged
    assert _published(cfg.version_dir) == before


def test_disk_full_at_the_end_leaves_no_finished_looking_snapshot(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import errno

    import data.pipeline as pipeline
    from data.cli import main

    cfg = _two_repos(tmp_path)
    cfg_path = tmp_path / "build.yaml"
    import yaml

    cfg_path.write_text(yaml.safe_dump(cfg.to_dict()))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(cfg.version_dir))

    monkeypatch.setattr(pipeline, "write_checksums", full)
    assert main(["build", str(cfg_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "rerun" in err and "Traceback" not in err
    # Only a complete snapshot has a manifest (what `stats`, `diff` and the next
    # version's changelog take as finished).
    assert not (cfg.version_dir / "manifest.json").exists()
    monkeypatch.undo()
    monkeypatch.setenv("DATA_PII_SECRET", "5e" * 32)
    assert main(["build", str(cfg_path), "--no-progress"]) == 0
    assert (cfg.version_dir / "manifest.json").exists()
    from data import verify_checksums

    assert verify_checksums(cfg.version_dir) == []


def test_stats_on_a_damaged_manifest_says_what_to_do(tmp_path: Path, capsys) -> None:
    from data.cli import main

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "manifest.json").write_text('{"format": 1, "shards": [')
    assert main(["stats", str(tmp_path / "v1")]) == 2
    err = capsys.readouterr().err
    assert "manifest.json" in err and "rerun" in err


@pytest.mark.parametrize(
    ("lang", "line", "value"),
    [
        ("Rust", 'const API_KEY: &str = "N3kcoNIWpiBpB3cvobXkwL9S";', "N3kcoNIWpiBpB3cvobXkwL9S"),
        ("Rust", 'static TOKEN: &\'static str = "Qm4xT7vLp2R9wZk3Hd8s";', "Qm4xT7vLp2R9wZk3Hd8s"),
        ("TypeScript", "const apiKey: string = 'Zr8Kq2Lm5Np7Xw3Vb9Tc';", "Zr8Kq2Lm5Np7Xw3Vb9Tc"),
        ("Kotlin", 'val dbPassword: String = "vT4#kq9Lm2x"', "vT4#kq9Lm2x"),
        ("Python", 'API_SECRET: Final[str] = "Hq7Rt2Lx9Vm4Nw8Kp3Zb"', "Hq7Rt2Lx9Vm4Nw8Kp3Zb"),
        (
            "Dockerfile",
            "ENV API_TOKEN SZMwAGGF8ZpU7DQxYp4XAj4uQpyU",
            "SZMwAGGF8ZpU7DQxYp4XAj4uQpyU",
        ),
        ("Shell", "ldapsearch -x -D cn=admin,dc=corp -w NkGmjEd-EC0 uid=jdoe", "NkGmjEd-EC0"),
        # Found after the held-out measurement (see the report): a call is not the value.
        ("Rust", '    password: String::from("gqRv8*RIU5X94"),', "gqRv8*RIU5X94"),
        ("Rust", '    password: "Tq7-vLp2xR9".to_string(),', "Tq7-vLp2xR9"),
        (
            "Python",
            'body = "{\\"api_key\\": \\"XZSIQCrEWkTwZ8eWUDf3e0k5lew\\"}"',
            "XZSIQCrEWkTwZ8eWUDf3e0k5lew",
        ),
        ("C", '#define API_SECRET "2PDwEAiyVMk5183Cjfj8UpadFIZW"', "2PDwEAiyVMk5183Cjfj8UpadFIZW"),
        (
            "Makefile",
            "API_KEY ?= E4dm8Loqn5pBcTumWxsRqH4bWBdwtpkkqtzO4",
            "E4dm8Loqn5pBcTumWxsRqH4bWBdwtpkkqtzO4",
        ),
        ("Shell", "curl -u admin_rw:QqEPG-EyIhKTcF6 https://api.host.dev/items", "QqEPG-EyIhKTcF6"),
        ("Shell", "curl --user 'svc:a1Jg*yeUxBO6' https://api.host.dev/items", "a1Jg*yeUxBO6"),
    ],
)
def test_secret_syntaxes_off_the_generated_set(lang: str, line: str, value: str) -> None:
    """Type-annotated constants, Dockerfile's ``ENV name value``, ``ldapsearch -w``."""
    from data.pii import redact_text

    assert value not in redact_text(line, lang=lang)


@pytest.mark.parametrize(
    "line",
    [
        "def connect(token: str = DEFAULT_TOKEN) -> None:",
        "password: str = Field(..., min_length=8)",
        "ENV API_TOKEN_FILE /run/secrets/token",
        "grep -w password README.md",
        "    password: String::from(input.trim()),",
        "curl -u $USER:$TOKEN https://api.host.dev/items",
        "#define PASSWORD_MAX 64",
    ],
)
def test_secret_syntax_negatives(line: str) -> None:
    from data.pii import redact_text

    assert redact_text(line) == line


def test_commit_authors_of_files_git_would_quote(tmp_path: Path) -> None:
    """Opt-out by author needs every file's authors, also for names git quotes."""
    from data.ingest import git_file_authors, git_head

    names = ["new\nline.py", 'q"uote.py', "back\\slash.py", "tab\tname.py", "plain.py"]
    repo = tmp_path / "r"
    make_repo(repo, {n: "x = 1\n" for n in names})
    commit, _ = git_head(str(repo))
    authors = git_file_authors(str(repo), commit)
    assert {n: authors.get(n) for n in names} == {n: ("t <t@example.com>",) for n in names}


def test_pii_time_is_linear_in_findings_and_line_length() -> None:
    """A 1 MiB access log (20k public IPs) and a 1 MiB line of `key=` names: both were
    quadratic (11.7 s and 6 s on the 2-core test machine); linear takes well under 2 s."""
    import time

    from data.pii import PIIDetector

    log = "\n".join(
        f'{93 + i % 7}.{184 + i % 50}.{i % 200 + 1}.{i % 250 + 1} - - "GET /k{i}" 200'
        for i in range(20_000)
    )
    line = " ".join(f"cfg{i}_key=v{i}" for i in range(60_000))
    det = PIIDetector()
    # This thread's CPU time, not wall time: on a loaded 2-core box (CI's two workers,
    # other processes) the wall time of the same work measured 3x to 7x its CPU time, and
    # this bound failed 1 run in 4. The detector is single-threaded pure Python.
    t0 = time.thread_time()
    assert len(det.find(log)) == 20_000
    det.find(line)
    assert time.thread_time() - t0 < 4.0


@pytest.mark.parametrize(("split", "recall"), [("dev", 0.86), ("test", 0.70)])
def test_offpath_secret_set(split: str, recall: float) -> None:
    """`pii_offpath_gen.py`: secrets in syntaxes the other sets lack, scored through the
    redact path. Test split first measured at 0.50 recall (before the syntax fixes)."""
    from pii_offpath_gen import cases

    from data.pii import redact_text

    cs = cases(split)
    pos = [c for c in cs if c["pii"]]
    neg = [c for c in cs if not c["pii"]]
    hit = sum(c["pii"][0]["value"] not in redact_text(c["text"], lang=c["lang"]) for c in pos)
    assert len(pos) >= 69 and len(neg) == 24
    assert hit / len(pos) >= recall
    assert [c["text"] for c in neg if redact_text(c["text"], lang=c["lang"]) != c["text"]] == []


def test_git_source_inside_another_repository_is_refused(tmp_path: Path) -> None:
    """A plain folder under a `type: git` source must not ingest the enclosing repository."""
    outer = tmp_path / "outer"
    make_repo(outer, {"outer_only.py": "SECRET_OUTSIDE = 1\n"})
    plain = outer / "repos" / "plain"
    plain.mkdir(parents=True)
    (plain / "b.py").write_text("x = 1\n")
    with pytest.raises(BuildError, match=r"inside .*outer.*Fix: .*type: dir"):
        ingest_all([SourceConfig(type="git", path=str(plain))])
    empty = tmp_path / "empty"
    empty.mkdir()
    import subprocess

    subprocess.run(["git", "init", "-q", str(empty)], check=True)
    with pytest.raises(BuildError, match=r"no commit.*Fix: "):
        ingest_all([SourceConfig(type="git", path=str(empty))])
