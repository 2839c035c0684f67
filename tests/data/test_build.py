"""End-to-end builds on test-made git repos: manifest completeness, versions, CLI, tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from conftest import git

from data import diff_versions, load_config, open_dataset, verify_checksums
from data.cli import main


def write_config(
    root: Path, corpus: dict[str, Path], version: str = "v1", out: str = "out", **extra
) -> Path:
    (root / "humaneval.txt").write_text("def has_close_elements(numbers, threshold):\n")
    cfg = {
        "sources": [
            {"type": "git", "path": str(corpus["alpha"]), "stars": 10},
            {"type": "git", "path": str(corpus["beta"]), "stars": 1000},
        ],
        "output_dir": str(root / out),
        "version": version,
        "num_shards": 2,
        "workers": 1,
        "progress": False,
        "optout": {"registry": str(root / "optout.yaml")},
        "decontam": {"files": [str(root / "humaneval.txt")]},
        **extra,
    }
    path = root / f"build-{out}-{version}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def git_file_count(repo: Path) -> int:
    return len(git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines())


def test_build_manifest_versions_and_cli(small_corpus: dict[str, Path], capsys) -> None:
    root = small_corpus["root"]
    main(
        [
            "optout",
            "add",
            "--registry",
            str(root / "optout.yaml"),
            "--path",
            "docs/*",
            "--reason",
            "author asked",
        ]
    )
    cfg_path = write_config(
        root, small_corpus, tokenize={"enabled": True, "vocab_size": 400, "num_shards": 2}
    )
    assert main(["build", str(cfg_path), "--no-progress"]) == 0
    cfg = load_config(cfg_path)
    v1 = cfg.version_dir
    m = json.loads((v1 / "manifest.json").read_text())
    n_inputs = git_file_count(small_corpus["alpha"]) + git_file_count(small_corpus["beta"])
    kept = sum(pq.read_metadata(v1 / s["path"]).num_rows for s in m["shards"])
    drops = [r for d in m["drops"] for r in pq.read_table(v1 / d["path"]).to_pylist()]
    # Completeness: every input file is kept or in the drop table, exactly once.
    assert (
        m["inputs"]["files"]
        == n_inputs
        == kept + len(drops)
        == m["outputs"]["files"] + m["dropped"]["files"]
    )
    out_rows = [r for s in m["shards"] for r in pq.read_table(v1 / s["path"]).to_pylist()]
    seen = {(r["repo"], r["path"]) for r in out_rows} | {(r["repo"], r["path"]) for r in drops}
    assert len(seen) == n_inputs
    reasons = {(r["repo"], r["path"]): (r["stage"], r["reason"]) for r in drops}
    assert all(stage and reason for stage, reason in reasons.values())
    assert reasons[("alpha", "data/blob.bin")] == ("ingest", "binary")
    assert reasons[("alpha", "gen/api_pb2.py")] == ("filters", "generated")
    assert reasons[("alpha", "min.js")][0] == "filters"
    assert reasons[("alpha", "docs/notes.md")] == ("optout", "path:author asked")
    assert reasons[("beta", "leak.py")][0] == "license"  # GPL repo: dropped before decontam
    assert reasons[("beta", "copy_of_constructor.py")][0] == "license"
    by_path = {(r["repo"], r["path"]): r for r in out_rows}
    secrets = by_path[("alpha", "src/secrets.py")]
    assert "<KEY>" in secrets["content"] and "<EMAIL>" in secrets["content"]
    assert "93.184.216.34" not in secrets["content"] and json.loads(secrets["pii"])["ip"] == 1
    assert by_path[("alpha", "src/constructor.py")]["license_ids"] == ["MIT"]
    assert by_path[("alpha", "src/constructor.py")]["language"] == "Python"
    assert m["optout_registry_version"] == 1
    assert m["dropped"]["by_stage"]["optout"] == {"path:author asked": 1}
    assert verify_checksums(v1) == []
    # Tokenized shards read back through Grain.
    ds = open_dataset(v1 / "tokens" / "index.json")
    index = json.loads((v1 / "tokens" / "index.json").read_text())
    assert len(ds) == m["outputs"]["files"] == index["records"]
    assert ds[0].dtype.name == "uint32" and ds[0][-1] == index["eos_id"]
    # A second version after a change: diff and changelog.
    (small_corpus["alpha"] / "src" / "new.py").write_text("def added():\n    return 'new'\n" * 3)
    (small_corpus["alpha"] / "src" / "constructor.py").write_text(
        (small_corpus["alpha"] / "src" / "constructor.py").read_text() + "\n# changed\n"
    )
    git(small_corpus["alpha"], "add", "-A")
    git(small_corpus["alpha"], "commit", "-qm", "v2", date="2024-03-01T00:00:00+00:00")
    cfg2 = write_config(root, small_corpus, version="v2")
    assert main(["build", str(cfg2), "--no-progress"]) == 0
    d = diff_versions(v1, root / "out" / "v2")
    assert d["added"] == [("alpha", "src/new.py")]
    assert d["changed"] == [("alpha", "src/constructor.py")] and d["removed"] == []
    changelog = (root / "out" / "CHANGELOG.md").read_text()
    assert "## v1 (" in changelog and "since v1: 1 added, 0 removed, 1 changed" in changelog
    capsys.readouterr()
    assert main(["diff", str(v1), str(root / "out" / "v2")]) == 0
    assert "added: 1" in capsys.readouterr().out
    assert main(["stats", str(v1)]) == 0
    out = capsys.readouterr().out
    assert "ingest" in out and "Python" in out and "permissive" in out


def test_cli_reports_config_errors(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: []\noutput_dir: out\n")
    assert main(["build", str(bad)]) == 2
    assert "sources: no inputs" in capsys.readouterr().err


def test_python_m_entry_point(tmp_path: Path) -> None:
    repo_root = Path(__file__).resolve().parents[2]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "data",
            "optout",
            "add",
            "--registry",
            str(tmp_path / "r.yaml"),
            "--repo",
            "a/b",
            "--reason",
            "x",
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "version 1" in res.stdout
