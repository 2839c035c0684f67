"""GRPO on a programmatic reward raises the mean reward within a fixed CPU budget."""

import numpy as np
import pytest

import jaxcore as jc
from inference import ServingConfig
from rlhf.grpo import GRPOConfig, GRPOTrainer
from rlhf.kl import AdaptiveKLController
from rlhf.models import lm_factory
from rlhf.rollout import Sampler

from .helpers import CFG, adam, count_good, engine, prompts

ITERATIONS = 8  # the fixed budget: 8 rollouts of 4 prompts x 4 completions of 8 tokens


def test_grpo_raises_reward_with_kl_under_target():
    eng = engine()
    state = eng.prepare(lm_factory(CFG), adam(1e-2), seed=0)
    sampler = Sampler(CFG, state.params, ServingConfig(slots=16, max_len=16))
    config = GRPOConfig(num_generations=4, max_tokens=8, beta=0.04)
    trainer = GRPOTrainer(eng, state, sampler, [(count_good, 1.0)], config)
    history = [trainer.step(prompts(i)) for i in range(ITERATIONS)]
    rewards = [m["reward_mean"] for m in history]
    kls = [m["kl"] for m in history]
    print("rewards", np.round(rewards, 3), "kl", np.round(kls, 3))
    target = AdaptiveKLController().target  # 6 nats per sequence (Ziegler et al. 2019)
    assert np.mean(rewards[-2:]) >= np.mean(rewards[:2]) + 0.15
    assert max(kls) < target
    assert all(m["logprob_diff_max"] < 1e-4 and m["tis_applied"] == 0 for m in history)
    assert all(m["completion_length"] == 8 for m in history)


def test_grpo_config_errors():
    with pytest.raises(jc.ConfigError, match="num_generations"):
        GRPOConfig(num_generations=1)
    with pytest.raises(jc.ConfigError, match="dr_grpo"):
        GRPOConfig(loss_type="bnpo2")
