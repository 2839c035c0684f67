"""Held-out byte-level text and perplexity of a params dict, dense or through a matmul hook.

Perplexity runs the decoding path (`jaxcore.models.prefill`) so that the inference
package's int8 weights are evaluated exactly as they are served: pass
``inference.quantize.quantize_weights`` as ``transform`` and
``inference.quantize.quantized_matmul`` as ``matmul`` (jaxcore itself never imports
``inference``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcore.errors import ConfigError
from jaxcore.models import TransformerConfig, plain_matmul, prefill
from jaxcore.models.decoding import Matmul, Weights


def decoding_weights_of(params: dict[str, Any], cfg: TransformerConfig) -> Weights:
    """The weights `prefill` reads, from the engine's params of a `Transformer`."""
    blocks = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
    if cfg.qkv_bias:  # Qwen2's q/k/v biases, which prefill adds (they used to be left out)
        blocks += ("bq", "bk", "bv")
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return {
        "embed": params["embed"],
        "final_norm": params["final_norm"],
        "head": head,
        "blocks": {n: params[n] for n in blocks},
    }


def text_batches(
    source: Sequence[np.ndarray],
    documents: Sequence[int],
    *,
    batch: int,
    seq_len: int,
    count: int,
    seed: int,
) -> list[np.ndarray]:
    """``count`` int32 batches ``(batch, seq_len + 1)`` of random windows of the given
    documents, concatenated (so train and held-out text come from disjoint documents)."""
    for name, value in (("batch", batch), ("seq_len", seq_len), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"text_batches: {name}={value!r} must be a positive int.")
    bad = [i for i in documents if not -len(source) <= i < len(source)]
    if bad:
        raise ConfigError(
            f"text_batches: document indices {bad[:5]} are out of range for a source of "
            f"{len(source)} documents; pass indices in [0, {len(source)})."
        )
    text = np.concatenate([np.asarray(source[i], np.int32) for i in documents] or [[]])
    if text.size <= seq_len + 1:
        raise ConfigError(
            f"text_batches: the {len(documents)} documents hold {text.size} tokens, too few "
            f"for windows of seq_len={seq_len} (+1 target); pass more documents or a shorter "
            "seq_len."
        )
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, text.size - seq_len - 1, (count, batch))
    return [np.stack([text[s : s + seq_len + 1] for s in row]) for row in starts]


def perplexity(
    cfg: TransformerConfig,
    params: dict[str, Any],
    batches: Sequence[np.ndarray],
    *,
    transform: Callable[[Weights], Weights] | None = None,
    matmul: Matmul = plain_matmul,
) -> float:
    """``exp`` of the mean next-token cross-entropy over every token of ``batches``.

    ``transform`` maps the decoding weights first (e.g. to int8), ``matmul`` is the hook
    that multiplies by them.
    """
    batches = [_tokens(b) for b in batches]
    if not batches:
        raise ConfigError(
            "perplexity: no batches; pass at least one (batch, seq_len + 1) token array."
        )
    weights = decoding_weights_of(params, cfg)
    if transform is not None:
        weights = transform(weights)
    total = _summed_nll(cfg, matmul)
    nll = sum(float(total(weights, jnp.asarray(b))) for b in batches)
    tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in batches)
    return float(np.exp(nll / tokens))


def _tokens(batch: Any) -> np.ndarray:
    """One evaluation batch as ``(batch, seq_len + 1)`` int tokens; every token counts."""
    if isinstance(batch, dict):
        raise ConfigError(
            f"perplexity: a batch is a dict with keys {sorted(batch)}; pass its token rows, "
            "batch['tokens'] of shape (batch, seq_len + 1), unpadded and unpacked (every "
            "token is scored: a mask or segments would not be applied)."
        )
    tokens = batch if hasattr(batch, "shape") and hasattr(batch, "dtype") else np.asarray(batch)
    if tokens.ndim != 2 or tokens.shape[1] < 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ConfigError(
            f"perplexity: a batch of shape {tokens.shape} and dtype {tokens.dtype}; pass int "
            "token rows of shape (batch, seq_len + 1), seq_len >= 1."
        )
    return tokens


@functools.lru_cache(maxsize=32)
def _summed_nll(cfg: TransformerConfig, matmul: Matmul) -> Callable:
    """One jitted ``(weights, tokens) -> summed NLL`` per config and hook (compiled once
    per shape, not once per call)."""

    def total(weights, tokens):
        logits, _ = prefill(cfg, weights, tokens[:, :-1], matmul=matmul)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        return jnp.sum(ce)

    return jax.jit(total)
