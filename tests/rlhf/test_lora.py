"""LoRA on the actor: the forward against a NumPy merge, step 0 and the reference are the
base exactly, only adapters train, one copy of the base, and GRPO with LoRA learns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcore as jc
from inference import ServingConfig
from rlhf import lora
from rlhf.grpo import GRPOConfig, GRPOTrainer
from rlhf.models import lm_factory, scalar_head_factory
from rlhf.ppo import PPOConfig, PPOTrainer
from rlhf.rollout import Sampler
from rlhf.scoring import logprob_scorer

from .helpers import CFG, VOCAB, adam, count_good, engine, prompts

LORA = lora.LoRAConfig(rank=4, alpha=8.0, targets=("all-linear", "lm_head"))
TOKENS = np.random.default_rng(0).integers(0, VOCAB, size=(8, 12)).astype(np.int32)


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


@pytest.fixture(scope="module")
def base():
    """A plain decoder with the LoRA model's base init (same seed): the oracle."""
    eng = engine()
    state = eng.prepare(lm_factory(CFG), adam(), seed=0)
    return state, logprob_scorer(eng)


@pytest.fixture(scope="module")
def actor():
    eng = engine()
    state = eng.prepare(lora.lora_factory(CFG, LORA), adam(3e-2), seed=0, trainable=lora.trainable)
    return eng, state, logprob_scorer(eng), lora.reference_scorer(eng)


def test_config_resolves_names_and_rejects_bad_values():
    assert lora.LoRAConfig(targets=["q_proj", "wv", "down_proj"]).targets == ("wq", "wv", "w_down")
    assert lora.LoRAConfig(targets="all-linear").targets == lora.PROJECTIONS
    assert lora.LoRAConfig(rank=8, alpha=16).scale == 2.0
    with pytest.raises(jc.ConfigError, match="rank"):
        lora.LoRAConfig(rank=0)
    with pytest.raises(jc.ConfigError, match="alpha"):
        lora.LoRAConfig(alpha=0)
    with pytest.raises(jc.ConfigError, match="unknown projection 'embed'"):
        lora.LoRAConfig(targets=("embed",))
    with pytest.raises(jc.ConfigError, match="empty"):
        lora.LoRAConfig(targets=())


@settings(max_examples=15, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(st.integers(1, 5), min_size=1, max_size=2),
    st.lists(st.integers(1, 5), min_size=1, max_size=2),
    st.floats(0.25, 4.0),
    st.integers(0, 2**31 - 1),
)
def test_merged_layer_equals_the_unmerged_lora_path(rank, ins, outs, scale, seed):
    """x @ (W + s A B) == x @ W + s (x @ A) @ B: peft's forward, in float64 NumPy."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(*ins, *outs)).astype(np.float32)
    a = rng.normal(size=(*ins, rank)).astype(np.float32)
    b = rng.normal(size=(rank, *outs)).astype(np.float32)
    x = rng.normal(size=(3, int(np.prod(ins)))).astype(np.float64)
    merged = np.asarray(w + lora.low_rank_update(a, b, scale), np.float64).reshape(x.shape[1], -1)
    flat = lambda m, k: m.reshape(int(np.prod(m.shape[:k])), -1).astype(np.float64)
    expect = x @ flat(w, len(ins)) + scale * (x @ flat(a, len(ins))) @ flat(b, 1)
    np.testing.assert_allclose(x @ merged, expect, rtol=1e-4, atol=1e-4)


def test_lora_forward_equals_the_base_on_numpy_merged_weights(base, actor):
    """Random B (not zero): the LoRA model's log-probs are the plain decoder's on weights
    merged in NumPy, W + alpha/r * A @ B per layer (wo contracts heads x head_dim)."""
    (base_state, base_score), (_, state, score, _) = base, actor
    rng = np.random.default_rng(1)
    adapters = {k: np.asarray(v) for k, v in state.params["lora"].items()}
    for k in adapters:
        if k.endswith("_b"):
            adapters[k] = rng.normal(0, 0.3, adapters[k].shape).astype(np.float32)
    merged = {k: np.asarray(v) for k, v in lora.base_params(state.params).items()}
    for name in LORA.targets:
        a, b = adapters[f"{name}_a"], adapters[f"{name}_b"]
        if name == "lm_head":  # (d_model, vocab): no layers axis
            delta = a @ b
        else:
            k_in = 2 if name == "wo" else 1
            layers, r = a.shape[0], a.shape[-1]
            delta = np.einsum("lir,lro->lio", a.reshape(layers, -1, r), b.reshape(layers, r, -1))
            assert merged[name].shape[1 : 1 + k_in] == a.shape[1:-1]
        merged[name] = merged[name] + LORA.scale * delta.reshape(merged[name].shape)
    put = lambda tree, like: jax.device_put(tree, jax.tree.map(lambda x: x.sharding, like))
    tuned = state.replace(params={**state.params, "lora": put(adapters, state.params["lora"])})
    oracle = base_state.replace(params=put(merged, base_state.params))
    got, want = score(tuned, TOKENS), base_score(oracle, TOKENS)
    assert np.abs(got - base_score(base_state, TOKENS)).max() > 1e-2  # the adapters act
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_step0_actor_equals_reference_and_base_exactly(base, actor):
    (base_state, base_score), (_, state, score, ref_score) = base, actor
    for k, v in lora.base_params(state.params).items():  # the same init as the plain model
        np.testing.assert_array_equal(np.asarray(v), np.asarray(base_state.params[k]))
    actor_logp, ref_logp = score(state, TOKENS), ref_score(state, TOKENS)
    np.testing.assert_array_equal(actor_logp, ref_logp)
    np.testing.assert_array_equal(ref_logp, base_score(base_state, TOKENS))


def test_only_adapters_are_in_the_optimizer_state(actor):
    _, state, _, _ = actor
    adapter_bytes = nbytes(state.params["lora"])
    arrays = [x for x in jax.tree.leaves(state.opt_state) if getattr(x, "ndim", 0) > 0]
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(state.params["lora"]))
    assert sorted(x.shape for x in arrays) == sorted(adapter_shapes * 2)  # Adam's mu, nu
    assert nbytes(arrays) == 2 * adapter_bytes
    # Full fine-tuning's Adam would hold 2x the base; here it is > 4x less (rank 4 of 32).
    assert 4 * nbytes(arrays) < 2 * nbytes(lora.base_params(state.params))


def test_grpo_with_lora_learns_and_keeps_one_frozen_base(base, actor):
    (base_state, base_score), (eng, state, score, ref_score) = base, actor
    state = jax.tree.map(jnp.copy, state)  # the train step donates; keep the fixture's
    frozen = {k: np.asarray(v) for k, v in lora.base_params(state.params).items()}
    sampler = Sampler(CFG, state.params, ServingConfig(slots=16, max_len=16))
    config = GRPOConfig(num_generations=4, max_tokens=8, beta=0.04, offload_optimizer=True)
    trainer = GRPOTrainer(eng, state, sampler, [(count_good, 1.0)], config)
    # One copy of the base: no reference state; the roles hold base + adapters only.
    assert trainer.reference is None and set(trainer.roles()) == {"actor"}
    params = trainer.roles()["actor"].params
    assert nbytes(params) == nbytes(frozen) + nbytes(params["lora"])
    history = [trainer.step(prompts(i)) for i in range(8)]
    rewards = [m["reward_mean"] for m in history]
    print("rewards", np.round(rewards, 3), "kl", np.round([m["kl"] for m in history], 3))
    assert np.mean(rewards[-2:]) >= np.mean(rewards[:2]) + 0.15
    # The sampler serves the merged weights: its log-probs are the trainer's.
    assert all(m["logprob_diff_max"] < 1e-4 for m in history)
    trained = trainer.state
    for k, v in lora.base_params(trained.params).items():  # bit-identical base
        np.testing.assert_array_equal(np.asarray(v), frozen[k])
    off = ref_score(trained, TOKENS)
    np.testing.assert_array_equal(off, base_score(base_state, TOKENS))  # adapters off == base
    assert np.abs(score(trained, TOKENS) - off).max() > 1e-2  # and the adapters moved


def test_ppo_with_lora_scores_the_reference_as_the_base(actor):
    """PPO's reference is the actor's base (no reference role); at iteration 0 the actor
    is the base, so the k1 KL to the reference is exactly zero."""
    eng, state, _, _ = actor
    state = jax.tree.map(jnp.copy, state)
    critic = engine()
    values = critic.prepare(scalar_head_factory(CFG), adam(3e-3), seed=1)
    sampler = Sampler(CFG, state.params, ServingConfig(slots=8, max_len=16))
    config = PPOConfig(max_tokens=8, ppo_epochs=1, offload_idle=True)
    trainer = PPOTrainer((eng, state), (critic, values), sampler, count_good, config)
    assert trainer.reference is None and set(trainer.roles()) == {"actor", "critic"}
    first, second = trainer.step(prompts(0, 8)), trainer.step(prompts(1, 8))
    assert first["kl"] == 0.0 and second["kl"] != 0.0
    assert first["logprob_diff_max"] < 1e-4 and second["logprob_diff_max"] < 1e-4
    with pytest.raises(jc.ConfigError, match="drop reference"):
        PPOTrainer((eng, state), (critic, values), sampler, count_good, config, reference=state)
