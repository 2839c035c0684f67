"""A Hugging Face ``LlamaForCausalLM`` holding the reference model's weights.

The reference `Transformer` is Llama-shaped (RMSNorm, rotate-half RoPE, SwiGLU, GQA), so
its weights map one to one onto ``transformers``' Llama: the comparison peer for
``generate`` parity and the serving benchmark. Built from a config, nothing downloaded.
Needs ``torch`` and ``transformers`` (the test extra).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxcore.models import TransformerConfig


def hf_llama_config(cfg: TransformerConfig, **overrides: Any) -> Any:
    """The ``transformers.LlamaConfig`` of ``cfg`` (no special tokens unless overridden)."""
    from transformers import LlamaConfig

    fields: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_size,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaConfig(**{**fields, **overrides})


def to_hf_llama(cfg: TransformerConfig, params: dict[str, Any]) -> Any:
    """A float32 ``LlamaForCausalLM`` (eval mode) with ``params`` loaded."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(hf_llama_config(cfg)).eval()
    p = {k: np.asarray(v, np.float32) for k, v in params.items()}
    D = cfg.d_model

    def t(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(x, dtype=np.float32, copy=True))

    state = {"model.embed_tokens.weight": t(p["embed"]), "model.norm.weight": t(p["final_norm"])}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = t(p["lm_head"].T)
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        state[pre + "input_layernorm.weight"] = t(p["attn_norm"][i])
        state[pre + "post_attention_layernorm.weight"] = t(p["mlp_norm"][i])
        for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
            state[pre + f"self_attn.{theirs}.weight"] = t(p[ours][i].reshape(D, -1).T)
        state[pre + "self_attn.o_proj.weight"] = t(p["wo"][i].reshape(-1, D).T)
        state[pre + "mlp.gate_proj.weight"] = t(p["w_gate"][i].T)
        state[pre + "mlp.up_proj.weight"] = t(p["w_up"][i].T)
        state[pre + "mlp.down_proj.weight"] = t(p["w_down"][i].T)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"to_hf_llama: missing {missing}, unexpected {unexpected}")
    return model
