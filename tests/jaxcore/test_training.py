"""Gradient accumulation, mixed precision, remat policies, ZeRO memory and eval metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import engine_run, factory, host, make_batch, max_rel_diff

FSDP8 = jc.ParallelConfig(fsdp=8)


def test_grad_accum_equals_full_batch_with_padding():
    # Padding makes microbatches hold different numbers of real tokens: the accumulated
    # step must still give the full batch's token-mean loss and update.
    batches = [make_batch(32, seed, padded=True) for seed in range(2)]
    tx = optax.sgd(0.1, momentum=0.9)
    full, full_params, _, _ = engine_run(jc.Engine(parallel=FSDP8), batches, tx)
    accum, accum_params, _, _ = engine_run(jc.Engine(parallel=FSDP8, grad_accum=4), batches, tx)
    np.testing.assert_allclose(accum, full, rtol=1e-5)
    assert max_rel_diff(accum_params, full_params) < 1e-5


def _poisoned_loss(model, batch, rng):
    loss, aux = lm_loss(model, batch, rng)
    return loss * batch["factor"][0], aux


def _fp16_run(loss_scale: jc.LossScaleConfig, factors):
    engine = jc.Engine(parallel=FSDP8, precision="fp16", loss_scale=loss_scale)
    state = engine.prepare(factory, optax.adamw(1e-3))
    step = engine.train_step(_poisoned_loss)
    out = []
    for f in factors:
        before = host(state.params)
        batch = {**make_batch(16, 0), "factor": np.full((16,), f, np.float32)}
        state, metrics = step(state, batch)
        out.append((before, host(state.params), {k: float(v) for k, v in metrics.items()}))
    return out


def test_fp16_overflow_skips_update_and_halves_scale():
    # hysteresis=1: every overflow halves the scale.
    (before, after, m0), (_, after1, m1) = _fp16_run(
        jc.LossScaleConfig(hysteresis=1), [np.inf, 1.0]
    )
    assert max_rel_diff(after, before) == 0.0, "an overflowing step must not change weights"
    assert m0["loss_scale"] == 2.0**15 and m0["skipped"] == 1
    assert max_rel_diff(after1, after) > 0, "the next clean step updates again"
    assert m1["loss_scale"] == 2.0**15 and m1["skipped"] == 1


def test_fp16_default_hysteresis_matches_deepspeed():
    # DeepSpeed's hysteresis=2: the first overflow spends the budget, the second halves.
    runs = _fp16_run(jc.LossScaleConfig(), [np.inf, np.inf, 1.0])
    scales = [m["loss_scale"] for _, _, m in runs]
    skipped = [m["skipped"] for _, _, m in runs]
    assert scales == [2.0**16, 2.0**15, 2.0**15]
    assert skipped == [1, 2, 2]
    for before, after, _ in runs[:2]:
        assert max_rel_diff(after, before) == 0.0


def test_fp16_scale_grows_after_clean_steps():
    runs = _fp16_run(jc.LossScaleConfig(growth_interval=2), [1.0, 1.0, 1.0])
    assert [m["loss_scale"] for _, _, m in runs] == [2.0**16, 2.0**17, 2.0**17]


def test_bf16_keeps_float32_master_weights_and_trains():
    engine = jc.Engine(parallel=FSDP8, precision="bf16")
    state = engine.prepare(factory, optax.adamw(1e-2))
    step = engine.train_step(lm_loss)
    batch = make_batch(16, 0)
    losses = []
    for _ in range(5):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    dtypes = {
        x.dtype
        for x in jax.tree.leaves((state.params, state.opt_state))
        if jnp.issubdtype(x.dtype, jnp.floating)
    }
    assert dtypes == {jnp.dtype(jnp.float32)}
    assert losses[-1] < losses[0]


@pytest.fixture(scope="module")
def sgd_grads_none():
    return _one_sgd_step("none")


# An "optimizer" that stores the gradient it is given in its state and changes nothing.
CAPTURE_GRADS = optax.GradientTransformation(
    init=lambda params: jax.tree.map(jnp.zeros_like, params),
    update=lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
)


def _one_sgd_step(policy: str):
    engine = jc.Engine(parallel=FSDP8, remat=policy)
    state = engine.prepare(factory, CAPTURE_GRADS)
    state, _ = engine.train_step(lm_loss)(state, make_batch(16, 0))
    return host(state.opt_state)


@pytest.mark.parametrize(
    "policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload"]
)
def test_remat_policies_give_the_same_gradients(policy, sgd_grads_none):
    assert max_rel_diff(_one_sgd_step(policy), sgd_grads_none) < 1e-5


def _state_bytes_per_device(zero: int) -> int:
    engine = jc.Engine(parallel=FSDP8, zero=zero)
    state = engine.prepare(factory, optax.adamw(1e-3))
    per_device = jc.per_device_bytes((state.params, state.opt_state))
    assert len(per_device) == 8
    return max(per_device.values())


def test_state_memory_falls_with_zero_stage():
    sizes = [_state_bytes_per_device(z) for z in range(4)]
    assert sizes[1] < sizes[0], sizes
    assert sizes[2] == sizes[1], "ZeRO 2 shards gradients, which the state does not hold"
    assert sizes[3] < sizes[2], sizes
    assert sizes[3] <= sizes[0] / 8 * 1.05, sizes


def test_eval_mean_over_real_tokens_matches_single_device():
    batches = [make_batch(16, seed, padded=True) for seed in range(3)]
    engine = jc.Engine(parallel=jc.ParallelConfig(data=2, fsdp=2, tensor=2))
    state = engine.prepare(factory, optax.adamw(1e-3))
    evaluate = engine.eval_step(lm_loss)
    mean = jc.MeanMetrics()
    for b in batches:
        mean.update(evaluate(state, b))
    result = mean.compute()

    model = engine.bind(jax.device_get(state))
    total, count = 0.0, 0.0
    for b in batches:
        loss, aux = lm_loss(model, jax.device_put(b, jax.devices()[0]), None)
        total += float(loss) * float(aux["weight"])
        count += float(aux["weight"])
    assert result["weight"] == count == sum(b["mask"][:, 1:].sum() for b in batches)
    np.testing.assert_allclose(result["loss"], total / count, rtol=1e-5)
