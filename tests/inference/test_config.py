"""Configuration mistakes raise ConfigError naming the field and the fix."""

from __future__ import annotations

import pytest

import jaxcore as jc
from inference import SamplingParams, ServingConfig
from inference.engine import SlotEngine
from inference.weights import init_params
from jaxcore.models import TransformerConfig


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: ServingConfig(slots=0), "ServingConfig.slots"),
        (lambda: ServingConfig(quantize="int4"), "ServingConfig.quantize"),
        (lambda: ServingConfig(dtype="float16"), "ServingConfig.dtype"),
        (lambda: ServingConfig(prefill_buckets=()), "ServingConfig.prefill_buckets"),
        (lambda: ServingConfig(smooth_alpha=2.0), "ServingConfig.smooth_alpha"),
        (lambda: SamplingParams(top_p=0.0), "SamplingParams.top_p"),
        (lambda: SamplingParams(temperature=-1.0), "SamplingParams.temperature"),
        (lambda: SamplingParams(logprobs=21), "SamplingParams.logprobs"),
        (lambda: SamplingParams(prompt_logprobs=21), "SamplingParams.prompt_logprobs"),
        (lambda: SamplingParams(min_tokens=-1), "SamplingParams.min_tokens"),
        (lambda: SamplingParams(repetition_penalty=0.0), "SamplingParams.repetition_penalty"),
        (lambda: SamplingParams(presence_penalty=3.0), "SamplingParams.presence_penalty"),
        (lambda: ServingConfig(decode_steps=0), "ServingConfig.decode_steps"),
        (lambda: SamplingParams(max_tokens=-1), "SamplingParams.max_tokens"),
        (lambda: SamplingParams(stop=("",)), "SamplingParams.stop"),
    ],
)
def test_config_errors_name_the_field(make, words):
    with pytest.raises(jc.ConfigError, match=words):
        make()


def test_engine_errors_name_the_fix():
    cfg = TransformerConfig.tiny(max_seq_len=32)
    params = init_params(cfg)
    with pytest.raises(jc.ConfigError, match="max_seq_len=32"):
        SlotEngine(cfg, params, ServingConfig(max_len=64))
    with pytest.raises(jc.ConfigError, match="multiple of 4"):
        SlotEngine(
            cfg,
            params,
            ServingConfig(slots=6, parallel=jc.ParallelConfig(data=4, tensor=2, fsdp=1)),
        )
    with pytest.raises(jc.ConfigError, match="calibration"):
        SlotEngine(cfg, params, ServingConfig(quantize="int8-smooth"))
