"""Experiments stop 38, the trial loop off the tested path: diverged (NaN/inf) metrics in
the searchers' rankings, trials that end without reporting the searcher metric, resumes
with a changed search, and kill -9 of the loop at seeded pause points of its trials."""

from __future__ import annotations

import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml

from jaxcore.errors import ConfigError
from jaxcore.experiments import ExperimentLoop, Store, parse_config
from jaxcore.experiments.cli import main
from jaxcore.experiments.searchers import Continue, Create, Stop, make_searcher

HERE = pathlib.Path(__file__)
X = {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}}


# ------------------------------------------------------------------ trial functions
def return_nan(ctx):
    return float("nan")  # an Optuna-style objective: the search never sees it


def return_label(ctx):
    return "abc"


def return_nothing(ctx):
    return None


def exit_zero(ctx):
    sys.exit(0)


def report_nan(ctx):
    ctx.report(1, {"loss": float("nan")})  # a run that diverged


def interrupted_once(ctx):
    """Reports ``x``; trial 2's first run interrupts the loop (Ctrl-C) before reporting."""
    marker = pathlib.Path(ctx.config["workdir"]) / "interrupted"
    if ctx.trial_id == 2 and not marker.exists():
        marker.touch()
        raise KeyboardInterrupt("the loop is stopped here")
    ctx.report(1, {"loss": ctx.hparams["x"]})


def paused_trial(ctx):
    """Trains to ``max_steps``, logging each step once its checkpoint is saved.

    At the point ``$JAXCORE_TEST_PAUSE`` = ``<trial>:<step>:<phase>`` it writes
    ``<workdir>/paused`` and waits on an event that never fires: the test kills the
    loop there, at a moment chosen by the test, not by timing.
    """
    import threading

    workdir = pathlib.Path(ctx.config["workdir"])
    pause = os.environ.get("JAXCORE_TEST_PAUSE", "")

    def point(step: int, phase: str) -> None:
        if pause == f"{ctx.trial_id}:{step}:{phase}":
            (workdir / "paused").write_text(pause)
            threading.Event().wait()

    state = ctx.restore() or {"loss": math.inf}
    x = ctx.hparams["x"]
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        state["loss"] = (x - 0.3) ** 2 + 1.0 / step
        point(step, "report")
        ctx.report(step, {"loss": state["loss"]})
        point(step, "checkpoint")
        ctx.checkpoint(state, step=step)
        with open(workdir / "trained.log", "a") as f:
            f.write(f"{ctx.trial_id} {step}\n")
        point(step, "after")
        if ctx.should_stop():
            break


def gated_finish(ctx):
    """Two steps; under ``$JAXCORE_TEST_PAUSE`` trial 1 waits for ``go-1`` before it
    returns and trial 2 blocks for good after its first report. Each return is logged."""
    import threading

    workdir = pathlib.Path(ctx.config["workdir"])
    gated = bool(os.environ.get("JAXCORE_TEST_PAUSE"))
    ctx.restore()
    for step in range(ctx.start_step + 1, ctx.max_steps + 1):
        ctx.report(step, {"loss": ctx.hparams["x"] + 1.0 / step})
        ctx.checkpoint({"step": step}, step=step)
        if gated and ctx.trial_id == 2:
            (workdir / "paused-2").touch()
            threading.Event().wait()
    if gated and ctx.trial_id == 1:
        (workdir / "waiting-1").touch()
        while not (workdir / "go-1").exists():  # the test's signal, after it stops the loop
            time.sleep(0.01)
    with open(workdir / "returned.log", "a") as f:
        f.write(f"{ctx.trial_id}\n")


def _raw(tmp_path, fn: str, searcher: dict, **extra) -> dict:
    return {
        "name": fn,
        "entrypoint": f"{HERE}:{fn}",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": X,
        "searcher": {"metric": "loss", "max_length": 1, "seed": 0, **searcher},
        **extra,
    }


# ------------------------------------------------------------------ NaN / inf metrics
def _searcher(tmp_path, **searcher):
    config = parse_config(_raw(tmp_path, "paused_trial", searcher))
    s = make_searcher(config, study_name="stop38")
    for trial_id, action in enumerate(s.initial(), 1):
        s.created(trial_id, action)
    return s


def test_asha_does_not_promote_a_diverged_trial(tmp_path):
    s = _searcher(
        tmp_path,
        name="adaptive_asha",
        max_length=4,
        max_trials=4,
        divisor=2,
        mode="aggressive",
        max_concurrent_trials=4,
    )
    rung = s.plan[0]["units"][0]
    assert s.validation(1, rung, 1.0) == []  # the first of the rung continues
    # NaN compares false with everything: it used to sort first and continue.
    assert Stop(2) in s.validation(2, rung, float("nan"))
    assert s.validation(3, rung, 0.5) == []  # a real result still beats the rung's best


def test_pbt_neither_keeps_nor_clones_a_diverged_member(tmp_path):
    s = _searcher(
        tmp_path,
        name="pbt",
        population_size=4,
        num_rounds=2,
        length_per_round=1,
        truncate_fraction=0.25,
    )
    for trial_id, loss in ((1, float("nan")), (2, 1.0), (3, 2.0), (4, 3.0)):
        s.validation(trial_id, 1, loss)
    actions = [a for t in (1, 2, 3, 4) for a in s.exited(t)]
    continued = {a.trial_id for a in actions if isinstance(a, Continue)}
    parents = {a.source_trial for a in actions if isinstance(a, Create)}
    assert continued == {2, 3, 4}
    assert parents == {2}


def test_bayesian_does_not_tell_optuna_an_infinite_value(tmp_path):
    s = _searcher(
        tmp_path, name="bayesian", max_trials=2, smaller_is_better=False, n_startup_trials=1
    )
    s.validation(1, 1, math.inf)  # a diverged accuracy would be the study's best
    s.validation(2, 1, 0.5)
    s.exited(1)
    s.exited(2)
    assert s.study.best_value == 0.5
    assert s.study.trials[0].state.name == "FAIL"


# ------------------------------------------------------------------ never reported
def _create_inline(tmp_path, raw: dict) -> tuple[int, dict, list[dict]]:
    """``jaxcore experiment create`` of ``raw`` with inline trials: (exit code, the
    experiment row, its trial rows)."""
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = main(["experiment", "create", str(path), "--executor", "inline", "--quiet"])
    store = Store(parse_config(raw).database_url)
    try:
        (exp,) = store.experiments()
        return code, exp, store.trials(exp["id"])
    finally:
        store.close()


@pytest.mark.parametrize("fn", ["return_nan", "return_label", "return_nothing", "exit_zero"])
def test_a_trial_that_never_reports_the_metric_is_errored(tmp_path, capsys, fn):
    raw = _raw(tmp_path, fn, {"name": "random", "max_trials": 2}, max_restarts=3)
    # It used to end COMPLETED (exit 0) with no best trial and no metric at all.
    code, exp, trials = _create_inline(tmp_path, raw)
    assert code == 1 and exp["state"] == "FAILED"
    assert [t["state"] for t in trials] == ["ERRORED", "ERRORED"]
    assert [t["restarts"] for t in trials] == [0, 0]  # a rerun would end the same way
    assert capsys.readouterr().out.endswith('"best_metric": null, "steps": 0}\n')
    log = next((tmp_path / "work").glob("*/trial-1/logs.txt")).read_text()
    assert "without reporting the searcher metric 'loss'" in log
    assert "ctx.report(step, {'loss': value})" in log


def test_a_subprocess_trial_that_returns_its_objective_is_told_so(tmp_path):
    raw = _raw(tmp_path, "return_nan", {"name": "single"})
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["experiment", "create", str(path), "--quiet"]) == 1
    log = next((tmp_path / "work").glob("*/trial-1/logs.txt")).read_text()
    assert "the trial function returned nan, which the search ignores" in log
    assert "exited without reporting the searcher metric 'loss'" in log


# ------------------------------------------------------------------ changed search
def _interrupted(tmp_path) -> tuple[dict, Store, int]:
    raw = _raw(tmp_path, "interrupted_once", {"name": "random", "max_trials": 3})
    store = Store(parse_config(raw).database_url)
    loop = ExperimentLoop(parse_config(raw), executor="inline", store=store)
    with pytest.raises(KeyboardInterrupt):
        loop.run()
    return raw, store, loop.exp_id


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"searcher": {"smaller_is_better": False}}, "searcher.smaller_is_better: True -> False"),
        ({"searcher": {"metric": "acc"}}, "searcher.metric: 'loss' -> 'acc'"),
        ({"hyperparameters": {"x": {"maxval": 2.0}}}, "hyperparameters.x.maxval: 1.0 -> 2.0"),
        (
            {"hyperparameters": {"y": {"type": "int", "minval": 1, "maxval": 3}}},
            "hyperparameters.y",
        ),
    ],
)
def test_resume_with_a_changed_search_is_refused(tmp_path, change, says):
    raw, store, exp_id = _interrupted(tmp_path)
    try:
        changed = yaml.safe_load(yaml.safe_dump(raw))
        for section, values in change.items():
            for key, value in values.items():
                old = changed[section].get(key)
                changed[section][key] = {**old, **value} if isinstance(old, dict) else value
        owner = store.experiment(exp_id)["owner"]
        with pytest.raises(ConfigError, match="cannot resume with a different search") as e:
            ExperimentLoop(
                parse_config(changed), executor="inline", store=store, experiment_id=exp_id
            )
        assert says in str(e.value)
        assert f"jaxcore experiment resume {exp_id}" in str(e.value)
        assert store.experiment(exp_id)["owner"] == owner  # refused before claiming it

        # The unchanged search resumes and finishes every trial once.
        summary = ExperimentLoop(
            parse_config(raw), executor="inline", store=store, experiment_id=exp_id
        ).run()
        assert summary.state == "COMPLETED"
        assert [t["state"] for t in summary.trials] == ["COMPLETED"] * 3
    finally:
        store.close()


def test_resume_may_change_a_constant(tmp_path):
    raw, store, exp_id = _interrupted(tmp_path)
    try:
        changed = {**raw, "hyperparameters": {**X, "note": "measured again"}}
        summary = ExperimentLoop(
            parse_config(changed), executor="inline", store=store, experiment_id=exp_id
        ).run()
        assert summary.state == "COMPLETED"
    finally:
        store.close()


# ------------------------------------------------------------------ search space errors
@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            {"type": "int", "minval": 1.0, "maxval": 8.0},
            r"x\.minval/maxval: .*\(got minval=1\.0, maxval=8\.0\).*e\.g\. 1, not 1\.0",
        ),
        ({"type": "log", "minval": 2, "maxval": 1}, r"x\.minval: minval 2 exceeds maxval 1 \(exp"),
    ],
)
def test_search_space_errors_show_what_was_written(tmp_path, spec, says):
    raw = _raw(tmp_path, "paused_trial", {"name": "random", "max_trials": 1})
    with pytest.raises(ConfigError, match=rf"hyperparameters\.{says}"):
        parse_config({**raw, "hyperparameters": {"x": spec}})


# ------------------------------------------------------------------ kill -9 and resume
SEARCHERS = {
    "pbt": {"name": "pbt", "population_size": 3, "num_rounds": 3, "length_per_round": 2},
    "bayesian": {"name": "bayesian", "max_length": 2, "max_trials": 5, "n_startup_trials": 2},
    "adaptive_asha": {
        "name": "adaptive_asha",
        "max_length": 4,
        "max_trials": 5,
        "divisor": 2,
        "mode": "aggressive",
    },
}


def _run_cli(args: list[str], pause: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("JAXCORE_DB", "JAXCORE_DB_URL")}
    if pause:
        env["JAXCORE_TEST_PAUSE"] = pause
    cmd = [sys.executable, "-m", "jaxcore.experiments.cli", "experiment", *args]
    return subprocess.Popen(
        [*cmd, "--quiet", "--executor", "inline"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _outcome(tmp_path, name: str, pause: str | None) -> tuple[dict, list[tuple[int, int]]]:
    """Run the search (killing its loop at ``pause``, then resuming): its final record
    and the (trial, step) pairs trained to their checkpoint, sorted."""
    folder = tmp_path / ("killed" if pause else "straight")
    raw = _raw(folder, "paused_trial", SEARCHERS[name], max_restarts=0)
    folder.mkdir()
    path = folder / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    url = parse_config(raw).database_url
    loop = _run_cli(["create", str(path)], pause)
    paused = pathlib.Path(raw["workdir"]) / "paused"
    if pause:
        deadline = time.monotonic() + 60
        while not paused.exists():  # the trial writes it, then blocks for good
            assert loop.poll() is None and time.monotonic() < deadline, "never paused"
            time.sleep(0.02)
        loop.send_signal(signal.SIGKILL)
        assert loop.wait() == -signal.SIGKILL
        assert _run_cli(["resume", "1", "--db", url], None).wait() == 0
    else:
        assert loop.wait() == 0
    store = Store(url)
    try:
        record = {
            "state": store.experiment(1)["state"],
            "best": store.experiment(1)["best_metric"],
            "trials": [
                (t["id"], t["state"], t["hparams"], t["steps_done"], t["parent_trial"])
                for t in store.trials(1)
            ],
            "metrics": sorted(
                (m["trial_id"], m["step"], m["values"]["loss"])
                for m in store.metrics(exp_id=1, kind="validation")
            ),
        }
    finally:
        store.close()
    trained = pathlib.Path(raw["workdir"], "trained.log").read_text().split("\n")[:-1]
    return record, sorted(tuple(map(int, line.split())) for line in trained)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["pbt", "bayesian", "adaptive_asha"])
def test_kill_9_at_a_seeded_pause_point_then_resume_changes_nothing(tmp_path, name, seed):
    expected, trained = _outcome(tmp_path, name, None)
    rng = random.Random(f"stop38-{name}-{seed}")
    trial, step = rng.choice(trained)
    phase = rng.choice(["report", "checkpoint", "after"])
    record, retrained = _outcome(tmp_path, name, f"{trial}:{step}:{phase}")
    # The same trials, hyperparameters, lineage, metrics and best: nothing lost, the
    # searcher's state (Optuna's sampler, PBT's rounds) carried over exactly.
    assert record == expected, (trial, step, phase)
    # Every step saved exactly once: none trained twice to its checkpoint, none lost.
    assert retrained == trained, (trial, step, phase)


def _state(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(what, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.02)


def test_a_trial_that_finished_while_its_loop_died_is_not_run_again(tmp_path):
    raw = _raw(
        tmp_path,
        "gated_finish",
        {"name": "random", "max_trials": 2, "max_length": 2, "max_concurrent_trials": 2},
        resources={"slots": 2},
        max_restarts=0,
    )
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    workdir = pathlib.Path(raw["workdir"])
    url = parse_config(raw).database_url
    env = {k: v for k, v in os.environ.items() if k not in ("JAXCORE_DB", "JAXCORE_DB_URL")}
    cmd = [sys.executable, "-m", "jaxcore.experiments.cli", "experiment"]
    loop = subprocess.Popen(
        [*cmd, "create", str(path), "--quiet"],
        env={**env, "JAXCORE_TEST_PAUSE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: (workdir / "waiting-1").exists() and (workdir / "paused-2").exists())
        store = Store(url)
        pid = store.trial(1)["pid"]
        # Trial 1 returns and exits while its loop cannot see it (stopped, then killed).
        loop.send_signal(signal.SIGSTOP)
        (workdir / "go-1").touch()
        _wait_for(lambda: _state(pid) == "Z")  # exited; its stopped loop has not reaped it
        loop.send_signal(signal.SIGKILL)
        loop.wait()
        assert store.trial(1)["state"] == "RUNNING"
        resume = subprocess.run(
            [*cmd, "resume", "1", "--db", url, "--quiet"], env=env, capture_output=True
        )
        assert resume.returncode == 0, resume.stderr.decode()[-2000:]
        assert [t["state"] for t in store.trials(1)] == ["COMPLETED", "COMPLETED"]
        store.close()
    finally:
        if loop.poll() is None:
            loop.kill()
    # Trial 1 ran once to its end; it used to be launched again from its last checkpoint.
    assert sorted((workdir / "returned.log").read_text().split()) == ["1", "2"]


def test_an_experiment_whose_every_trial_diverged_ends_failed(tmp_path, caplog):
    """Every trial reported only NaN: no result, so FAILED and exit 1 (it ended COMPLETED,
    exit 0, best null, as if the search had found something)."""
    raw = _raw(tmp_path, "report_nan", {"name": "random", "max_trials": 2})
    code, exp, trials = _create_inline(tmp_path, raw)
    assert code == 1 and exp["state"] == "FAILED" and exp["best_metric"] is None
    assert [t["state"] for t in trials] == ["COMPLETED", "COMPLETED"]
    assert "no trial reported a finite 'loss'" in caplog.text
