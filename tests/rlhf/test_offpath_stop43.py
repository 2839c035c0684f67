"""Stop 43: Ctrl-C in ``jaxcore rlhf`` prints one line saying how to resume (it printed a
KeyboardInterrupt traceback that said nothing of the checkpoints)."""

from __future__ import annotations

import pytest
import yaml

import rlhf.cli
from tests.rlhf.test_cli import PPO


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path, monkeypatch, capsys):
    def interrupted(cfg, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlhf.cli, "run_rl", interrupted)
    config = tmp_path / "ppo.yaml"
    config.write_text(yaml.safe_dump({**PPO, "train": {**PPO["train"], "out": "unused"}}))
    out = tmp_path / "run"
    assert rlhf.cli.main(["ppo", str(config), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (
        f"jaxcore rlhf ppo: interrupted (Ctrl-C); run the same command again to resume from "
        f"the last checkpoint in {out} (every train.checkpoint_every steps; SIGTERM saves "
        "the current step before it stops)."
    )


def test_ctrl_c_during_a_save_lets_the_save_complete_first(tmp_path):
    """Ctrl-C inside an Orbax save left the step half-written and Orbax's threads on a
    closed event loop ("Event loop is closed" tracebacks by the dozen at exit). The
    interrupt is now held until the save is complete, then raised."""
    import signal
    import types

    from rlhf.checkpoint import latest_iteration, save_trainer

    class Trainer:
        iteration = 3
        parity = types.SimpleNamespace(in_tolerance=True)

        def roles(self):
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, mid-save
            return {}

    before = signal.getsignal(signal.SIGINT)
    try:
        save_trainer(Trainer(), tmp_path)
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False
    assert interrupted  # the Ctrl-C is not lost
    assert latest_iteration(tmp_path) == 3  # and the step it interrupted is complete
    assert signal.getsignal(signal.SIGINT) is before
    Trainer.roles = lambda self: {}  # no Ctrl-C: nothing raised
    Trainer.iteration = 4
    assert save_trainer(Trainer(), tmp_path) == 4 and signal.getsignal(signal.SIGINT) is before


def test_a_finished_sft_run_reruns_as_nothing_to_do_and_steps_go_on(tmp_path, capsys):
    """A rerun of a finished SFT run trained it all again from step 0 (its preemption
    checkpoint is removed at the end and the final one was not looked at); ``--steps N``
    (more) did the same instead of going on. Both now start from the final checkpoint, and
    the longer run's metrics are those of a run of N steps from the start."""
    from tests.rlhf.helpers import read_metrics, write_config
    from tests.rlhf.test_offpath_stop36 import SFT

    raw = {**SFT, "train": {**SFT["train"], "steps": 2}}
    config = str(write_config(tmp_path, "sft.yaml", raw))
    out, whole = str(tmp_path / "out"), str(tmp_path / "whole")
    assert rlhf.cli.main(["sft", config, "--out", out]) == 0
    first = read_metrics(tmp_path / "out")
    capsys.readouterr()
    assert rlhf.cli.main(["sft", config, "--out", out]) == 0
    said = capsys.readouterr().out
    assert f"jaxcore rlhf sft: nothing to do: {out} already holds all 2 steps" in said
    assert read_metrics(tmp_path / "out") == first
    assert rlhf.cli.main(["sft", config, "--out", out, "--steps", "3"]) == 0
    assert rlhf.cli.main(["sft", config, "--out", whole, "--steps", "3"]) == 0
    went_on, straight = read_metrics(tmp_path / "out"), read_metrics(tmp_path / "whole")
    assert [m["step"] for m in went_on] == [0, 1, 2, 3]
    for a, b in zip(went_on, straight, strict=True):
        for key in set(b) - {"time", "elapsed_s"}:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (b["step"], key)
    assert rlhf.cli.main(["sft", config, "--out", out, "--steps", "1"]) == 2
    assert "holds a run trained for 3 steps, more than train.steps=1" in capsys.readouterr().err
