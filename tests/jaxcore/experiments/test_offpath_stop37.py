"""Experiments stop 37: SIGTERM to `jaxcore run` (trials inline, stop_on_sigterm) stops
the loop (the trial saves and the experiment resumes later) instead of relaunching it."""

from __future__ import annotations

import pytest

from jaxcore.experiments import ExperimentLoop, Store, parse_config
from jaxcore.experiments.trial_executors import InlineTrialExecutor

TRIAL = """
import os, pathlib, signal, sys

def train(ctx):
    marker = pathlib.Path(__file__).with_name("sigterm-sent")
    start = (ctx.restore() or {"step": 0})["step"]
    for step in range(start + 1, 7):
        if step == 3 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGTERM)  # what `docker stop` / Slurm sends
        if ctx.preempted():
            ctx.checkpoint({"step": step - 1}, step=step - 1)
            sys.exit(75)
        ctx.report(step, {"loss": 1.0 / step})
    ctx.report(6, {"val_loss": 0.5})
    ctx.checkpoint({"step": 6}, step=6)
"""


def _loop(tmp_path, store, exp_id=None):
    raw = {
        "name": "sigterm",
        "entrypoint": f"{tmp_path / 'trial.py'}:train",
        "workdir": str(tmp_path / "exp"),
        "hyperparameters": {"lr": 0.1},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": 6},
    }
    executor = InlineTrialExecutor(stop_on_sigterm=True)  # as `jaxcore run` runs its phases
    return ExperimentLoop(parse_config(raw), executor=executor, store=store, experiment_id=exp_id)


def test_sigterm_to_an_inline_loop_stops_it_and_resume_finishes_the_trial(tmp_path):
    (tmp_path / "trial.py").write_text(TRIAL)
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        loop = _loop(tmp_path, store)
        # TrialTerminated, a KeyboardInterrupt: `jaxcore run` and Ctrl-C handlers catch it.
        with pytest.raises(KeyboardInterrupt, match="SIGTERM: trial 1 exited with 75"):
            loop.run()
        (trial,) = store.trials(loop.exp_id)
        assert trial["steps_done"] < 6  # stopped, not relaunched to the end

        summary = _loop(tmp_path, store, loop.exp_id).run()
        assert summary.state == "COMPLETED"
        (trial,) = summary.trials
        assert trial["state"] == "COMPLETED"
        assert trial["steps_done"] == 6
    finally:
        store.close()
