"""The README's experiments commands, one step off their path (stop 42): Ctrl-C during
`experiment create`, `model register` with a relative checkpoint folder, `trial logs` of
a trial that ran inline, an entrypoint path that is relative to another folder."""

from __future__ import annotations

import json
import pathlib
import textwrap

import numpy as np
import yaml

from jaxcore.experiments.cli import main

# A trial without JAX: it reports, checkpoints, then is "interrupted" (the KeyboardInterrupt
# Ctrl-C raises) at step 2 while the file INTERRUPT exists beside it; without the file it
# resumes from its checkpoint and completes.
TRIAL = textwrap.dedent(
    """
    import pathlib

    HERE = pathlib.Path(__file__).parent


    def train(ctx):
        start = ctx.start_step
        for step in range(start + 1, ctx.max_steps + 1):
            ctx.report(step, {"val_loss": 1.0 / step})
            ctx.checkpoint({"step": step}, step=step)
            if step == 2 and (HERE / "INTERRUPT").exists():
                raise KeyboardInterrupt
    """
)


def _config(tmp_path: pathlib.Path, entry: str) -> pathlib.Path:
    cfg = {
        "name": "ctrl-c",
        "entrypoint": entry,
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"lr": 0.1},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 4},
    }
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_ctrl_c_during_create_is_one_line_naming_the_resume(tmp_path, capsys):
    """Ctrl-C in `experiment create` printed a KeyboardInterrupt traceback from the loop's
    sleep; now one line (exit 130) saying the experiment stays ACTIVE and the exact resume
    command, which then completes it from the trial's checkpoint."""
    (tmp_path / "trial.py").write_text(TRIAL)
    (tmp_path / "INTERRUPT").touch()
    cfg = _config(tmp_path, f"{tmp_path / 'trial.py'}:train")
    db = f"sqlite:///{tmp_path / 'work' / 'jaxcore.db'}"
    assert main(["experiment", "create", str(cfg), "--executor", "inline", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = [x for x in err.splitlines() if "interrupted" in x]
    assert len(line) == 1 and "experiment 1 stays ACTIVE" in line[0], err
    assert f"jaxcore experiment resume 1 --db {db}" in line[0]
    # The advice works: the resume (here inline) continues from step 2 and completes.
    (tmp_path / "INTERRUPT").unlink()
    assert main(["experiment", "resume", "1", "--db", db, "--executor", "inline"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["state"] == "COMPLETED"
    # trial logs of an inline trial: it wrote no file; say why instead of "no logs yet".
    assert main(["trial", "logs", "1", "--db", db]) == 1
    err = capsys.readouterr().err
    assert "no logs yet" not in err and "ran inside the command that launched it" in err


def test_an_entrypoint_path_relative_to_another_folder_names_the_folder(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "trial.py").write_text(TRIAL)
    cfg = _config(tmp_path, "trial.py:train")
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    assert main(["experiment", "create", str(cfg), "--executor", "inline"]) == 2
    err = capsys.readouterr().err
    assert f"trial.py does not exist in {sub}" in err and "absolute path" in err


def _orbax_step(step_dir: pathlib.Path) -> None:
    """A checkpoint step folder as `jaxcore.Checkpointer` lays it out (``state`` written by
    Orbax, ``meta/metadata`` with the leaves' shapes), without a model or an engine."""
    import orbax.checkpoint as ocp

    params = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    with ocp.PyTreeCheckpointer() as ckptr:
        ckptr.save(step_dir.absolute() / "state", params)
    (step_dir / "meta").mkdir()
    record = {"leaves": {"params/w": [[2, 3], "float32"]}, "step": 7}
    (step_dir / "meta" / "metadata").write_text(json.dumps(record))


def test_model_register_takes_a_relative_checkpoint_folder(tmp_path, capsys, monkeypatch):
    """`jaxcore model register m runs/7` (a path relative to the current folder) was an
    Orbax ValueError traceback ("Checkpoint path should be absolute")."""
    from jaxcore.experiments import Registry

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    _orbax_step(tmp_path / "runs" / "7")
    db = f"sqlite:///{tmp_path / 'store' / 'jaxcore.db'}"
    assert main(["model", "create", "m", "--db", db]) == 0
    assert main(["model", "register", "m", "runs/7", "--alias", "prod", "--db", db]) == 0
    reg = Registry(db)
    try:
        params = reg.load("m", "prod")
        np.testing.assert_array_equal(params["w"], np.arange(6).reshape(2, 3))
        lineage = reg.version("m", "prod")["meta"]["lineage"]
        assert lineage["source_path"] == str(tmp_path / "runs" / "7")
    finally:
        reg.store.close()


def test_a_relative_dataset_in_a_versions_metadata_links_on_the_dashboard(tmp_path, monkeypatch):
    """README: ``Registry.register(..., metadata={"dataset": "out/v2"})``. The models page
    links a lineage's dataset when its path starts with a `--datasets` root (models.js
    ``datasetLink``); the relative path was stored as written, so it never did."""
    from fastapi.testclient import TestClient

    from jaxcore.experiments import Registry
    from jaxcore.ui import create_app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "v2").mkdir(parents=True)
    step = tmp_path / "ckpt"
    step.mkdir()
    (step / "state.json").write_text(json.dumps({"state": {"a": 1}}))
    db = f"sqlite:///{tmp_path / 'store' / 'jaxcore.db'}"
    reg = Registry(db)
    try:
        reg.create_model("m")
        reg.register("m", checkpoint=str(step), metadata={"dataset": "out/v2"})
        reg.register("m", checkpoint=str(step), metadata={"dataset": {"path": "out/v2", "n": 1}})
        reg.register("m", checkpoint=str(step), metadata={"dataset": "hub:org/set"})  # no folder
    finally:
        reg.store.close()
    body = TestClient(create_app(db, datasets=[tmp_path / "out"])).get("/api/models").json()
    root = body["datasets"]["out"]
    got = [v["lineage"]["dataset"] for v in body["models"][0]["versions"]]
    assert got[:2] == [f"{root}/v2", f"{root}/v2"] and got[2] == "hub:org/set", got


def test_a_token_file_on_a_local_bind_is_required_not_dropped(tmp_path, monkeypatch):
    """`jaxcore ui --token-file tok` on 127.0.0.1 printed "no token (local bind)" and served
    every route without it: the explicit token was dropped."""
    import argparse

    from jaxcore.ui.auth import TOKEN_ENV
    from jaxcore.ui.cli import resolve

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token = "s3cret-token-0123456789"
    (tmp_path / "tok").write_text(token + "\n")
    args = dict(workdir=str(tmp_path), db=None, datasets=[], port=0, require_token=False)
    for host in ("127.0.0.1", "127.0.0.2", "localhost"):
        ns = argparse.Namespace(**args, host=host, token_file=str(tmp_path / "tok"))
        assert resolve(ns)[1] == token
    monkeypatch.setenv(TOKEN_ENV, token)  # only in the environment: a local bind ignores it
    assert resolve(argparse.Namespace(**args, host="127.0.0.1", token_file=None))[1] is None


def test_ui_datasets_given_a_version_folder_names_the_output_dir(tmp_path, capsys, monkeypatch):
    """`jaxcore ui --datasets out/v1` (a version, not the output_dir the README shows)
    served an empty "v1" dataset without a word."""
    import uvicorn

    from jaxcore.ui.cli import main as ui_main

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))

    (tmp_path / "out" / "v1").mkdir(parents=True)
    (tmp_path / "out" / "v1" / "manifest.json").write_text("{}")
    argv = ["--workdir", str(tmp_path / "work"), "--datasets", str(tmp_path / "out" / "v1")]
    assert ui_main(argv) == 2 and not served  # refused before serving
    err = capsys.readouterr().err
    assert f"give its output_dir: --datasets {tmp_path / 'out'}" in err
    from jaxcore.ui.cli import check_datasets

    notes = check_datasets([str(tmp_path / "out"), str(tmp_path / "later")])
    assert len(notes) == 1 and f"no folder {tmp_path / 'later'} yet" in notes[0]


def test_ray_address_auto_without_a_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    """README: `jaxcore experiment create x.yaml --executor ray --ray-address auto`. With
    no cluster running, Ray's ConnectionError came out as a traceback. Ray itself is
    replaced by a stand-in raising what ray 2.60's `ray.init(address="auto")` raises there
    (seen on this machine), to keep the test from importing Ray."""
    import sys
    import types

    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False

    def init(address=None, **kw):
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect "
            "to by setting `--address` flag or `RAY_ADDRESS` environment variable."
        )

    fake.init = init
    monkeypatch.setitem(sys.modules, "ray", fake)
    (tmp_path / "trial.py").write_text(TRIAL)
    cfg = _config(tmp_path, f"{tmp_path / 'trial.py'}:train")
    argv = ["experiment", "create", str(cfg), "--executor", "ray", "--ray-address", "auto"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--ray-address auto: Could not find any running Ray instance" in err
    assert "ray start --head" in err and "Traceback" not in err
    monkeypatch.setitem(sys.modules, "ray", None)  # not installed
    assert main(argv) == 2
    assert "Ray is not installed here" in capsys.readouterr().err
