"""inference: KV-cache generation, continuous batching, int8 weights and an OpenAI-style
server for jaxcore models.

    from inference import LLM
    llm = LLM("model.safetensors")
    print(llm.generate("def main(", max_tokens=32).text)
"""

from inference.batching import QueueFullError, Request, RequestError, Scheduler
from inference.engine import ServingConfig, SlotEngine
from inference.llm import LLM, Completion
from inference.quantize import QuantizedWeight, quantize_weights, smooth_weights
from inference.sampling import SamplingParams, sample_tokens
from inference.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer
from inference.weights import load_safetensors, resolve, save_safetensors

__all__ = [
    "LLM",
    "ByteTokenizer",
    "Completion",
    "ServingConfig",
    "HFTokenizer",
    "QuantizedWeight",
    "QueueFullError",
    "Request",
    "RequestError",
    "SamplingParams",
    "Scheduler",
    "SlotEngine",
    "Tokenizer",
    "load_safetensors",
    "load_tokenizer",
    "quantize_weights",
    "resolve",
    "sample_tokens",
    "save_safetensors",
    "smooth_weights",
]
