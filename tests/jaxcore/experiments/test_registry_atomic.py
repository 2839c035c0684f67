"""A registration is all or nothing on disk: a failed or killed one leaves no files that
a later version picks up, and "latest" never resolves to a version whose files were
never written."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from jaxcore.errors import ConfigError
from jaxcore.experiments import Registry


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(f"sqlite:///{tmp_path}/store/jaxcore.db")


def _state_ckpt(path: pathlib.Path, value: int) -> pathlib.Path:
    """A plain-Python checkpoint step directory (what ``ctx.checkpoint({...})`` writes)."""
    path.mkdir()
    (path / "state.json").write_text(json.dumps({"state": {"a": value}}))
    return path


def test_a_failed_registration_leaves_no_files_for_the_next_version(registry, tmp_path):
    registry.create_model("m")
    broken = tmp_path / "torn-checkpoint"
    (broken / "meta").mkdir(parents=True)
    (broken / "meta" / "metadata").write_text("{")  # the export fails after config.json
    with pytest.raises(ValueError):
        registry.register("m", checkpoint=str(broken), model_config={"d_model": 999})
    # The next registration gets the freed number; it was given no model config, so its
    # folder must not hold the failed attempt's config.json.
    v = registry.register("m", checkpoint=str(_state_ckpt(tmp_path / "ok", 1)))
    folder = pathlib.Path(registry.version("m", v)["path"]).parent
    assert sorted(p.name for p in folder.iterdir()) == ["state.json"]
    assert registry.load("m") == {"a": 1}
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no staging left


CHILD = textwrap.dedent(
    """
    import os, sys, time
    from jaxcore.experiments import registry as reg

    real_copy = reg.shutil.copy

    def copy_then_stop(src, dst):
        real_copy(src, dst)
        print("PAUSED", flush=True)  # the parent kills us here, files half written
        time.sleep(600)

    reg.shutil.copy = copy_then_stop
    r = reg.Registry(sys.argv[1])
    r.register("m", checkpoint=sys.argv[2], tokenizer=sys.argv[3])
    """
)


def test_a_registration_killed_midway_is_never_resolved_and_the_next_one_works(registry, tmp_path):
    registry.create_model("m")
    registry.register("m", checkpoint=str(_state_ckpt(tmp_path / "c1", 1)))
    tokenizer = tmp_path / "tok.json"
    tokenizer.write_text("{}")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            registry.store.url,
            str(_state_ckpt(tmp_path / "c2", 2)),
            str(tokenizer),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        assert child.stdout.readline().strip() == "PAUSED"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)

    # Version 2's row exists, its files never finished: "latest" is still version 1.
    assert registry.load("m") == {"a": 1}
    assert registry.version("m")["version"] == 1
    with pytest.raises(ConfigError, match=r"version 2 .*did not finish.*register"):
        registry.version("m", 2)
    assert not (registry.directory / "m" / "v2").exists()

    v = registry.register("m", checkpoint=str(_state_ckpt(tmp_path / "c3", 3)))
    assert v == 3 and registry.load("m") == {"a": 3}
    assert registry.load("m", 1) == {"a": 1}


def test_a_folder_that_is_no_checkpoint_step_is_named_from_the_cli(tmp_path, capsys):
    """``jaxcore model register m <dir>`` on a folder without a step's files: one line
    saying what to pass (was a FileNotFoundError traceback about meta/metadata)."""
    from jaxcore.experiments.cli import main

    db = f"sqlite:///{tmp_path}/s/jaxcore.db"
    (tmp_path / "empty").mkdir()
    assert main(["model", "create", "m", "--db", db]) == 0
    assert main(["model", "register", "m", str(tmp_path / "empty"), "--db", db]) == 2
    err = capsys.readouterr().err
    assert "not a checkpoint step directory" in err and "Traceback" not in err
