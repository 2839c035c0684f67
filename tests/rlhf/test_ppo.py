"""PPO (actor, critic, frozen reference, Python reward) on a programmatic reward."""

import numpy as np
import pytest

import jaxcore as jc
from inference import ServingConfig
from rlhf.models import lm_factory, scalar_head_factory
from rlhf.ppo import PPOConfig, PPOTrainer
from rlhf.rollout import Sampler

from ..inference.helpers import count_compiles
from .helpers import CFG, adam, count_good, engine, prompts

ITERATIONS = 10  # the fixed budget: 10 rollouts of 32 completions of 8 tokens, 4 epochs


def test_ppo_raises_reward_with_kl_under_the_controllers_target():
    actor, critic = engine(), engine()
    state = actor.prepare(lm_factory(CFG), adam(5e-3), seed=0)
    values = critic.prepare(scalar_head_factory(CFG), adam(3e-3), seed=1)
    sampler = Sampler(CFG, state.params, ServingConfig(slots=32, max_len=16))
    config = PPOConfig(max_tokens=8, kl_coef=0.05, kl_target=6.0)
    trainer = PPOTrainer((actor, state), (critic, values), sampler, count_good, config)
    history = [trainer.step(prompts(0, 32))]
    # The first iteration compiles every program; the adaptive coefficient moving after
    # each one must not recompile the advantages (it did when traced in as a constant).
    with count_compiles() as compiles:
        history += [trainer.step(prompts(i, 32)) for i in range(1, ITERATIONS)]
    assert compiles.count == 0
    rewards = [m["reward_mean"] for m in history]
    kls = [m["kl"] for m in history]
    print("rewards", np.round(rewards, 3), "kl", np.round(kls, 3))
    assert np.mean(rewards[-2:]) >= np.mean(rewards[:2]) + 0.2
    assert max(kls) < config.kl_target
    # The adaptive controller moved the coefficient down while the KL was under target.
    assert history[-1]["kl_coef"] < history[0]["kl_coef"]
    assert history[-1]["value_loss"] < history[0]["value_loss"]
    assert all(m["logprob_diff_max"] < 1e-4 for m in history)


def test_ppo_config_errors():
    with pytest.raises(jc.ConfigError, match="kl_estimator"):
        PPOConfig(kl_estimator="k9")
    with pytest.raises(jc.ConfigError, match="ppo_epochs"):
        PPOConfig(ppo_epochs=0)
    assert PPOConfig().controller().value == 0.05
    assert PPOConfig(kl_target=6.0).controller().target == 6.0
