"""Experiments stop 39: a trial that stops because it was preempted (the experiment
paused, or SIGTERM from a cluster) is paused or requeued, not recorded as ended; and
``trial_timeout`` stops a hung trial and restarts it from its latest checkpoint."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml

from jaxcore.errors import ConfigError
from jaxcore.experiments import ExperimentLoop, Store, parse_config
from jaxcore.experiments import experiment as experiment_module
from jaxcore.experiments.cli import main

HERE = pathlib.Path(__file__)
MAX_STEPS = 6


# ------------------------------------------------------------------ trial functions
def _barrier(ctx, name: str) -> pathlib.Path:
    return pathlib.Path(ctx.config["workdir"]) / f"{name}-{ctx.trial_id}"


def breaks_on_preemption(ctx):
    """The documented loop (``if ctx.should_stop() or ctx.preempted(): break``). Its
    first run reports at step 2, checkpoints, writes ``<workdir>/at3-<trial>`` at step 3
    and waits there until it is preempted; a resumed run goes on to the end."""
    state = ctx.restore()
    first_run = state is None
    _barrier(ctx, "starts").open("a").write(f"{ctx.start_step}\n")
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        if step == 2 or step == ctx.max_steps:
            ctx.report(step, {"loss": 1.0 / step})
            ctx.checkpoint({"step": step}, step=step)
        if step == 3 and first_run:
            _barrier(ctx, "at3").write_text(str(os.getpid()))
            while not ctx.preempted():
                time.sleep(0.02)
        if ctx.should_stop() or ctx.preempted():
            break


def hangs(ctx):
    """``mode`` hang_once: the first run hangs at step 1 (until SIGTERM), the restart
    finishes. ``mode`` ignore_term: every run hangs and ignores SIGTERM."""
    if ctx.hparams["mode"] == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    mark = _barrier(ctx, "hung")
    if not mark.exists():
        mark.touch()
        while not ctx.preempted():  # a stuck collective that SIGTERM still reaches
            time.sleep(0.02)
        return
    ctx.report(1, {"loss": 0.5})


# ------------------------------------------------------------------ helpers
def _raw(tmp_path, fn: str, **extra) -> dict:
    return {
        "name": fn,
        "entrypoint": f"{HERE}:{fn}",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"x": 1.0},
        "searcher": {"name": "single", "metric": "loss", "max_length": MAX_STEPS},
        **extra,
    }


def _wait(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _trial(db: str) -> dict:
    store = Store(db, create=False)
    try:
        return store.trials(1)[0]
    finally:
        store.close()


# ------------------------------------------------------------------ preempted trials
@pytest.mark.parametrize("how", ["pause", "sigterm"])
def test_a_trial_that_breaks_out_when_preempted_is_resumed_not_ended(tmp_path, how):
    """It used to be recorded COMPLETED at step 2 of 6 (ERRORED when it had not reported
    yet): the runner marked every return as the trial's end."""
    raw = _raw(tmp_path, "breaks_on_preemption")
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    db = parse_config(raw).database_url
    cli = [sys.executable, "-m", "jaxcore.cli", "experiment"]
    loop = subprocess.Popen(
        [*cli, "create", str(path), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        at3 = tmp_path / "work" / "at3-1"
        _wait(at3.exists, "the trial at step 3")
        if how == "pause":
            subprocess.run([*cli, "pause", "1", "--db", db], check=True, capture_output=True)
            assert _wait(lambda: _trial(db)["state"] == "PAUSED", "PAUSED")
            assert _trial(db)["steps_done"] == 2
            subprocess.run([*cli, "resume", "1", "--db", db], check=True, capture_output=True)
        else:  # a cluster's preemption of the trial's process, the experiment active
            os.kill(int(_wait(at3.read_text, "the trial's pid")), signal.SIGTERM)
        out, _ = loop.communicate(timeout=120)
    finally:
        loop.kill()
    assert loop.returncode == 0, out
    trial = _trial(db)
    assert (trial["state"], trial["steps_done"], trial["restarts"]) == ("COMPLETED", 6, 0)
    # Two runs: the second continued from the step-2 checkpoint.
    assert (tmp_path / "work" / "starts-1").read_text().split() == ["0", "2"]


# ------------------------------------------------------------------ trial_timeout
def test_trial_timeout_stops_a_hung_trial_and_restarts_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(experiment_module, "TIMEOUT_GRACE_S", 0.5)
    raw = _raw(
        tmp_path,
        "hangs",
        hyperparameters={"mode": {"type": "categorical", "vals": ["hang_once", "ignore_term"]}},
        searcher={"name": "grid", "metric": "loss", "max_length": 1, "max_concurrent_trials": 2},
        max_restarts=1,
        trial_timeout=6,
    )
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    code = main(["experiment", "create", str(path), "--executor", "local", "--quiet"])
    took = time.monotonic() - started
    store = Store(parse_config(raw).database_url, create=False)
    try:
        by_mode = {t["hparams"]["mode"]: t for t in store.trials(1)}
        exp = store.experiments()[0]
    finally:
        store.close()
    assert code == 0 and exp["state"] == "COMPLETED"
    once, stubborn = by_mode["hang_once"], by_mode["ignore_term"]
    # SIGTERM reached it: its preemption exit counted as a failure, and the restart ran.
    assert (once["state"], once["restarts"], once["exit_code"]) == ("COMPLETED", 1, 0)
    # It ignored SIGTERM: SIGKILL after the grace, twice (the launch and its restart).
    assert (stubborn["state"], stubborn["restarts"]) == ("ERRORED", 1)
    assert stubborn["exit_code"] == -signal.SIGKILL
    assert took < 60, took  # two timeouts of 6 s each, not a hang
    log = next((tmp_path / "work").glob(f"*/trial-{stubborn['id']}/logs.txt")).read_text()
    assert log.count("has run for more than trial_timeout (6 s)") == 2
    assert "ran past trial_timeout (6 s) and was stopped, failed 2 times" in caplog.text


@pytest.mark.parametrize("bad", [0, -1, "1h", True, float("nan"), float("inf")])
def test_a_bad_trial_timeout_is_refused_naming_it(tmp_path, bad):
    with pytest.raises(ConfigError, match="trial_timeout"):
        parse_config(_raw(tmp_path, "hangs", trial_timeout=bad))


def test_trial_timeout_with_inline_trials_is_refused(tmp_path):
    config = parse_config(_raw(tmp_path, "hangs", trial_timeout=10))
    with pytest.raises(ConfigError, match="inline executor runs them in this one"):
        ExperimentLoop(config, executor="inline")
