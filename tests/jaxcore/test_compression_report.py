"""The report's counts against independent sources: the model's own parameter and FLOP
formulas and the inference package's bytes of its int8 weights."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from inference import quantize as iq
from jaxcore.compression import decoding_weights_of, format_table, method_report, weight_bytes
from jaxcore.models import Transformer, TransformerConfig, count_params, training_flops_per_token

CFG = TransformerConfig.tiny(max_seq_len=32)


def test_counts_match_the_model_and_inference():
    # One program each for the init and the int8 weights (op by op, every primitive of
    # every initializer and per-weight quantization would compile on its own).
    params = jax.jit(
        lambda: nnx.to_pure_dict(nnx.state(Transformer(CFG, rngs=nnx.Rngs(0)), nnx.Param))
    )()
    served = jax.jit(iq.quantize_weights)(decoding_weights_of(params, CFG))
    assert weight_bytes(params, int8=True) == iq.weight_bytes(served)
    assert weight_bytes(params) == 4 * count_params(CFG)
    params["wq"] = np.asarray(params["wq"]).copy()
    params["wq"][:, :, :2] = 0.0  # half the query heads zeroed
    r = method_report("x", CFG, params, seq_len=32, ppl_before=2.0, ppl_after=3.0)
    assert r.params == count_params(CFG)
    assert r.nonzero == count_params(CFG) - params["wq"].size // 2
    np.testing.assert_allclose(r.flops_per_token, training_flops_per_token(CFG, 32) / 3)
    assert r.flops_per_token - r.sparse_flops_per_token == params["wq"].size
    table = format_table(
        [
            r,
            method_report(
                "y", CFG, params, seq_len=32, ppl_before=1, ppl_after=1, tokens_per_s=5.0
            ),
        ]
    )
    assert "x" in table and "y" in table
