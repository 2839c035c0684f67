"""Property tests of the loader's packing and padding against a plain reference.

The reference packs an epoch the obvious way: documents in the epoch's order, each
followed by ``eos_id`` when given, concatenated and cut into rows of ``seq_len + 1``, the
partial last row dropped. Every document's tokens name it (``1000 * doc + position``), so
the epoch's order can be read back from the rows for shuffled epochs.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcore.input import InputConfig, Loader

EOS = 999_999


def _documents(sizes: list[int]) -> list[np.ndarray]:
    return [np.arange(size, dtype=np.int64) + 1000 * (i + 1) for i, size in enumerate(sizes)]


def _epoch_rows(loader: Loader, epoch: int, batch: int) -> np.ndarray:
    per_epoch = loader.rows_per_epoch
    first = epoch * per_epoch
    rows = []
    for k in range(first, first + per_epoch):
        step, i = divmod(k, batch)
        rows.append(loader.local_batch(step)["tokens"][i])
    return np.stack(rows)


def _order_read_back(flat: np.ndarray, sizes: list[int]) -> list[int]:
    """Documents in the order their tokens appear (each must be contiguous). An ``EOS``
    with no tokens before it is an empty document: any of them, they are all ``[EOS]``."""
    empty = [d for d, size in enumerate(sizes) if size == 0]
    order: list[int] = []
    current = None  # the document whose tokens are being read
    for t in flat.tolist():
        if t == EOS:
            if current is None:
                order.append(empty.pop(0))
            current = None
            continue
        doc = t // 1000 - 1
        if doc != current:
            assert current is None or not order or order[-1] == current
            assert doc not in order, f"document {doc} appears twice in one epoch"
            order.append(doc)
            current = doc
    return order


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    seq_len=st.integers(1, 24),
    batch=st.integers(1, 4),
    eos=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_epochs_equal_the_reference_packing(sizes, seq_len, batch, eos, shuffle, seed):
    docs = _documents(sizes)
    extra = 1 if eos else 0
    total = sum(sizes) + extra * len(sizes)
    width = seq_len + 1
    if total < width:
        return  # fewer tokens than a row: a ConfigError, tested in test_input_offpath.py
    cfg = InputConfig(
        global_batch_size=batch,
        seq_len=seq_len,
        mode="pack",
        seed=seed,
        shuffle=shuffle,
        eos_id=EOS if eos else None,
    )
    loader = Loader(docs, cfg)
    assert loader.rows_per_epoch == total // width
    for epoch in range(2):
        rows = _epoch_rows(loader, epoch, batch)
        flat = rows.ravel()
        order = _order_read_back(flat, sizes)
        # Documents the rows never reached (empty ones, or past the last full row) follow
        # in an unknown order; the reference only needs the ones that were read.
        if not shuffle:
            order = list(range(len(docs)))
        else:
            order += [d for d in range(len(docs)) if d not in order]
        parts = [np.append(docs[d], EOS) if eos else docs[d] for d in order]
        reference = np.concatenate(parts)[: len(flat)]
        np.testing.assert_array_equal(flat, reference)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=10),
    seq_len=st.integers(1, 16),
    pad_id=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_padded_rows_hold_one_document_each(sizes, seq_len, pad_id, seed):
    docs = _documents(sizes)
    cfg = InputConfig(global_batch_size=1, seq_len=seq_len, mode="pad", seed=seed, pad_id=pad_id)
    loader = Loader(docs, cfg)
    width = seq_len + 1
    seen = []
    for step in range(len(docs)):
        got = loader.local_batch(step)
        tokens, mask = got["tokens"][0], got["mask"][0]
        real = int(mask.sum())
        assert mask.tolist() == [1] * real + [0] * (width - real)
        assert (tokens[real:] == pad_id).all()
        if real:
            doc = int(tokens[0]) // 1000 - 1
            np.testing.assert_array_equal(tokens[:real], docs[doc][:width])
            seen.append(doc)
        else:
            seen.append(next(d for d, s in enumerate(sizes) if s == 0 and d not in seen))
    assert sorted(seen) == list(range(len(docs)))
