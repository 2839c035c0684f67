"""`inference.LLM` on tiny Hugging Face checkpoints (``save_pretrained``, random weights,
nothing downloaded) against ``transformers`` ``generate(do_sample=False)`` as the oracle:
Llama (tied and untied, Llama 3 rope scaling), Qwen2 (q/k/v biases) and Mistral with a
sliding window shorter than prompt plus completion, on the contiguous and the paged
cache, in one continuous batch where requests join, queue and finish at different steps.

The paged cache ignored the sliding window (every key attended) and the rope scaling
(plain RoPE frequencies), so Mistral and Llama 3 checkpoints generated other tokens than
transformers with ``kv_cache="paged"``; the contiguous cache was right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import jaxcore as jc
from inference import LLM, SamplingParams, ServingConfig
from inference.batching import run_to_completion
from tests.jaxcore import hf_models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_LEN = 32
PAGE = 8
COMMON = {**hf_models.COMMON, "max_position_embeddings": 64}
LLAMA3_ROPE = hf_models.LLAMA3_ROPE
CONFIGS = {
    "llama-tied": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "llama-untied": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=False),
    "llama3-rope": lambda: transformers.LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, rope_parameters={"rope_theta": 1e6}),
    "mistral-window5": lambda: transformers.MistralConfig(
        **COMMON, sliding_window=5, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    ),
}
# Prompt lengths across a page boundary (PAGE - 1, PAGE, PAGE + 1) and past the window,
# with completions of different lengths, so requests finish (and the third queues and
# joins) at different steps; the last one fills the slot to MAX_LEN exactly.
LENGTHS = (PAGE - 1, PAGE, PAGE + 1, 3, 2 * PAGE + 1)
NEW_TOKENS = (11, 4, 9, 14, MAX_LEN - (2 * PAGE + 1))


def _checkpoint(kind: str, folder: Path):
    """A random-weight checkpoint of ``kind`` saved with ``save_pretrained`` (norm scales
    and biases random too); the torch model and its folder."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        CONFIGS[kind](), attn_implementation="eager"
    ).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.05
            p.copy_(1.0 + noise if "norm" in name else noise)
    model.generation_config.eos_token_id = None  # run to max_new_tokens, as we do
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    return model, folder


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy tokens (the attention mask given: with ``pad_token_id=0`` it
    would otherwise mask every 0 in the prompt)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False
        )
    return out[0, len(prompt) :].tolist()


def _prompts(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n).tolist() for n in LENGTHS]


def _llm(folder: Path, cache: str, **engine) -> LLM:
    config = ServingConfig(
        slots=3,
        max_len=MAX_LEN,
        decode_steps=3,
        prefill_buckets=(16, MAX_LEN),
        kv_cache=cache,
        page_size=PAGE,
        **engine,
    )
    return LLM(str(folder), engine=config)


@pytest.mark.parametrize("kind", ["mistral-window5", "llama3-rope"])
def test_paged_cache_generates_transformers_tokens(tmp_path, kind):
    model, folder = _checkpoint(kind, tmp_path / kind)
    prompts = _prompts()
    want = [_hf_greedy(model, p, n) for p, n in zip(prompts, NEW_TOKENS, strict=True)]
    with _llm(folder, "paged") as llm:
        work = [(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, NEW_TOKENS, strict=True)]
        got = run_to_completion(llm.scheduler, work)
        assert [r.output for r in got] == want
        assert [r.finish_reason for r in got] == ["length"] * len(work)
        assert llm.scheduler.pool.free_pages() == llm.scheduler.pool.total


@pytest.mark.parametrize(
    "kind", ["llama-tied", "llama-untied", "llama3-rope", "qwen2", "mistral-window5"]
)
def test_contiguous_batch_generates_transformers_tokens(tmp_path, kind):
    model, folder = _checkpoint(kind, tmp_path / kind)
    prompts = _prompts(seed=2)
    want = [_hf_greedy(model, p, n) for p, n in zip(prompts, NEW_TOKENS, strict=True)]
    with _llm(folder, "contiguous") as llm:
        work = [(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, NEW_TOKENS, strict=True)]
        assert [r.output for r in run_to_completion(llm.scheduler, work)] == want


def test_cancel_mid_generation_frees_pages_and_leaves_the_others_alone(tmp_path):
    _, folder = _checkpoint("qwen2", tmp_path / "qwen2")
    a, b = _prompts(seed=3)[:2]
    with _llm(folder, "paged") as llm:
        sched = llm.scheduler
        alone = run_to_completion(sched, [(b, SamplingParams(max_tokens=20))])[0].output
        cancelled = sched.submit(a, SamplingParams(max_tokens=20))
        other = sched.submit(b, SamplingParams(max_tokens=20))
        for _ in range(3):
            sched.step()
        assert 0 < len(cancelled.output) < 20
        cancelled.cancel()
        while sched.busy():
            sched.step()
        assert cancelled.finish_reason == "cancelled"
        assert other.output == alone
        assert sched.pool.free_pages() == sched.pool.total


@pytest.fixture(scope="module")
def tiny_llm():
    config = ServingConfig(slots=2, max_len=MAX_LEN, prefill_buckets=(16, MAX_LEN), decode_steps=2)
    with LLM("tiny", engine=config) as llm:
        yield llm


@pytest.mark.parametrize("seed", [1.5, "7", True])
def test_a_seed_that_is_not_an_integer_is_refused_when_the_params_are_built(tiny_llm, seed):
    # It raised TypeError (float & int) inside the scheduler's step, after the request
    # had left the queue: that request never finished, and a scheduler thread died.
    with pytest.raises(jc.ConfigError, match=r"SamplingParams\.seed"):
        SamplingParams(seed=seed)
    assert tiny_llm.generate("ab", max_tokens=2, seed=np.int64(4)).finish_reason == "length"


def test_seeds_past_32_bits_draw_their_own_tokens(tiny_llm):
    # Only the low 32 bits reached the key: seed 2**32 (or the server's seed + i for the
    # i-th sample) repeated seed 0's tokens exactly.
    def draw(seed: int) -> list[int]:
        return tiny_llm.generate("ab", max_tokens=8, temperature=1.0, seed=seed).tokens

    assert draw(2**32) != draw(0)
    assert draw(2**32 + 5) != draw(5)
    assert draw(2**32) == draw(2**32)


def test_smoothing_keeps_a_qkv_bias_model_unchanged():
    # The value projection's columns were divided by the attention-output scales but its
    # bias (Qwen2's bv) was not: the "unchanged" float model moved, and int8-smooth
    # greedy agreed with float32 on 43 of 160 tokens (int8: 152) on a tiny Qwen2.
    import jax

    from inference.quantize import calibrate, smooth_weights
    from inference.weights import build_model, init_params
    from jaxcore.models import TransformerConfig
    from jaxcore.models.decoding import decoding_weights, prefill

    cfg = TransformerConfig.tiny(max_seq_len=MAX_LEN, qkv_bias=True)
    params = init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    for name in ("bq", "bk", "bv"):
        params[name] = rng.normal(0, 0.5, params[name].shape).astype(np.float32)
    weights = decoding_weights(build_model(cfg, params))
    tokens = rng.integers(0, 256, (2, 16)).astype(np.int32)
    stats = calibrate(cfg, weights, [tokens])
    smoothed = smooth_weights(weights, stats, alpha=0.5, n_kv_heads=cfg.n_kv_heads)
    run = jax.jit(lambda w, t: prefill(cfg, w, t)[0])
    np.testing.assert_allclose(run(smoothed, tokens), run(weights, tokens), atol=2e-4, rtol=1e-4)
