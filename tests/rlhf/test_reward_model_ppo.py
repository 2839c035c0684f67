"""`jaxcore rlhf ppo` with a reward model trained by `jaxcore rlhf reward` (in-process CLI),
weighted alongside a Python reward; `reward.model` paths that hold no reward model fail
with a ConfigError that says what was found and which command makes one."""

import json

import pytest
import yaml

import jaxcore as jc
from rlhf.cli import main
from rlhf.config import parse_config
from rlhf.rewards import load_reward_model

from .test_cli import MODEL, PPO

REWARD = {
    "model": {**MODEL, "max_seq_len": 16},
    "parallel": {"fsdp": 8},
    "train": {"steps": 8, "lr": 3e-3, "batch_size": 16},
    "data": {"n": 48, "held_out": 16, "prompt_len": 3, "completion_len": 4, "token": 3},
}
FN_WEIGHT = 0.5


def lines(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory):
    """A reward model trained through the CLI: its ``train.out``."""
    root = tmp_path_factory.mktemp("rm")
    out = root / "reward"
    config = root / "reward.yaml"
    config.write_text(yaml.safe_dump({**REWARD, "train": {**REWARD["train"], "out": str(out)}}))
    assert main(["reward", str(config)]) == 0
    assert "held_out_accuracy" in lines(out)[-1]
    return out


@pytest.mark.slow
def test_ppo_with_a_trained_reward_model_and_a_weighted_function(reward_run, tmp_path):
    out = tmp_path / "ppo"
    raw = {
        **PPO,
        "train": {**PPO["train"], "out": str(out), "steps": 2},
        "rewards": [{**PPO["rewards"][0], "weight": FN_WEIGHT}],
        "reward": {"model": str(reward_run), "weight": 1.0},
    }
    config = tmp_path / "ppo.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["ppo", str(config)]) == 0
    got = lines(out)
    assert [m["step"] for m in got] == [0, 1]
    for m in got:
        # reward = 1.0 * model score + 0.5 * token share (in [0, 1]).
        rest = m["reward_mean"] - m["reward_model_mean"]
        assert -1e-5 <= rest <= FN_WEIGHT + 1e-5, m
        assert m["reward_model_mean"] != pytest.approx(0.0, abs=1e-6)
    # What reward.model loads is the reward run's final, trained step.
    cfg = parse_config("ppo", raw)
    rm = load_reward_model(reward_run, jc.Engine(parallel=cfg.parallel), cfg.model)
    assert int(rm.state.step) == REWARD["train"]["steps"]


@pytest.mark.slow
def test_reward_model_path_errors_say_what_was_found(reward_run, tmp_path):
    cfg = parse_config("ppo", {**PPO, "train": {**PPO["train"], "out": "x"}})
    engine = jc.Engine(parallel=cfg.parallel)
    with pytest.raises(jc.ConfigError, match=r"no such directory.*jaxcore rlhf reward"):
        load_reward_model(tmp_path / "missing", engine, cfg.model)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(jc.ConfigError, match=r"no checkpoints/ directory; found \['metrics"):
        load_reward_model(tmp_path / "empty", engine, cfg.model)
    # An SFT run's output is a checkpoint, but not a reward model's.
    sft = tmp_path / "sft"
    config = tmp_path / "sft.yaml"
    sft_raw = {**REWARD, "train": {**REWARD["train"], "out": str(sft), "steps": 1}}
    config.write_text(yaml.safe_dump({**sft_raw, "loss": {"length": 12}}))
    assert main(["sft", str(config)]) == 0
    with pytest.raises(jc.ConfigError, match=r"a 'sft' run's checkpoint at step 1"):
        load_reward_model(sft, engine, cfg.model)
    other = cfg.model.__class__(**{**MODEL, "vocab_size": 32, "max_seq_len": 16})
    with pytest.raises(jc.ConfigError, match=r"vocabulary of 16 ids .*vocab_size is 32"):
        load_reward_model(reward_run, engine, other)


def test_ppo_config_accepts_a_reward_model_without_functions():
    raw = {**PPO, "train": {**PPO["train"], "out": "x"}, "rewards": [], "reward": {"model": "m"}}
    cfg = parse_config("ppo", raw)
    assert cfg.reward.model == "m" and cfg.reward.weight == 1.0 and cfg.rewards == ()
    with pytest.raises(jc.ConfigError, match=r"reward\.modle: unknown key"):
        parse_config("ppo", {**raw, "reward": {"modle": "m"}})


def test_cli_stops_on_a_missing_reward_model_before_compiling(tmp_path, capsys):
    raw = {**PPO, "train": {**PPO["train"], "out": str(tmp_path / "o")}}
    config = tmp_path / "ppo.yaml"
    config.write_text(yaml.safe_dump({**raw, "reward": {"model": str(tmp_path / "none")}}))
    assert main(["ppo", str(config)]) == 2
    err = capsys.readouterr().err
    assert "holds no reward model (no such directory)" in err and "jaxcore rlhf reward" in err
    assert not (tmp_path / "o").exists()  # failed before the run began
