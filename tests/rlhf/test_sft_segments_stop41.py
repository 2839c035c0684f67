"""Packed SFT equals unpacked SFT: `rlhf.sft.pack` gives each example a segment id and its
own positions, and `sft_loss` passes them to the model (the plain decoder and
`rlhf.lora.LoRATransformer`), so a packed row's loss is the token-weighted mean of its
examples' losses alone and each example's logits are its logits alone.

Before stop 41 the row was TRL's "wrapped" packing: a later example attended to the
earlier ones in its row, and a completion starting a packed example (no prompt) was
scored as a prediction from the previous example's last token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.models import Transformer
from rlhf import lora
from rlhf.sft import pack, sft_loss

from .helpers import CFG, VOCAB

LENGTH = 15  # rows of 16 tokens
ROWS = 6  # batches are padded to this many rows: one compile per model
TOL = dict(rtol=2e-5, atol=2e-5)
# Prompt-less examples included: their first completion token is no target alone.
EXAMPLES = [
    ([3, 4, 5], [6, 7, 8]),
    ([9, 10], [11, 12, 13, 14]),
    ([], [5, 6, 7]),
    ([12], [4, 15]),
]
LORA = lora.LoRAConfig(rank=4, alpha=8.0, targets=("wq", "wv", "w_down", "lm_head"))


def _lora_model() -> lora.LoRATransformer:
    """LoRA with non-zero ``B``: the adapters change the forward (at init they are a no-op)."""
    model = lora.LoRATransformer(CFG, LORA, rngs=nnx.Rngs(0))
    key = jax.random.key(1)
    for name in LORA.targets:
        key, sub = jax.random.split(key)
        b = getattr(model.lora, f"{name}_b")
        b[...] = 0.5 * jax.random.normal(sub, b[...].shape)
    return model


@pytest.fixture(scope="module", params=["plain", "lora"])
def fns(request):
    """``batch -> (loss, weight, logits)``: `sft_loss` and the logits it got from the
    model, one jitted function (batches padded to ``ROWS`` rows: one compile)."""
    model = Transformer(CFG, rngs=nnx.Rngs(0)) if request.param == "plain" else _lora_model()

    @nnx.jit
    def run(model, batch):
        seen = {}

        def spy(*args):
            seen["logits"] = model(*args)
            return seen["logits"]

        value, aux = sft_loss()(spy, batch, None)
        return value, aux["weight"], seen["logits"]

    def call(batch):
        value, weight, logits = run(model, _rows(batch))
        return float(value), float(weight), np.asarray(logits)

    return call


def _rows(batch: dict[str, np.ndarray]) -> dict[str, jnp.ndarray]:
    """``batch`` padded with empty rows (no loss weight, segment 0) to ``ROWS`` rows."""
    n = len(batch["tokens"])
    assert n <= ROWS
    out = {}
    for k, v in batch.items():
        pad = np.zeros((ROWS - n, *v.shape[1:]), v.dtype)
        out[k] = jnp.asarray(np.concatenate([v, pad]))
    return out


def test_pack_emits_a_segment_and_restarting_positions_per_example():
    rows = pack(EXAMPLES, LENGTH, eos_id=1)
    # 7 + 7 tokens in row 1 (of 16); 4 + 4 tokens in row 2.
    np.testing.assert_array_equal(rows["segments"][0], [1] * 7 + [2] * 7 + [0] * 2)
    np.testing.assert_array_equal(rows["segments"][1], [1] * 4 + [2] * 4 + [0] * 8)
    np.testing.assert_array_equal(rows["positions"][0, :14], [*range(7), *range(7)])
    np.testing.assert_array_equal(rows["positions"][1, :8], [*range(4), *range(4)])
    # The prompt-less example's first token is never a target (it is not one alone).
    np.testing.assert_array_equal(rows["loss_mask"][1, :8], [0, 1, 1, 1, 0, 1, 1, 1])
    assert rows["segments"].dtype == np.int32 and rows["segments"].shape == rows["tokens"].shape
    alone = pack(EXAMPLES[:1], LENGTH, packing=False)
    np.testing.assert_array_equal(alone["segments"], [[1] * 6 + [0] * 10])


def test_each_packed_example_gets_its_loss_and_logits_alone(fns):
    packed = pack(EXAMPLES, LENGTH, eos_id=1)
    assert len(packed["tokens"]) < len(EXAMPLES)  # the rows really pack
    got, weight, packed_logits = fns(packed)
    alone = [fns(pack([ex], LENGTH, eos_id=1)) for ex in EXAMPLES]
    weights = np.array([w for _, w, _ in alone])
    assert weight == weights.sum() == 4 + 5 + 3 + 3  # completions + eos; not a first token
    want = sum(x * w for (x, _, _), w in zip(alone, weights, strict=True)) / weights.sum()
    assert got == pytest.approx(want, rel=2e-5, abs=2e-5)

    for ex, one, (row, at) in zip(EXAMPLES, alone, [(0, 0), (0, 7), (1, 0), (1, 4)], strict=True):
        n = len(ex[0]) + len(ex[1]) + 1
        single = one[2][0, :n]
        np.testing.assert_allclose(packed_logits[row, at : at + n], single, **TOL)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(2, VOCAB - 1), max_size=6),
            st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=ROWS,
    )
)
def test_packed_loss_is_the_unpacked_loss(fns, examples):
    packed = pack(examples, LENGTH, eos_id=1)
    apart = pack(examples, LENGTH, eos_id=1, packing=False)  # one example per row
    (got, weight, _), (want, want_weight, _) = fns(packed), fns(apart)
    assert weight == want_weight
    assert got == pytest.approx(want, rel=2e-5, abs=2e-5)


def test_batches_without_segments_keep_working():
    """A hand-built batch of the old keys, and a model taking ``(tokens, positions)``."""
    rows = pack(EXAMPLES[:2], LENGTH)
    old = {k: rows[k] for k in ("tokens", "loss_mask", "positions")}
    logits = jax.random.normal(jax.random.key(0), (1, LENGTH, VOCAB))
    calls = []

    def model(tokens, positions):
        calls.append(positions.shape)
        return logits

    loss, aux = sft_loss()(model, old, None)
    assert calls == [(1, LENGTH)] and float(aux["weight"]) == 7.0 and np.isfinite(float(loss))
    with pytest.raises(jc.BatchError, match=r"rlhf\.sft\.pack"):
        sft_loss()(model, {"tokens": rows["tokens"]}, None)
    # The same model on pack's rows (with segments): told what to change, not a TypeError.
    with pytest.raises(jc.BatchError, match="segments=None"):
        sft_loss()(model, rows, None)


def _pad8(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {
        k: np.concatenate([v, np.zeros((8 - len(v), *v.shape[1:]), v.dtype)])
        for k, v in batch.items()
    }


def test_a_lora_actor_trains_packed_rows_as_unpacked_through_the_engine():
    """The segment ids ride the engine's sharded batch (fsdp over 8 devices) into a LoRA
    actor whose base is frozen: a step on the packed rows has the unpacked rows' loss and
    moves the adapters as a step on the unpacked rows does (SGD: the same gradient)."""
    eng = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = eng.prepare(
        lora.lora_factory(CFG, LORA), optax.sgd(0.5), seed=0, trainable=lora.trainable
    )
    states = [jax.tree.map(jnp.copy, state), state]  # steps donate their state
    step = eng.train_step(sft_loss())
    # Both padded to 8 rows (one per device): one compile.
    packed, apart = (_pad8(pack(EXAMPLES, LENGTH, eos_id=1, packing=p)) for p in (True, False))
    (a, got), (b, want) = step(states[0], packed), step(states[1], apart)
    assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=2e-5, abs=2e-5)
    assert float(got["weight"]) == float(want["weight"]) == 15.0
    moved = [np.asarray(x) for x in jax.tree.leaves(a.params[lora.ADAPTERS])]
    for x, y in zip(moved, jax.tree.leaves(b.params[lora.ADAPTERS]), strict=True):
        np.testing.assert_allclose(x, np.asarray(y), **TOL)
    assert max(np.abs(x).max() for x in moved[1::2]) > 0  # some B left 0: the step trained
