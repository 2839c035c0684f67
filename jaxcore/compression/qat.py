"""Quantization-aware fine-tuning for the inference int8 format.

`qat_loss(loss_fn)` wraps a loss function for ``engine.train_step``: the bound model's
weights are replaced by their fake-quantized values (`fake_quant`: the exact int8 rounding
of ``inference``'s per-channel format, straight-through gradients) before ``loss_fn`` runs,
so the float master weights learn to sit where int8 rounding hurts least (Jacob et al.
2018). After training, quantize the float weights with the inference int8 format as usual
(``inference.LLM(params, config=cfg, ...)`` with int8 quantization).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax import nnx

from jaxcore.compression.int8 import CONTRACTED_AXES, fake_quant
from jaxcore.errors import ConfigError

LossFn = Callable[[Any, Any, jax.Array | None], tuple[jax.Array, dict[str, Any]]]


def fake_quantize_params(
    params: Any, contracted: Mapping[str, tuple[int, ...]] = CONTRACTED_AXES
) -> Any:
    """``params`` with every weight named in ``contracted`` fake-quantized (others as is).

    The key is the last path component, so nested params (``student/wq``) match too.
    """

    def one(path, w):
        name = getattr(path[-1], "key", getattr(path[-1], "name", None)) if path else None
        return fake_quant(w, contracted[name]) if name in contracted else w

    return jax.tree_util.tree_map_with_path(one, params)


def qat_loss(
    loss_fn: LossFn, contracted: Mapping[str, tuple[int, ...]] = CONTRACTED_AXES
) -> LossFn:
    """``loss_fn`` evaluated on the fake-quantized model (an NNX module, as the engine binds).

    Gradients reach the float parameters through the straight-through estimator.
    """

    def wrapped(model: Any, batch: Any, rng: jax.Array | None):
        if not isinstance(model, nnx.Module):
            raise ConfigError(
                f"qat_loss: the engine bound a {type(model).__name__}; quantization-aware "
                "training rewrites an NNX module's parameters (jaxcore.models.Transformer)."
            )
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        pure = nnx.to_pure_dict(params)
        quantized = fake_quantize_params(pure, contracted)
        nnx.replace_by_pure_dict(params, quantized)
        return loss_fn(nnx.merge(graphdef, params, rest), batch, rng)

    return wrapped
