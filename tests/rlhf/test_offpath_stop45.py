"""Stop 45: a rerun into a ``train.out`` whose data file changed since the run started.

A resume reads on at the same record position, so another file under the same path
(edited, regenerated, shuffled) trained the rest of the run on other records without a
word: ``run.json`` recorded the path only. Nothing here compiles a model.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from jaxcore import ConfigError
from rlhf.cli import RUN_RECORD, _record_settings, check_out
from rlhf.config import load_config
from tests.rlhf.helpers import write_config

MODEL = dict(
    vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16
)


def _config(tmp_path, data):
    raw = {"model": MODEL, "train": {"steps": 2, "batch_size": 8}}
    raw["data"] = {"path": str(data), "held_out": 1}
    cfg = load_config("dpo", write_config(tmp_path, "d.yaml", raw))
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=str(tmp_path / "o")))


def _records(path, n):
    path.write_text(
        "".join(
            json.dumps({"prompt": [4, i], "chosen": [5], "rejected": [6]}) + "\n" for i in range(n)
        )
    )


def test_a_data_file_changed_since_the_run_started_is_refused(tmp_path):
    data = tmp_path / "pairs.jsonl"
    _records(data, 9)
    cfg = _config(tmp_path, data)
    _record_settings(cfg, tmp_path / "o")
    check_out(cfg)  # the same file: resumes
    _records(data, 10)
    with pytest.raises(
        ConfigError, match=r"started on another data.path file: .*pairs.jsonl changed"
    ):
        check_out(cfg)


def test_a_run_recorded_without_the_hash_still_resumes(tmp_path):
    data = tmp_path / "pairs.jsonl"
    _records(data, 9)
    cfg = _config(tmp_path, data)
    _record_settings(cfg, tmp_path / "o")
    record = tmp_path / "o" / RUN_RECORD
    settings = json.loads(record.read_text())
    del settings["data.path contents (sha256)"]  # as run.json was before stop 45
    record.write_text(json.dumps(settings))
    _records(data, 10)
    check_out(cfg)
    other = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seed=1))
    with pytest.raises(ConfigError, match=r"data.seed: 0 -> 1"):
        check_out(other)


def test_merged_lora_params_are_a_plain_transformer_with_the_same_logits(tmp_path):
    # hf.save / save_params take a plain Transformer's params; a LoRA run had no public
    # way to fold its adapters in ("unknown ['lora']").
    import jax
    import numpy as np
    from flax import nnx

    from jaxcore.models import Transformer, TransformerConfig
    from rlhf import lora

    cfg = TransformerConfig(**MODEL)
    config = lora.LoRAConfig(rank=2, alpha=6.0, targets=("wo", "w_up", "lm_head"))
    model = lora.LoRATransformer(cfg, config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    for name in config.targets:  # B starts at zero: give the adapters something to add
        b = getattr(model.lora, f"{name}_b")
        b[...] = rng.normal(size=b[...].shape).astype(np.float32)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    merged = lora.merged_params(params, config)
    assert "lora" not in merged and set(merged) == set(params) - {"lora"}
    plain = Transformer(cfg, rngs=nnx.Rngs(1))
    state = nnx.state(plain, nnx.Param)
    nnx.replace_by_pure_dict(state, merged)
    nnx.update(plain, state)
    tokens = rng.integers(0, cfg.vocab_size, (2, 8)).astype(np.int32)
    forward = nnx.jit(lambda m, t: m(t))  # eager, the two forwards took ~10 s
    np.testing.assert_allclose(forward(plain, tokens), forward(model, tokens), rtol=1e-5, atol=1e-5)
    assert not np.allclose(jax.device_get(merged["wo"]), jax.device_get(params["wo"]))
    from jaxcore import hf

    with pytest.raises(ConfigError, match=r"rlhf\.lora\.merged_params\(params, lora_config\)"):
        hf.save(params, cfg, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ConfigError, match="pass the LoRAConfig the run was trained with"):
        lora.merged_params(params, lora.LoRAConfig(rank=2, targets=("wq",)))
