"""The README's "Inference and serving" / "Hugging Face models" driven off their path with a
tiny random Llama written by ``save_pretrained``; ``transformers`` is the oracle."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcore as jc
from inference import LLM, RequestError, SamplingParams, ServingConfig
from inference.paging import PagePool, PromptScores

CONTEXT = 16


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A 1-layer Llama (vocab 256, context 16, untied head, EOS 1) and its folder."""
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # large random weights: a greedy path with no near ties
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape) * 0.3 + (1.0 if "norm" in name else 0.0))
    folder = tmp_path_factory.mktemp("llama")
    model.save_pretrained(folder)
    llm = LLM(
        str(folder), engine=ServingConfig(slots=2, prefill_buckets=(CONTEXT,), decode_steps=1)
    )
    yield model, folder, llm
    llm.close()


def _greedy(model, ids: list[int], n: int) -> list[int]:
    """transformers' generate(do_sample=False), made to run n tokens past its EOS."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=1
        )
    return out[0, len(ids) :].tolist()


def test_greedy_batches_and_edges_equal_transformers(llama):
    """Lengths 1 .. the whole context, batched with others and alone, max_tokens 0 / 1, a
    stop token at the first position, temperature 0 and top_p=1 / top_k=0 (all passed)."""
    model, _, llm = llama
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 256, n).tolist() for n in (1, 5, CONTEXT - 3, CONTEXT - 1)]
    work = [SamplingParams(max_tokens=min(3, CONTEXT - len(p)), ignore_eos=True) for p in prompts]
    batch = [c.tokens for c in llm.generate(prompts, work)]
    alone = [llm.generate(p, s).tokens for p, s in zip(prompts, work, strict=True)]
    want = [_greedy(model, p, s.max_tokens) for p, s in zip(prompts, work, strict=True)]
    assert batch == alone == want
    five = prompts[1]
    first = want[1][0]
    one = llm.generate(five, max_tokens=1, temperature=0.0, top_p=1.0, top_k=0)
    assert (one.tokens, one.finish_reason) == ([first], "length")
    none = llm.generate(five, max_tokens=0)
    assert (none.tokens, none.text, none.finish_reason) == ([], "", "length")
    stopped = llm.generate(five, max_tokens=3, stop_token_ids=[first])
    assert (stopped.tokens, stopped.finish_reason) == ([], "stop")
    # log p of a prompt that fills the context, against transformers' log-softmax
    full = rng.integers(2, 256, CONTEXT).tolist()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
    want_lp = [float(ref[i - 1, t]) for i, t in enumerate(full) if i]
    np.testing.assert_allclose(llm.score(full), want_lp, atol=1e-4, rtol=0)
    with pytest.raises(RequestError, match="context is 16 tokens"):
        llm.generate([*full, 5], max_tokens=0)


def test_a_prompt_past_the_largest_prefill_bucket_is_refused_at_once(llama, monkeypatch):
    """It was admitted, then failed in its prefill: a ConfigError without the fix out of
    LLM.generate (the batch's other completions lost), a 500 from the server."""
    _, _, llm = llama
    monkeypatch.setattr(llm.engine, "buckets", (4,))  # as ServingConfig(prefill_buckets=(4,))
    failed = llm.scheduler.stats.get("requests_failed", 0)
    with pytest.raises(
        RequestError, match=r"prompt has 6 tokens.*largest prefill bucket is 4"
    ) as e:
        llm.generate([[3, 4], [5] * 6], max_tokens=2)
    assert "prefill_buckets" in str(e.value) and e.value.param == "prompt"
    assert llm.scheduler.stats.get("requests_failed", 0) == failed  # nothing admitted


def test_a_save_pretrained_folder_without_config_json_says_to_restore_it(llama, tmp_path):
    """It said to write "a config.json of TransformerConfig fields", which the HF tensor
    names then did not fit (and a sharded folder was "model.safetensors does not exist")."""
    _, folder, _ = llama
    single = shutil.copytree(folder, tmp_path / "single")
    (single / "config.json").unlink()
    with pytest.raises(jc.ConfigError, match=r"Hugging Face.*no config\.json") as e:
        LLM(str(single))
    assert "TransformerConfig fields" not in str(e.value)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(jc.ConfigError, match=r"Hugging Face.*no config\.json"):
        LLM(str(sharded))


def _scores(n: int) -> PromptScores:
    """Stand-in prompt scores of ``n`` positions (entry t: ``-t``) for the cache."""
    lp = -np.arange(n, dtype=np.float32)
    return PromptScores(lp, np.ones(n, np.int32), np.zeros((n, 1), np.int32), lp[:, None])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_size=st.integers(1, 5),
    max_len=st.integers(2, 16),
    requests=st.lists(
        st.tuples(st.integers(1, 16), st.integers(0, 16), st.booleans()), min_size=1, max_size=4
    ),
)
def test_an_idle_paged_pool_always_admits_a_request_that_fits(page_size, max_len, requests):
    """A pool just large enough for one request (ServingConfig(slots=1, kv_cache='paged'))
    never admitted a prompt whose cached blocks plus the copy-on-write source it pinned
    left too few pages: score(p) then generate(p, max_tokens=2) with p 14 tokens, 16
    positions and page_size=4 waited forever in LLM.generate (and a server request)."""
    per_slot = -(-max_len // page_size)
    pool = PagePool(per_slot + 1, page_size, per_slot, prefix_caching=True)
    base = list(range(100, 100 + max_len))  # shared heads: every request hits the cache
    for length, max_tokens, scored in requests:
        prompt = base[: min(length, max_len)]
        total = min(len(prompt) + max(max_tokens, 1), max_len)
        r = pool.reserve(prompt, total, use_cache=True, scores=scored)
        assert r is not None, "nothing else holds a page, yet the request would wait forever"
        assert len(r.pages) == -(-total // page_size) and r.cached_tokens < len(prompt)
        if r.copy is not None:
            assert r.copy[0] not in r.pages and r.copy[1] == r.pages[r.cached_tokens // page_size]
        if scored and r.cached_tokens:
            np.testing.assert_array_equal(r.scores.logprobs, _scores(r.cached_tokens + 1).logprobs)
        if scored:
            pool.store_scores(r.hashes, _scores(len(prompt)), 1)
        pool.release(r)
        assert pool.free_pages() == pool.total
