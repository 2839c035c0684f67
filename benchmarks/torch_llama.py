"""The reference decoder written in plain PyTorch (same architecture as jaxcore.models).

RMSNorm, rotary embeddings (rotate-half), SwiGLU, grouped-query attention, untied output
projection, and the same weight shapes, so FLOPs and parameter counts match exactly.
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
        self.wq = nn.Linear(d, h * dh, bias=False)
        self.wk = nn.Linear(d, k * dh, bias=False)
        self.wv = nn.Linear(d, k * dh, bias=False)
        self.wo = nn.Linear(h * dh, d, bias=False)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, f, bias=False)
        self.w_up = nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.h, self.dh).transpose(1, 2)
        k = self.wk(h).view(b, t, self.k, self.dh).transpose(1, 2)
        v = self.wv(h).view(b, t, self.k, self.dh).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.k)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, self.h * self.dh))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class TorchLlama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        dh = self.cfg.head_size
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, dh, 2).float() / dh))
        ang = torch.arange(t).float()[:, None] * inv[None, :]
        cos, sin = ang.cos(), ang.sin()
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.lm_head(self.final_norm(x))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
