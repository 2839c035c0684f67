"""An RLHF trial preempted mid-run (experiment loop, inline) checkpoints every role into
the trial's store-backed directory, is requeued, resumes at the iteration it reached and
reports the same metrics as an uninterrupted twin; the best trial's actor registers."""

import pathlib

import jax
import numpy as np
import pytest
import yaml

from jaxcore.experiments import Registry, Store, parse_config, run_experiment
from jaxcore.experiments.trial_context import TrialContext

from .test_cli import PPO, TIMINGS

ITERATIONS = 3
PREEMPT_AFTER = 1  # the injected preemption lands right after this iteration's report
CACHE_KEYS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory):
    """The three trainer builds (twin, preempted, resumed) share one shape: the later two
    read JAX's persistent cache (as tests/jaxcore/experiments/test_tiny_trials.py)."""
    before = {k: getattr(jax.config, k) for k in CACHE_KEYS}
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla-cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    yield
    for k, v in before.items():
        jax.config.update(k, v)


def test_preempted_ppo_trial_resumes_from_its_store_checkpoint(tmp_path, monkeypatch):
    rlhf_config = tmp_path / "ppo.yaml"
    rlhf_config.write_text(yaml.safe_dump({**PPO, "train": {**PPO["train"], "out": "unused"}}))
    raw = {
        "name": "rlhf-preempt",
        "entrypoint": "rlhf.trial:ppo",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"rlhf_config": str(rlhf_config)},
        # Two trials with the same hyperparameters: trial 1 runs through, trial 2 is
        # preempted once. max_restarts=0: a requeue after preemption is no failure.
        "searcher": {
            "name": "random",
            "metric": "reward_mean",
            "smaller_is_better": False,
            "max_length": ITERATIONS,
            "max_trials": 2,
        },
        "max_restarts": 0,
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0},
    }
    # Deterministic fault injection: trial 2 sees a preemption (as from SIGTERM or a
    # pause) at its first check, right after iteration PREEMPT_AFTER's report.
    fired = []
    real = TrialContext.preempted

    def preempted(self):
        if self.trial_id == 2 and not fired:
            fired.append(True)
            return True
        return real(self)

    monkeypatch.setattr(TrialContext, "preempted", preempted)
    summary = run_experiment(raw, executor="inline")
    assert summary.state == "COMPLETED" and fired
    store = Store(parse_config(raw).database_url)
    plain, resumed = sorted(summary.trials, key=lambda t: t["id"])
    assert plain["state"] == resumed["state"] == "COMPLETED"
    assert resumed["exit_code"] == 0 and resumed["restarts"] == 0

    want = store.metrics(plain["id"], kind="validation")
    got = store.metrics(resumed["id"], kind="validation")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    for w, g in zip(want, got, strict=True):
        for key in set(w["values"]) - TIMINGS:
            assert g["values"][key] == pytest.approx(w["values"][key], rel=1e-6, abs=1e-7), (
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
