"""The documents and model of the checkpoint subprocess runs (`train.py`, `ckpt_train.py`).

Small on purpose: each start of those scripts traces (and, without a cache hit, compiles)
the model, and scanning the standard library for `jaxcore.stdlib_source` took seconds of
every start, so the data are 30 seeded byte documents and the model has one layer.
"""

import numpy as np

from jaxcore.models import TransformerConfig

CFG = TransformerConfig.tiny(max_seq_len=64, n_layers=1)


def corpus() -> list[np.ndarray]:
    """30 byte documents of 40-400 tokens, the same in every process and run."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, size=int(n), dtype=np.int32) for n in rng.integers(40, 400, 30)]
