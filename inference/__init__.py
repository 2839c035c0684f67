"""inference: KV-cache generation, continuous batching, int8 weights and an OpenAI-style
server for jaxcore models.

    from inference import LLM
    llm = LLM("model.safetensors")
    print(llm.generate("def main(", max_tokens=32).text)
"""

from inference.batching import Scheduler
from inference.config import ServingConfig
from inference.engine import SlotEngine
from inference.llm import LLM, ClosedError, Completion
from inference.quantize import QuantizedWeight, quantize_weights, smooth_weights
from inference.request import QueueFullError, Request, RequestError
from inference.sampling import SamplingParams, sample_tokens
from inference.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from inference.weights import (
    ResolvedModel,
    load_safetensors,
    resolve,
    resolve_model,
    save_safetensors,
)

__all__ = [
    "LLM",
    "ByteTokenizer",
    "ClosedError",
    "Completion",
    "QuantizedWeight",
    "QueueFullError",
    "Request",
    "RequestError",
    "ResolvedModel",
    "SamplingParams",
    "Scheduler",
    "ServingConfig",
    "SlotEngine",
    "Tokenizer",
    "load_safetensors",
    "load_tokenizer",
    "quantize_weights",
    "resolve",
    "resolve_model",
    "sample_tokens",
    "save_safetensors",
    "smooth_weights",
]
