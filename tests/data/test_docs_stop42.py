"""data/README.md's build.yaml, one step off its path (stop 42): a decontamination file
that is not there, an opt-out registry path that names no file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from data.cli import main


def _build_yaml(root: Path, version: str, **extra) -> Path:
    repo = root / "checkouts" / "acme-app"
    if not repo.exists():
        repo.mkdir(parents=True)
        (repo / "app.py").write_text("def main():\n    return 'hello from app'\n")
    cfg = {
        "sources": [{"type": "dir", "path": "checkouts", "layout": "repos"}],
        "output_dir": "out",
        "version": version,
        "num_shards": 1,
        "workers": 1,
        "progress": False,
        **extra,
    }
    path = root / f"build-{version}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_missing_decontamination_file_is_refused_before_any_shard(tmp_path, capsys):
    """It failed mid-build with "No such file or directory ... Fix: free space or fix
    permissions there, then rerun": advice that cannot help."""
    cfg = _build_yaml(tmp_path, "v1", decontam={"files": ["benchmarks/humaneval_prompts.jsonl"]})
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "decontam.files[0]" in err and "does not exist" in err
    assert "free space" not in err
    assert not (tmp_path / "out" / "v1" / "_work").exists()  # refused before the plan


def test_a_mistyped_optout_registry_is_said_not_silently_empty(tmp_path, caplog, capsys):
    """README: `optout: {registry: optout.yaml}`. A path that names no file was read as an
    empty registry without a word, so a typo built a snapshot with opted-out code."""
    main(["optout", "add", "--registry", str(tmp_path / "optout.yaml"), "--repo", "acme-app",
          "--reason", "owner request"])  # fmt: skip
    cfg = _build_yaml(tmp_path, "v1", optout={"registry": "optuot.yaml"})
    with caplog.at_level(logging.WARNING, logger="data.pipeline"):
        assert main(["build", str(cfg), "--no-progress"]) == 0
    said = [r.getMessage() for r in caplog.records if "optout.registry" in r.getMessage()]
    assert len(said) == 1 and "optuot.yaml does not exist" in said[0], said
    manifest = json.loads((tmp_path / "out" / "v1" / "manifest.json").read_text())
    assert manifest["optout_registry_version"] == 0
    # The registry the user meant: the repository is dropped, and nothing is said.
    caplog.clear()
    cfg = _build_yaml(tmp_path, "v2", optout={"registry": "optout.yaml"})
    with caplog.at_level(logging.WARNING, logger="data.pipeline"):
        assert main(["build", str(cfg), "--no-progress"]) == 0
    assert not [r for r in caplog.records if "optout.registry" in r.getMessage()]
    manifest = json.loads((tmp_path / "out" / "v2" / "manifest.json").read_text())
    assert manifest["optout_registry_version"] == 1
    assert manifest["dropped"]["by_stage"]["optout"]
    # v1 again, now with the registry that exists: v1 is finished, not "resumed".
    cfg = _build_yaml(tmp_path, "v1", optout={"registry": "optout.yaml"})
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is a finished snapshot built with a different" in err and "resuming" not in err
    assert "build into a new version" in err


def test_a_script_calling_build_at_top_level_is_told_about_the_main_guard(tmp_path):
    """data/README.md's Python snippet, saved as a script and run: with the default
    ``workers`` (auto, > 1 here) each forkserver worker imported the script and built
    again; the user saw "another build is writing" from every worker, then the parent's
    BrokenProcessPool traceback, and nothing about the guard."""
    import subprocess
    import sys

    cfg = _build_yaml(tmp_path, "v1", workers=2, num_shards=2)
    (tmp_path / "checkouts" / "bob-lib").mkdir()
    (tmp_path / "checkouts" / "bob-lib" / "lib.py").write_text("def f(x):\n    return x\n")
    script = tmp_path / "make_dataset.py"
    script.write_text(f"from data import load_config, build\n\nbuild(load_config({str(cfg)!r}))\n")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("data.errors.BuildError: a worker process of 'curate shards' died")
    assert 'if __name__ == "__main__":' in last
    assert "another build is writing" not in proc.stderr


def test_stats_of_an_output_dir_names_its_versions(tmp_path, capsys):
    """`data stats out` (the output_dir, not `out/v1`) said "out has no manifest.json: not
    a finished build"; a folder that does not exist said the same."""
    out = tmp_path / "out"
    for v in ("v2", "v10", "v1"):
        (out / v).mkdir(parents=True)
        (out / v / "manifest.json").write_text("{}")
    (out / "v3").mkdir()  # unfinished: not offered
    assert main(["stats", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is an output_dir, not a version" in err
    assert f"{out / 'v1'}, {out / 'v2'}, {out / 'v10'}" in err and "v3" not in err
    assert main(["diff", str(tmp_path / "nope"), str(out / "v1")]) == 2
    assert f"{tmp_path / 'nope'} does not exist" in capsys.readouterr().err


def test_the_main_guard_check_counts_only_the_scripts_import():
    """A function of the script that the user's own child process runs (its ``target``)
    may call build(); only the script's module-level code, run by a worker's import, may
    not."""
    from data.pipeline import _called_from_mp_main

    g = {"__name__": "__mp_main__", "probe": _called_from_mp_main}
    exec(compile("at_import = probe()\ndef target():\n    return probe()\n", "s.py", "exec"), g)
    assert g["at_import"] is True and g["target"]() is False
