"""`jaxcore rlhf` end to end in subprocesses: PPO killed with SIGKILL mid-run and resumed
repeats the uninterrupted run's metrics; DPO runs; config errors name the bad key."""

import os
import signal
import subprocess
import sys

import pytest
import yaml

import jaxcore as jc
from rlhf.cli import KILL_ENV, main
from rlhf.config import parse_config
from tests.rlhf.helpers import read_metrics

MODEL = dict(vocab_size=16, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
PPO = {
    "model": {**MODEL, "max_seq_len": 16},
    "parallel": {"fsdp": 8},
    "serving": {"slots": 8, "max_len": 8},
    "train": {"steps": 3, "lr": 5e-3, "critic_lr": 3e-3, "checkpoint_every": 1},
    "ppo": {"max_tokens": 4, "ppo_epochs": 2, "kl_target": 1.0, "kl_horizon": 100},
    "prompts": {"count": 8, "length": 3, "low": 4},
    "rewards": [{"fn": "rlhf.tasks:token_share", "kwargs": {"token": 3, "length": 4}}],
}
# Everything but wall-clock timings must repeat exactly.
TIMINGS = {"generate_s", "train_s", "rollout_tokens_per_s"}


def cli(stage, config, out, env=None):
    return subprocess.Popen(
        [sys.executable, "-m", "jaxcore.cli", "rlhf", stage, str(config), "--out", str(out)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc):
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out


def test_ppo_sigkill_and_resume_repeats_the_uninterrupted_metrics(tmp_path):
    config = tmp_path / "ppo.yaml"
    config.write_text(yaml.safe_dump({**PPO, "train": {**PPO["train"], "out": "unused"}}))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # The three runs are one program: the first compiles it into JAX's persistent cache and
    # the other two read it (measured: a PPO run 34 CPU-s cold, 12 warm).
    cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    rc_whole, log_whole = finish(cli("ppo", config, whole, cache))
    # Each role's checkpoints record its engine's plan (stop 43: every save warned).
    assert "Checkpointer has no plan" not in log_whole
    # Killed after iteration 2's metrics are written, before its checkpoint begins: the
    # newest checkpoint is iteration 1, and the resumed run must recompute iteration 2.
    rc_killed, log_killed = finish(cli("ppo", config, killed, {**cache, KILL_ENV: "2:before_save"}))
    assert rc_whole == 0, log_whole
    assert rc_killed == -signal.SIGKILL, log_killed
    assert [m["step"] for m in read_metrics(killed)] == [0, 1]
    assert sorted(p.name for p in (killed / "checkpoints").glob("trainer-*.json")) == [
        "trainer-1.json"
    ]
    assert {p.name for p in (killed / "checkpoints").iterdir()} >= {"actor", "critic", "reference"}

    rc, log = finish(cli("ppo", config, killed, cache))
    assert rc == 0, log
    expected, resumed = read_metrics(whole), read_metrics(killed)
    assert [m["step"] for m in resumed] == [0, 1, 2]
    for want, got in zip(expected, resumed, strict=True):
        for key in set(want) - TIMINGS:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (want["step"], key)

    # A rerun of the finished run trains nothing and says so (it printed "done, {}").
    rc, log = finish(cli("ppo", config, killed, cache))
    assert rc == 0, log
    assert f"nothing to do: {killed} already holds all 3 steps; pass --steps N" in log
    assert len(read_metrics(killed)) == 3


def test_dpo_through_the_cli(tmp_path):
    config = tmp_path / "dpo.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {**MODEL, "max_seq_len": 16},
                "parallel": {"fsdp": 8},
                "train": {"out": str(tmp_path / "dpo"), "steps": 4, "lr": 3e-3, "batch_size": 16},
                "data": {"n": 64, "held_out": 16},
            }
        )
    )
    rc, log = finish(cli("dpo", config, tmp_path / "dpo"))
    assert rc == 0, log
    lines = read_metrics(tmp_path / "dpo")
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    assert lines[0]["reward_margin"] == pytest.approx(0.0, abs=1e-5)  # policy == reference
    assert lines[-1]["held_out_reward_margin"] > 0.0


@pytest.mark.parametrize(
    "patch, match",
    [
        ({"ppo": {"kl_estimatr": "k3"}}, r"ppo\.kl_estimatr: unknown key for PPOConfig"),
        ({"ppo": {"kl_estimator": "k9"}}, r"ppo: PPOConfig\.kl_estimator='k9'"),
        ({"model": {**MODEL, "max_seq_len": 0}}, r"^model: "),
        ({"rewards": [{"fn": "m:f", "wieght": 2}]}, r"rewards\[0\]\.wieght: unknown key"),
        ({"trian": {}}, r"trian: unknown section"),
        ({"rewards": []}, r"rewards: ppo needs at least one reward"),
    ],
)
def test_config_errors_name_the_bad_key(patch, match):
    raw = {**PPO, "train": {**PPO["train"], "out": "x"}, **patch}
    with pytest.raises(jc.ConfigError, match=match):
        parse_config("ppo", raw)


def test_cli_reports_config_errors_without_a_traceback(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({**PPO, "train": {"out": "x", "stepz": 1}}))
    assert main(["ppo", str(config)]) == 2
    assert "train.stepz: unknown key for TrainSection" in capsys.readouterr().err
    cfg = parse_config("grpo", {**PPO, "train": {"out": "x"}, "grpo": {"num_generations": 2}})
    assert cfg.grpo.num_generations == 2 and cfg.ppo.kl_target == 1.0
