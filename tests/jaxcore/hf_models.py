"""Tiny random-init Hugging Face models (no downloads) for the jaxcore.hf tests."""

from __future__ import annotations

import pathlib

import numpy as np
import torch
import transformers

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

# Each family with the switches that make it differ from plain Llama.
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        **COMMON, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE
    ),
    "mistral": lambda: transformers.MistralConfig(
        **COMMON, sliding_window=5, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    ),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, rope_parameters={"rope_theta": 1e6}),
}


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random, biases and norm scales included (HF inits those to 0 / 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.05
            p.copy_(1.0 + noise if "norm" in name else noise)
    return model


def make_model(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        CONFIGS[kind](), attn_implementation="eager"
    )
    return randomize(model, seed).eval()


def save_model(
    kind: str, directory: pathlib.Path, **kwargs
) -> tuple[torch.nn.Module, pathlib.Path]:
    model = make_model(kind)
    model.save_pretrained(directory, **kwargs)
    return model, directory


def torch_logits(model: torch.nn.Module, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


def tokens(batch: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, length)).astype(np.int32)
