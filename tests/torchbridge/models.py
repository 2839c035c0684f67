"""Tiny PyTorch models for the bridge tests (plain torch, nothing bridge-specific)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, d_hidden: int = 16, d_out: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TwoLayer(nn.Module):
    """Two named layers (``a``, ``b``): tests freeze, regroup or skip one of them."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class CNN(nn.Module):
    """Conv -> BatchNorm (train mode) -> ReLU -> pool -> linear."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.head(h.mean(dim=(2, 3)))


class GRUModel(nn.Module):
    def __init__(self, d_in: int = 6, hidden: int = 8):
        super().__init__()
        self.gru = nn.GRU(d_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.dropout = dropout

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):
            return y.view(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        att = F.dropout(att, self.dropout, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.o_proj(y)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.up_proj = nn.Linear(d, ff)
        self.down_proj = nn.Linear(ff, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.down_proj(F.gelu(self.up_proj(self.ln2(x)))))


class GPT(nn.Module):
    """A small GPT in plain PyTorch; ``tie=True`` shares the embedding with the head."""

    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        layers: int = 2,
        heads: int = 4,
        ff: int = 64,
        max_len: int = 32,
        dropout: float = 0.0,
        tie: bool = False,
    ):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.layers = nn.ModuleList(Block(d, heads, ff, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.embed_tokens(tokens) + self.pos(torch.arange(t))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def gpt_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on ``tokens: (batch, length + 1)``."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
