"""Stop 44: an all-padding batch under gradient accumulation reports weight 0.

``metrics["weight"]`` read 1e-12 (the divisor's floor) when every token of a step was
padding, so a host-side weighted mean (``jc.MeanMetrics``) counted the step as real.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import factory, make_batch


def test_all_padding_step_weighs_zero_and_changes_nothing():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3, grad_accum=2)
    plan = engine.plan(factory, optax.sgd(0.1))
    state = plan.init(0)
    batch = make_batch(16, seed=0)
    batch["mask"] = np.zeros_like(batch["tokens"])
    before = jax.device_get(state.params)  # the step donates its input state
    new_state, metrics = plan.train_step(lm_loss)(state, batch)
    assert float(metrics["weight"]) == 0.0
    assert float(metrics["loss"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
    after = jax.device_get(new_state.params)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)
    mean = jc.MeanMetrics()
    mean.update(metrics)
    assert mean.compute() == {"weight": 0.0}


@pytest.mark.parametrize(
    ("spec", "hub"),
    [
        ("org/model", True),
        ("Qwen/Qwen2.5-0.5B", True),
        ("missing/", False),  # a folder typed with its slash
        ("out/tokenizer.json", False),
        ("./org/model", False),
        ("a/b/c", False),
    ],
)
def test_only_what_reads_as_a_hub_id_is_called_one(spec, hub, tmp_path, monkeypatch):
    # `--tokenizer missing/` was told it "looks like a Hugging Face Hub name" and to run
    # snapshot_download('missing/'); the model loader had its own, different rule.
    from inference.weights import load_safetensors

    monkeypatch.chdir(tmp_path)
    for load in (jc.load_tokenizer, load_safetensors):
        with pytest.raises(jc.ConfigError, match="does not exist") as err:
            load(spec)
        assert ("snapshot_download" in str(err.value)) is hub, (load, str(err.value))


def test_exported_weights_are_readable_by_others(tmp_path):
    # safetensors writes 0600: a file saved for a server running as another user (or a
    # colleague) could not be read. Saved files now get open()'s mode, 0o666 less umask.
    import os

    import torch

    import torchbridge

    os.umask(umask := os.umask(0o022))
    path = jc.save_params({"w": np.ones((2, 2), np.float32)}, tmp_path / "a.safetensors")
    torchbridge.save_safetensors({"w": torch.ones(2)}, tmp_path / "b.safetensors")
    for name in (path, tmp_path / "b.safetensors"):
        assert os.stat(name).st_mode & 0o777 == 0o666 & ~umask, name
