"""Loading weights (params, TrainState, safetensors), tokenizers, and parity with HF."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from inference import (
    SamplingParams,
    Scheduler,
    ServingConfig,
    load_tokenizer,
    resolve,
    save_safetensors,
)
from inference.batching import run_to_completion
from inference.engine import SlotEngine
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params, load_safetensors
from jaxcore.models import Transformer, TransformerConfig
from jaxcore.tokenization import Tokenizer as FileTokenizer

CFG = TransformerConfig.tiny(max_seq_len=64, rope_theta=5000.0)


def test_safetensors_round_trip_and_train_state(tmp_path):
    params = init_params(CFG, seed=5)
    path = save_safetensors(tmp_path / "m.safetensors", CFG, params)
    cfg, loaded = load_safetensors(path)
    assert cfg == CFG
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    state = engine.prepare(lambda rngs: Transformer(CFG, rngs=rngs), optax.sgd(0.1))
    cfg, from_state = resolve(state, config=CFG)
    assert jax.tree.structure(from_state) == jax.tree.structure(params)
    with pytest.raises(jc.ConfigError, match="without config"):
        resolve(params)
    with pytest.raises(jc.ConfigError, match="does not exist"):
        resolve(str(tmp_path / "missing.safetensors"))


def test_tokenizers_bytes_and_json(tmp_path):
    tok = ByteTokenizer()
    text = "héllo ✓"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text)[:-1]).endswith("\ufffd")  # incomplete character
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator(
        ["def f(x): return x + 1"] * 20,
        trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]", "</s>"]),
    )
    hf.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, FileTokenizer) and loaded.eos_id == hf.token_to_id("</s>")
    assert loaded.decode(loaded.encode("return x")) == "return x"
    with pytest.raises(jc.ConfigError, match="tokenizer"):
        load_tokenizer(tmp_path / "nope.json")


@pytest.mark.slow
def test_greedy_generation_equals_hugging_face_generate():
    """Our KV-cache greedy tokens equal transformers' LlamaForCausalLM.generate on the
    same weights (the peer of the serving benchmark)."""
    import torch

    from inference.hf import to_hf_llama

    params = init_params(CFG, seed=6)
    hf = to_hf_llama(CFG, params)
    prompt = [3, 14, 15, 92, 65, 35]
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False
        )
        hf_logits = hf(ids).logits[0].numpy()
    engine = SlotEngine(CFG, params, ServingConfig(slots=1, prefill_buckets=(16,)))
    (ours,) = run_to_completion(
        Scheduler(engine, ByteTokenizer()),
        [(prompt, SamplingParams(max_tokens=20, prompt_logprobs=True))],
    )
    assert ours.output == out[0, len(prompt) :].tolist()
    want = torch.log_softmax(torch.from_numpy(hf_logits), -1).numpy()[np.arange(5), prompt[1:]]
    np.testing.assert_allclose(ours.prompt_logprobs, want, atol=1e-4)


def test_checkpoint_export_loads_for_serving(tmp_path):
    # Train one step, checkpoint it, export the portable file, serve it: the bridge from
    # training (jaxcore.checkpoint) to inference is the one safetensors format.
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    state = engine.prepare(lambda rngs: Transformer(CFG, rngs=rngs), optax.sgd(0.1))
    state, _ = engine.train_step(jc.models.lm_loss)(
        state, {"tokens": np.arange(2 * 17, dtype=np.int32).reshape(2, 17) % 256}
    )
    config = jc.CheckpointConfig(
        directory=tmp_path / "ckpt", async_save=False, save_on_sigterm=False, announce=False
    )
    with jc.Checkpointer(config) as ckpt:
        ckpt.save(state, force=True)
    exported = jc.export_checkpoint(tmp_path / "ckpt" / "1", tmp_path / "model.safetensors")
    with pytest.raises(jc.ConfigError, match="does not say its model config"):
        resolve(str(exported))
    cfg, params = resolve(str(exported), config=CFG)
    for a, b in zip(
        jax.tree.leaves(params), jax.tree.leaves(jax.device_get(state.params)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    # A file written for serving carries its config, and is jaxcore's portable format.
    served = save_safetensors(tmp_path / "served.safetensors", cfg, params)
    assert jc.read_params(served)[1]["model_config"]["rope_theta"] == CFG.rope_theta
