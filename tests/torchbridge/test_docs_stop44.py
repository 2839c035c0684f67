"""The README's "Bring your PyTorch model" section driven off its path (stop 44).

A module built on the ``meta`` device (``torch.device("meta")``, as big-model loaders do)
passed to ``prepare`` before its weights are materialised.
"""

from __future__ import annotations

import pytest
import torch

import jaxcore as jc
import torchbridge


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x):
        return self.l(x) * self.scale


@pytest.fixture(scope="module")
def engine():
    return jc.Engine()


@pytest.mark.parametrize("what", ["parameter", "buffer"])
def test_a_module_on_the_meta_device_is_named_with_how_to_materialise_it(engine, what):
    """Before: NotImplementedError "Cannot copy out of meta tensor; no data!" from deep
    inside the bridge. A meta tensor has no values to train from, so ``prepare`` says which
    tensor it is and how to give it values (``to_empty`` then load or initialise)."""
    model = _Tiny()
    if what == "parameter":
        model.l.to("meta")
        name = "l.weight"
    else:
        model.scale = torch.empty(3, device="meta")
        name = "scale"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(jc.ConfigError, match="meta") as e:
        torchbridge.prepare(engine, model, opt)
    assert f"'{name}'" in str(e.value)
    assert "to_empty" in str(e.value)
    if what == "buffer":
        return
    # The fix the message names trains.
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.l.reset_parameters()
        model.scale.fill_(1.0)
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = engine.train_step(torchbridge.loss(torch.nn.MSELoss()))
    state, metrics = step(state, (torch.ones(8, 4), torch.zeros(8, 3)))
    assert float(metrics["loss"]) >= 0.0


# --- SGD(dampening=...) ----------------------------------------------------------------


class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 3)
        self.unread = torch.nn.Linear(2, 2)  # no .grad: torch skips it (no buffer)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_sgd_with_dampening_in_two_groups_matches_torch(engine):
    """Before: ``UnsupportedError: SGD dampening=0.5 is not supported; use 0``. torch's
    buffer is the first gradient itself and ``momentum * buf + (1 - dampening) * g`` after;
    two groups with their own momentum/dampening (one maximizing) match torch's 3 steps."""
    import copy

    import numpy as np

    from tests.torchbridge.helpers import max_abs_diff_to_torch, torch_train

    torch.manual_seed(0)
    model = _Two()
    twin = copy.deepcopy(model)

    def make(m):
        return torch.optim.SGD(
            [
                {"params": m.a.parameters(), "dampening": 0.5, "weight_decay": 0.01},
                {
                    "params": [*m.b.parameters(), *m.unread.parameters()],
                    "momentum": 0.5,
                    "dampening": 0.9,
                    "maximize": True,
                },
            ],
            lr=0.1,
            momentum=0.9,
        )

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)) for _ in range(3)]
    mse = torch.nn.MSELoss()
    state = torchbridge.prepare(engine, model, make(model))
    step = engine.train_step(torchbridge.loss(mse))
    got = []
    for b in batches:
        state, metrics = step(state, b)
        got.append(float(metrics["loss"]))
    want = torch_train(twin, make(twin), lambda m, b: mse(m(b[0]), b[1]), batches)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert max_abs_diff_to_torch(state.params, twin) < 1e-5


# --- nn.Embedding(scale_grad_by_freq=True) ------------------------------------------------


class _Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.e = torch.nn.Embedding(10, 4, padding_idx=1, scale_grad_by_freq=True)
        self.o = torch.nn.Linear(4, 3)

    def forward(self, ids):
        return self.o(self.e(ids).mean(1))


def test_embedding_scale_grad_by_freq_divides_each_rows_gradient_like_torch(engine):
    """Before: the flag was ignored (torchax's embedding gradient is a plain scatter-add),
    so repeated ids trained rows up to their count times too fast: 0.04 off torch's
    weights after 3 SGD steps. torch divides each row's gradient by how often its id
    occurs in the batch; the padding row stays untouched."""
    import copy

    from tests.torchbridge.helpers import max_abs_diff_to_torch, torch_train

    torch.manual_seed(0)
    model = _Bag()
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    # few distinct ids (0..3, 1 the padding), so each batch repeats them many times
    batches = [
        (torch.randint(0, 4, (8, 6), generator=g), torch.randint(0, 3, (8,), generator=g))
        for _ in range(3)
    ]
    ce = torch.nn.CrossEntropyLoss()
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.5))
    step = engine.train_step(torchbridge.loss(ce))
    for b in batches:
        state, _ = step(state, b)
    torch_train(
        twin, torch.optim.SGD(twin.parameters(), lr=0.5), lambda m, b: ce(m(b[0]), b[1]), batches
    )
    assert max_abs_diff_to_torch(state.params, twin) < 1e-5
    trained = torchbridge.state_dict(state)["e.weight"]
    assert torch.equal(trained[1], model.e.weight[1])  # the padding row


def test_embedding_max_norm_is_named_with_its_fix(engine):
    """``max_norm`` renormalises the weight in place from the ids' values (``unique``): the
    error names the Embedding and that option (before: only generic ``torch.where`` advice)."""

    class Capped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4, max_norm=1.0)

        def forward(self, ids):
            return self.emb(ids).sum(1)

    model = Capped()
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.1))
    step = engine.train_step(torchbridge.loss(torch.nn.MSELoss()))
    with pytest.raises(torchbridge.UntraceableError, match="max_norm") as e:
        step(state, (torch.zeros(8, 3, dtype=torch.long), torch.zeros(8, 4)))
    assert "'emb'" in str(e.value)
