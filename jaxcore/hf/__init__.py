"""Hugging Face Llama, Mistral and Qwen2 checkpoints in the native engine.

    cfg, params = jaxcore.hf.load("path/to/hf_dir", engine)       # sharded, lazy slices
    state = engine.prepare(jaxcore.hf.model_factory("path/to/hf_dir", engine), optax.adamw(1e-5))
    jaxcore.hf.save(state.params, cfg, "out_dir")                  # from_pretrained-ready

`config_from_hf` / `config_to_hf` map ``config.json`` to `TransformerConfig` and back.
"""

from jaxcore.hf.config import ARCHITECTURES, config_from_hf, config_to_hf, read_config
from jaxcore.hf.factory import build_model, model_factory
from jaxcore.hf.reader import load, param_shardings
from jaxcore.hf.writer import save

__all__ = [
    "ARCHITECTURES",
    "build_model",
    "config_from_hf",
    "config_to_hf",
    "load",
    "model_factory",
    "param_shardings",
    "read_config",
    "save",
]
