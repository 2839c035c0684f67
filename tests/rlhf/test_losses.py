"""Every RLHF loss and estimator against a NumPy reference written as TRL's loops read."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcore import ConfigError
from rlhf import losses as L
from rlhf.kl import AdaptiveKLController, FixedKLController

SETTINGS = settings(max_examples=20, deadline=None)
B, T = 3, 7


@st.composite
def batch(draw, holes: bool = False):
    """Random floats and a right-padded mask of random lengths (optionally with holes)."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    lengths = np.array([draw(st.integers(0, T)) for _ in range(B)])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    if holes:
        mask *= rng.random((B, T)) > 0.3
    x = rng.normal(size=(5, B, T)).astype(np.float32)
    return x, mask


def np_masked_mean(x, m):
    return (x * m).sum() / max(m.sum(), 1.0)


def np_whiten(x, m, shift_mean=True):
    n = m.sum()
    mean = np_masked_mean(x, m)
    var = np_masked_mean((x - mean) ** 2, m) * n / max(n - 1, 1)
    w = (x - mean) / np.sqrt(var + 1e-8)
    return (w if shift_mean else w + mean) * m


def np_gae(r, v, m, gamma, lam):
    """The TRL loop, with masked tokens skipped (carried over) instead of assumed trailing."""
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        last_adv, next_v = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t] == 0:
                continue
            delta = r[b, t] + gamma * next_v - v[b, t]
            last_adv = delta + gamma * lam * last_adv
            adv[b, t], next_v = last_adv, v[b, t]
    return adv, (adv + v) * m


@SETTINGS
@given(batch(holes=True), st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_loop(data, gamma, lam):
    (r, v, *_), m = data
    adv, ret = L.gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma, lam)
    want_adv, want_ret = np_gae(r, v, m, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_right_padding_equals_trl_unmasked_loop():
    # TRL zeroes values/rewards past the end and runs the plain loop: same numbers.
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(2, 2, 6)).astype(np.float32)
    m = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.float32)
    r, v = r * m, v * m
    adv = np.zeros_like(r)
    last = 0.0
    for t in reversed(range(6)):
        nv = v[:, t + 1] if t < 5 else 0.0
        last = r[:, t] + nv - v[:, t] + 0.95 * last
        adv[:, t] = last
    got, _ = L.gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m))
    np.testing.assert_allclose(got, adv * m, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(batch(), st.booleans())
def test_whiten(data, shift):
    (x, *_), m = data
    got = L.masked_whiten(jnp.asarray(x), jnp.asarray(m), shift_mean=shift)
    np.testing.assert_allclose(got, np_whiten(x, m, shift), rtol=1e-4, atol=1e-4)


@SETTINGS
@given(batch(), st.sampled_from(L.KL_ESTIMATORS))
def test_kl_estimators(data, kind):
    (a, b, *_), _ = data
    lr = b - a
    want = {"k1": -lr, "k2": 0.5 * lr**2, "k3": np.exp(lr) - 1 - lr}[kind]
    np.testing.assert_allclose(
        L.kl_estimate(jnp.asarray(a), jnp.asarray(b), kind), want, rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ConfigError, match="k1"):
        L.kl_estimate(jnp.asarray(a), jnp.asarray(b), "k4")


def test_k3_is_nonnegative_and_zero_on_equal():
    x = jnp.linspace(-3, 3, 11)
    assert float(jnp.min(L.kl_estimate(x, x[::-1], "k3"))) >= 0
    assert float(jnp.max(jnp.abs(L.kl_estimate(x, x, "k3")))) == 0


@SETTINGS
@given(batch(), st.sampled_from([None, 3.0]), st.sampled_from([None, 0.28]))
def test_policy_loss(data, dual, high):
    (logp, old, adv, *_), m = data
    logp, old = logp * 0.3, old * 0.3  # ratios in a realistic range, some clipped
    ratio = np.exp(logp - old)
    hi = 0.2 if high is None else high
    l1, l2 = -adv * ratio, -adv * np.clip(ratio, 0.8, 1 + hi)
    per = np.maximum(l1, l2)
    if dual is not None:
        per = np.where(adv < 0, np.minimum(per, -dual * adv), per)
    got, stats = L.policy_loss(
        jnp.asarray(logp),
        jnp.asarray(old),
        jnp.asarray(adv),
        jnp.asarray(m),
        dual_clip=dual,
        clip_eps_high=high,
    )
    np.testing.assert_allclose(got, np_masked_mean(per, m), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["clip_frac"], np_masked_mean((l2 > l1) * 1.0, m), atol=1e-6)
    np.testing.assert_allclose(
        stats["approx_kl"], 0.5 * np_masked_mean((logp - old) ** 2, m), rtol=1e-4, atol=1e-6
    )


def test_dual_clip_must_exceed_one():
    x = jnp.zeros((1, 2))
    with pytest.raises(ConfigError, match="dual_clip"):
        L.policy_loss(x, x, x, x + 1, dual_clip=0.5)


@SETTINGS
@given(batch(), st.sampled_from([None, 0.2]))
def test_value_loss(data, clip):
    (v, old, ret, *_), m = data
    unc = (v - ret) ** 2
    if clip is None:
        want = 0.5 * np_masked_mean(unc, m)
    else:
        vc = np.clip(v, old - clip, old + clip)
        want = 0.5 * np_masked_mean(np.maximum(unc, (vc - ret) ** 2), m)
    got, _ = L.value_loss(
        jnp.asarray(v), jnp.asarray(old), jnp.asarray(ret), jnp.asarray(m), clip=clip
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(batch(holes=True), st.floats(0.0, 1.0))
def test_ppo_rewards_put_score_on_last_real_token(data, coef):
    (kl, s, *_), m = data
    scores = s[:, 0]
    want = -coef * kl * m
    for b in range(B):
        idx = np.nonzero(m[b])[0]
        if len(idx):
            want[b, idx[-1]] += scores[b]
    got = L.ppo_rewards(jnp.asarray(scores), jnp.asarray(kl), jnp.asarray(m), coef)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_eos_mask_penalty_and_clip():
    tokens = jnp.array([[5, 2, 5, 5], [5, 5, 5, 5], [2, 5, 5, 5]])
    lengths = jnp.array([4, 3, 4])
    m = L.completion_mask(tokens, eos_id=2, lengths=lengths)
    np.testing.assert_array_equal(m, [[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    has_eos = jnp.any((tokens == 2) & (m > 0), axis=1)
    scores = L.missing_eos_penalty(jnp.array([1.0, 1.0, 1.0]), has_eos, 1.5)
    np.testing.assert_allclose(scores, [1.0, -0.5, 1.0])
    np.testing.assert_allclose(L.clip_rewards(jnp.array([-9.0, 0.5, 9.0]), 2.0), [-2, 0.5, 2])
    assert L.clip_rewards(scores, None) is scores


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from([2, 4]), st.booleans())
def test_group_advantages(seed, g, scale):
    r = np.random.default_rng(seed).normal(size=(3 * g,)).astype(np.float32)
    grouped = r.reshape(3, g)
    want = grouped - grouped.mean(1, keepdims=True)
    if scale:
        want = want / (grouped.std(1, ddof=1, keepdims=True) + 1e-4)
    got = L.group_advantages(jnp.asarray(r), g, scale=scale)
    np.testing.assert_allclose(got, want.reshape(-1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="num_generations"):
        L.group_advantages(jnp.asarray(r[:-1]), g)


@SETTINGS
@given(batch(), st.sampled_from(L.LOSS_AGGREGATIONS))
def test_aggregations(data, kind):
    (x, *_), m = data
    if kind == "grpo":
        want = np.mean([(x[b] * m[b]).sum() / max(m[b].sum(), 1) for b in range(B)])
    elif kind == "dapo":
        want = np_masked_mean(x, m)
    else:
        want = (x * m).sum() / (B * T)
    np.testing.assert_allclose(
        L.aggregate_loss(jnp.asarray(x), jnp.asarray(m), kind), want, rtol=1e-5, atol=1e-6
    )


@SETTINGS
@given(batch(), st.sampled_from([0.0, 0.04]))
def test_grpo_token_loss(data, beta):
    (logp, old, ref, a, *_), _ = data
    adv = a[:, 0]
    ratio = np.exp(logp - old)
    want = -np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.2) * adv[:, None])
    want = want + beta * (np.exp(ref - logp) - (ref - logp) - 1)
    got = L.grpo_token_loss(
        jnp.asarray(logp), jnp.asarray(old), jnp.asarray(ref), jnp.asarray(adv), beta=beta
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from([0.0, 0.1]))
def test_dpo_loss(seed, smoothing):
    pc, pr, rc, rr = np.random.default_rng(seed).normal(size=(4, 5)).astype(np.float32) * 5
    z = 0.1 * ((pc - pr) - (rc - rr))
    logsig = lambda x: -np.log1p(np.exp(-x))
    want = np.mean(-logsig(z) * (1 - smoothing) - logsig(-z) * smoothing)
    got, stats = L.dpo_loss(*map(jnp.asarray, (pc, pr, rc, rr)), label_smoothing=smoothing)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(stats["reward_margin"], np.mean(z), rtol=1e-4, atol=1e-6)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from([None, 0.01]), st.floats(0, 1))
def test_bradley_terry(seed, center, margin):
    c, r = np.random.default_rng(seed).normal(size=(2, 6)).astype(np.float32)
    want = np.mean(np.log1p(np.exp(-(c - r - margin))))
    if center:
        want += center * np.mean((c + r) ** 2)
    got = L.bradley_terry_loss(jnp.asarray(c), jnp.asarray(r), margin=margin, center_coef=center)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@SETTINGS
@given(st.floats(0.01, 30.0), st.integers(1, 5000))
def test_adaptive_kl_controller(kl, n):
    ctl = AdaptiveKLController(value=0.2, target=6.0, horizon=10_000)
    want = 0.2 * (1 + np.clip(kl / 6.0 - 1, -0.2, 0.2) * n / 10_000)
    assert ctl.update(kl, n) == pytest.approx(want)
    assert FixedKLController(0.05).update(kl, n) == 0.05


def test_adaptive_kl_controller_validates():
    with pytest.raises(ConfigError, match="target"):
        AdaptiveKLController(target=0.0)


def test_parity_monitor_checks_every_interval_and_corrects_beyond_tolerance():
    from types import SimpleNamespace

    from rlhf.scoring import ParityMonitor, truncated_is_weights

    rng = np.random.default_rng(0)
    sampler = rng.normal(size=(2, 5)).astype(np.float32)
    mask = np.ones((2, 5), np.float32)
    rollout = SimpleNamespace(sampler_logp=sampler, mask=mask)
    calls = []

    def rescore(delta):
        def fn():
            calls.append(delta)
            return sampler + delta

        return fn

    monitor = ParityMonitor(3, tolerance=1e-3, cap=2.0)
    old, w, m = monitor.old_logprobs(0, rollout, rescore(0.0))
    assert m["parity_checked"] == 1 and m["tis_applied"] == 0 and np.all(w == 1)
    old, w, m = monitor.old_logprobs(1, rollout, rescore(0.0))
    assert m == {"parity_checked": 0.0, "tis_applied": 0.0} and calls == [0.0]
    np.testing.assert_array_equal(old, sampler)  # no rescoring between checks
    old, w, m = monitor.old_logprobs(3, rollout, rescore(0.5))
    assert m["parity_checked"] == 1 and m["tis_applied"] == 1
    assert m["logprob_diff_max"] == pytest.approx(0.5, abs=1e-6)
    np.testing.assert_allclose(w, np.minimum(np.exp(0.5), 2.0) * np.ones_like(w), rtol=1e-6)
    np.testing.assert_allclose(w, truncated_is_weights(sampler + 0.5, sampler, mask, 2.0))
    # Out of tolerance: the next iteration is checked even off the interval.
    _, _, m = monitor.old_logprobs(4, rollout, rescore(0.0))
    assert m["parity_checked"] == 1 and m["tis_applied"] == 0 and calls == [0.0, 0.5, 0.0]
    with pytest.raises(ConfigError, match="parity_interval"):
        ParityMonitor(0, 1e-3, 2.0)
