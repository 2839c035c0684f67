"""The README's "Curate a code dataset" commands driven through faults (stop 45): damaged
and vanishing archives, a damaged or repeated opt-out registry, `data diff` off its path."""

from __future__ import annotations

import io
import json
import random
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import ingest_all

from data.cli import main
from data.config import IngestConfig, SourceConfig
from data.ingest import IngestStep, plan_units
from data.optout import OptOutRegistry


def _text(rng: random.Random, n: int) -> bytes:
    """Python-looking lines that gzip cannot shrink much (so a cut lands mid-archive)."""
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(n)]
    return "".join(f"{w} = {rng.randrange(10**9)}\n" for w in words).encode()


def _members(rng: random.Random) -> list[tuple[str, bytes]]:
    # The license file comes last, as `tar` of a tree often orders it (src/ < zLICENSE):
    # a cut archive without it would publish the code before it as `no_license`.
    return [(f"proj/src/m{i}.py", _text(rng, 300)) for i in range(4)] + [
        ("proj/zLICENSE", b"GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n")
    ]


def _tar(members: list[tuple[str, bytes]], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip_with_bad_crc(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    raw = bytearray(buf.getvalue())
    last = members[-2][1]  # flip a byte of the last source file's stored data
    at = bytes(raw).index(last) + 10
    raw[at] ^= 0x01
    return bytes(raw)


@pytest.mark.parametrize("kind", ["tar.gz", "tar", "zip"])
def test_a_damaged_archive_contributes_no_member(tmp_path: Path, kind: str) -> None:
    """README: "corrupt archives become drop rows". A cut .tar.gz/.tar (an interrupted
    download) or a zip whose member fails its CRC yielded every member before the damage
    as a kept file, so part of a repository, without its license file, went on to be
    published (`no_license`). The archive is now one `corrupt_archive` row, nothing else."""
    members = _members(random.Random(45))
    if kind == "zip":
        raw = _zip_with_bad_crc(members)
    else:
        whole = _tar(members, "w:gz" if kind == "tar.gz" else "w")
        raw = whole[: int(len(whole) * 0.7)]
    path = tmp_path / f"proj.{kind}"
    path.write_bytes(raw)
    recs, stats = ingest_all([SourceConfig(type="archive", path=str(path))])
    kept = [r.path for r in recs if not r.drop_stage]
    assert kept == [], kept
    assert [r.drop_reason.split(":")[0] for r in recs] == ["corrupt_archive"]
    assert stats.counters.get("corrupt_archives") == 1


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_path_an_archive_holds_twice_is_kept_once_the_last(tmp_path: Path, kind: str) -> None:
    """`tar -r` appends a newer copy of a file, and zip tools can add a name twice:
    extracting leaves the last copy, but every copy became a row of the snapshot (three
    `p/a.py` rows with different code; `data diff` counts one of them)."""
    import warnings

    members = [("p/a.py", b"x = 1\n"), ("p/b.py", b"y = 1\n"), ("p/./a.py", b"x = 3\n")]
    path = tmp_path / f"p.{kind}"
    if kind == "tar":
        path.write_bytes(_tar(members, "w"))
    else:
        with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
            warnings.simplefilter("ignore")  # zipfile's "Duplicate name" warning
            for name, data in members:
                zf.writestr(name, data)
    recs, _ = ingest_all([SourceConfig(type="archive", path=str(path))])
    assert [(r.path, r.drop_reason, r.content) for r in recs] == [
        ("p/a.py", "duplicate_path", ""),
        ("p/b.py", "", "y = 1\n"),
        ("p/a.py", "", "x = 3\n"),
    ]


def test_an_archive_or_git_repository_that_vanished_after_planning_is_an_unreadable_row(
    tmp_path: Path,
) -> None:
    """A repository folder removed between the plan and its shard is an `unreadable` drop
    row; an archive removed the same way stopped the whole build with FileNotFoundError
    ("Fix: free space or fix permissions"), a git repository with "is not a git
    repository ... Fix: commit to it"."""
    import shutil

    from conftest import make_repo

    tarballs = tmp_path / "tarballs"
    tarballs.mkdir()
    (tarballs / "a.tar").write_bytes(_tar([("a/x.py", b"x = 1\n")], "w"))
    (tarballs / "b.zip").write_bytes(b"")
    make_repo(tmp_path / "gits" / "c", {"y.py": "y = 2\n"})
    units = plan_units(
        [
            SourceConfig(type="archive", path=str(tarballs), layout="repos"),
            SourceConfig(type="git", path=str(tmp_path / "gits"), layout="repos"),
        ]
    )
    (tarballs / "b.zip").unlink()
    shutil.rmtree(tmp_path / "gits" / "c")
    recs = list(IngestStep(IngestConfig()).run(units))
    assert [(r.repo, r.path, r.drop_reason) for r in recs] == [
        ("a", "a/x.py", ""),
        ("b", "", "unreadable"),
        ("c", "", "unreadable"),
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('version: 2\nentries:\n  - {repo: "acme/*"\n', "not valid YAML"),
        ("- a\n- b\n", "not a mapping"),
        ("version: two\n", "version"),
        ("entries:\n  - hello\n", "entries[0]"),
        ("entries: {repo: x}\n", "entries"),
        (None, "cannot be read"),  # the registry path is a folder
    ],
)
def test_a_damaged_optout_registry_is_one_line(
    tmp_path: Path, capsys, text: str, problem: str
) -> None:
    """`optout add` to a registry that is not the registry's YAML printed a yaml/
    AttributeError/ValueError traceback (or "unknown keys ['e', 'h', 'l', 'o']" for an
    entry that is a string); a build with it failed the same way inside a shard."""
    reg = tmp_path / "optout.yaml"
    if text is None:
        reg.mkdir()
    else:
        reg.write_text(text)
    rc = main(["optout", "add", "--registry", str(reg), "--repo", "x/*", "--reason", "r"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(reg) in err and problem in err and "Fix:" in err, err
    assert text is None or reg.read_text() == text  # left as it was


def test_optout_add_of_a_rule_already_there_changes_nothing(tmp_path: Path, capsys) -> None:
    """The README's `optout add` run twice (a retried command, a request filed twice) added
    the same rule again and bumped the registry version, which alone makes the next build
    of a finished version refuse ("built with a different ... opt-out registry")."""
    reg = tmp_path / "optout.yaml"
    args = ["optout", "add", "--registry", str(reg), "--repo", "acme/*", "--reason", "owner"]
    assert main(args) == 0
    first = reg.read_text()
    assert main([*args[:-1], "second request"]) == 0
    out = capsys.readouterr().out
    assert reg.read_text() == first
    loaded = OptOutRegistry.load(reg)
    assert (loaded.version, len(loaded.entries)) == (1, 1)
    assert "already" in out and "version 1" in out, out


def test_a_build_with_a_damaged_optout_registry_stops_before_any_shard(
    tmp_path: Path, capsys
) -> None:
    """`optout: {registry: optout.yaml}` naming a file cut short: one line, no shard run."""
    repo = tmp_path / "checkouts" / "app"
    repo.mkdir(parents=True)
    (repo / "app.py").write_text("x = 1\n")
    (tmp_path / "optout.yaml").write_text('entries:\n  - {repo: "acme/*", reason: "ow')
    cfg = {
        "sources": [{"type": "dir", "path": "checkouts", "layout": "repos"}],
        "output_dir": "out",
        "version": "v1",
        "num_shards": 1,
        "workers": 1,
        "optout": {"registry": "optout.yaml"},
    }
    (tmp_path / "build.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["build", str(tmp_path / "build.yaml"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optout.yaml" in err and "not valid YAML" in err, err
    assert not (tmp_path / "out" / "v1" / "_work" / "stage1").exists()


def test_two_optout_adds_at_once_keep_both_rules(tmp_path: Path, monkeypatch) -> None:
    """Two `optout add` at once both read version N and wrote N+1 with only their own
    rule: one opt-out request was lost. The registry is now locked while a request is
    added (and written beside, then renamed)."""
    import threading

    reg = tmp_path / "optout.yaml"
    saving, release = threading.Event(), threading.Event()
    real_save = OptOutRegistry.save

    def slow_save(self, path):  # the first writer pauses after reading, before writing
        if not saving.is_set():
            saving.set()
            assert release.wait(10)
        real_save(self, path)

    monkeypatch.setattr(OptOutRegistry, "save", slow_save)
    from data.optout import add_request

    a = threading.Thread(target=add_request, args=(reg,), kwargs={"repo": "a/*", "reason": "a"})
    a.start()
    assert saving.wait(10)
    b = threading.Thread(target=add_request, args=(reg,), kwargs={"repo": "b/*", "reason": "b"})
    b.start()
    b.join(0.3)  # old code: b reads the empty registry and writes its version 1 now
    release.set()
    a.join(10)
    b.join(10)
    loaded = OptOutRegistry.load(reg)
    assert loaded.version == 2
    assert sorted(e.repo for e in loaded.entries) == ["a/*", "b/*"]


def test_a_folder_removed_while_its_repository_is_read_is_unreadable_rows(
    tmp_path: Path, monkeypatch
) -> None:
    """A folder removed after os.walk listed it and before its files were read (a checkout
    updated under the build) stopped the whole build with FileNotFoundError; its files are
    now `unreadable` drop rows, as a folder that vanished before the walk is."""
    import shutil

    import data.ingest as ingest

    repo = tmp_path / "repos" / "app"
    (repo / "pkg").mkdir(parents=True)
    (repo / "main.py").write_text("x = 1\n")
    (repo / "pkg" / "mod.py").write_text("y = 2\n")
    real_walk = ingest.os.walk

    def walk_then_remove(top, **kw):  # the removal lands right after walk listed pkg/
        for dirpath, dirs, files in real_walk(top, **kw):
            if dirpath.endswith("pkg"):
                shutil.rmtree(dirpath)
            yield dirpath, dirs, files

    units = plan_units([SourceConfig(type="dir", path=str(repo))])
    monkeypatch.setattr(ingest.os, "walk", walk_then_remove)
    recs = list(IngestStep(IngestConfig()).run(units))
    assert [(r.path, r.drop_reason) for r in recs] == [
        ("main.py", ""),
        ("pkg/mod.py", "unreadable"),
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """One README build (two repositories, two shards, an opt-out registry) during which
    an `optout add` lands between the two shards; shared by the tests below."""
    import data.pipeline as pipeline
    from data import build, load_config
    from data.optout import add_request

    root = tmp_path_factory.mktemp("built")
    for name in ("acme-a", "acme-b"):
        repo = root / "checkouts" / name
        repo.mkdir(parents=True)
        (repo / "app.py").write_text(f"def main():\n    return '{name} says hello'\n")
    reg = root / "optout.yaml"
    add_request(reg, repo="nobody/*", reason="first request")
    cfg = {
        "sources": [{"type": "dir", "path": "checkouts", "layout": "repos"}],
        "output_dir": "out",
        "version": "v1",
        "num_shards": 2,
        "workers": 1,
        "progress": False,
        "optout": {"registry": "optout.yaml"},
    }
    (root / "build.yaml").write_text(yaml.safe_dump(cfg))
    real = pipeline.stage1_shard

    def then_add(config, shard):  # the request lands between the two shards
        out = real(config, shard)
        if shard == 0:
            add_request(reg, repo="acme-*", reason="owner request")
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "stage1_shard", then_add)
        manifest = build(load_config(root / "build.yaml"))
    return {"root": root, "manifest": manifest, "v1": root / "out" / "v1"}


def test_an_optout_added_while_a_build_runs_applies_to_no_shard_of_it(built: dict) -> None:
    """Each shard read the registry when it started, and the manifest at the end: an
    `optout add` between two shards left one repository out and not another under the
    same rule, and a manifest claiming a registry version its first shards never saw.
    The build now reads the registry as it was at its start; the request is for the next
    version."""
    manifest = built["manifest"]
    assert manifest["optout_registry_version"] == 1
    assert manifest["outputs"]["files"] == 2 and "optout" not in manifest["dropped"]["by_stage"]


def test_diff_with_itself_and_with_a_damaged_manifest(built: dict, tmp_path: Path, capsys) -> None:
    """`data diff out/v1 out/v1` is empty; a damaged manifest on either side is one line."""
    v1 = built["v1"]
    assert main(["diff", str(v1), str(v1)]) == 0
    assert capsys.readouterr().out == "added: 0\nremoved: 0\nchanged: 0\n"
    bad = tmp_path / "bad" / "v1"
    bad.mkdir(parents=True)
    text = json.dumps(json.loads((v1 / "manifest.json").read_text()))
    (bad / "manifest.json").write_text(text[: len(text) // 2])
    for a, b in ((v1, bad), (bad, v1)):
        assert main(["diff", str(a), str(b)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad / "manifest.json") in err and "Fix:" in err
    unfinished = tmp_path / "out" / "v2"  # a version whose build is still running
    (unfinished / "_work").mkdir(parents=True)
    assert main(["diff", str(v1), str(unfinished)]) == 2
    err = capsys.readouterr().err
    assert "not a finished build" in err and "Fix:" in err, err


def test_a_full_disk_during_optout_add_leaves_the_registry_as_it_was(
    tmp_path: Path, capsys
) -> None:
    """The registry was rewritten in place: a write that failed part-way (a full disk;
    here a file-size limit, which fails the same way) left it cut short (unreadable, or
    fewer opt-outs) after a traceback. Now one line, and the registry is unchanged."""
    import resource

    reg = tmp_path / "optout.yaml"
    args = ["optout", "add", "--registry", str(reg), "--reason", "owner request"]
    for owner in ("a", "b", "c"):
        assert main([*args, "--repo", f"{owner}/*"]) == 0
    before = reg.read_bytes()
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) - 20, hard))
    try:
        rc = main([*args, "--repo", "d/*"])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot be written" in err, err
    assert reg.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
