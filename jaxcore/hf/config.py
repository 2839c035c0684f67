"""Hugging Face ``config.json`` <-> `TransformerConfig`, for the Llama family.

Llama, Mistral and Qwen2 share one decoder (RMSNorm, rotary embeddings, SwiGLU,
grouped-query attention); they differ in a few switches that `TransformerConfig` names:
Qwen2's q/k/v biases (``qkv_bias``), Mistral's ``sliding_window``, Llama 3's rotary
scaling (``rope_scaling``). Anything else a config asks for (another activation, MLP
biases, per-layer sliding windows, partial rotary) is refused with the field that asked,
so a checkpoint never loads into a model that computes something else.

Both spellings of the rotary fields are read: transformers 5's ``rope_parameters`` and
the older top-level ``rope_theta`` + ``rope_scaling``. levanter's ``HFCompatConfig``
(``from_hf_config``/``to_hf_config``) plays the same role there.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.models.transformer import RopeScaling, TransformerConfig

# model_type -> the architecture name transformers' Auto classes dispatch on.
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a Hugging Face model directory (or the file itself)."""
    path = pathlib.Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(
            f"{path}: no config.json. Pass a Hugging Face model directory (what "
            "save_pretrained writes: config.json + *.safetensors). A jaxcore.hf.save or "
            "`jaxcore export --hf` that failed midway leaves none: run it again."
        )
    return json.loads(file.read_text())


def _refuse(model_type: str, field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"Hugging Face {model_type} config: {field}={value!r} {why}")


def _rope(hf: dict[str, Any], model_type: str) -> tuple[float, RopeScaling | None]:
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    params = {**legacy, **params}
    kind = params.get("rope_type", params.get("type", "default"))
    if float(params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))) != 1.0:
        raise _refuse(
            model_type,
            "partial_rotary_factor",
            params.get("partial_rotary_factor"),
            "is not supported: the native model rotates the whole head.",
        )
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise _refuse(
            model_type,
            "rope_type",
            kind,
            "is not supported; the native model has default, linear and llama3 RoPE.",
        )
    names = ["factor"]
    if kind == "llama3":
        names += ["low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
    missing = [n for n in names if params.get(n) is None]
    if missing:
        raise _refuse(
            model_type,
            "rope_type",
            kind,
            f"needs {names} in rope_parameters (or rope_scaling); missing {missing}. "
            "Add them from the model's original config.json.",
        )
    fields = {n: float(params[n]) for n in names}
    if kind == "llama3":
        fields["original_max_position_embeddings"] = int(params["original_max_position_embeddings"])
    return theta, RopeScaling(kind=kind, **fields)


def _sliding_window(hf: dict[str, Any], model_type: str) -> int | None:
    if model_type == "mistral":
        return hf.get("sliding_window")
    if model_type == "qwen2" and hf.get("use_sliding_window"):
        # transformers follows layer_types when the config has them, else max_window_layers
        # (layers from max_window_layers on slide); refused when either mixes the two kinds.
        layers = int(hf["num_hidden_layers"])
        first = int(hf.get("max_window_layers", layers))
        derived = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        for field, value, types in [
            ("max_window_layers", first, derived),
            ("layer_types", hf.get("layer_types"), hf.get("layer_types") or derived),
        ]:
            if len(set(types)) > 1:
                raise _refuse(
                    model_type,
                    field,
                    value,
                    f"with use_sliding_window=True and {layers} layers gives some layers a "
                    "sliding window and others none; the native model has one window for "
                    "all layers. Set use_sliding_window=false (full attention), or make "
                    "every layer 'sliding_attention'.",
                )
        if hf.get("sliding_window") and types == ["sliding_attention"] * layers:
            return int(hf["sliding_window"])
    return None


def config_from_hf(hf: dict[str, Any] | str | os.PathLike) -> TransformerConfig:
    """`TransformerConfig` of a Llama / Mistral / Qwen2 ``config.json`` (dict or path)."""
    if not isinstance(hf, dict):
        hf = read_config(hf)
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"Hugging Face config: model_type={model_type!r} is not supported; the native "
            f"engine loads {sorted(ARCHITECTURES)} (for other models use torchbridge)."
        )
    heads = [a for a in hf.get("architectures") or [] if not a.endswith("ForCausalLM")]
    if heads:
        raise _refuse(
            model_type,
            "architectures",
            hf["architectures"],
            "is not a causal language model; jaxcore.hf loads *ForCausalLM checkpoints "
            f"(e.g. {ARCHITECTURES[model_type]}: model.* + lm_head). For other heads use "
            "torchbridge.",
        )
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in (*required, "intermediate_size") if k not in hf]
    if missing:
        raise ConfigError(
            f"Hugging Face config ({model_type}): missing {missing}; a complete config.json "
            "has them. Download the checkpoint's config.json again, or build it with "
            "transformers' config class."
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse(model_type, "hidden_act", act, "is not supported; the MLP is SwiGLU.")
    if hf.get("mlp_bias"):
        raise _refuse(model_type, "mlp_bias", True, "is not supported (no MLP biases).")
    if model_type == "llama" and hf.get("attention_bias"):
        raise _refuse(
            model_type,
            "attention_bias",
            True,
            "(biases on q/k/v and o) is not supported; only Qwen2's q/k/v biases are.",
        )
    theta, scaling = _rope(hf, model_type)
    heads = int(hf["num_attention_heads"])
    return TransformerConfig(
        vocab_size=int(hf["vocab_size"]),
        d_model=int(hf["hidden_size"]),
        n_layers=int(hf["num_hidden_layers"]),
        n_heads=heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        d_ff=int(hf["intermediate_size"]),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),
        qkv_bias=model_type == "qwen2",
        rope_scaling=scaling,
        sliding_window=_sliding_window(hf, model_type),
    )


def model_type_of(cfg: TransformerConfig) -> str:
    """The Hugging Face family that computes what ``cfg`` computes."""
    if cfg.qkv_bias:  # Qwen2; with a window on every layer (max_window_layers=0)
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


def config_to_hf(cfg: TransformerConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """A ``config.json`` dict that transformers' ``AutoConfig`` reads back as ``cfg``."""
    model_type = model_type_of(cfg)
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope = {"rope_theta": cfg.rope_theta, "rope_type": s.kind, "factor": s.factor}
        if s.kind == "llama3":
            rope |= {
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_size,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": rope,
        "dtype": dtype,
    }
    if model_type == "llama":
        out |= {"attention_bias": False, "mlp_bias": False}
    if model_type == "mistral":
        out["sliding_window"] = cfg.sliding_window
    if model_type == "qwen2":
        window = cfg.sliding_window
        out |= {"use_sliding_window": window is not None, "sliding_window": window}
        if window is not None:
            out |= {"max_window_layers": 0, "layer_types": ["sliding_attention"] * cfg.n_layers}
    return out
