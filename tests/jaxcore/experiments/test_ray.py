"""The same experiment with its trials as Ray tasks, on a local Ray cluster."""

from __future__ import annotations

import pytest
import ray  # the data-ray extra (installed by make test)

from jaxcore.experiments import Store, parse_config, run_experiment


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_asha_trials_as_ray_tasks(raw_config, local_ray):
    raw = raw_config(
        "asha_quad",
        {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_length": 16,
            "max_trials": 4,
            "mode": "aggressive",
            "max_concurrent_trials": 2,
            "seed": 0,
        },
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
    )
    summary = run_experiment(raw, executor="ray")
    assert summary.state == "COMPLETED"
    assert len(summary.trials) == 4
    assert all(t["state"] in ("COMPLETED", "STOPPED") for t in summary.trials)
    # rungs of 16 with 4 trials: int(log 4 / log 4) + 1 = 2 rungs -> units 4, 16
    assert {t["steps_done"] for t in summary.trials} <= {4, 16}
    best = min(summary.trials, key=lambda t: abs(t["hparams"]["x"] - 0.7))
    assert best["steps_done"] == 16
    store = Store(parse_config(raw).database_url)
    assert all(store.metrics(t["id"]) for t in summary.trials)
