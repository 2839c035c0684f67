"""The torch loop off the tested path: clip_grad_*_ copied into a bridged loop, custom
batch samplers, and a transformers model trained with a linear warmup schedule, gradient
checkpointing and padded masks, then saved with save_pretrained."""

from __future__ import annotations

import copy
import random
import warnings

import jax
import numpy as np
import pytest
import torch
import torch.utils.checkpoint
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, TensorDataset

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import max_abs_diff_to_torch
from tests.torchbridge.models import MLP
from tests.torchbridge.test_offpath_stop37 import _hf_batches, _hf_groups


def _xy(n: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(8, 8)).astype(np.float32) * 3, rng.integers(0, 4, 8).astype(np.int64))
        for _ in range(n)
    ]


def _ce(module, batch):
    return F.cross_entropy(module(batch[0]), batch[1])


def _two_groups(model, cls=torch.optim.AdamW):
    return cls(
        [
            {"params": model.fc1.parameters(), "weight_decay": 0.1},
            {"params": model.fc2.parameters(), "lr": 3e-2, "weight_decay": 0.0},
        ],
        lr=1e-2,
    )


# ------------------------------------------------------------------ clip_grad_*_
def test_clip_grad_norm_and_value_in_a_bridged_loop_raise_naming_the_fix():
    """Copied from a torch loop, the clip calls used to return 0 and clip nothing."""
    torch.manual_seed(0)
    model = MLP()
    opt = _two_groups(model)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, model, opt)
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    x, y = _xy(1)[0]
    state, _ = step(state, (x, y))
    with pytest.raises(torchbridge.UnsupportedError, match=r"jc\.Engine\(clip_grad_norm=1\.0\)"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(torchbridge.UnsupportedError, match=r"norm_type=inf is not supported"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type="inf")
    from torch.nn.utils.clip_grad import clip_grad_value_  # the module's name too

    with pytest.raises(
        torchbridge.UnsupportedError, match=r"prepare\(\.\.\., clip_grad_value=0\.5"
    ):
        clip_grad_value_(model.parameters(), clip_value=0.5)
    # One parameter (a Tensor, not an iterable) is caught as well.
    with pytest.raises(torchbridge.UnsupportedError):
        torch.nn.utils.clip_grad_norm_(model.fc1.weight, 1.0)


def test_clip_grad_norm_on_unprepared_or_eagerly_backpropagated_parameters_is_torchs():
    torch.manual_seed(0)
    model = MLP()
    twin = copy.deepcopy(model)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    torchbridge.prepare(engine, model, _two_groups(model))
    x, y = (torch.from_numpy(a) for a in _xy(1)[0])
    for m in (model, twin):  # an eager backward after prepare: real .grad to clip
        F.cross_entropy(m(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    twin_norm = torch.nn.utils.clip_grad.clip_grad_norm_(twin.parameters(), 0.1)
    assert float(norm) == float(twin_norm) > 0.1
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    total = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
    assert abs(float(total) - 0.1) < 1e-6


def test_engine_clip_grad_norm_with_two_groups_matches_torchs_clip_grad_norm_():
    """The fix the error names: same update, and metrics['grad_norm'] is torch's return."""
    torch.manual_seed(0)
    ours = MLP()
    theirs = copy.deepcopy(ours)
    topt = _two_groups(theirs)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), clip_grad_norm=1.0)
    state = torchbridge.prepare(engine, ours, _two_groups(ours))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    clipped = 0
    for x, y in _xy(6):
        state, metrics = step(state, (x, y))
        topt.zero_grad()
        F.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        norm = float(torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0))
        topt.step()
        clipped += norm > 1.0
        assert abs(float(metrics["grad_norm"]) - norm) < 1e-5 * max(1.0, norm)
    assert clipped >= 3  # the clip did act
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5


# ------------------------------------------------------------------ batch_sampler
class NoCopy(TensorDataset):
    """A dataset too big to copy: the loader's copies of a batch sampler share it."""

    def __deepcopy__(self, memo):
        raise AssertionError("the dataset was deep-copied")


def _lengths_dataset(n: int = 40) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return NoCopy(torch.arange(n), torch.randint(1, 30, (n,), generator=g))


class BucketBatchSampler(Sampler):
    """Batches of similar length, shuffled per epoch from ``(seed, epoch)``."""

    def __init__(self, lengths, batch_size: int, seed: int = 0):
        self.lengths = [int(v) for v in lengths]
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = sorted(range(len(self.lengths)), key=self.lengths.__getitem__)
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for k in torch.randperm(len(batches), generator=g).tolist():
            yield batches[k]

    def __len__(self):
        return -(-len(self.lengths) // self.batch_size)


class GlobalRandomBatchSampler(BucketBatchSampler):
    """Draws from Python's global RNG: no two iterations agree."""

    def __iter__(self):
        order = list(range(len(self.lengths)))
        random.shuffle(order)
        for i in range(0, len(order), self.batch_size):
            yield order[i : i + self.batch_size]


def _ids(batches) -> list[list[int]]:
    return [np.asarray(b[0]).tolist() for b in batches]


def test_custom_batch_sampler_gives_torchs_batches_per_epoch_and_resumes_mid_epoch():
    ds = _lengths_dataset()
    bs = BucketBatchSampler(ds.tensors[1], 6)
    bs.dataset = ds  # a sampler that holds its dataset (to read lengths)
    expected = []
    for epoch in range(3):  # the torch loop: set_epoch, then iterate the DataLoader
        bs.set_epoch(epoch)
        expected += _ids(DataLoader(ds, batch_sampler=bs))
    bs.set_epoch(0)
    assert len(expected) == 21 and expected[:7] != expected[7:14]
    loader = torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), num_epochs=3)
    assert len(loader) == 7
    assert _ids(loader) == expected
    first = torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), num_epochs=3)
    it = iter(first)
    for _ in range(10):
        next(it)
    resumed = torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), num_epochs=3)
    resumed.set_state(first.get_state())
    assert _ids(resumed) == expected[10:]
    assert bs.epoch == 0  # the loop's own sampler is left as it was


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 30),
    size=st.integers(1, 7),
    seed=st.integers(0, 2**16),
    stop=st.integers(0, 40),
)
def test_bucketed_batches_and_any_resume_point_match_torch(n, size, seed, stop):
    ds = _lengths_dataset(n)
    bs = BucketBatchSampler(ds.tensors[1], size, seed=seed)
    expected = []
    for epoch in range(2):
        bs.set_epoch(epoch)
        expected += _ids(DataLoader(ds, batch_sampler=bs))
    bs.set_epoch(0)
    stop = min(stop, len(expected))
    first = torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), num_epochs=2)
    it = iter(first)
    got = [np.asarray(next(it)[0]).tolist() for _ in range(stop)]
    resumed = torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), num_epochs=2)
    resumed.set_state(first.get_state())
    assert got + _ids(resumed) == expected


def test_torchs_batch_sampler_passed_explicitly_is_the_batch_size_loader():
    ds = _lengths_dataset(26)

    def make():
        g = torch.Generator().manual_seed(3)
        bs = BatchSampler(RandomSampler(ds, generator=g), batch_size=4, drop_last=True)
        return DataLoader(ds, batch_sampler=bs, generator=torch.Generator().manual_seed(7))

    torch_dl = make()
    expected = [b for _ in range(2) for b in _ids(torch_dl)]
    assert len(expected) == 12
    assert _ids(torchbridge.TorchLoader(make(), num_epochs=2)) == expected


def test_a_batch_sampler_that_cannot_be_replayed_is_refused_and_leaves_the_rngs_alone():
    ds = _lengths_dataset()
    before = random.getstate(), torch.get_rng_state()
    with pytest.raises(torchbridge.UnsupportedError, match=r"GlobalRandomBatchSampler.*set_epoch"):
        torchbridge.TorchLoader(DataLoader(ds, batch_sampler=GlobalRandomBatchSampler([1] * 40, 4)))
    assert random.getstate() == before[0]
    assert torch.equal(torch.get_rng_state(), before[1])
    with pytest.raises(torchbridge.UnsupportedError, match=r"batch_size=None"):
        torchbridge.TorchLoader(DataLoader(ds, batch_size=None))


def test_bucketed_batches_train_like_torch():
    ds = _lengths_dataset(24)
    feats = torch.randn(24, 8, generator=torch.Generator().manual_seed(1))
    ds = TensorDataset(torch.arange(24), feats, ds.tensors[1] % 4)
    bs = BucketBatchSampler(ds.tensors[2].tolist(), 8)
    torch.manual_seed(0)
    ours = MLP()
    theirs = copy.deepcopy(ours)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, ours, torch.optim.SGD(ours.parameters(), 0.1, 0.9))
    step = engine.train_step(lambda m, b, rng: (m.call(_ce, (b[1], b[2]), rng=rng), {}))
    for batch in torchbridge.TorchLoader(DataLoader(ds, batch_sampler=bs), engine, num_epochs=2):
        state, _ = step(state, batch)
    for epoch in range(2):
        bs.set_epoch(epoch)
        for _, x, y in DataLoader(ds, batch_sampler=bs):
            topt.zero_grad()
            _ce(theirs, (x, y)).backward()
            topt.step()
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5


# ------------------------------------------------------------------ transformers
def _tiny(kind: str, dropout: float = 0.0) -> torch.nn.Module:
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        )  # fmt: skip
        return transformers.GPT2LMHeadModel(cfg).train()
    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).train()


def _hf_step(engine):
    return engine.train_step(lambda m, batch, rng: (m(**batch, rng=rng).loss, {}))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hf_model_with_linear_warmup_and_gradient_checkpointing_matches_torch_and_reloads(
    kind, tmp_path
):
    """AdamW in two groups + get_linear_schedule_with_warmup, right-padded masks,
    gradient_checkpointing_enable() on both sides; then save_pretrained -> from_pretrained
    gives torch's logits."""
    torch.manual_seed(0)
    ours = _tiny(kind)
    theirs = copy.deepcopy(ours)
    for m in (ours, theirs):
        m.gradient_checkpointing_enable()
    batches = _hf_batches(causal=True)
    topt = _hf_groups(theirs)
    tsched = transformers.get_linear_schedule_with_warmup(topt, 2, 10)
    expected = []
    for b in batches:
        topt.zero_grad()
        loss = theirs(**{k: torch.as_tensor(v).long() for k, v in b.items()}).loss
        loss.backward()
        topt.step()
        tsched.step()
        expected.append(float(loss.detach()))
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    opt = _hf_groups(ours)
    sched = transformers.get_linear_schedule_with_warmup(opt, 2, 10)
    state = torchbridge.prepare(engine, ours, opt, sched)
    step = _hf_step(engine)
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    ours.load_state_dict(torchbridge.state_dict(state))
    for name, p in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], p, atol=5e-6, err_msg=name)
    ours.save_pretrained(tmp_path)
    back = type(ours).from_pretrained(tmp_path).eval()
    ids = torch.as_tensor(batches[0]["input_ids"]).long()
    mask = torch.as_tensor(batches[0]["attention_mask"]).long()
    with torch.no_grad():
        got = back(input_ids=ids, attention_mask=mask).logits
        want = theirs.eval()(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _gpt2_run(checkpointing: bool):
    torch.manual_seed(0)
    model = _tiny("gpt2", dropout=0.1)
    if checkpointing:
        model.gradient_checkpointing_enable()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), 1e-3))
    step = _hf_step(engine)
    batches = _hf_batches(causal=True)[:3]
    text = step.jitted.lower(state, batches[0]).as_text()
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    return text.count("optimization_barrier"), losses, state.params


@pytest.mark.slow
def test_gradient_checkpointing_enable_rematerialises_each_layer_with_the_same_dropout():
    """It used to be a no-op on JAX (every activation kept, silently): now each
    checkpointed layer is a jax.checkpoint (an optimization barrier per layer in the
    step), and dropout masks and losses are those of the run without checkpointing."""
    plain_barriers, plain_losses, plain = _gpt2_run(False)
    barriers, losses, params = _gpt2_run(True)
    assert (plain_barriers, barriers) == (0, 2)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    worst = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(plain), strict=True)
    )
    assert worst < 1e-6


class CheckpointedMLP(torch.nn.Module):
    """A user's own ``torch.utils.checkpoint.checkpoint`` around a block."""

    def __init__(self):
        super().__init__()
        self.inner = MLP(8, 16, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        return self.head(h)


def test_a_modules_own_torch_checkpoint_call_is_rematerialised_and_trains_like_torch():
    torch.manual_seed(0)
    ours = CheckpointedMLP()
    theirs = copy.deepcopy(ours)
    topt = torch.optim.AdamW(theirs.parameters(), 1e-2)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, ours, torch.optim.AdamW(ours.parameters(), 1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    data = _xy(4)
    assert step.jitted.lower(state, data[0]).as_text().count("optimization_barrier") == 1
    for x, y in data:
        state, _ = step(state, (x, y))
        topt.zero_grad()
        _ce(theirs, (torch.from_numpy(x), torch.from_numpy(y))).backward()
        topt.step()
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5


class CheckpointedNorm(torch.nn.Module):
    """A checkpointed block with train-mode BatchNorm (its statistics change inside)."""

    def __init__(self, checkpointed: bool = True):
        super().__init__()
        self.checkpointed = checkpointed
        self.inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        if self.checkpointed:
            return self.head(torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False))
        return self.head(self.inner(x))


def test_batchnorm_statistics_inside_a_checkpointed_block_update_once_per_step():
    """Updated inside jax.checkpoint, the statistics leaked a tracer (UnexpectedTracerError)
    once checkpointing was remat; they come out once per step, as torch's without
    checkpointing (torch's recomputation would update them twice: num_batches_tracked 2)."""
    torch.manual_seed(0)
    ours = CheckpointedNorm()
    theirs = copy.deepcopy(ours)
    theirs.checkpointed = False
    topt = torch.optim.SGD(theirs.parameters(), 0.1)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, ours, torch.optim.SGD(ours.parameters(), 0.1))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    for x, y in _xy(3):
        state, _ = step(state, (x, y))
        topt.zero_grad()
        _ce(theirs, (torch.from_numpy(x), torch.from_numpy(y))).backward()
        topt.step()
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-5
    stats = state.model_state["inner"]["1"]
    bn = theirs.inner[1]
    assert int(stats["num_batches_tracked"]) == int(bn.num_batches_tracked) == 3
    np.testing.assert_allclose(stats["running_mean"], bn.running_mean, atol=1e-6)
    np.testing.assert_allclose(stats["running_var"], bn.running_var, atol=1e-6)


def test_the_engines_remat_policy_applies_to_checkpointed_blocks_without_a_warning():
    """jc.Engine(remat=...) warned 'had no effect' for a bridged module; a block under
    torch.utils.checkpoint now takes the policy (and counts as wrapped)."""
    torch.manual_seed(0)
    model = CheckpointedMLP()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), remat="dots_saveable")
    state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), 1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = step.jitted.lower(state, _xy(1)[0]).as_text()
        state, metrics = step(state, _xy(1)[0])
    assert text.count("optimization_barrier") == 1
    assert np.isfinite(float(metrics["loss"]))
