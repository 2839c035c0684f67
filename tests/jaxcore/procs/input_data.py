"""The small documents the input tests read: document i holds ids i*1000 + 0..len-1."""

import grain
import numpy as np

from jaxcore.input import InputConfig

N_DOCS = 24
CONFIG = InputConfig(global_batch_size=8, seq_len=7, mode="pad", seed=5)


def documents() -> grain.MapDataset:
    return grain.MapDataset.source(
        [np.arange(1 + i % 6, dtype=np.int32) + 1000 * i for i in range(N_DOCS)]
    )
