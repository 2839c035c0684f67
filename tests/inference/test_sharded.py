"""Sharded serving (tensor=2 over heads, data=4 over slots) equals one device."""

from __future__ import annotations

import numpy as np
import pytest

import jaxcore as jc
from inference import SamplingParams, Scheduler, ServingConfig
from inference.batching import run_to_completion
from inference.engine import SlotEngine
from inference.tokenizer import ByteTokenizer
from inference.weights import init_params
from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64)


@pytest.mark.slow
def test_tensor2_data4_equals_one_device():
    params = init_params(CFG, seed=2)
    config = ServingConfig(slots=8, prefill_buckets=(32,))
    single = SlotEngine(CFG, params, config)
    sharded = SlotEngine(
        CFG,
        params,
        ServingConfig(
            slots=8, prefill_buckets=(32,), parallel=jc.ParallelConfig(data=4, tensor=2, fsdp=1)
        ),
    )
    # The weights and the cache really are split: heads over tensor, slots over data.
    wq = sharded.weights["blocks"][0]["wq"]  # layer 0: (d_model, heads, head_dim)
    assert wq.addressable_shards[0].data.shape[1] == CFG.n_heads // 2
    cache = sharded.state.cache.k[0]  # layer 0: (slots, kv_heads, length, head_dim)
    assert len(cache.sharding.device_set) == 8
    assert cache.addressable_shards[0].data.shape[0:2] == (8 // 4, CFG.n_kv_heads // 2)

    rng = np.random.default_rng(0)
    work = [
        (
            rng.integers(0, 256, int(rng.integers(2, 30))).tolist(),
            SamplingParams(max_tokens=16, prompt_logprobs=True),
        )
        for _ in range(10)
    ]
    work.append(([9, 8, 7], SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=3)))
    a = run_to_completion(Scheduler(single, ByteTokenizer()), work)
    b = run_to_completion(Scheduler(sharded, ByteTokenizer()), work)
    for x, y in zip(a, b, strict=True):
        assert x.output == y.output
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
        np.testing.assert_allclose(x.prompt_logprobs, y.prompt_logprobs, atol=1e-5)
