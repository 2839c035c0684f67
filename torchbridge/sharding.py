"""Tensor-parallel (Megatron) rules for torch parameter names.

torch parameters carry no logical axis names. Unnamed ones are sharded by the engine's
automatic rule (largest dimension that divides over ``fsdp``); these regex rules name
the projections of a standard transformer so that ``tensor`` splits them the Megatron way
(Shoeybi et al. 2019): column-parallel ``q/k/v/up/gate`` (output features split), row-
parallel ``o/down`` (input features split), so each block needs one all-reduce forward.
A ``torch.nn.Linear`` weight is ``(out_features, in_features)``; the names follow that.
Pass them to the engine: ``jc.Engine(..., param_rules=torchbridge.TENSOR_PARALLEL_RULES)``.
"""

from __future__ import annotations

from jaxcore import axes

COLUMN = r"q_proj|k_proj|v_proj|query|key|value|up_proj|gate_proj|fc1|c_fc|w1|w3"
ROW = r"o_proj|out_proj|down_proj|fc2|c_proj|w2"
EMBEDDING = r"embed_tokens|tok_embeddings|wte|embedding|embed|lm_head|head"


def tensor_parallel_rules(
    column: str = COLUMN, row: str = ROW, embedding: str = EMBEDDING
) -> tuple[tuple[str, tuple], ...]:
    """``param_rules`` for the engine, from alternations of module names.

    ``column``, ``row`` and ``embedding`` are regex alternations matched against the
    last module name before ``/weight`` or ``/bias`` in the parameter path.
    """
    return (
        (rf"(.*/)?({column})/weight", (axes.MLP, axes.EMBED)),
        (rf"(.*/)?({column})/bias", (axes.MLP,)),
        (rf"(.*/)?({row})/weight", (axes.EMBED, axes.MLP)),
        (rf"(.*/)?({row})/bias", (None,)),
        (rf"(.*/)?({embedding})/weight", (axes.VOCAB, axes.EMBED)),
    )


TENSOR_PARALLEL_RULES = tensor_parallel_rules()
