"""The reference trial (tiny LM) through preemption and PBT: checkpoints at one step
never destroy each other, hyperparameters win over restored state, and the registered
model loads and generates from its name alone."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from jaxcore.experiments import Registry, Store, parse_config, registry, run_experiment, tinylm
from jaxcore.experiments.trial_context import trial_dir
from jaxcore.models import TransformerConfig
from tests.jaxcore.experiments.conftest import entry

TINY = {"lr": 3e-3, "files": 40, "batch": 8, "seq": 32}


# Trials of one shape compile once: later launches read JAX's persistent cache.
pytestmark = pytest.mark.usefixtures("compile_cache")


@pytest.mark.slow
def test_preemption_on_a_checkpoint_step_keeps_progress(tmp_path, monkeypatch):
    raw = {
        "name": "preempted",
        "entrypoint": entry("tiny_preempted"),
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {
            **TINY,
            "report_every": 4,
            "preempt": {"type": "categorical", "vals": ["flag@4", "sigterm@6"]},
        },
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": 8},
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 1},
    }
    summary = run_experiment(raw, executor="inline")
    store = Store(parse_config(raw).database_url)
    exp = store.experiment(summary.experiment_id)
    assert summary.state == "COMPLETED"
    by_how = {t["hparams"]["preempt"]: t for t in summary.trials}
    for how, resumed_at in (("flag@4", 4), ("sigterm@6", 6)):
        t = by_how[how]
        assert (t["state"], t["steps_done"], t["restarts"]) == ("COMPLETED", 8, 0)
        starts = (trial_dir(exp, t["id"]) / "starts.log").read_text().split()
        assert starts == ["0", str(resumed_at)], f"{how}: progress lost, restarted at {starts}"
        rows = store.checkpoints(trial_id=t["id"])
        assert len({(r["step"], r["path"]) for r in rows}) == len(rows)  # one row each
        assert resumed_at in {r["step"] for r in rows}  # the preemption save is recorded
    # No COMPLETED row points at a deleted directory.
    completed = store.checkpoints(exp_id=exp["id"], state="COMPLETED")
    assert completed and all(pathlib.Path(r["path"]).is_dir() for r in completed)

    # The best checkpoint registers and loads from its name alone.
    best = min(completed, key=lambda r: r["metrics"]["val_loss"])
    reg = Registry(store)
    reg.create_model("tiny-preempted")
    version = reg.register("tiny-preempted", checkpoint=best["id"], aliases=["production"])
    for spec in ("registry:tiny-preempted@production", f"registry:tiny-preempted@{version}"):
        resolved = registry.resolve(spec, db=store.url)
        assert resolved.config == dataclasses.asdict(TransformerConfig.tiny(max_seq_len=32))
        assert resolved.lineage["trial_id"] == best["trial_id"]
        assert resolved.lineage["step"] == best["step"]
        assert resolved.lineage["experiment_uuid"] == exp["uuid"]
        assert resolved.tokenizer_path is None
    import jaxcore

    assert jaxcore.registry.resolve("tiny-preempted@production", db=store.url) == resolved
    from inference import LLM

    llm = LLM(resolved.weights_path, config=TransformerConfig(**resolved.config))
    out = llm.generate("def ", max_tokens=4, temperature=0.0)
    assert len(out.tokens) == 4
    assert LLM(resolved.weights_path).config == llm.config  # config.json beside it
    monkeypatch.setenv("JAXCORE_DB", store.url)
    by_name = LLM("registry:tiny-preempted@production")  # the store from $JAXCORE_DB
    assert by_name.generate("def ", max_tokens=4, temperature=0.0).tokens == out.tokens
    params = registry.load("tiny-preempted", "production", db=store.url)
    assert params  # the exported parameters read back


@pytest.mark.slow
def test_pbt_children_train_with_their_own_learning_rate(tmp_path):
    raw = {
        "name": "pbt-lr",
        "entrypoint": entry("tiny_record_lr"),
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {
            **TINY,
            "lr": {"type": "double", "minval": 1e-3, "maxval": 1e-2, "log": True},
        },
        "searcher": {
            "name": "pbt",
            "metric": "val_loss",
            "population_size": 2,
            "num_rounds": 2,
            "length_per_round": 2,
            "truncate_fraction": 0.5,
            "perturb_factor": 0.2,
            "resample_probability": 0.0,
            "seed": 0,
        },
    }
    summary = run_experiment(raw, executor="inline")
    store = Store(parse_config(raw).database_url)
    exp = store.experiment(summary.experiment_id)
    restored = 0
    children = [t for t in summary.trials if t["parent_trial"] is not None]
    assert children
    for t in summary.trials:
        path = trial_dir(exp, t["id"]) / "restored_lr.jsonl"
        for rec in map(json.loads, path.read_text().splitlines()):
            if rec["start_step"] == 0:
                continue
            restored += 1
            assert rec["lr"] == pytest.approx(t["hparams"]["lr"], rel=1e-6), (t, rec)
    for child in children:
        parent = store.trial(child["parent_trial"])
        assert child["hparams"]["lr"] != pytest.approx(parent["hparams"]["lr"], rel=1e-3)
    assert restored >= len(children) + 1  # the children and the surviving parent


def test_setup_shares_programs_only_where_they_are_the_same():
    """Launches in one process reuse the jitted steps when only values in the optimizer
    state differ; a fresh state from the shared plan then gets its own trial's values."""
    from jaxcore.experiments.trial_context import apply_hyperparams

    a = tinylm.setup(TINY)
    b = tinylm.setup({**TINY, "lr": 1e-3, "weight_decay": 0.1, "files": 41, "preempt": "x"})
    try:
        assert b["train_step"] is a["train_step"] and b["eval_step"] is a["eval_step"]
        assert b["plan"] is a["plan"] and b["loader"] is not a["loader"]
        assert b["optimizer"] is not a["optimizer"]
        state = b["plan"].init()
        assert tinylm.effective_lr(state) == pytest.approx(TINY["lr"])  # a's, until:
        state = state.replace(
            opt_state=apply_hyperparams(state.opt_state, b["optimizer"], state.params)
        )
        assert tinylm.effective_lr(state) == pytest.approx(1e-3)
    finally:
        a["loader"].close()
        b["loader"].close()
    # What shapes the programs is in the key (no setup needed to see it).
    key = tinylm._program_key(TINY)
    for name, value in {"seq": 16, "batch": 4, "seed": 1, "warmup": 2}.items():
        assert tinylm._program_key({**TINY, name: value}) != key, name
    warm = {**TINY, "warmup": 2}  # a schedule's peak is a constant of the program
    assert tinylm._program_key({**warm, "lr": 1e-3}) != tinylm._program_key(warm)
