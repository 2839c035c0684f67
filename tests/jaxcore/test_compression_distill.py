"""Distillation: the loss against a NumPy oracle, the teacher sharded by the engine with
no optimizer state and no updates, and a half-depth student that learns more from the
teacher than from scratch on held-out demo text."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import jaxcore as jc
from jaxcore.compression import (
    distill_loss,
    distill_pair,
    kd_loss,
    load_teacher,
    perplexity,
    student_from_teacher,
    student_only,
    text_batches,
)
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from tests.jaxcore.helpers import host, make_batch


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


logits = hnp.arrays(np.float32, (2, 3, 5), elements=st.floats(-8, 8, width=32))


@settings(max_examples=50, deadline=None)
@given(
    s=logits,
    t=logits,
    temperature=st.floats(0.5, 4.0),
    alpha=st.floats(0.0, 1.0),
    seed=st.integers(0, 100),
)
def test_kd_loss_matches_numpy(s, t, temperature, alpha, seed):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 5, (2, 3))
    mask = (rng.random((2, 3)) < 0.7).astype(np.float32)
    loss, aux = kd_loss(s, t, targets, mask, temperature=temperature, alpha=alpha)
    lt, ls = log_softmax(t / temperature), log_softmax(s / temperature)
    kl = (np.exp(lt) * (lt - ls)).sum(-1)
    ce = -np.take_along_axis(log_softmax(s), targets[..., None], -1)[..., 0]
    n = max(mask.sum(), 1.0)
    want = alpha * temperature**2 * (kl * mask).sum() / n + (1 - alpha) * (ce * mask).sum() / n
    np.testing.assert_allclose(float(loss), want, rtol=2e-4, atol=2e-5)
    assert float(aux["weight"]) == mask.sum()


def test_bad_settings_are_refused():
    with pytest.raises(jc.ConfigError, match="temperature"):
        distill_loss(temperature=0.0)
    with pytest.raises(jc.ConfigError, match="alpha"):
        distill_loss(alpha=1.5)


def test_teacher_is_sharded_has_no_optimizer_state_and_never_moves():
    teacher_cfg = TransformerConfig.tiny(max_seq_len=64)
    student_cfg = TransformerConfig.tiny(max_seq_len=64, n_layers=1)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)
    pair = distill_pair(
        lambda r: Transformer(student_cfg, rngs=r), lambda r: Transformer(teacher_cfg, rngs=r)
    )
    plan = engine.plan(pair, optax.adamw(1e-2, weight_decay=0.1), trainable=student_only)
    state = plan.init(0)
    trained = jax.tree.map(lambda x: np.asarray(x) + 1.0, host(state.params["teacher"]))
    state = load_teacher(plan, state, trained)
    # ZeRO-3 shards the teacher's weights like any parameter.
    for name, leaf in state.params["teacher"].items():
        assert leaf.sharding == plan.state_shardings.params["teacher"][name]
    assert "fsdp" in str(state.params["teacher"]["wq"].sharding.spec)
    # Optimizer slots exist for the student only.
    slots = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state.opt_state)
    ]
    assert slots and not any("teacher" in p for p in slots)
    assert any("student" in p for p in slots)
    step = plan.train_step(distill_loss(temperature=2.0, alpha=0.5))
    before = host(state.params["student"])
    for i in range(3):
        state, metrics = step(state, make_batch(8, i))
    assert np.isfinite(float(metrics["kl"])) and np.isfinite(float(metrics["ce"]))
    jax.tree.map(np.testing.assert_array_equal, host(state.params["teacher"]), trained)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), host(state.params["student"]), before)
    assert min(jax.tree.leaves(moved)) > 0
    with pytest.raises(jc.ConfigError, match="shape"):
        load_teacher(plan, state, host(state.params["student"]))


# ---------------------------------------------------------------- student vs scratch
SEQ, BATCH = 32, 8
TEACHER = TransformerConfig.tiny(n_layers=4, max_seq_len=SEQ)
STUDENT = TransformerConfig.tiny(n_layers=2, max_seq_len=SEQ)
BUDGET = 40  # student steps, the same for both


def test_distilled_half_depth_student_beats_scratch_on_held_out_text():
    source = jc.stdlib_source(max_files=60)
    train_docs, held_docs = range(50), range(50, 60)  # disjoint files
    held_out = text_batches(source, held_docs, batch=32, seq_len=SEQ, count=4, seed=99)
    one = jax.devices()[:1]

    def engine():
        return jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), devices=one, zero=0)

    def batches(count, seed):
        return text_batches(source, train_docs, batch=BATCH, seq_len=SEQ, count=count, seed=seed)

    teacher_engine = engine()
    state = teacher_engine.prepare(lambda r: Transformer(TEACHER, rngs=r), optax.adamw(3e-3))
    step = teacher_engine.train_step(lm_loss)
    for b in batches(150, seed=7):
        state, _ = step(state, {"tokens": b})
    teacher = host(state.params)
    teacher_loss = np.log(perplexity(TEACHER, teacher, held_out))

    # One plan and one train step per model, reused by both seeds: a seed changes the
    # initial values, not the program, so each step compiles once.
    scratch_plan = engine().plan(lambda r: Transformer(STUDENT, rngs=r), optax.adamw(3e-3))
    scratch_step = scratch_plan.train_step(lm_loss)
    pair = distill_pair(
        lambda r: Transformer(STUDENT, rngs=r), lambda r: Transformer(TEACHER, rngs=r)
    )
    kd_plan = engine().plan(pair, optax.adamw(3e-3), trainable=student_only)
    kd_step = kd_plan.train_step(distill_loss(temperature=2.0, alpha=0.5))
    for seed in (0, 1):
        scratch = scratch_plan.init(seed)
        for b in batches(BUDGET, seed):
            scratch, _ = scratch_step(scratch, {"tokens": b})
        scratch_loss = np.log(perplexity(STUDENT, host(scratch.params), held_out))

        state = load_teacher(kd_plan, kd_plan.init(seed), teacher)
        start = student_from_teacher(teacher, layers=range(0, TEACHER.n_layers, 2))
        params = {**state.params, "student": start}
        state = state.replace(params=jax.device_put(params, kd_plan.state_shardings.params))
        for b in batches(BUDGET, seed):
            state, _ = kd_step(state, {"tokens": b})
        student_loss = np.log(perplexity(STUDENT, host(state.params["student"]), held_out))
        print(
            f"seed {seed}: teacher {teacher_loss:.3f} distilled {student_loss:.3f} "
            f"scratch {scratch_loss:.3f} (held-out nats/byte)"
        )
        assert student_loss < scratch_loss, (seed, student_loss, scratch_loss)
