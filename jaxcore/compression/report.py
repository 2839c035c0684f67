"""What a compression method bought: parameters, FLOPs, memory, perplexity, tokens/s.

Host-side bookkeeping over a params dict of the reference `Transformer`. Served tokens/s
is measured by the caller (``inference.LLM(...).generate``; jaxcore does not import the
inference package) and passed in.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from jaxcore.compression.int8 import CONTRACTED_AXES
from jaxcore.errors import ConfigError
from jaxcore.models import TransformerConfig

_MATMULS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodReport:
    """One row of the report.

    Attributes:
        method: what was done (``base``, ``magnitude 50%``, ``int8 QAT``, ...).
        params: number of parameters (the shapes the model has).
        nonzero: parameters that are not exactly zero (< ``params`` after unstructured
            pruning).
        flops_per_token: dense forward FLOPs per token at ``seq_len`` (2 per matmul weight
            plus attention's two ``T x T`` matmuls); what dense kernels execute.
        sparse_flops_per_token: the same counting only nonzero matmul weights: what a
            sparse kernel could skip to (equal to the dense count without pruning).
        weight_bytes: bytes of the weights as served (float32, or int8 values plus
            float32 per-channel scales).
        ppl_before: perplexity of the model the method started from.
        ppl_after: perplexity after the method (for int8, through the int8 path).
        tokens_per_s: generated tokens per second when served (``None`` if not measured).
    """

    method: str
    params: int
    nonzero: int
    flops_per_token: float
    sparse_flops_per_token: float
    weight_bytes: int
    ppl_before: float
    ppl_after: float
    tokens_per_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _host(params: Any) -> dict[str, np.ndarray]:
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(jax.device_get(x))
        for path, x in jax.tree_util.tree_leaves_with_path(params)
    }


def weight_bytes(params: dict[str, Any], *, int8: bool = False) -> int:
    """Bytes of the weights: float32 each, or int8 plus one float32 scale per channel for
    the matrices the inference int8 format quantizes (``int8=True``)."""
    total = 0
    for name, x in _host(params).items():
        axes = CONTRACTED_AXES.get(name.rsplit("/", 1)[-1])
        if int8 and axes is not None:
            channels = x.size // math.prod(x.shape[a] for a in axes)
            total += x.size + 4 * channels
        else:
            total += x.size * 4
    return total


def _check_params(host: dict[str, np.ndarray], cfg: TransformerConfig) -> None:
    """Refuse params that are not ``cfg``'s `Transformer` (counts would be silently wrong)."""
    want = {"embed": (cfg.vocab_size, cfg.d_model), "wq": (cfg.n_layers, cfg.d_model)}
    got = {name: host[name].shape[:2] if name in host else None for name in want}
    if got != want:
        raise ConfigError(
            f"method_report: params do not match the config: (first two) shapes {got}, the "
            f"config gives {want}; pass the top-level params dict of a Transformer built with "
            "cfg (for a DistillPair, params['student'] with the student's config)."
        )


def method_report(
    method: str,
    cfg: TransformerConfig,
    params: dict[str, Any],
    *,
    seq_len: int,
    ppl_before: float,
    ppl_after: float,
    int8: bool = False,
    tokens_per_s: float | None = None,
) -> MethodReport:
    """Count ``params`` (a `Transformer`'s, with config ``cfg``) into a `MethodReport`."""
    if seq_len < 1:
        raise ConfigError(f"method_report(seq_len={seq_len!r}): must be >= 1 (tokens attended).")
    host = _host(params)
    _check_params(host, cfg)
    L, _, H, _, Dh, _, _ = cfg.dims
    attention = 4.0 * L * H * Dh * seq_len
    matmul = {k: v for k, v in host.items() if k.rsplit("/", 1)[-1] in _MATMULS}
    if cfg.tie_embeddings:
        matmul["embed"] = host["embed"]
    dense = sum(v.size for v in matmul.values())
    nonzero_matmul = sum(int(np.count_nonzero(v)) for v in matmul.values())
    return MethodReport(
        method=method,
        params=sum(v.size for v in host.values()),
        nonzero=sum(int(np.count_nonzero(v)) for v in host.values()),
        flops_per_token=2.0 * dense + attention,
        sparse_flops_per_token=2.0 * nonzero_matmul + attention,
        weight_bytes=weight_bytes(params, int8=int8),
        ppl_before=ppl_before,
        ppl_after=ppl_after,
        tokens_per_s=tokens_per_s,
    )


def format_table(rows: list[MethodReport], *, baseline: str | None = None) -> str:
    """A fixed-width table; ratios are against the row named ``baseline`` (default: first)."""
    base = next((r for r in rows if r.method == baseline), rows[0]) if rows else None
    head = (
        f"{'method':<22}{'params':>10}{'nonzero':>10}{'MFLOP/tok':>11}{'weights KiB':>13}"
        f"{'ppl before':>12}{'ppl after':>11}{'tok/s':>9}{'x base':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        speed = f"{r.tokens_per_s:9.1f}" if r.tokens_per_s else f"{'-':>9}"
        ratio = (
            f"{r.tokens_per_s / base.tokens_per_s:8.2f}"
            if r.tokens_per_s and base and base.tokens_per_s
            else f"{'-':>8}"
        )
        lines.append(
            f"{r.method:<22}{r.params:>10}{r.nonzero:>10}{r.flops_per_token / 1e6:>11.3f}"
            f"{r.weight_bytes / 1024:>13.1f}{r.ppl_before:>12.3f}{r.ppl_after:>11.3f}"
            f"{speed}{ratio}"
        )
    return "\n".join(lines)
