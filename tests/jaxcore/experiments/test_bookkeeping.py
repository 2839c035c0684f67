"""Bookkeeping that must not lose or invent anything: the checkpoint ledger, atomic loop
turns, recovery of unacknowledged reports, honest outcomes, strict configs, store
identity and discovery. Pure-Python trials: cheap."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.experiments import ExperimentLoop, Store, load_config, parse_config, run_experiment
from jaxcore.experiments import store as tables
from jaxcore.experiments.cli import main
from jaxcore.experiments.config import RetentionConfig, yaml_load
from jaxcore.experiments.retention import apply_retention
from jaxcore.experiments.trial_executors import TrialExecutor
from tests.jaxcore.experiments.conftest import OBJECTIVES


# --------------------------------------------------------------------- the ledger
def _trial(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    exp = store.create_experiment("e", {}, str(tmp_path))
    return store, exp, store.create_trial(exp, {}, 10)


def test_saving_a_step_again_updates_its_row(tmp_path):
    store, _, trial = _trial(tmp_path)
    path = tmp_path / "c" / "4"
    path.mkdir(parents=True)
    a = store.add_checkpoint(trial, 4, str(path), "json", {"loss": 2.0})
    b = store.add_checkpoint(trial, 4, str(path), "json", {"loss": 1.5}, {"model_config": {}})
    c = store.add_checkpoint(trial, 4, str(path), "json", None)  # a re-save without metrics
    rows = store.checkpoints(trial_id=trial)
    assert a == b == c and len(rows) == 1
    assert rows[0]["metrics"] == {"loss": 1.5} and rows[0]["meta"] == {"model_config": {}}


def test_retention_never_deletes_a_path_a_kept_row_refers_to(tmp_path):
    """Two rows on one directory (what stores written before the ledger hold): the
    newest is kept, so the directory stays, whatever happens to the older row."""
    store, exp, trial = _trial(tmp_path)
    path = tmp_path / "c" / "4"
    path.mkdir(parents=True)
    first = store.add_checkpoint(trial, 4, str(path), "json", {"loss": 2.0})
    store._run(
        lambda c: c.execute(
            tables.checkpoints.insert().values(
                trial_id=trial,
                step=4,
                path=str(path),
                format="json",
                state="COMPLETED",
                metrics={"loss": 2.0},
                created=tables.now(),
            )
        )
    )
    old = tmp_path / "c" / "2"
    old.mkdir()
    store.add_checkpoint(trial, 2, str(old), "json", {"loss": 3.0})
    policy = RetentionConfig(save_trial_latest=1, save_trial_best=0)
    deleted = apply_retention(store, exp, policy, "loss", True)
    assert path.is_dir(), "a kept row's directory was deleted"
    assert {r["path"] for r in deleted} == {str(old)} and not old.exists()
    states = {r["id"]: r["state"] for r in store.checkpoints(trial_id=trial)}
    assert states[first] == "COMPLETED"


# --------------------------------------------------------------------- atomic turns
class DrivenExecutor(TrialExecutor):
    """Trials that do nothing on their own: the test writes their reports and exits."""

    def __init__(self) -> None:
        self.launched: list[int] = []
        self.done: list[tuple[int, int]] = []

    def capacity(self) -> int:
        return 4

    def launch(self, trial_id, env, log_path):
        self.launched.append(trial_id)
        return None

    def poll(self):
        done, self.done = self.done, []
        return done

    def running(self):
        return set(self.launched)


def _asha(raw_config):
    return parse_config(
        raw_config(
            "asha_quad",
            {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_length": 16,
                "max_trials": 12,
                "mode": "aggressive",
                "max_concurrent_trials": 4,
                "seed": 2,
            },
            {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        )
    )


def test_unacknowledged_report_is_recovered_by_the_next_loop(raw_config):
    cfg = _asha(raw_config)
    first = ExperimentLoop(cfg, executor=DrivenExecutor())
    first.step()
    store, trial = first.store, first.executor.launched[0]
    store.add_metrics(trial, 4, {"loss": 3.0}, "validation")  # ... and the loop dies
    resumed = ExperimentLoop(
        cfg, store=store, experiment_id=first.exp_id, executor=DrivenExecutor()
    )
    resumed.step()
    assert store.trial(trial)["acked_step"] == 4
    assert resumed.best == (3.0, trial)
    assert len(store.metrics(trial)) == 1


def test_a_turn_that_fails_leaves_nothing_behind(raw_config, monkeypatch):
    cfg = _asha(raw_config)
    loop = ExperimentLoop(cfg, executor=DrivenExecutor())
    loop.step()
    store, trial = loop.store, loop.executor.launched[0]
    store.add_metrics(trial, 4, {"loss": 9.0}, "validation")

    def crash():
        raise RuntimeError("injected: the loop dies before its turn commits")

    monkeypatch.setattr(loop, "_save_snapshot", crash)
    with pytest.raises(RuntimeError, match="injected"):
        loop.step()
    # The searcher's decision on that report (stop or go on) and its ack were not kept.
    row = store.trial(trial)
    assert row["acked_step"] == -1 and not row["stop_requested"]
    resumed = ExperimentLoop(cfg, store=store, experiment_id=loop.exp_id, executor=DrivenExecutor())
    resumed.step()
    assert store.trial(trial)["acked_step"] == 4
    assert sorted(resumed.executor.launched) == sorted(loop.executor.launched)


def test_a_live_loop_is_not_resumed_twice(raw_config):
    from jaxcore.experiments.experiment import owner_alive

    cfg = _asha(raw_config)
    loop = ExperimentLoop(cfg, executor=DrivenExecutor())
    store = loop.store
    exp = store.experiment(loop.exp_id)
    assert not owner_alive(exp)  # this very process: an abandoned loop object
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:  # a live Python process on this host owns it
        store.update_experiment(loop.exp_id, owner=f"{exp['owner'].rsplit(' ', 1)[0]} {other.pid}")
        with pytest.raises(jc.ConfigError, match="live loop"):
            ExperimentLoop(cfg, store=store, experiment_id=loop.exp_id, executor=DrivenExecutor())
    finally:
        other.kill()
        other.wait()
    dead = f"{exp['owner'].rsplit(' ', 1)[0]} {2**22 + 12345}"  # no such pid
    store.update_experiment(loop.exp_id, owner=dead, heartbeat=9e18)  # fresh heartbeat
    assert not owner_alive(store.experiment(loop.exp_id))  # the pid answers, not the beat


# --------------------------------------------------------------------- honest outcomes
def _write(tmp_path, raw, name="exp.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_all_trials_fail_is_failed_and_the_cli_exits_non_zero(raw_config, tmp_path, capsys):
    raw = raw_config(
        "always_fail",
        {"name": "grid", "metric": "loss", "max_length": 1},
        {
            "fail": {"type": "categorical", "vals": [True]},
            "k": {"type": "categorical", "vals": [1, 2]},
        },
        max_restarts=1,
    )
    assert (
        main(["experiment", "create", _write(tmp_path, raw), "--executor", "inline", "--quiet"])
        == 1
    )
    assert '"state": "FAILED"' in capsys.readouterr().out
    store = Store(parse_config(raw).database_url)
    assert store.experiments()[-1]["state"] == "FAILED"
    assert {t["state"] for t in store.trials(store.experiments()[-1]["id"])} == {"ERRORED"}


@pytest.mark.parametrize(
    "entrypoint,message",
    [
        (f"{OBJECTIVES}:no_such_function", "has no 'no_such_function'"),
        ("no_such_module_xyz:train", "cannot import no_such_module_xyz"),
        (f"{OBJECTIVES}:not_a_trial", "must take one argument"),
        (f"{OBJECTIVES}:BEST_X", "not callable"),
    ],
)
def test_bad_entrypoint_fails_before_any_launch(raw_config, tmp_path, capsys, entrypoint, message):
    raw = raw_config("bowl", {"name": "single", "metric": "loss", "max_length": 1})
    raw["entrypoint"] = entrypoint
    assert main(["experiment", "create", _write(tmp_path, raw), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not pathlib.Path(raw["workdir"]).exists()  # no store, no trial, no launch
    with pytest.raises(jc.ConfigError, match="entrypoint"):
        run_experiment(raw, executor="local")


# --------------------------------------------------------------------- strict configs
GOOD = {
    "name": "x",
    "entrypoint": "m:f",
    "searcher": {"name": "random", "metric": "loss", "max_length": 4, "max_trials": 2},
}


def test_yaml_exponent_numbers_are_floats(tmp_path):
    text = yaml.safe_dump({**GOOD, "workdir": str(tmp_path)}) + (
        "hyperparameters:\n  lr: {type: double, minval: 1e-4, maxval: 3E-2, log: true}\n"
    )
    (tmp_path / "x.yaml").write_text(text)
    p = load_config(tmp_path / "x.yaml").param("lr")
    assert (p.minval, p.maxval) == (1e-4, 3e-2)


@pytest.mark.parametrize(
    "patch,field",
    [
        (
            {"hyperparameters": {"lr": {"type": "double", "minval": "1e-4", "maxval": 1.0}}},
            "lr.minval",
        ),
        ({"max_restarts": True}, "max_restarts"),
        ({"searcher": {**GOOD["searcher"], "max_trials": True}}, "searcher.max_trials"),
        ({"searcher": {**GOOD["searcher"], "max_length": False}}, "searcher.max_length"),
        ({"resources": {"devices": True}}, "resources.devices"),
        ({"checkpoint_storage": {"save_trial_latest": True}}, "save_trial_latest"),
        ({"early_stopping": {"metric": "loss", "patience": True}}, "early_stopping.patience"),
        ({"hyperparameters": {"n": {"type": "int", "minval": 1, "maxval": True}}}, "n.maxval"),
        ({"searcher": {**GOOD["searcher"], "divisor": "4"}}, "searcher.divisor"),
    ],
)
def test_strings_and_booleans_are_not_numbers(patch, field):
    with pytest.raises(jc.ConfigError, match=field.replace(".", r"\.")):
        parse_config({**GOOD, **patch})


@settings(max_examples=200, deadline=None)
@given(
    mantissa=st.decimals(min_value=-1000, max_value=1000, allow_nan=False, places=3),
    exponent=st.integers(-30, 30),
    e=st.sampled_from(["e", "E"]),
    sign=st.sampled_from(["", "+", "-"]),
    dot=st.booleans(),
)
def test_yaml_float_forms_match_python(mantissa, exponent, e, sign, dot):
    m = str(mantissa) if dot else str(int(mantissa))
    exp = f"{sign}{abs(exponent)}" if sign else str(abs(exponent))
    text = f"{m}{e}{exp}"
    assert yaml_load(f"v: {text}")["v"] == float(text)  # Python's float() is the oracle
    assert yaml_load(f"v: {m}")["v"] == (float(m) if "." in m else int(m))


# --------------------------------------------------------------------- identity, discovery
def test_a_second_store_over_the_same_workdir_is_refused(raw_config, tmp_path):
    raw = raw_config(
        "bowl", {"name": "single", "metric": "loss", "max_length": 1}, {"x": 0.1, "y": 0.2}
    )
    first = run_experiment(raw, executor="inline")
    exp = Store(parse_config(raw).database_url).experiment(first.experiment_id)
    assert (pathlib.Path(exp["workdir"]) / exp["uuid"]).is_dir()  # trial dirs under the UUID
    other = f"sqlite:///{tmp_path / 'fresh.db'}"
    with pytest.raises(jc.ConfigError) as e:
        run_experiment({**raw, "database": other}, executor="inline")
    assert "work/jaxcore.db" in str(e.value) and "fresh.db" in str(e.value)
    assert Store(other).experiments() == []  # nothing ran against the other store


def test_cli_finds_the_store_and_never_creates_one_to_read(
    raw_config, tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("JAXCORE_DB", raising=False)
    monkeypatch.delenv("JAXCORE_DB_URL", raising=False)
    raw = raw_config(
        "ckpt_curve", {"name": "single", "metric": "loss", "max_length": 4}, {"x": 0.3}
    )
    cfg = _write(tmp_path, raw)
    assert main(["experiment", "create", cfg, "--executor", "inline", "--quiet"]) == 0
    db = parse_config(raw).database_url
    assert f"store {db}" in capsys.readouterr().err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["experiment", "list"]) == 2
    assert "no experiment store found" in capsys.readouterr().err
    assert list(elsewhere.rglob("*")) == []  # no database was created
    assert main(["experiment", "list", "--config", cfg]) == 0
    out = capsys.readouterr()
    assert f"store {db}" in out.err and "ckpt_curve" in out.out
    monkeypatch.setenv("JAXCORE_DB", db)
    assert main(["trial", "describe", "1", "--metrics"]) == 0
    out = capsys.readouterr()
    assert f"store {db}" in out.err
    assert "validation" in out.out and "loss" in out.out
    missing = f"sqlite:///{elsewhere / 'nope.db'}"
    assert main(["experiment", "list", "--db", missing]) == 2
    assert not (elsewhere / "nope.db").exists()


def test_inline_trials_load_a_file_entrypoint_once(tmp_path):
    """The loop checks the entrypoint once and its inline trials call that function: a
    file with costly top-level imports is not re-run for every trial."""
    runs = tmp_path / "module-runs.log"
    trial_py = tmp_path / "counted_trial.py"
    trial_py.write_text(
        f"with open({str(runs)!r}, 'a') as f:\n"
        "    f.write('run\\n')\n\n\n"
        "def train(ctx):\n"
        "    ctx.report(1, {'loss': ctx.hparams['x']})\n"
    )
    summary = run_experiment(
        {
            "name": "counted",
            "entrypoint": f"{trial_py}:train",
            "workdir": str(tmp_path / "work"),
            "hyperparameters": {"x": {"type": "categorical", "vals": [3.0, 1.0, 2.0]}},
            "searcher": {"name": "grid", "metric": "loss", "max_length": 1},
        },
        executor="inline",
    )
    assert summary.state == "COMPLETED" and summary.best_metric == 1.0
    assert len(summary.trials) == 3
    assert runs.read_text().splitlines() == ["run"]
