"""RLHF trials interrupted mid-run (experiment loop, inline) checkpoint every role into the
trial's store-backed directory and resume at the iteration they reached with the same
metrics as an uninterrupted twin: one preempted (requeued), one crashed inside an
iteration before its checkpoint (restarted from the one before); the best registers."""

import pathlib

import numpy as np
import pytest
import yaml

from jaxcore.experiments import Registry, Store, parse_config, run_experiment
from jaxcore.experiments.trial_context import TrialContext
from rlhf.trial import TrialCheckpoints

from .test_cli import PPO, TIMINGS

ITERATIONS = 3
PREEMPT_AFTER = 1  # trial 2's injected preemption lands right after this iteration's report
CRASH_AT = 2  # trial 3 crashes after this iteration's report, before its checkpoint
# The three trainer builds (twin, preempted, resumed) share one shape: the later two read
# JAX's persistent cache (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.mark.slow
def test_interrupted_ppo_trials_resume_from_their_store_checkpoints(tmp_path, monkeypatch):
    rlhf_config = tmp_path / "ppo.yaml"
    rlhf_config.write_text(yaml.safe_dump({**PPO, "train": {**PPO["train"], "out": "unused"}}))
    raw = {
        "name": "rlhf-preempt",
        "entrypoint": "rlhf.trial:ppo",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"rlhf_config": str(rlhf_config)},
        # Three trials with the same hyperparameters: trial 1 runs through, trial 2 is
        # preempted once (a requeue, not a restart), trial 3 crashes once (one restart).
        "searcher": {
            "name": "random",
            "metric": "reward_mean",
            "smaller_is_better": False,
            "max_length": ITERATIONS,
            "max_trials": 3,
        },
        "max_restarts": 1,
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0},
    }
    # Deterministic fault injection. Trial 2 sees a preemption (as from SIGTERM or a
    # pause) at its first check, right after iteration PREEMPT_AFTER's report. Trial 3
    # raises while saving iteration CRASH_AT, before anything of it is written: the
    # restart (the path a SIGKILLed trial takes too) resumes from iteration CRASH_AT - 1.
    fired, crashed = [], []
    real_preempted, real_save = TrialContext.preempted, TrialCheckpoints.save

    def preempted(self):
        if self.trial_id == 2 and not fired:
            fired.append(True)
            return True
        return real_preempted(self)

    def save(self, trainer):
        if self.ctx.trial_id == 3 and trainer.iteration == CRASH_AT and not crashed:
            crashed.append(True)
            raise RuntimeError("injected crash")
        real_save(self, trainer)

    monkeypatch.setattr(TrialContext, "preempted", preempted)
    monkeypatch.setattr(TrialCheckpoints, "save", save)
    summary = run_experiment(raw, executor="inline")
    assert summary.state == "COMPLETED" and fired and crashed
    store = Store(parse_config(raw).database_url)
    plain, resumed, restarted = sorted(summary.trials, key=lambda t: t["id"])
    assert plain["state"] == resumed["state"] == restarted["state"] == "COMPLETED"
    assert resumed["exit_code"] == 0 and resumed["restarts"] == 0
    assert restarted["exit_code"] == 0 and restarted["restarts"] == 1

    want = store.metrics(plain["id"], kind="validation")
    for trial in (resumed, restarted):
        got = store.metrics(trial["id"], kind="validation")
        assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
        # Iteration 3 follows the resume in both (and, for trial 3, the recomputed 2).
        for w, g in zip(want, got, strict=True):
            for key in set(w["values"]) - TIMINGS:
                assert g["values"][key] == pytest.approx(w["values"][key], rel=1e-6, abs=1e-7), (
                    trial["id"],
                    w["step"],
                    key,
                )

    # The store's ledger holds the trial's checkpoints (retention kept the latest); the
    # critic, reference and host state of that iteration sit inside it.
    rows = store.checkpoints(trial_id=resumed["id"], state="COMPLETED")
    assert [r["step"] for r in rows] == [ITERATIONS]
    step_dir = pathlib.Path(rows[0]["path"])
    assert sorted(p.name for p in step_dir.parent.iterdir() if p.name.isdigit()) == ["3"]
    roles = step_dir / "rlhf"
    assert {p.name for p in roles.iterdir()} == {"critic", "reference", "trainer-3.json"}
    assert not (step_dir.parents[1] / "rlhf" / "staging").exists()

    # The best trial's checkpoint registers: the exported actor has the model's shapes.
    best = max(
        store.checkpoints(exp_id=summary.experiment_id, state="COMPLETED"),
        key=lambda r: r["metrics"]["reward_mean"],
    )
    reg = Registry(store)
    reg.create_model("rlhf-actor")
    version = reg.register("rlhf-actor", checkpoint=best["id"])
    params = reg.load("rlhf-actor", version)
    assert reg.version("rlhf-actor", version)["meta"]["model_config"]["vocab_size"] == 16
    embed = [v for k, v in _flat(params) if "embed" in k]
    assert embed and embed[0].shape[0] == 16 and np.all(np.isfinite(embed[0]))


def _flat(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v
