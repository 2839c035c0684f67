"""Real tiny-model trials: a SIGKILLed trial resumes to the same result; errored trials;
the model registry round-trip with the trained model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxcore as jc
from jaxcore.experiments import Registry, Store, parse_config, registry, run_experiment, tinylm
from tests.jaxcore.experiments.conftest import entry

STEPS = 8


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Two identical tiny-LM trials at once; one SIGKILLs itself after step 5 (once)."""
    work = tmp_path_factory.mktemp("tiny")
    raw = {
        "name": "fault-tolerance",
        "entrypoint": entry("tiny_kill_once"),
        "workdir": str(work),
        "hyperparameters": {
            "lr": 3e-3,
            "files": 40,
            "batch": 8,
            "seq": 32,
            "report_every": 2,
            "kill_at": {"type": "categorical", "vals": [0, 5]},
        },
        "searcher": {"name": "grid", "metric": "val_loss", "max_length": STEPS},
        "max_restarts": 2,
        "resources": {"devices": 1, "slots": 2},
        "checkpoint_storage": {"save_trial_latest": 1, "save_trial_best": 0},
    }
    # The restarted trial runs the program its first process compiled: JAX's persistent
    # cache, inherited by the trial processes, spares it the compile.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JAX_COMPILATION_CACHE_DIR", str(work / "xla-cache"))
        env.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        summary = run_experiment(raw, executor="local")
    return raw, summary, Store(parse_config(raw).database_url)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigkilled_trial_resumes_to_the_same_metric(tiny_run):
    _raw, summary, store = tiny_run
    assert summary.state == "COMPLETED"
    by_kill = {t["hparams"]["kill_at"]: t for t in summary.trials}
    plain, killed = by_kill[0], by_kill[5]
    assert plain["state"] == killed["state"] == "COMPLETED"
    assert plain["restarts"] == 0 and killed["restarts"] == 1
    assert killed["exit_code"] == 0
    # the killed run reported steps 2 and 4 before dying, then resumed from step 4
    killed_steps = [m["step"] for m in store.metrics(killed["id"], kind="validation")]
    assert killed_steps == [2, 4, 6, 8]
    final = {k: store.metrics(t["id"], kind="validation")[-1]["values"] for k, t in by_kill.items()}
    assert final[5]["val_loss"] == pytest.approx(final[0]["val_loss"], rel=1e-6, abs=1e-6)
    assert final[5]["loss"] == pytest.approx(final[0]["loss"], rel=1e-6, abs=1e-6)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_always_failing_trial_is_errored_and_search_completes(raw_config):
    raw = raw_config(
        "always_fail",
        {"name": "grid", "metric": "loss", "max_length": 1},
        {"fail": {"type": "categorical", "vals": [True, False]}},
        max_restarts=1,
        resources={"devices": 1, "slots": 2},
    )
    summary = run_experiment(raw, executor="local")
    assert summary.state == "COMPLETED"
    states = {t["hparams"]["fail"]: t for t in summary.trials}
    assert states[True]["state"] == "ERRORED" and states[True]["restarts"] == 1
    assert states[False]["state"] == "COMPLETED"
    assert summary.best_metric == 1.0


@pytest.mark.slow
def test_registry_round_trip_with_the_trained_model(tiny_run, tmp_path):
    _raw, summary, store = tiny_run
    plain = next(t for t in summary.trials if t["hparams"]["kill_at"] == 0)
    ckpt = max(store.checkpoints(trial_id=plain["id"], state="COMPLETED"), key=lambda r: r["step"])
    assert ckpt["step"] == STEPS
    reg = Registry(store)
    reg.create_model("tiny-lm", description="byte-level tiny decoder", tags=["test"])
    v1 = reg.register("tiny-lm", checkpoint=ckpt["id"], aliases=["staging"])
    v2 = reg.register("tiny-lm", checkpoint=ckpt["id"], description="promoted")
    assert (v1, v2) == (1, 2)
    reg.set_alias("tiny-lm", "production", 2)
    reg.set_alias("tiny-lm", "staging", 2)  # aliases move
    info = reg.describe("tiny-lm")
    assert info["aliases"] == {"staging": 2, "production": 2}
    assert [v["version"] for v in reg.compare("tiny-lm", "val_loss")] in ([1, 2], [2, 1])

    # The checkpoint's own parameters, restored through the checkpointer.
    hp = dict(plain["hparams"])
    env = tinylm.setup(hp)
    ckptr = jc.Checkpointer(
        jc.CheckpointConfig(
            directory=ckpt["path"].rsplit("/", 1)[0],
            keep_last=None,
            save_on_sigterm=False,
            announce=False,
        )
    )
    state, _ = ckptr.restore_or_init(env["engine"], env["factory"], env["optimizer"], env["loader"])
    ckptr.close()
    assert int(state.step) == STEPS
    loaded = registry.load("tiny-lm", "production", db=store.url)
    flat_ckpt = jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]
    flat_loaded = dict(jax.tree_util.tree_flatten_with_path(loaded)[0])
    assert len(flat_ckpt) == len(flat_loaded)
    for path, value in flat_ckpt:
        key = tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
        got = flat_loaded[tuple(jax.tree_util.DictKey(str(k)) for k in key)]
        np.testing.assert_array_equal(np.asarray(value), got)

    # Loaded into a fresh engine (sharded), the model evaluates to the reported loss.
    params = registry.load("tiny-lm", 2, db=store.url, engine=env["engine"])
    batches = tinylm.val_batches(env)
    loss = tinylm.evaluate(env, state.replace(params=params), batches)
    reported = store.metrics(plain["id"], kind="validation")[-1]["values"]["val_loss"]
    assert loss == pytest.approx(reported, rel=1e-4)
    assert loss == pytest.approx(tinylm.evaluate(env, state, batches), rel=1e-6)
    env["loader"].close()
    with pytest.raises(jc.ConfigError, match="no alias 'canary'"):
        reg.load("tiny-lm", "canary")
