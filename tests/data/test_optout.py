"""Opt-outs: by author against commit metadata, and carried to copies in other repositories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
from conftest import make_repo

from data.config import config_from_dict
from data.optout import add_request
from data.pipeline import _previous_version, build

ENGINE = "".join(
    f"def step_{i}(state, rate):\n    state = state * rate + {i}\n    return state - {i} // 2\n\n"
    for i in range(40)
)


def _commit_as(repo: Path, name: str, email: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (repo / rel).write_text(text)
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
    )
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", "work"], check=True, env=env)


def _build(
    root: Path, sources: list[dict], registry: Path, version: str = "v1"
) -> dict[tuple[str, str], dict]:
    cfg = config_from_dict(
        {
            "sources": sources,
            "output_dir": str(root / "out"),
            "version": version,
            "num_shards": 2,
            "workers": 1,
            "progress": False,
            "optout": {"registry": str(registry)},
        }
    )
    build(cfg)
    rows = {}
    for part in sorted((cfg.version_dir / "drops").glob("*.parquet")):
        for r in pq.read_table(part).to_pylist():
            rows[(r["repo"], r["path"])] = {"reason": r["reason"], "detail": r["detail"]}
    for part in sorted((cfg.version_dir / "shards").glob("*.parquet")):
        for r in pq.read_table(part, columns=["repo", "path"]).to_pylist():
            rows[(r["repo"], r["path"])] = {"reason": "kept"}
    return rows


def test_author_optout_matches_commit_metadata_of_folder_named_repos(tmp_path: Path) -> None:
    repo = tmp_path / "engine"  # named by folder: no owner to match
    make_repo(repo, {"README.md": "# engine\n"})
    _commit_as(repo, "Ada Lovelace", "ada@analytical.org", {"engine.py": ENGINE})
    _commit_as(
        repo, "Charles Babbage", "cb@analytical.org", {"diff.py": ENGINE.replace("state", "value")}
    )
    registry = tmp_path / "optout.yaml"
    add_request(registry, author="ADA@analytical.org", reason="asked by email")
    rows = _build(tmp_path, [{"type": "git", "path": str(repo)}], registry)
    assert rows[("engine", "engine.py")]["reason"] == "author:asked by email"
    assert rows[("engine", "diff.py")]["reason"] == "kept"
    add_request(registry, author="Charles *", reason="by name glob")
    rows = _build(tmp_path, [{"type": "git", "path": str(repo)}], registry, "v2")
    assert rows[("engine", "diff.py")]["reason"] == "author:by name glob"


def test_optout_reaches_forks_and_near_copies(tmp_path: Path) -> None:
    make_repo(tmp_path / "src" / "original", {"engine.py": ENGINE, "util.py": "X = 1\n"})
    near = ENGINE.replace("step_3(", "step_three(").replace("+ 7\n", "+ 70\n")
    make_repo(
        tmp_path / "src" / "fork",
        {
            "engine.py": ENGINE,
            "engine_v2.py": near,
            "own.py": "def mine():\n    return 'fork only'\n",
        },
    )
    registry = tmp_path / "optout.yaml"
    add_request(registry, repo="original", reason="owner request")
    rows = _build(
        tmp_path, [{"type": "git", "path": str(tmp_path / "src"), "layout": "repos"}], registry
    )
    assert rows[("original", "engine.py")]["reason"] == "repo:owner request"
    assert rows[("fork", "engine.py")]["reason"] == "optout_duplicate"
    assert rows[("fork", "engine_v2.py")]["reason"] == "optout_near_duplicate"
    assert "original/engine.py" in rows[("fork", "engine_v2.py")]["detail"]
    assert rows[("fork", "own.py")]["reason"] == "kept"


def test_previous_version_is_semantic(tmp_path: Path) -> None:
    for v in ("v9", "v10", "v11", "v2"):
        (tmp_path / v).mkdir()
        (tmp_path / v / "manifest.json").write_text("{}")
    assert _previous_version(tmp_path, "v12") == "v11"
    assert _previous_version(tmp_path, "v11") == "v10"
    assert _previous_version(tmp_path, "v10") == "v9"


def test_pii_log_keyed_by_a_secret_outside_the_snapshot(tmp_path: Path, monkeypatch) -> None:
    import hashlib
    import hmac

    monkeypatch.delenv("DATA_PII_SECRET")
    repo = tmp_path / "r"
    make_repo(repo, {"cfg.py": "DB_PASSWORD = 'Maple42!river'\nHOST = '93.184.216.34'\n"})
    _build(tmp_path, [{"type": "git", "path": str(repo)}], tmp_path / "optout.yaml")
    out = tmp_path / "out"
    key = bytes.fromhex((out / ".pii_secrets" / "v1.key").read_text())
    logged = [
        r
        for part in sorted((out / "v1" / "pii_log").glob("*.parquet"))
        for r in pq.read_table(part).to_pylist()
    ]
    digests = {r["value_hmac"] for r in logged}
    for value in ("Maple42!river", "93.184.216.34"):
        assert hmac.new(key, value.encode(), hashlib.sha256).hexdigest() in digests
    published = b"".join(p.read_bytes() for p in (out / "v1").rglob("*") if p.is_file())
    assert key.hex().encode() not in published and key not in published
