"""Reference models that name every parameter with logical axes, and their KV-cache decoding."""

from jaxcore.models.decoding import (
    CausalDecoder,
    KVCache,
    TransformerDecoder,
    decode_step,
    decoding_weights,
    init_cache,
    insert,
    matmul_input_absmax,
    plain_matmul,
    prefill,
)
from jaxcore.models.loss import lm_loss
from jaxcore.models.paged_decoding import (
    PagedKVCache,
    init_paged_cache,
    paged_decode_step,
    paged_extend,
)
from jaxcore.models.transformer import (
    Transformer,
    TransformerConfig,
    attention_implementation,
    count_params,
    training_flops_per_token,
)

__all__ = [
    "CausalDecoder",
    "KVCache",
    "PagedKVCache",
    "Transformer",
    "TransformerConfig",
    "TransformerDecoder",
    "attention_implementation",
    "count_params",
    "decode_step",
    "decoding_weights",
    "init_cache",
    "init_paged_cache",
    "insert",
    "lm_loss",
    "matmul_input_absmax",
    "paged_decode_step",
    "paged_extend",
    "plain_matmul",
    "prefill",
    "training_flops_per_token",
]
