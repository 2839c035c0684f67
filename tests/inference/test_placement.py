"""Serving shardings come from the rules table (no training engine), the model source is
resolved in one place (registry hook, HF folders), and the penalties match an oracle."""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from inference import ServingConfig, resolve_model, save_safetensors
from inference.engine import SlotEngine
from inference.sampling import penalize
from inference.weights import init_params
from jaxcore.models import TransformerConfig
from jaxcore.sharding import DEFAULT_RULES

CFG = TransformerConfig.tiny(max_seq_len=32)


def _rules(**changes):
    return tuple((name, changes.get(name, target)) for name, target in DEFAULT_RULES)


def test_the_kv_cache_follows_the_kv_heads_rule():
    params = init_params(CFG, seed=0)
    parallel = jc.ParallelConfig(data=4, tensor=2, fsdp=1)
    on_tensor = SlotEngine(CFG, params, ServingConfig(slots=4, parallel=parallel))
    assert on_tensor.state.cache.k[0].sharding.spec[1] == "tensor"  # layer 0's cache
    assert on_tensor.weights["blocks"][0]["wk"].sharding.spec[1] == "tensor"  # layer 0
    assert on_tensor.state.cache.k[0].sharding.spec[0] == "data"  # slots like the batch
    replicated = SlotEngine(
        CFG, params, ServingConfig(slots=4, parallel=parallel, rules=_rules(kv_heads=None))
    )
    assert replicated.state.cache.k[0].sharding.spec[1] is None
    assert replicated.weights["blocks"][0]["wk"].sharding.spec[1] is None
    assert replicated.weights["blocks"][0]["wq"].sharding.spec[1] == "tensor"  # heads unchanged
    moved = SlotEngine(
        CFG, params, ServingConfig(slots=4, parallel=parallel, rules=_rules(batch=None))
    )
    assert tuple(moved.state.cache.k[0].sharding.spec)[0:2] == (None, "tensor")
    assert moved.state.tokens.sharding.spec == jax.sharding.PartitionSpec(None)


def test_resolve_model_registry_hook_and_hf_folders(tmp_path, monkeypatch):
    params = init_params(CFG, seed=1)
    weights = save_safetensors(tmp_path / "m.safetensors", CFG, params)
    (tmp_path / "tok").mkdir()
    registry = pytest.importorskip("jaxcore.experiments.registry")
    calls = []

    def resolve(spec):
        calls.append(spec)
        return types.SimpleNamespace(
            weights_path=weights, config=None, tokenizer_path=str(tmp_path / "tok")
        )

    monkeypatch.setattr(registry, "resolve", resolve, raising=False)
    got = resolve_model("registry:demo@prod")
    assert calls == ["demo@prod"] and got.config == CFG
    assert got.tokenizer_path == str(tmp_path / "tok")
    np.testing.assert_array_equal(got.params["embed"], params["embed"])
    monkeypatch.delattr(registry, "resolve")
    with pytest.raises(jc.ConfigError, match="no resolve"):
        resolve_model("registry:demo@prod")
    # A Hugging Face folder (config.json with a model_type) is read by jaxcore.hf, and its
    # tokenizer.json, when there is one, comes along.
    import jaxcore.hf

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    loaded = []
    monkeypatch.setattr(jaxcore.hf, "load", lambda path: loaded.append(path) or (CFG, params))
    got = resolve_model(hf)
    assert loaded == [hf] and got.config == CFG and got.tokenizer_path is None
    (hf / "tokenizer.json").write_text("{}")
    assert resolve_model(hf).tokenizer_path == str(hf)


@settings(max_examples=50, deadline=None)
@given(
    # XLA's CPU backend flushes subnormals to zero in every op, the model's included.
    st.lists(st.floats(-5, 5, width=32, allow_subnormal=False), min_size=6, max_size=6),
    st.lists(st.integers(0, 3), min_size=6, max_size=6),
    st.lists(st.booleans(), min_size=6, max_size=6),
    st.floats(0.5, 2.0),
    st.floats(-2, 2),
    st.floats(-2, 2),
)
def test_penalize_matches_a_reference(logits, counts, seen, rep, pres, freq):
    x = np.asarray(logits, np.float32)
    c = np.asarray(counts, np.int32)
    s = np.asarray(seen) | (c > 0)
    want = np.where(s, np.where(x > 0, x / rep, x * rep), x) - freq * c - pres * (c > 0)
    got = penalize(
        jnp.asarray(x)[None],
        jnp.asarray(s)[None],
        jnp.asarray(c)[None],
        jnp.float32([rep]),
        jnp.float32([pres]),
        jnp.float32([freq]),
    )[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    neutral = penalize(
        jnp.asarray(x)[None],
        jnp.asarray(s)[None],
        jnp.asarray(c)[None],
        jnp.float32([1.0]),
        jnp.float32([0.0]),
        jnp.float32([0.0]),
    )[0]
    np.testing.assert_array_equal(np.asarray(neutral), x)  # bit for bit: greedy unchanged
