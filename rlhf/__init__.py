"""rlhf: SFT, reward models, DPO, GRPO and PPO on jaxcore, with rollouts through inference."""

from rlhf import losses
from rlhf.kl import AdaptiveKLController, FixedKLController

__all__ = ["AdaptiveKLController", "FixedKLController", "losses"]
