"""A transformers loop switched to torchbridge, each step compared with plain torch.

``model(**batch).loss`` on Hugging Face models with padded attention masks, class-id
labels, torch-tensor and ``BatchEncoding`` batches; the prepared module's own
``state_dict()`` after training; Adam's per-parameter step count across freeze/unfreeze,
and ``zero_grad(set_to_none=False)``.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch
import transformers

import jaxcore as jc
import torchbridge
from tests.torchbridge.helpers import max_abs_diff_to_torch
from tests.torchbridge.models import TwoLayer

STEPS = 5
NO_DECAY = ("bias", "LayerNorm.weight", "norm.weight")


def _hf_groups(model: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW with transformers' usual grouping: no weight decay for biases and norms."""
    named = list(model.named_parameters())
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in named if not n.endswith(NO_DECAY)], "weight_decay": 0.1},
            {"params": [p for n, p in named if n.endswith(NO_DECAY)], "weight_decay": 0.0},
        ],
        lr=1e-3,
    )


def _llama() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(cfg)


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=128,
        max_position_embeddings=64,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForSequenceClassification(cfg)


def _hf_batches(causal: bool) -> list[dict[str, np.ndarray]]:
    """Right-padded rows (mask zeros); causal LM labels are the ids with -100 on padding."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        mask = np.ones((8, 12), np.int32)
        mask[:, 9:] = 0
        mask[::2, 6:] = 0
        ids = np.where(mask == 1, rng.integers(1, 128, (8, 12)), 0).astype(np.int32)
        labels = np.where(mask == 1, ids, -100) if causal else rng.integers(0, 3, 8)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels.astype(np.int32)})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("make, causal", [(_llama, True), (_bert, False)], ids=["llama", "bert"])
def test_hf_models_trained_the_hf_way_match_torch(make, causal):
    """``model(**batch).loss``, two AdamW groups, cosine warmup, clip_grad_norm_: five
    steps equal torch's. BERT's ``labels`` are class ids of shape (batch,), not tokens."""
    torch.manual_seed(0)
    ours = make().train()
    theirs = copy.deepcopy(ours)
    batches = _hf_batches(causal)
    topt = _hf_groups(theirs)
    tsched = transformers.get_cosine_schedule_with_warmup(topt, 2, 10)
    expected = []
    for b in batches:
        topt.zero_grad()
        loss = theirs(**{k: torch.as_tensor(v).long() for k, v in b.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
        topt.step()
        tsched.step()
        expected.append(float(loss.detach()))

    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), clip_grad_norm=0.5)
    opt = _hf_groups(ours)
    sched = transformers.get_cosine_schedule_with_warmup(opt, 2, 10)
    state = torchbridge.prepare(engine, ours, opt, sched)
    step = engine.train_step(lambda m, batch, rng: (m(**batch, rng=rng).loss, {}))
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    trained = torchbridge.state_dict(state)
    for name, p in theirs.state_dict().items():
        np.testing.assert_allclose(trained[name].numpy(), p.numpy(), atol=2e-6, err_msg=name)


class Classifier(torch.nn.Module):
    """An HF-style head: ``forward(input_ids, attention_mask, labels)`` returns ``.loss``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask, labels):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        loss = torch.nn.functional.cross_entropy(self.head(pooled), labels)
        return transformers.modeling_outputs.SequenceClassifierOutput(loss=loss)


def _encodings(n: int) -> list[transformers.BatchEncoding]:
    """What transformers' collators hand a loop: a BatchEncoding of int64 torch tensors."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(n):
        mask = torch.ones(8, 6, dtype=torch.long)
        mask[::2, 4:] = 0
        ids = torch.as_tensor(rng.integers(1, 32, (8, 6))) * mask
        labels = torch.as_tensor(rng.integers(0, 3, 8))
        out.append(
            transformers.BatchEncoding({"input_ids": ids, "attention_mask": mask, "labels": labels})
        )
    return out


def test_torch_tensor_and_batch_encoding_batches_go_straight_into_the_step():
    """A DataLoader's own batches (int64 torch tensors, BatchEncoding) into ``step``, and
    through TorchLoader with a collate_fn returning a BatchEncoding."""
    torch.manual_seed(0)
    ours = Classifier()
    theirs = copy.deepcopy(ours)
    encodings = _encodings(3)
    engine = jc.Engine(parallel=jc.ParallelConfig(data=8))
    state = torchbridge.prepare(engine, ours, torch.optim.AdamW(ours.parameters(), lr=1e-2))
    step = engine.train_step(lambda m, batch, rng: (m(**batch, rng=rng).loss, {}))
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    for batch in (encodings[0], dict(encodings[1])):
        state, metrics = step(state, batch)
        topt.zero_grad()
        loss = theirs(**batch).loss
        loss.backward()
        topt.step()
        assert float(metrics["loss"]) == pytest.approx(float(loss.detach()), abs=1e-6)
    loader = torch.utils.data.DataLoader(
        [dict(encodings[2])], batch_size=1, collate_fn=lambda rows: rows[0]
    )
    for batch in torchbridge.TorchLoader(loader, engine, num_epochs=1):
        state, _ = step(state, batch)
    assert max_abs_diff_to_torch(state.params, theirs) > 0  # the third step ran
    topt.zero_grad()
    theirs(**encodings[2]).loss.backward()
    topt.step()
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


def _pair() -> tuple[TwoLayer, TwoLayer]:
    torch.manual_seed(0)
    ours = TwoLayer()
    return ours, copy.deepcopy(ours)


def _batches(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((8, 4), dtype=np.float32), rng.integers(0, 3, 8).astype(np.int32))
        for _ in range(n)
    ]


def _bridged(module: TwoLayer, opt: torch.optim.Optimizer, traces: list | None = None):
    """The prepared state and train step; ``traces`` gets an item per trace of the loss."""
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, module, opt)
    criterion = torchbridge.loss(torch.nn.CrossEntropyLoss())

    def loss_fn(model, batch, rng):
        if traces is not None:
            traces.append(1)
        return criterion(model, batch, rng)

    return state, engine.train_step(loss_fn)


def _torch_step(module, opt, x, y, set_to_none=True) -> None:
    opt.zero_grad(set_to_none=set_to_none)
    x, y = torch.from_numpy(x), torch.from_numpy(y).long()
    torch.nn.functional.cross_entropy(module(x), y).backward()
    opt.step()


def test_trained_modules_state_dict_and_eager_calls_warn_until_the_weights_are_loaded():
    ours, _ = _pair()
    state, step = _bridged(ours, torch.optim.SGD(ours.parameters(), lr=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.state_dict()  # nothing trained yet: the module's weights are the state's
    x, y = _batches(1)[0]
    state, _ = step(state, (x, y))
    with pytest.warns(
        UserWarning,
        match=r"TwoLayer.state_dict\(\) after bridged training.*"
        r"load_state_dict\(torchbridge.state_dict\(state\)\)",
    ) as stale_warning:
        stale = ours.state_dict()
    assert stale_warning[0].filename == __file__
    assert torch.equal(stale["a.weight"], ours.a.weight)  # the pre-training weights
    with pytest.warns(UserWarning, match=r"TwoLayer runs eagerly .*load_state_dict") as caught:
        ours(torch.from_numpy(x))
    assert caught[0].filename == __file__  # points at the caller's line
    ours.eval()  # the step retraces: the bridge's own call of the module is no eager one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state, _ = step(state, (x, y))
        trained = torchbridge.state_dict(state, ours)  # reads the module's keys, quietly
        ours.load_state_dict(trained)
        synced = ours.state_dict()
        pickle.loads(pickle.dumps(ours))  # the hooks do not stop torch.save(model)
        copy.deepcopy(ours).state_dict()
        ours(torch.from_numpy(x))
    torch.testing.assert_close(synced["a.weight"], trained["a.weight"])
    state, _ = step(state, (x, y))
    with pytest.warns(UserWarning, match="after bridged training"):
        ours.state_dict()
    ours.train()
    with pytest.warns(UserWarning, match=r"preparing TwoLayer again .*load_state_dict"):
        _bridged(ours, torch.optim.SGD(ours.parameters(), lr=0.1))


def test_adam_bias_correction_counts_steps_per_parameter_across_freeze_and_unfreeze():
    """torch's Adam keeps ``state["step"]`` per parameter: ``a`` frozen for steps 2-3 has
    taken 4 steps, not 6, when the run ends, and corrects its moments with that count."""
    ours, theirs = _pair()
    opt = torch.optim.AdamW(ours.parameters(), lr=1e-2, weight_decay=0.1)
    topt = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1)
    state, step = _bridged(ours, opt)
    for i, (x, y) in enumerate(_batches(6)):
        if i in (2, 4):
            for module in (ours, theirs):
                module.a.requires_grad_(i == 4)
        state, _ = step(state, (x, y))
        _torch_step(theirs, topt, x, y)
    assert max_abs_diff_to_torch(state.params, theirs) < 1e-6


@pytest.mark.parametrize(
    "opt_cls, kw",
    [
        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
    ],
    ids=["adamw", "sgd-momentum"],
)
def test_zero_grad_set_to_none_false_keeps_stepping_frozen_parameters_like_torch(opt_cls, kw):
    """torch keeps a zeroed ``.grad`` after ``zero_grad(set_to_none=False)``, so a frozen
    parameter still moves (momentum, weight decay); back on ``set_to_none=True`` it stops."""
    ours, theirs = _pair()
    opt, topt = opt_cls(ours.parameters(), **kw), opt_cls(theirs.parameters(), **kw)
    traces = []
    state, step = _bridged(ours, opt, traces)
    for i, (x, y) in enumerate(_batches(6)):
        if i == 2:
            ours.a.requires_grad_(False)
            theirs.a.requires_grad_(False)
        keep = i < 4
        opt.zero_grad(set_to_none=not keep)
        state, _ = step(state, (x, y))
        _torch_step(theirs, topt, x, y, set_to_none=not keep)
        assert max_abs_diff_to_torch(state.params, theirs) < 1e-6, f"step {i}"
    # Traced at steps 0 (all train), 2 (a frozen, still stepped), 4 (a skipped): no more.
    assert len(traces) == 3


def test_multiple_choice_ids_of_three_dimensions_train_like_torch():
    """``BertForMultipleChoice`` takes ``input_ids`` of shape (batch, choices, length): the
    bridged step accepts them (the engine's 2-d token contract is the native LM's) and its
    losses equal torch's. SGD, not Adam: Adam turns the float noise of gradients that are
    zero in exact arithmetic (the key biases) into full-size steps, 2e-5 apart by step 3."""
    cfg = transformers.BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        vocab_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    ours = transformers.BertForMultipleChoice(cfg).train()
    theirs = copy.deepcopy(ours)
    rng = np.random.default_rng(0)
    batches = [
        {
            "input_ids": rng.integers(1, 64, (8, 3, 10)).astype(np.int32),
            "attention_mask": np.ones((8, 3, 10), np.int32),
            "labels": rng.integers(0, 3, 8).astype(np.int32),
        }
        for _ in range(3)
    ]
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    expected = []
    for b in batches:
        topt.zero_grad()
        loss = theirs(**{k: torch.as_tensor(v).long() for k, v in b.items()}).loss
        loss.backward()
        topt.step()
        expected.append(float(loss.detach()))
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, ours, torch.optim.SGD(ours.parameters(), lr=0.1))
    step = engine.train_step(lambda m, batch, rng: (m(**batch, rng=rng).loss, {}))
    losses = []
    for b in batches:
        state, metrics = step(state, b)
        losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    with pytest.raises(jc.BatchError, match="token ids"):  # ids of one dimension still refused
        step(state, {**batches[0], "input_ids": batches[0]["input_ids"][:, 0, 0]})


def test_engine_shard_batch_takes_the_bridged_plans_torch_batches():
    """``engine.shard_batch`` (the README's loop) goes through the last plan, so a torch
    DataLoader's batch of int64 tensors is sharded like the step's own batches."""
    model = Classifier()
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = torchbridge.prepare(engine, model, torch.optim.SGD(model.parameters(), lr=0.1))
    batch = {
        "input_ids": torch.randint(0, 32, (8, 5)),
        "attention_mask": torch.ones(8, 5, dtype=torch.int64),
        "labels": torch.randint(0, 3, (8,)),
    }
    sharded = engine.shard_batch(batch)
    assert sharded["labels"].shape == (8,) and sharded["input_ids"].dtype == np.int32
    step = engine.train_step(lambda m, b, rng: (m(**b, rng=rng).loss, {}))
    state, metrics = step(state, sharded)
    assert np.isfinite(float(metrics["loss"]))
