"""Adaptive ASHA: Determined's brackets and rungs, the best trial survives, steps saved."""

from __future__ import annotations

import collections

import pytest

from jaxcore.experiments import parse_config, run_experiment
from jaxcore.experiments.preview import preview
from jaxcore.experiments.searchers.asha import plan
from tests.jaxcore.experiments.objectives import BEST_X

MAX_LENGTH, MAX_TRIALS = 1000, 100

# Worked by hand from Determined's adaptive_asha.go / asha_stopping.go with divisor 4,
# max_rungs 5, max_length 1000, max_trials 100:
#   rungs = min(5, int(log 1000 / log 4) + 1 = 5, int(log 100 / log 4) + 1 = 4) = 4
#   brackets: aggressive [4]; standard [(4-1)//2+1 .. 4] = [4, 3, 2]; conservative [4..1]
#   trials: weight 4**(n-1)/n -> 16, 5.33, 2 (, 1): int(w/sum * 100), remainder to first
#   rung units: int(1000 / 4**(n-i-1)) -> 15, 62, 250, 1000
#   concurrency (max_concurrent_trials 0): max(last bracket's trials, 4)
EXPECTED = {
    "aggressive": [([15, 62, 250, 1000], 100, 100)],
    "standard": [
        ([15, 62, 250, 1000], 70, 8),
        ([62, 250, 1000], 22, 8),
        ([250, 1000], 8, 8),
    ],
    "conservative": [
        ([15, 62, 250, 1000], 67, 4),
        ([62, 250, 1000], 21, 4),
        ([250, 1000], 8, 4),
        ([1000], 4, 4),
    ],
}


def _raw(raw_config, mode: str, **searcher):
    return raw_config(
        "asha_quad",
        {
            "name": "adaptive_asha",
            "metric": "loss",
            "max_length": MAX_LENGTH,
            "max_trials": MAX_TRIALS,
            "mode": mode,
            "seed": 3,
            **searcher,
        },
        {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        checkpoint_storage={"save_trial_latest": 0, "save_trial_best": 0},
    )


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_brackets_match_determined(raw_config, mode):
    got = [
        (b["units"], b["max_trials"], b["max_concurrent"])
        for b in plan(parse_config(_raw(raw_config, mode)))
    ]
    assert got == EXPECTED[mode]


def test_concurrency_split_and_caps(raw_config):
    # max_concurrent_trials 10 over 3 brackets: 4, 3, 3 (remainder to the first).
    cfg = parse_config(_raw(raw_config, "standard", max_concurrent_trials=10))
    assert [b["max_concurrent"] for b in plan(cfg)] == [4, 3, 3]
    # max_length 16 caps the rungs at int(log 16 / log 4) + 1 = 3.
    cfg = parse_config(_raw(raw_config, "aggressive", max_length=16))
    assert [b["units"] for b in plan(cfg)] == [[1, 4, 16]]
    # explicit bracket_rungs win over the mode
    cfg = parse_config(_raw(raw_config, "aggressive", bracket_rungs=[2, 3]))
    assert [b["units"] for b in plan(cfg)] == [[62, 250, 1000], [250, 1000]]


@pytest.mark.parametrize("mode", ["aggressive", "standard", "conservative"])
def test_asha_search(raw_config, mode):
    raw = _raw(raw_config, mode)
    summary = run_experiment(raw, executor="inline")
    trials = summary.trials
    assert summary.state == "COMPLETED"
    assert len(trials) == MAX_TRIALS
    # Each bracket ran its share of trials, and each trial stopped on one of its rungs.
    brackets = EXPECTED[mode]
    by_bracket = collections.Counter(tuple(t["milestones"]) for t in trials)
    assert by_bracket == collections.Counter({tuple(u): n for u, n, _ in brackets})
    for t in trials:
        assert t["steps_done"] in t["milestones"], t
        assert t["state"] in ("COMPLETED", "STOPPED")
    # The known best configuration (closest to 0.7) reaches the top rung.
    best = min(trials, key=lambda t: abs(t["hparams"]["x"] - BEST_X))
    assert best["steps_done"] == MAX_LENGTH
    assert summary.best_trial == best["id"]
    # At least 60% of a full grid's budget (every trial to max_length) is saved.
    grid_budget = MAX_TRIALS * MAX_LENGTH
    saved = 1 - summary.steps_trained / grid_budget
    assert summary.steps_trained == sum(t["steps_done"] for t in trials)
    assert saved >= 0.6, f"{mode}: saved only {saved:.0%}"


def test_preview_counts(raw_config):
    out = preview(parse_config(_raw(raw_config, "standard")))
    assert out["trials"] == MAX_TRIALS
    assert out["steps"] < 0.4 * MAX_TRIALS * MAX_LENGTH
    assert set(out["by_length"]) <= {15, 62, 250, 1000}
