"""Stop 43: off-path mistakes that were bare Python errors or said too little.

- ``SamplingParams(n=2)`` copied from vLLM (TypeError naming no way out).
- ``compression.text_batches`` given too little text, no documents or a bad index
  (a plain ValueError / numpy's "need at least one array" / IndexError).
- an experiment whose ``searcher.metric`` is mistyped: each trial was marked errored
  without saying what it did report.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import yaml

import jaxcore as jc
from inference.sampling import SamplingParams
from jaxcore.cli import main
from jaxcore.compression.evaluate import text_batches
from jaxcore.experiments.store import Store

HERE = pathlib.Path(__file__)


def reports_loss(ctx):
    ctx.report(1, {"loss": ctx.hparams["x"], "acc": 0.5})


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (
            {"n": 2},
            r"SamplingParams: 'n' is not a setting of SamplingParams; 2 samples: pass "
            r"the prompt 2 times",
        ),
        ({"best_of": 3}, r"'best_of' is not a setting of SamplingParams; 3 samples"),
        ({"temprature": 0.5}, r"'temprature' is not a setting.*did you mean 'temperature'"),
    ],
)
def test_sampling_params_refuses_unknown_keywords_with_a_way_out(kwargs, says):
    with pytest.raises(jc.ConfigError, match=says):
        SamplingParams(**kwargs)
    assert SamplingParams(max_tokens=3, temperature=0.5).max_tokens == 3


@pytest.mark.parametrize(
    ("documents", "kw", "says"),
    [
        ([0], {}, r"the 1 documents hold 5 tokens, too few for windows of seq_len=8"),
        ([], {}, r"the 0 documents hold 0 tokens"),
        ([0, 7], {}, r"document indices \[7\] are out of range for a source of 2 documents"),
        ([0, 1], {"batch": 0}, r"batch=0 must be a positive int"),
    ],
)
def test_text_batches_says_what_is_wrong(documents, kw, says):
    source = [np.arange(5), np.arange(40)]
    args = {"batch": 2, "seq_len": 8, "count": 1, "seed": 0, **kw}
    with pytest.raises(jc.ConfigError, match=says):
        text_batches(source, documents, **args)
    (b,) = text_batches(source, [0, 1], batch=2, seq_len=8, count=1, seed=0)
    assert b.shape == (2, 9) and b.dtype == np.int32


def test_a_mistyped_searcher_metric_names_what_the_trial_reported(tmp_path):
    raw = {
        "name": "typo",
        "entrypoint": f"{HERE}:reports_loss",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
        "searcher": {"name": "single", "metric": "los", "max_length": 1},
    }
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["experiment", "create", str(path), "--executor", "inline", "--quiet"]) == 1
    log = next((tmp_path / "work").glob("*/trial-1/logs.txt")).read_text()
    assert "without reporting the searcher metric 'los' (it reported 'acc', 'loss'" in log
    assert "did you mean searcher.metric: loss?" in log


def test_a_refused_create_leaves_no_empty_store_file(tmp_path, monkeypatch, capsys):
    """``create --executor ray`` with no cluster was refused after the store was opened,
    leaving an empty ``jaxcore.db`` that later commands took for a real store. Ray is a
    stand-in raising what ``ray.init(address="auto")`` raises with no cluster."""
    import sys
    import types

    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False

    def init(address=None, **kw):
        raise ConnectionError("Could not find any running Ray instance.")

    fake.init = init
    monkeypatch.setitem(sys.modules, "ray", fake)
    raw = {
        "name": "refused",
        "entrypoint": f"{HERE}:reports_loss",
        "workdir": str(tmp_path / "work"),
        "hyperparameters": {"x": 0.5},
        "searcher": {"name": "single", "metric": "loss", "max_length": 1},
    }
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    db = tmp_path / "mine.db"
    argv = ["experiment", "create", str(path), "--db", f"sqlite:///{db}"]
    assert main([*argv, "--executor", "ray", "--ray-address", "auto"]) == 2
    assert "Could not find any running Ray instance" in capsys.readouterr().err
    assert not db.exists() and not list(tmp_path.glob("mine.db*"))
    # An existing store is left as it was (only a file this command made is removed).
    assert main([*argv, "--executor", "inline", "--quiet"]) == 0
    assert main([*argv, "--executor", "ray", "--ray-address", "auto"]) == 2
    # (its size may change: SQLite folds the WAL into the file when a connection closes)
    store = Store(f"sqlite:///{db}", create=False)
    try:
        assert [e["state"] for e in store.experiments()] == ["COMPLETED"]
    finally:
        store.close()
