"""The README's "Bring your PyTorch model" section driven as a user would (stop 42).

Off the documented path: a ``TorchLoader`` run forever (``num_epochs=None``) over a
DataLoader that gives no batch in an epoch (an empty dataset, or fewer rows than
``batch_size`` with ``drop_last=True``).
"""

from __future__ import annotations

import contextlib
import signal

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxcore as jc
import torchbridge


@contextlib.contextmanager
def deadline(seconds: int):
    """Raise in the main thread if the body runs past ``seconds`` (the old loader spun)."""

    def fire(*_):
        raise TimeoutError(f"no batch and no error within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _loader(rows: int, batch_size: int, drop_last: bool) -> torch.utils.data.DataLoader:
    ds = torch.utils.data.TensorDataset(torch.arange(rows * 2.0).reshape(rows, 2))
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, drop_last=drop_last)


@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(0, 9),
    batch_size=st.integers(1, 6),
    drop_last=st.booleans(),
)
@example(rows=0, batch_size=1, drop_last=False)  # an empty dataset
@example(rows=3, batch_size=4, drop_last=True)  # fewer rows than one batch, dropped
def test_a_loader_run_forever_yields_as_torch_does_or_says_why_it_cannot(
    rows, batch_size, drop_last
):
    """The oracle is torch's DataLoader: when an epoch has batches, the first ones match
    it; when it has none, ``num_epochs=None`` is a ConfigError naming the cause (before:
    ``next(iter(loader))`` never returned, spinning over empty epochs)."""
    dl = _loader(rows, batch_size, drop_last)
    loader = torchbridge.TorchLoader(dl, None)
    with deadline(5):
        if len(dl) == 0:
            with pytest.raises(jc.ConfigError, match="no batch") as e:
                next(iter(loader))
            assert f"batch_size={batch_size}" in str(e.value)
            return
        got = next(iter(loader))
    want = next(iter(dl))
    assert got[0].tolist() == want[0].tolist()


def test_a_loader_with_a_number_of_epochs_over_no_batches_just_ends():
    """As torch's ``for epoch in range(n): for batch in dl`` does: nothing to yield, no error."""
    with deadline(5):
        assert list(torchbridge.TorchLoader(_loader(3, 4, True), None, num_epochs=2)) == []


# --- torchbridge.loss with a criterion holding tensors, and a dict batch ------------------

CRITERIA = {
    "ce_class_weights": (
        lambda: torch.nn.CrossEntropyLoss(weight=torch.tensor([0.2, 1.0, 3.0])),
        lambda g: torch.randint(0, 3, (8,), generator=g),
    ),
    "bce_pos_weight": (
        lambda: torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([0.5, 2.0, 4.0])),
        lambda g: torch.randint(0, 2, (8, 3), generator=g).float(),
    ),
}


@pytest.mark.parametrize("name", sorted(CRITERIA))
def test_a_criterion_with_its_own_tensors_trains_as_torch_does(name):
    """``torchbridge.loss(nn.CrossEntropyLoss(weight=w))`` (class-imbalance weights).
    Before: torchax's ``AssertionError: ... mixed math between XLATensor and
    torch.Tensor``. The oracle is the same SGD step in torch eager."""
    make, target = CRITERIA[name]
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4, generator=g), target(g)

    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    want_loss = make()(reference(x), y)
    want_loss.backward()
    opt.step()

    engine = jc.Engine()
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.5))
    state, metrics = engine.train_step(torchbridge.loss(make()))(state, (x, y))
    assert abs(float(metrics["loss"]) - want_loss.item()) < 1e-6
    got = torchbridge.state_dict(state)
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(got[key], value, atol=1e-6, rtol=0)


def test_a_dict_batch_with_the_default_keys_says_how_to_name_them():
    """Before: a bare ``KeyError: 0`` from inside the step's trace."""
    model = torch.nn.Linear(4, 3)
    engine = jc.Engine()
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    batch = {"x": torch.randn(8, 4), "y": torch.randint(0, 3, (8,))}
    with pytest.raises(jc.BatchError, match=r"\['x', 'y'\].*inputs='x', target='y'"):
        step(state, batch)
