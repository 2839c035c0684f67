"""The reference decoder written in plain PyTorch (same architecture as jaxcore.models).

RMSNorm, rotary embeddings (rotate-half), SwiGLU, grouped-query attention and an untied
output projection with the same weight shapes, so FLOPs and parameter counts match.
Parameter names follow Hugging Face's Llama (``q_proj``, ``down_proj``, ...) so that
`torchbridge.TENSOR_PARALLEL_RULES` apply. Shared by `vs_torch_cpu.py` and
`torchbridge_vs_torch.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h, k, dh, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size, cfg.d_ff
        self.h, self.k, self.dh = h, k, dh
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.q_proj = nn.Linear(d, h * dh, bias=False)
        self.k_proj = nn.Linear(d, k * dh, bias=False)
        self.v_proj = nn.Linear(d, k * dh, bias=False)
        self.o_proj = nn.Linear(h * dh, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, t, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.k, self.dh).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.k, self.dh).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.k)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, self.h * self.dh))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TorchLlama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        dh = cfg.head_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dh, 2).float() / dh))
        ang = torch.arange(cfg.max_seq_len).float()[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
