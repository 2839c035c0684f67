"""Reference models that name every parameter with logical axes."""

from jaxcore.models.loss import lm_loss
from jaxcore.models.transformer import (
    Transformer,
    TransformerConfig,
    count_params,
    training_flops_per_token,
)

__all__ = [
    "Transformer",
    "TransformerConfig",
    "count_params",
    "lm_loss",
    "training_flops_per_token",
]
