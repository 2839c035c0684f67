"""A random-access source's ``lengths`` must count its documents' tokens: packing places
rows by them, so a wrong entry stops with a `ConfigError` naming the document when that
document is read (no extra pass over the data)."""

import numpy as np
import pytest

import jaxcore as jc
from jaxcore.input import InputConfig, Loader

N_DOCS, DECLARED = 8, 10


class Source:
    """Document ``i`` holds ids ``i * 100 + [0, size)``; ``lengths`` says ``DECLARED``."""

    def __init__(self, actual: dict[int, int]):
        self.sizes = [actual.get(i, DECLARED) for i in range(N_DOCS)]
        self.lengths = np.full(N_DOCS, DECLARED, np.int64)

    def __len__(self) -> int:
        return N_DOCS

    def __getitem__(self, i: int) -> np.ndarray:
        return i * 100 + np.arange(self.sizes[i], dtype=np.int32)


def epoch_tokens(source, shuffle: bool) -> np.ndarray:
    cfg = InputConfig(global_batch_size=2, seq_len=DECLARED - 1, shuffle=shuffle, seed=4)
    loader = Loader(source, cfg)
    rows = [next(loader)["tokens"] for _ in range(loader.rows_per_epoch // 2)]
    return np.concatenate(rows).ravel()


@pytest.mark.parametrize("actual", [7, 50], ids=["shorter", "longer"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_lengths_that_disagree_with_a_document_name_it(actual, shuffle):
    with pytest.raises(
        jc.ConfigError,
        match=rf"source\.lengths\[3\] = 10 but document 3 holds {actual} tokens",
    ):
        epoch_tokens(Source({3: actual}), shuffle)


def test_lengths_that_agree_pack_every_token_once():
    tokens = epoch_tokens(Source({}), shuffle=False)
    every = np.concatenate([Source({})[i] for i in range(N_DOCS)])
    np.testing.assert_array_equal(tokens, every)
