"""The engine against a plain single-device float32 optax loop, off the tested path:
padded accumulation under every ZeRO stage and 2-d layouts with parameter groups, fp16
overflow with a schedule, bf16, and remat inside accumulation."""

import jax
import numpy as np
import optax
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import engine_run, factory, host, make_batch, max_rel_diff, reference_run

LAYOUTS = {
    "tensor2_fsdp4": jc.ParallelConfig(tensor=2, fsdp=4),
    "data2_fsdp4": jc.ParallelConfig(data=2, fsdp=4),
}


def _labels(params):
    return {k: "head" if k == "lm_head" else "frozen" if k == "embed" else "body" for k in params}


def _groups() -> optax.GradientTransformation:
    """Two learning rates and a frozen group (SGD: no Adam amplification of round-off)."""
    return optax.multi_transform(
        {
            "head": optax.sgd(3.0, momentum=0.9),
            "body": optax.sgd(30.0),
            "frozen": optax.set_to_zero(),
        },
        _labels,
    )


def _update_diff(params, ref_params, init) -> float:
    """max |engine update - reference update| / max |reference update|, over all leaves."""
    delta = jax.tree.map(lambda p, i: p - i, params, init)
    ref_delta = jax.tree.map(lambda p, i: p - i, ref_params, init)
    return max_rel_diff(delta, ref_delta)


def _padded_unevenly(seed: int) -> dict[str, np.ndarray]:
    """32 rows whose real-token counts differ a lot between microbatches of any k."""
    batch = make_batch(32, seed)
    lengths = np.where(np.arange(32) % 4 == 0, 17, 3 + np.arange(32) % 3)
    batch["mask"] = (np.arange(17)[None, :] < lengths[:, None]).astype(np.int32)
    return batch


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    accum=st.sampled_from([2, 4]),
    layout=st.sampled_from(sorted(LAYOUTS)),
    zero=st.sampled_from([1, 2, 3]),
)
def test_accumulated_groups_match_the_single_device_loop(accum, layout, zero):
    batches = [_padded_unevenly(seed) for seed in range(2)]
    engine = jc.Engine(parallel=LAYOUTS[layout], zero=zero, grad_accum=accum)
    losses, params, init, _ = engine_run(engine, batches, _groups())
    ref_losses, ref_params = reference_run(init, batches, _groups())
    # The token-weighted mean over the whole batch, not a mean of microbatch means.
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    assert _update_diff(params, ref_params, init) < 2e-5
    np.testing.assert_array_equal(params["embed"], init["embed"])


def _poisoned(model, batch, rng):
    loss, aux = lm_loss(model, batch, rng)
    return loss * batch["factor"][0], aux


def test_fp16_overflow_leaves_the_optimizer_count_and_schedule_alone():
    # x1e4 keeps the loss finite but overflows the float16 backward pass at scale 2**16.
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(sched))
    engine = jc.Engine(parallel=LAYOUTS["tensor2_fsdp4"], zero=2, precision="fp16", grad_accum=2)
    state = engine.prepare(factory, tx)
    step = engine.train_step(_poisoned)
    scales, counts = [], []
    for factor in (1.0, 1e4, 1e4, 1.0, 1e4):
        before = host(state.params)
        batch = {**make_batch(16, 0), "factor": np.full((16,), factor, np.float32)}
        state, metrics = step(state, batch)
        scales.append(float(metrics["loss_scale"]))
        counts.append(int(state.opt_state[1][0].count))
        if factor > 1:
            assert np.isfinite(float(metrics["loss"]))
            assert max_rel_diff(host(state.params), before) == 0.0
    # Hysteresis 2: the first overflow spends the budget, the second halves; the budget
    # refills only when the scale grows, so the third overflow halves at once.
    assert scales == [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**14]
    assert counts == [1, 1, 1, 2, 2]
    assert int(metrics["skipped"]) == 3 and int(metrics["consecutive_skips"]) == 0


def test_bf16_accumulated_tracks_the_float32_loop():
    batches = [_padded_unevenly(seed) for seed in range(2)]
    engine = jc.Engine(parallel=LAYOUTS["data2_fsdp4"], zero=2, precision="bf16", grad_accum=2)
    losses, params, init, state = engine_run(engine, batches, optax.sgd(0.1))
    ref_losses, ref_params = reference_run(init, batches, optax.sgd(0.1))
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(state.params))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-2)
    assert _update_diff(params, ref_params, init) < 5e-2


def test_remat_inside_accumulation_matches_no_remat():
    batches = [_padded_unevenly(0)]
    runs = {
        policy: engine_run(
            jc.Engine(parallel=LAYOUTS["tensor2_fsdp4"], zero=3, grad_accum=2, remat=policy),
            batches,
            optax.sgd(0.1),
        )
        for policy in ("none", "dots_with_no_batch_dims_saveable")
    }
    (loss_a, params_a, _, _), (loss_b, params_b, _, _) = runs.values()
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6)
    assert max_rel_diff(params_b, params_a) < 1e-6
