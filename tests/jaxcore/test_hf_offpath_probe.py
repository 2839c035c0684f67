"""jaxcore.hf off the well-trodden path: directories that already hold a checkpoint, Qwen2's
per-layer sliding-window switch, and damaged checkpoints (clear errors naming the file).

Reference: `transformers` on the same tiny random-init models (float32, eager attention).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers

import jaxcore as jc
from jaxcore import hf
from tests.jaxcore import hf_models as H


def _model(cls, seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = cls(**{**H.COMMON, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return H.randomize(model, seed).eval()


def _our_logits(directory, tokens: np.ndarray) -> np.ndarray:
    cfg, params = hf.load(directory)
    net = hf.build_model(cfg, params)
    return np.asarray(jax.jit(lambda t: net(t))(tokens))


def _hf_logits(directory, tokens: np.ndarray) -> np.ndarray:
    back = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=torch.float32
    )
    return H.torch_logits(back, tokens)


@pytest.mark.parametrize(
    "first_shard_bytes", [64 * 1024, None], ids=["sharded-then-single", "single-then-sharded"]
)
def test_saving_over_an_existing_checkpoint_leaves_no_stale_weights(tmp_path, first_shard_bytes):
    """A second `hf.save` into the same directory with another file layout: both jaxcore
    and transformers must read the new weights, not the old files left behind."""
    old, new = _model(transformers.LlamaConfig, seed=0), _model(transformers.LlamaConfig, seed=1)
    old.save_pretrained(tmp_path / "old")
    new.save_pretrained(tmp_path / "new")
    out = tmp_path / "out"
    cfg, params = hf.load(tmp_path / "old")
    hf.save(
        params, cfg, out, **({"max_shard_bytes": first_shard_bytes} if first_shard_bytes else {})
    )
    cfg, params = hf.load(tmp_path / "new")
    second = {} if first_shard_bytes else {"max_shard_bytes": 64 * 1024}
    hf.save(params, cfg, out, **second)

    tokens = H.tokens(2, 12)
    want = H.torch_logits(new, tokens)
    np.testing.assert_allclose(_hf_logits(out, tokens), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(_our_logits(out, tokens), want, atol=1e-5, rtol=0)
    written = sorted(p.name for p in out.iterdir() if "safetensors" in p.name)
    if second:
        assert "model.safetensors" not in written
    else:
        assert written == ["model.safetensors"]


def test_qwen2_with_every_layer_sliding_loads_and_saves_back(tmp_path):
    """``max_window_layers=0``: every layer slides, one window, which the native model has."""
    tokens = H.tokens(2, 12)  # longer than the window of 5
    model = _model(
        transformers.Qwen2Config, use_sliding_window=True, sliding_window=5, max_window_layers=0
    )
    model.save_pretrained(tmp_path / "in")
    cfg, params = hf.load(tmp_path / "in")
    assert cfg.sliding_window == 5 and cfg.qkv_bias
    want = H.torch_logits(model, tokens)
    np.testing.assert_allclose(_our_logits(tmp_path / "in", tokens), want, atol=1e-5, rtol=0)
    hf.save(params, cfg, tmp_path / "out")
    np.testing.assert_allclose(_hf_logits(tmp_path / "out", tokens), want, atol=1e-5, rtol=0)


def test_qwen2_mixed_layer_types_are_refused_naming_the_field(tmp_path):
    """transformers follows ``layer_types`` over ``max_window_layers`` (28 here: "all full"):
    one sliding layer of two must be refused, not loaded as full attention."""
    model = _model(
        transformers.Qwen2Config,
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=28,
        layer_types=["full_attention", "sliding_attention"],
    )
    model.save_pretrained(tmp_path / "mixed")
    with pytest.raises(jc.ConfigError, match=r"layer_types=\['full_attention', 'sliding"):
        hf.load(tmp_path / "mixed")


def test_missing_or_truncated_shard_is_named_with_a_fix(tmp_path):
    model = _model(transformers.LlamaConfig)
    model.save_pretrained(tmp_path / "m", max_shard_size="20KB")
    shards = sorted(p for p in (tmp_path / "m").iterdir() if p.name.startswith("model-"))
    assert len(shards) > 2
    shards[1].unlink()
    with pytest.raises(jc.ConfigError, match=rf"{shards[1].name}.*download") as e:
        hf.load(tmp_path / "m")
    assert "missing" in str(e.value)

    model.save_pretrained(tmp_path / "t", max_shard_size="20KB")
    victim = sorted((tmp_path / "t").glob("model-*"))[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(jc.ConfigError, match=rf"{victim.name}.*download"):
        hf.load(tmp_path / "t")


@pytest.mark.parametrize(
    ("rope", "key"),
    [
        ({"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}, "low_freq_factor"),
        ({"rope_type": "linear", "rope_theta": 5e5}, "factor"),
    ],
)
def test_rope_scaling_missing_a_field_is_a_config_error_naming_it(rope, key):
    config = {**H.CONFIGS["llama"]().to_dict(), "rope_parameters": rope}
    with pytest.raises(jc.ConfigError, match=rf"rope_type='{rope['rope_type']}'.*'{key}'"):
        hf.config_from_hf(config)


@pytest.mark.parametrize("head", ["LlamaModel", "LlamaForSequenceClassification"])
def test_a_checkpoint_that_is_not_a_causal_lm_is_refused_naming_architectures(tmp_path, head):
    """A tied-embedding backbone or classifier has every tensor a tied causal LM needs:
    it must not load as a language model with the head silently dropped."""
    config = transformers.LlamaConfig(**H.COMMON, tie_word_embeddings=True, num_labels=3)
    getattr(transformers, head)(config).save_pretrained(tmp_path / "m")
    with pytest.raises(jc.ConfigError, match=rf"architectures=\['{head}'\].*ForCausalLM"):
        hf.load(tmp_path / "m")


def test_a_config_missing_a_size_field_names_it():
    config = H.CONFIGS["llama"]().to_dict()
    del config["num_hidden_layers"]
    with pytest.raises(jc.ConfigError, match=r"missing \['num_hidden_layers'\]"):
        hf.config_from_hf(config)
