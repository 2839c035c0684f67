"""`jaxcore run --dry-run` stop 38: the plan checks the data sources the data phase would
read, so a wrong path is found before a long job is launched, not by it."""

from __future__ import annotations

from tests.jaxcore.test_run import DEMO
from tests.jaxcore.test_run_stop37 import TINY


def _dry_run(tmp_path, monkeypatch, capsys, source: str) -> tuple[int, str, str]:
    """``jaxcore run --dry-run`` of the tiny demo reading ``source`` alone."""
    from jaxcore.run.cli import main

    monkeypatch.chdir(tmp_path)
    args = [str(DEMO), "--dry-run", *(x for s in TINY for x in ("--set", s))]
    code = main([*args, "--set", "data.packages=[]", "--set", f"data.sources=[{source}]"])
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_refuses_a_missing_source_path(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-dir"
    code, out, err = _dry_run(tmp_path, monkeypatch, capsys, f"{{type: dir, path: {missing}}}")
    assert code == 2, out + err
    assert f"source path {missing} does not exist" in err and "Traceback" not in err
    assert "AOT memory" not in out  # refused before the plan is printed as if runnable


def test_dry_run_refuses_a_bad_source_entry_naming_the_field(tmp_path, monkeypatch, capsys):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    source = f"{{type: folder, path: {tmp_path / 'repo'}}}"
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys, source)
    assert code == 2, err
    assert "sources[].type" in err and "use one of dir, git, archive" in err
    assert "Traceback" not in err


def test_dry_run_counts_the_repositories_it_would_build_from(tmp_path, monkeypatch, capsys):
    for name in ("a", "b"):
        (tmp_path / "repos" / name).mkdir(parents=True)
        (tmp_path / "repos" / name / "m.py").write_text("x = 1\n")
    source = f"{{type: dir, path: {tmp_path / 'repos'}, layout: repos}}"
    code, out, err = _dry_run(tmp_path, monkeypatch, capsys, source)
    assert code == 0, err
    assert "to build from 2 repositories" in " ".join(out.split())
