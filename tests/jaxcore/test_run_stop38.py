"""`jaxcore run --dry-run` stop 38: the plan checks the data sources the data phase would
read, so a wrong path is found before a long job is launched, not by it."""

from __future__ import annotations

from tests.jaxcore.test_run import DEMO
from tests.jaxcore.test_run_stop37 import TINY


def test_dry_run_refuses_a_missing_source_path(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no-such-dir"
    from jaxcore.run.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(
        [
            str(DEMO),
            "--dry-run",
            *(x for s in TINY for x in ("--set", s)),
            "--set",
            "data.packages=[]",
            "--set",
            f"data.sources=[{{type: dir, path: {missing}}}]",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert f"source path {missing} does not exist" in err and "Traceback" not in err
    assert "AOT memory" not in out  # refused before the plan is printed as if runnable


def test_dry_run_refuses_a_bad_source_entry_naming_the_field(tmp_path, monkeypatch, capsys):
    from jaxcore.run.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    code = main(
        [
            str(DEMO),
            "--dry-run",
            *(x for s in TINY for x in ("--set", s)),
            "--set",
            "data.packages=[]",
            "--set",
            f"data.sources=[{{type: folder, path: {tmp_path / 'repo'}}}]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "sources[].type" in err and "use one of dir, git, archive" in err
    assert "Traceback" not in err
