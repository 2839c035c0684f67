"""The RLHF losses and estimators, each a small pure JAX function a test holds against NumPy.

Arrays are ``(batch, tokens)`` over completion tokens with a float ``mask`` (1 = a real
completion token, 0 = padding or a token that is not the policy's). Defaults follow TRL
(``trl/trainer/ppo_trainer.py``, ``grpo_trainer.py``, ``dpo_trainer.py``,
``reward_trainer.py``); the dual clip follows Ye et al. 2020 ("Mastering complex control in
MOBA games", as OpenRLHF's ``PolicyLoss``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcore import ConfigError

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("grpo", "dapo", "dr_grpo")


def masked_sum(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    return jnp.sum(x * mask, axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    """Mean of ``x`` over ``mask`` (0 where the mask is empty rather than NaN)."""
    return jnp.sum(x * mask, axis=axis) / jnp.maximum(jnp.sum(mask, axis=axis), 1.0)


def masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Unbiased (Bessel-corrected) variance over the mask, as TRL's ``masked_var``."""
    n = jnp.sum(mask)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return var * n / jnp.maximum(n - 1.0, 1.0)


def masked_whiten(
    x: jax.Array, mask: jax.Array, *, shift_mean: bool = True, eps: float = 1e-8
) -> jax.Array:
    """``(x - mean) / std`` over the masked entries (TRL: advantages are whitened with the
    mean removed, rewards with ``shift_mean=False``); masked-out entries come back 0."""
    mean = masked_mean(x, mask)
    whitened = (x - mean) * jax.lax.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k1") -> jax.Array:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs.

    Schulman's estimators ("Approximating KL divergence", 2020): with
    ``log_ratio = ref_logp - logp``, k1 = ``-log_ratio`` (unbiased, noisy, can be negative),
    k2 = ``log_ratio**2 / 2``, k3 = ``exp(log_ratio) - 1 - log_ratio`` (unbiased, >= 0).
    TRL's PPO defaults to k1; GRPO's KL term is k3.
    """
    if estimator not in KL_ESTIMATORS:
        raise ConfigError(f"kl estimator {estimator!r}: use one of {list(KL_ESTIMATORS)}.")
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return jnp.expm1(log_ratio) - log_ratio


def clip_rewards(scores: jax.Array, clip: float | None) -> jax.Array:
    """Clamp sequence scores to ``[-clip, clip]`` (OpenRLHF's ``reward_clip_range``)."""
    return scores if clip is None else jnp.clip(scores, -clip, clip)


def missing_eos_penalty(scores: jax.Array, has_eos: jax.Array, penalty: float | None) -> jax.Array:
    """Subtract ``penalty`` from the score of every completion that never emitted EOS
    (TRL's ``missing_eos_penalty``: truncated answers must not look as good as finished ones).
    """
    if penalty is None:
        return scores
    return scores - penalty * (1.0 - has_eos.astype(scores.dtype))


def completion_mask(tokens: jax.Array, eos_id: int | None, lengths: jax.Array) -> jax.Array:
    """1 for generated tokens up to and including the first EOS, 0 after it and past
    ``lengths`` (TRL truncates after the stop token and fills with padding)."""
    t = jnp.arange(tokens.shape[1])[None, :]
    valid = t < lengths[:, None]
    if eos_id is None:
        return valid.astype(jnp.float32)
    is_eos = (tokens == eos_id) & valid
    # Tokens strictly after the first EOS: the running count of EOS before them is > 0.
    before = jnp.cumsum(is_eos, axis=1) - is_eos
    return (valid & (before == 0)).astype(jnp.float32)


def ppo_rewards(
    scores: jax.Array, kl: jax.Array, mask: jax.Array, kl_coef: float | jax.Array
) -> jax.Array:
    """Per-token rewards: ``-kl_coef * kl`` on every token plus the sequence score on the
    last real token (TRL PPO's ``non_score_reward`` and ``rewards[i, sequence_lengths]``)."""
    # The last real token is the highest masked index (the mask may have holes).
    idx = jnp.arange(mask.shape[1])[None, :]
    last = jnp.max(jnp.where(mask > 0, idx, -1), axis=1)
    score_at = (idx == last[:, None]).astype(scores.dtype) * scores[:, None]
    return (-kl_coef * kl + score_at) * mask


def gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float = 1.0, lam: float = 0.95
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016) as a reverse ``lax.scan``.

    Masked-out tokens are skipped: they get advantage 0 and the recursion carries over
    them to the previous real token, so a mask with holes (tool outputs) works as well as
    right padding (where this equals TRL's loop). Returns ``(advantages, returns)`` with
    ``returns = advantages + values``. Defaults are TRL PPO's (gamma 1, lambda 0.95).
    """

    def step(carry, inputs):
        next_adv, next_value = carry
        r, v, m = inputs
        delta = r + gamma * next_value - v
        adv = delta + gamma * lam * next_adv
        new_carry = (jnp.where(m > 0, adv, next_adv), jnp.where(m > 0, v, next_value))
        return new_carry, adv * m

    batch = rewards.shape[0]
    zeros = jnp.zeros((batch,), rewards.dtype)
    _, adv = jax.lax.scan(
        step, (zeros, zeros), (rewards.T, values.T, mask.T.astype(rewards.dtype)), reverse=True
    )
    adv = adv.T
    return adv, (adv + values) * mask


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's clipped surrogate, token mean over the mask (TRL PPO, cliprange 0.2).

    ``clip_eps_high`` clips the ratio's top separately (DAPO's clip-higher); ``dual_clip``
    (> 1, 3 in Ye et al. 2020) bounds the loss of negative-advantage tokens by
    ``-dual_clip * advantage`` so one huge ratio cannot dominate. Returns the loss and
    ``clip_frac`` and ``approx_kl`` (``mean((logp - old)^2) / 2``, as TRL logs).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ConfigError(f"dual_clip={dual_clip}: must be > 1 (3 in Ye et al. 2020) or None.")
    per_token, clipped = policy_token_loss(logp, old_logp, advantages, clip_eps, clip_eps_high)
    if dual_clip is not None:
        per_token = jnp.where(
            advantages < 0, jnp.minimum(per_token, -dual_clip * advantages), per_token
        )
    stats = {
        "clip_frac": masked_mean(clipped.astype(jnp.float32), mask),
        "approx_kl": 0.5 * masked_mean((logp - old_logp) ** 2, mask),
    }
    return masked_mean(per_token, mask), stats


def policy_token_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-token ``max(-A * ratio, -A * clip(ratio))`` and where the clipped side won."""
    ratio = jnp.exp(logp - old_logp)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: float | None = 0.2,
) -> tuple[jax.Array, jax.Array]:
    """``0.5 * mean(max((v - R)^2, (v_clipped - R)^2))`` with ``v_clipped`` within ``clip``
    of the rollout's values (TRL PPO, cliprange_value 0.2). Returns the loss and the
    fraction of tokens where the clipped error was larger."""
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask), jnp.zeros((), jnp.float32)
    v_clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped = (v_clipped - returns) ** 2
    frac = masked_mean((clipped > unclipped).astype(jnp.float32), mask)
    return 0.5 * masked_mean(jnp.maximum(unclipped, clipped), mask), frac


def group_advantages(
    rewards: jax.Array, num_generations: int, *, scale: bool = True, eps: float = 1e-4
) -> jax.Array:
    """GRPO's advantages: each reward minus its group's mean, divided by the group's
    (unbiased) std + ``eps`` when ``scale`` (TRL's ``scale_rewards``; Dr. GRPO turns it off).

    ``rewards`` is ``(groups * num_generations,)`` with a group's completions adjacent.
    """
    if rewards.shape[0] % num_generations:
        raise ConfigError(
            f"group_advantages: {rewards.shape[0]} rewards do not split into groups of "
            f"num_generations={num_generations}; generate num_generations per prompt."
        )
    # Centred on each group's first reward first (mean and std are shift-invariant): a
    # group of equal rewards is then exactly 0, where a float32 mean one ulp off would be
    # divided by (std 0 + eps) into advantages of ~1e-3 that push the policy on no signal.
    grouped = rewards.reshape(-1, num_generations)
    grouped = grouped - grouped[:, :1]
    adv = grouped - grouped.mean(axis=1, keepdims=True)
    if scale:
        std = grouped.std(axis=1, ddof=1, keepdims=True) if num_generations > 1 else 0.0
        adv = adv / (std + eps)
    return adv.reshape(-1)


def aggregate_loss(
    per_token: jax.Array, mask: jax.Array, kind: str = "dapo", *, max_length: int | None = None
) -> jax.Array:
    """TRL GRPO's loss aggregations over ``(batch, tokens)``:

    - ``grpo``: mean over each sequence's tokens, then over sequences (long answers'
      tokens weigh less, the length bias Dr. GRPO points out);
    - ``dapo``: one mean over all tokens of the batch (DAPO, Yu et al. 2025);
    - ``dr_grpo``: sum over all tokens / (batch * max_length), a constant normaliser
      (Liu et al. 2025); ``max_length`` defaults to the token axis.
    """
    if kind == "grpo":
        per_seq = masked_sum(per_token, mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        return jnp.mean(per_seq)
    if kind == "dapo":
        return masked_sum(per_token, mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if kind == "dr_grpo":
        length = per_token.shape[1] if max_length is None else max_length
        return masked_sum(per_token, mask) / (per_token.shape[0] * length)
    raise ConfigError(f"loss aggregation {kind!r}: use one of {list(LOSS_AGGREGATIONS)}.")


def grpo_token_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    ref_logp: jax.Array | None,
    advantages: jax.Array,
    *,
    beta: float = 0.0,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> jax.Array:
    """GRPO's per-token loss: the clipped surrogate with one advantage per sequence plus
    ``beta`` times the k3 KL to the reference (TRL: beta 0 needs no reference model)."""
    per_token, _ = policy_token_loss(logp, old_logp, advantages[:, None], clip_eps, clip_eps_high)
    if beta:
        if ref_logp is None:
            raise ConfigError("grpo: beta > 0 needs the reference log-probs (ref_logp).")
        per_token = per_token + beta * kl_estimate(logp, ref_logp, "k3")
    return per_token


def dpo_loss(
    chosen_logp: jax.Array,
    rejected_logp: jax.Array,
    ref_chosen_logp: jax.Array,
    ref_rejected_logp: jax.Array,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DPO's sigmoid loss (Rafailov et al. 2023; TRL ``loss_type="sigmoid"``, beta 0.1) on
    sequence log-probs; ``label_smoothing`` is cDPO's. Returns the mean loss and the
    implicit rewards ``beta * (logp - ref_logp)`` and their margin and accuracy."""
    logits = (chosen_logp - rejected_logp) - (ref_chosen_logp - ref_rejected_logp)
    losses = (
        -jax.nn.log_sigmoid(beta * logits) * (1 - label_smoothing)
        - jax.nn.log_sigmoid(-beta * logits) * label_smoothing
    )
    chosen_r = beta * (chosen_logp - ref_chosen_logp)
    rejected_r = beta * (rejected_logp - ref_rejected_logp)
    stats = {
        "reward_margin": jnp.mean(chosen_r - rejected_r),
        "reward_accuracy": jnp.mean((chosen_r > rejected_r).astype(jnp.float32)),
    }
    return jnp.mean(losses), stats


def bradley_terry_loss(
    chosen: jax.Array,
    rejected: jax.Array,
    *,
    margin: jax.Array | float = 0.0,
    center_coef: float | None = None,
) -> jax.Array:
    """Reward-model loss ``-log sigmoid(r_chosen - r_rejected - margin)`` (TRL's
    RewardTrainer), plus ``center_coef * mean((r_c + r_r)^2)`` when set (Eisenstein et
    al. 2023's reward centering, TRL's ``center_rewards_coefficient``)."""
    loss = -jnp.mean(jax.nn.log_sigmoid(chosen - rejected - margin))
    if center_coef:
        loss = loss + center_coef * jnp.mean((chosen + rejected) ** 2)
    return loss
