"""`jaxcore run` stop 37: a run killed between the registry commit and the register
phase's record ends, after the rerun, with the registry an uninterrupted run leaves."""

from __future__ import annotations

import pytest
import yaml

from jaxcore.experiments import Registry
from jaxcore.run import phases as ph
from jaxcore.run import run_pipeline
from jaxcore.run.config import parse_run_config
from tests.jaxcore import test_run
from tests.jaxcore.test_run import DEMO

# test_run's tiny demo, two steps, no search or serving.
TINY = [
    *(s for s in test_run.TINY if not s.startswith(("train.steps=", "search.", "serve."))),
    "train.steps=2",
    "search.enabled=false",
    "serve.enabled=false",
    "run_dir=run",
    "data.output_dir=datasets",
]


class Killed(BaseException):
    """Stands for kill -9 at the moment the register record would be written."""


def test_rerun_after_kill_past_the_registry_commit_adds_no_second_version(
    tmp_path, monkeypatch, compile_cache
):
    config = parse_run_config(yaml.safe_load(DEMO.read_text()), tmp_path, TINY)
    write_record = ph.write_record

    def die_at_register(run_dir, phase, record):
        if phase == "register":
            raise Killed
        write_record(run_dir, phase, record)

    monkeypatch.setattr(ph, "write_record", die_at_register)
    with pytest.raises(Killed):
        run_pipeline(config)
    monkeypatch.setattr(ph, "write_record", write_record)

    result = run_pipeline(config)

    assert result.skipped == ("data", "tokenizer", "train", "search")
    assert result.outputs["register"]["version"] == 1
    reg = Registry(f"sqlite:///{config.path / 'jaxcore.db'}")
    try:
        info = reg.describe(config.model_name)
        assert [v["version"] for v in info["versions"]] == [1]
        assert info["aliases"] == {"latest-run": 1}
    finally:
        reg.store.close()


def test_a_second_run_on_a_busy_run_dir_is_refused_before_any_phase(tmp_path, capsys):
    import fcntl

    from jaxcore.errors import ConfigError

    config = parse_run_config(yaml.safe_load(DEMO.read_text()), tmp_path, TINY)
    config.path.mkdir(parents=True)
    with open(config.path / "run.lock", "w") as held:  # the first run, still going
        held.write("4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match=r"is in use by another `jaxcore run` \(pid 4242\)"):
            run_pipeline(config)
    assert not (config.path / "phases").exists()  # nothing was run or written


def test_sigterm_stops_the_run_after_the_trial_saves_and_the_rerun_resumes(
    tmp_path, monkeypatch, compile_cache
):
    import os
    import signal

    from jaxcore.run import trial

    config = parse_run_config(yaml.safe_load(DEMO.read_text()), tmp_path, [*TINY, "train.steps=4"])

    def terminate(ctx, step):
        if step == 1:  # what `docker stop` or a Slurm preemption sends
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trial, "after_step", terminate)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM: trial 1 exited with 75"):
        run_pipeline(config)
    assert not (config.path / "phases" / "train.json").exists()
    monkeypatch.setattr(trial, "after_step", None)

    result = run_pipeline(config)

    assert result.outputs["train"]["resumed"] is True
    (t,) = result.outputs["train"]["trials"]
    assert (t["steps"], t["resumed_from_step"]) == (4, 2)


def test_the_cli_exits_with_the_preemption_code_on_a_terminated_trial(
    tmp_path, monkeypatch, capsys
):
    """SIGTERM's stop is jaxcore's "preempted, saved: rerun" exit (75: Slurm requeues)."""
    import jaxcore
    import jaxcore.run.pipeline as pipeline
    from jaxcore.experiments.trial_executors import TrialTerminated
    from jaxcore.run.cli import main

    def terminated(config):
        raise TrialTerminated("SIGTERM: trial 1 exited with 75; a resume continues")

    monkeypatch.setattr(pipeline, "run_pipeline", terminated)
    monkeypatch.chdir(tmp_path)
    code = main([str(DEMO), "--set", "run_dir=run"])
    assert code == jaxcore.PREEMPTION_EXIT_CODE
    assert "Run the same command again" in capsys.readouterr().err


def test_a_missing_data_source_is_a_usage_error_naming_it(tmp_path, monkeypatch, capsys):
    """Exit 2 and one line naming the path, as every other config error (was a traceback
    and exit 1 from the data phase)."""
    from jaxcore.run.cli import main

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-such-dir"
    code = main(
        [
            str(DEMO),
            *(x for s in TINY for x in ("--set", s)),
            "--set",
            "data.packages=[]",
            "--set",
            f"data.sources=[{{type: dir, path: {missing}}}]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"source path {missing} does not exist" in err and "Traceback" not in err
