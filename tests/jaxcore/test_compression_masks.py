"""Magnitude pruning: the schedule against Zhu & Gupta's formula, masks that hold under
ZeRO-3, and exact per-layer sparsity."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.compression import (
    SparsitySchedule,
    find_masks,
    magnitude_mask,
    magnitude_pruning,
    sparsity_report,
)
from jaxcore.models import lm_loss
from tests.jaxcore.helpers import factory, host, make_batch

PRUNED = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def zhu_gupta(t, s_i, s_f, t0, n, dt):
    """The reference: eq. 1 of Zhu & Gupta 2017, held constant after the last update."""
    if t < t0:
        return 0.0
    t = min(t, t0 + n * dt)
    return s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3


@settings(max_examples=60, deadline=None)
@given(
    s_f=st.floats(0.05, 0.95),
    frac=st.floats(0.0, 1.0),
    t0=st.integers(0, 20),
    n=st.integers(1, 10),
    dt=st.integers(1, 5),
    t=st.integers(0, 100),
)
def test_gradual_schedule_matches_the_formula(s_f, frac, t0, n, dt, t):
    s_i = s_f * frac
    sched = SparsitySchedule(final=s_f, initial=s_i, begin_step=t0, num_updates=n, frequency=dt)
    np.testing.assert_allclose(
        float(sched.sparsity(t)), zhu_gupta(t, s_i, s_f, t0, n, dt), rtol=1e-5, atol=1e-6
    )
    due = t >= t0 and t <= t0 + n * dt and (t - t0) % dt == 0
    assert bool(sched.updates_at(t)) == due


# Each (rows, cols) is a new XLA program: a few buckets (one column, a prime, the largest)
# with free sparsity, ties and values check the count rule without ~40 compiles.
_mask = jax.jit(magnitude_mask, static_argnames="stacked")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.sampled_from((1, 4)),
    cols=st.sampled_from((1, 2, 7, 40)),
    sparsity=st.floats(0.0, 0.99),
    zeros=st.integers(0, 10),
    seed=st.integers(0, 2**16),
)
def test_magnitude_mask_prunes_the_smallest_exactly(rows, cols, sparsity, zeros, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(rows, cols)).astype(np.float32)
    w[:, : min(zeros, cols)] = 0.0  # ties at zero (already pruned weights)
    mask = np.asarray(_mask(w, np.float32(sparsity), stacked=True))
    k = int(np.floor(np.float32(sparsity) * cols + 1e-4))
    for r in range(rows):
        assert (~mask[r]).sum() == k
        if 0 < k < cols:
            assert np.abs(w[r][~mask[r]]).max() <= np.abs(w[r][mask[r]]).min()


def test_schedule_rejects_bad_targets():
    with pytest.raises(jc.ConfigError, match="target sparsity"):
        SparsitySchedule(final=1.0)
    with pytest.raises(jc.ConfigError, match="initial"):
        SparsitySchedule(final=0.3, initial=0.5)
    with pytest.raises(jc.ConfigError, match="regular expression"):
        magnitude_pruning(optax.sgd(0.1), SparsitySchedule.one_shot(0.5), targets="(")


@pytest.fixture(scope="module")
def zero3():
    return jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)


def test_masks_hold_under_zero3_and_sparsity_is_the_target(zero3):
    # One-shot at step 0, then 10 AdamW steps with weight decay and a large lr: any leak
    # (decay, momentum, the update itself) would move a pruned weight off zero.
    tx = magnitude_pruning(optax.adamw(1e-2, weight_decay=0.1), SparsitySchedule.one_shot(0.5))
    state = zero3.prepare(factory, tx)
    masks = find_masks(state.opt_state)
    # The masks are sharded like their parameters (the engine's ZeRO-3 layout).
    for name in PRUNED:
        assert masks[name].sharding == state.params[name].sharding
        assert masks[name].sharding.spec == zero3.state_shardings.params[name].spec
    step = zero3.train_step(lm_loss)
    for i in range(10):
        state, metrics = step(state, make_batch(8, i))
    assert np.isfinite(float(metrics["loss"]))
    params, masks = host(state.params), host(find_masks(state.opt_state))
    report = sparsity_report(params)
    for name in PRUNED:
        assert np.all(params[name][~masks[name]] == 0.0), name
        assert report[name] == [0.5, 0.5], (name, report[name])
        # The kept weights did train.
        assert np.count_nonzero(params[name]) == params[name].size // 2
    for name in ("embed", "lm_head", "attn_norm"):
        assert np.count_nonzero(params[name]) == params[name].size


def test_gradual_schedule_in_the_jitted_step(zero3):
    sched = SparsitySchedule(final=0.75, initial=0.25, begin_step=2, num_updates=3, frequency=2)
    tx = magnitude_pruning(optax.adamw(1e-2, weight_decay=0.1), sched)
    state = zero3.prepare(factory, tx)
    step = zero3.train_step(lm_loss)
    seen = []
    for i in range(10):
        state, _ = step(state, make_batch(8, i))
        params, masks = host(state.params), host(find_masks(state.opt_state))
        w = params["w_up"]
        assert np.all(w[~masks["w_up"]] == 0.0)
        seen.append(sparsity_report(params)["w_up"][0])
    # Update i saw count i: masks at 2, 4, 6, 8 follow the cubic, then stay at the target.
    expect = [
        zhu_gupta(max(i if (i - 2) % 2 == 0 else i - 1, 0), 0.25, 0.75, 2, 3, 2) if i >= 2 else 0.0
        for i in range(10)
    ]
    size = w[0].size
    np.testing.assert_allclose(seen, [np.floor(e * size + 1e-4) / size for e in expect])
    assert seen[-1] == 0.75
    np.testing.assert_array_equal(np.diff(seen) >= 0, True)
