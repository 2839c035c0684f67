"""``jaxcore export --hf``: fine-tune a HF model, checkpoint, export, load in transformers."""

from __future__ import annotations

import json

import jax
import numpy as np
import optax
import pytest
import transformers

import jaxcore as jc
from jaxcore import hf
from jaxcore.cli import main as cli
from jaxcore.models import lm_loss
from tests.jaxcore import hf_models as H


def test_fine_tune_checkpoint_and_export_to_transformers(tmp_path, capsys):
    _, directory = H.save_model("qwen2", tmp_path / "hf")
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(hf.model_factory(directory, engine), optax.adamw(1e-2))
    state, _ = engine.train_step(lm_loss)(state, {"tokens": H.tokens(8, 13)})
    ckpt = jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path / "run", save_every_steps=1))
    ckpt.save(state, force=True)
    ckpt.close()

    out = tmp_path / "exported"
    with pytest.raises(SystemExit):  # argparse: --config is required
        cli(["export", "--hf", str(tmp_path / "run" / "1"), str(out)])
    assert "--config" in capsys.readouterr().err
    assert cli(["export", "--hf", str(tmp_path / "run"), str(out), "--config", str(directory)]) == 2
    assert "not a checkpoint step" in capsys.readouterr().err
    rc = cli(["export", "--hf", str(tmp_path / "run" / "1"), str(out), "--config", str(directory)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"

    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    tokens = H.tokens(2, 12)
    cfg = hf.config_from_hf(directory)
    trained = hf.build_model(cfg, jax.tree.map(np.asarray, jax.device_get(state.params)))
    ours = np.asarray(jax.jit(lambda t: trained(t))(tokens))
    np.testing.assert_allclose(H.torch_logits(back, tokens), ours, atol=1e-5, rtol=0)
