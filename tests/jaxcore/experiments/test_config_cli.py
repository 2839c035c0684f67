"""Bad configs are rejected before any trial starts; early stopping; the command line."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

import jaxcore as jc
from jaxcore.experiments import (
    EarlyStopping,
    EarlyStoppingConfig,
    Store,
    parse_config,
    run_experiment,
)
from jaxcore.experiments.cli import main
from jaxcore.experiments.trial_context import trial_dir

GOOD = {
    "name": "x",
    "entrypoint": "m:f",
    "searcher": {"name": "random", "metric": "loss", "max_length": 4, "max_trials": 2},
}


@pytest.mark.parametrize(
    "patch,field",
    [
        ({"searcher": {"name": "hyperband9", "metric": "loss", "max_length": 4}}, "searcher.name"),
        ({"searcher": {"name": "random", "max_length": 4, "max_trials": 2}}, "searcher.metric"),
        (
            {
                "hyperparameters": {
                    "lr": {"type": "double", "minval": 0.0, "maxval": 1.0, "log": True}
                }
            },
            "hyperparameters.lr.minval",
        ),
        (
            {
                "hyperparameters": {
                    "lr": {"type": "double", "minval": -1, "maxval": 1e-2, "log": True}
                }
            },
            "hyperparameters.lr.minval",
        ),
        (
            {"searcher": {"name": "random", "metric": "loss", "max_length": 4}},
            "searcher.max_trials",
        ),
        (
            {
                "searcher": {
                    "name": "adaptive_asha",
                    "metric": "loss",
                    "max_length": 4,
                    "max_trials": 4,
                    "mode": "reckless",
                }
            },
            "searcher.mode",
        ),
        (
            {
                "hyperparameters": {"a": {"type": "int", "minval": 1, "maxval": 3}},
                "searcher": {"name": "grid", "metric": "loss", "max_length": 4},
            },
            "hyperparameters.a.count",
        ),
        ({"checkpoint_storage": {"save_trial_latest": -1}}, "checkpoint_storage.save_trial_latest"),
        ({"resources": {"devices": 0}}, "resources.devices"),
        ({"searchr": {}}, "searchr"),
        ({"max_restarts": "3"}, "max_restarts"),
    ],
)
def test_invalid_config_names_the_field(patch, field):
    with pytest.raises(jc.ConfigError, match=field.replace(".", r"\.")):
        parse_config({**GOOD, **patch})


def test_invalid_config_rejected_before_any_trial(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    work = tmp_path / "work"
    bad.write_text(
        yaml.safe_dump(
            {
                **GOOD,
                "workdir": str(work),
                "searcher": {"name": "random", "max_length": 4, "max_trials": 2},
            }
        )
    )
    assert main(["experiment", "create", str(bad)]) == 2
    assert "searcher.metric" in capsys.readouterr().err
    assert not work.exists()  # no store, no trial


def test_early_stopping_policies():
    p = EarlyStopping(EarlyStoppingConfig(metric="loss", patience=2, min_delta=0.1))
    assert [p.update({"loss": v}) is None for v in (1.0, 0.95, 0.5, 0.45)] == [True] * 4
    assert p.update({"loss": 0.44}) is not None  # 2 reports without a 0.1 improvement
    t = EarlyStopping(EarlyStoppingConfig(metric="acc", smaller_is_better=False, threshold=0.9))
    assert t.update({"acc": 0.5}) is None and t.update({"other": 1}) is None
    assert "threshold" in t.update({"acc": 0.95})


def test_patience_stops_trials_in_a_search(raw_config):
    raw = raw_config(
        "ckpt_curve",
        {"name": "grid", "metric": "loss", "max_length": 40},
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 2}},
        early_stopping={"metric": "loss", "patience": 2},
    )
    out = run_experiment(raw, executor="inline")
    assert all(t["state"] == "STOPPED" and t["steps_done"] < 40 for t in out.trials)


def test_median_pruner_stops_bad_bayesian_trials(raw_config):
    raw = raw_config(
        "every_step_quad",
        {
            "name": "bayesian",
            "metric": "loss",
            "max_length": 8,
            "max_trials": 14,
            "pruner": "median",
            "n_startup_trials": 4,
            "seed": 0,
            "max_concurrent_trials": 1,
        },
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
    )
    out = run_experiment(raw, executor="inline")
    assert len(out.trials) == 14
    stopped = [t for t in out.trials if t["state"] == "STOPPED"]
    assert stopped and all(t["steps_done"] < 8 for t in stopped)


def _write(tmp_path, raw) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_cli_train_list_describe_logs_models(raw_config, tmp_path, capsys, monkeypatch):
    raw = raw_config(
        "ckpt_curve",
        {"name": "grid", "metric": "loss", "max_length": 6},
        {"x": {"type": "double", "minval": 0.2, "maxval": 0.8, "count": 2}},
    )
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("JAXCORE_DB_URL", db)
    cfg = _write(tmp_path, raw)
    assert main(["experiment", "preview", cfg]) == 0
    assert json.loads(capsys.readouterr().out)["trials"] == 2
    assert main(["train", cfg]) == 0  # one trial, inline
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["state"] == "COMPLETED" and out["steps"] == 6
    assert main(["experiment", "create", cfg, "--executor", "inline", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["experiment", "list"]) == 0
    listing = capsys.readouterr().out
    assert "ckpt_curve" in listing and "COMPLETED" in listing
    assert main(["experiment", "describe", "2"]) == 0
    assert "trial" in capsys.readouterr().out
    store = Store(db)
    trial = store.trials(2)[0]
    log = trial_dir(store.experiment(2), trial["id"]) / "logs.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("hello from the trial\n")
    assert main(["trial", "logs", str(trial["id"])]) == 0
    assert "hello from the trial" in capsys.readouterr().out
    ckpt = store.checkpoints(trial_id=trial["id"], state="COMPLETED")[-1]
    assert main(["model", "create", "curve", "--description", "d"]) == 0
    assert main(["model", "register", "curve", str(ckpt["id"]), "--alias", "production"]) == 0
    assert main(["model", "list"]) == 0
    assert "curve" in capsys.readouterr().out
    assert main(["model", "describe", "curve"]) == 0
    assert "production" in capsys.readouterr().out
    assert jc_load(db) == {"x": trial["hparams"]["x"], "step": ckpt["step"]}
    assert main(["model", "create", "curve"]) == 2  # already exists: a clear error


def jc_load(db):
    from jaxcore.experiments import registry

    return registry.load("curve", "production", db=db)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_cli_pause_resume_kill(raw_config, tmp_path):
    """A running search (another process) is paused, resumed and killed from the CLI."""
    import subprocess
    import sys
    import time

    raw = raw_config(
        "slow_steps",
        {"name": "grid", "metric": "loss", "max_length": 200},
        {"k": {"type": "categorical", "vals": [1]}},
        resources={"devices": 1, "slots": 1},
    )
    cfg = _write(tmp_path, raw)
    db = parse_config(raw).database_url
    env = {**os.environ, "JAXCORE_DB_URL": db}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxcore.experiments.cli", "experiment", "create", cfg, "--quiet"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        store = _wait_store(db)

        def trial():
            rows = store.trials(1)
            return rows[0] if rows else {}

        _wait(lambda: trial().get("steps_done", 0) >= 3)
        assert main(["experiment", "pause", "1", "--db", db]) == 0
        _wait(lambda: trial().get("state") == "PAUSED")
        paused_at = trial()["steps_done"]
        time.sleep(1.0)
        assert trial()["steps_done"] == paused_at  # nothing runs while paused
        assert main(["experiment", "resume", "1", "--db", db]) == 0
        _wait(lambda: trial().get("steps_done", 0) > paused_at + 2)
        # resumed from its checkpoint, not from scratch
        steps = [m["step"] for m in store.metrics(trial()["id"])]
        assert steps.count(1) == 1
        assert main(["experiment", "kill", "1", "--db", db]) == 0
        assert proc.wait(timeout=60) == 0
        assert store.experiment(1)["state"] == "CANCELED"
        assert trial()["state"] == "CANCELED"
    finally:
        if proc.poll() is None:
            proc.kill()


def _wait_store(db):
    _wait(lambda: os.path.exists(db.removeprefix("sqlite:///")))
    store = Store(db)
    _wait(lambda: store.experiment(1) is not None)
    return store


def _wait(cond, timeout=90.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize(
    "path",
    sorted((pathlib.Path(__file__).parents[3] / "configs" / "experiments").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_example_configs_are_valid(path, capsys):
    from jaxcore.experiments import load_config

    cfg = load_config(path)
    assert cfg.entrypoint == "jaxcore.experiments.tinylm:train"
    assert main(["experiment", "preview", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["trials"] >= 1


def test_stored_config_round_trips(raw_config):
    from jaxcore.experiments.config import to_dict

    cfg = parse_config(
        raw_config(
            "asha_quad",
            {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_length": 64,
                "max_trials": 8,
                "bracket_rungs": [2, 3],
            },
            {
                "lr": {"type": "double", "minval": 1e-4, "maxval": 1e-1, "log": True},
                "n": {"type": "int", "minval": 1, "maxval": 4, "count": 2},
                "opt": {"type": "categorical", "vals": ["adam", "sgd"]},
                "seq": 32,
            },
            early_stopping={"metric": "loss", "patience": 3},
        )
    )
    assert parse_config(to_dict(cfg)) == cfg


def test_device_slots_are_split_between_trials():
    from jaxcore.experiments.trial_executors import SubprocessTrialExecutor, trial_env

    ex = SubprocessTrialExecutor(devices_per_trial=2, slots=8, platform="gpu")
    assert ex.capacity() == 4
    assert trial_env("gpu", [2, 3], {})["CUDA_VISIBLE_DEVICES"] == "2,3"
    env = trial_env(
        "cpu", [0, 1, 2], {"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=8"}
    )
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=3"
    assert env["JAX_PLATFORMS"] == "cpu"


def test_resume_after_the_loop_died(raw_config, monkeypatch):
    """`experiment resume` restarts a dead loop from the searcher snapshot in the store."""
    from jaxcore.experiments.experiment import ExperimentLoop

    raw = raw_config(
        "asha_quad",
        {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_length": 64,
            "max_trials": 12,
            "mode": "aggressive",
            "seed": 5,
        },
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
    )
    cfg = parse_config(raw)
    loop = ExperimentLoop(cfg, executor="inline")
    for _ in range(4):  # four trials run, then the loop "dies"
        loop.step()
    loop._beat(force=True)
    store = loop.store
    store.update_experiment(loop.exp_id, heartbeat=0.0)
    before = {t["id"]: t["state"] for t in store.trials(loop.exp_id)}
    assert sum(s in ("COMPLETED", "STOPPED") for s in before.values()) == 4
    monkeypatch.setenv("JAXCORE_DB_URL", cfg.database_url)
    assert main(["experiment", "resume", str(loop.exp_id), "--executor", "inline", "--quiet"]) == 0
    trials = store.trials(loop.exp_id)
    assert len(trials) == 12  # the snapshot knew how many it had created
    assert all(t["state"] in ("COMPLETED", "STOPPED") for t in trials)
    assert store.experiment(loop.exp_id)["state"] == "COMPLETED"


def test_a_config_that_is_not_a_mapping_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- name\n- searcher\n")
    assert main(["experiment", "preview", str(path)]) == 2
    assert "the top level is a list, not a mapping" in capsys.readouterr().err
