"""rlhf: SFT, reward models, DPO, GRPO and PPO on jaxcore, with rollouts through inference.

    from rlhf import GRPOConfig, GRPOTrainer, Sampler, lm_factory
    state = engine.prepare(lm_factory(cfg), optax.adam(1e-2))
    trainer = GRPOTrainer(engine, state, Sampler(cfg, state.params), reward_fn,
                          GRPOConfig(num_generations=4, max_tokens=8))
    metrics = trainer.step(prompts)

Or from the command line: ``jaxcore rlhf sft|reward|ppo|grpo|dpo CONFIG.yaml``
(`rlhf.cli`, configs under ``configs/rlhf/``).

Training goes through `jaxcore.Engine` (any mesh, any ZeRO stage); generation through
`inference` (continuous batching). This package adds no parallelism of its own.
"""

from rlhf import lora, losses
from rlhf.checkpoint import latest_iteration, restore_trainer, save_trainer
from rlhf.config import RunConfig, load_config, parse_config
from rlhf.dpo import dpo_objective, sequence_logprob, with_reference
from rlhf.grpo import GRPOConfig, GRPOTrainer
from rlhf.kl import AdaptiveKLController, FixedKLController
from rlhf.layout import Roles, build_roles
from rlhf.lora import LoRAConfig, LoRATransformer, lora_factory
from rlhf.models import (
    ScalarHeadModel,
    lm_factory,
    logprobs_and_entropy,
    scalar_head_factory,
    token_logprobs,
)
from rlhf.ppo import PPOConfig, PPOTrainer
from rlhf.reward import export_reward_model, pair_scores, reward_loss
from rlhf.rewards import ModelReward, RewardError, load_reward_model, score_rollout
from rlhf.rollout import IdTokenizer, Rollout, Sampler
from rlhf.scoring import logprob_scorer, parity, truncated_is_weights, value_scorer
from rlhf.sft import chat_example, pack, sft_loss
from rlhf.split import SplitConfig, SplitLayout

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "GRPOConfig",
    "GRPOTrainer",
    "IdTokenizer",
    "LoRAConfig",
    "LoRATransformer",
    "ModelReward",
    "PPOConfig",
    "PPOTrainer",
    "RewardError",
    "Roles",
    "Rollout",
    "RunConfig",
    "Sampler",
    "ScalarHeadModel",
    "SplitConfig",
    "SplitLayout",
    "build_roles",
    "chat_example",
    "dpo_objective",
    "export_reward_model",
    "latest_iteration",
    "lm_factory",
    "load_config",
    "load_reward_model",
    "logprob_scorer",
    "logprobs_and_entropy",
    "lora",
    "lora_factory",
    "losses",
    "pack",
    "pair_scores",
    "parity",
    "parse_config",
    "restore_trainer",
    "reward_loss",
    "save_trainer",
    "scalar_head_factory",
    "score_rollout",
    "sequence_logprob",
    "sft_loss",
    "token_logprobs",
    "truncated_is_weights",
    "value_scorer",
    "with_reference",
]
