"""A tiny PPO run as a trial of `jaxcore train` (the experiments system, inline)."""

import json

import yaml

from jaxcore.experiments.cli import main
from jaxcore.experiments.store import Store

from .test_cli import PPO


def test_ppo_runs_as_an_experiment_trial(tmp_path, capsys, monkeypatch):
    rlhf_config = tmp_path / "ppo.yaml"
    rlhf_config.write_text(yaml.safe_dump({**PPO, "train": {**PPO["train"], "out": "unused"}}))
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "rlhf-ppo",
                "entrypoint": "rlhf.trial:ppo",
                "workdir": str(tmp_path / "work"),
                "hyperparameters": {
                    "rlhf_config": str(rlhf_config),
                    "ppo.kl_coef": 0.1,
                    "ppo.parity_interval": 2,
                },
                "searcher": {"name": "single", "metric": "reward_mean", "max_length": 2},
            }
        )
    )
    db = f"sqlite:///{tmp_path / 'exp.db'}"
    monkeypatch.setenv("JAXCORE_DB_URL", db)
    assert main(["train", str(experiment)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED" and summary["steps"] == 2
    rows = Store(db).metrics(summary["trial"], kind="validation")
    assert [r["step"] for r in rows] == [1, 2]
    first = rows[0]["values"]
    assert 0.0 <= first["reward_mean"] <= 1.0
    assert first["kl_coef"] == 0.1  # the trial's overrides reached PPOConfig
    assert first["parity_checked"] == 1 and first["logprob_diff_max"] < 1e-4
    assert rows[1]["values"]["parity_checked"] == 0  # parity_interval=2: skipped
    trial_dir = next((tmp_path / "work").rglob("checkpoints/2/rlhf/trainer-2.json"))
    assert json.loads(trial_dir.read_text())["iteration"] == 2
