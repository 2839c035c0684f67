"""GRPO (Shao et al. 2024) on the jaxcore engine with rollouts through `inference`.

One iteration: sample ``num_generations`` completions per prompt with the sampler,
reward them, normalise rewards within each prompt's group, take one clipped policy-
gradient step (TRL's default ``num_iterations=1``: the "old" log-probs are the current
policy's, computed by the trainer), and hand the new weights to the sampler. With
``beta == 0`` no reference model is held (TRL's default since 0.19); with a LoRA actor
(`rlhf.lora`) the reference is the actor's own base weights with adapters off.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxcore import ConfigError, Engine, TrainState
from rlhf import lora
from rlhf import losses as L
from rlhf.layout import copy_role, offload, onload
from rlhf.models import logprobs_and_entropy
from rlhf.rewards import as_weighted, score_rollout
from rlhf.rollout import Sampler
from rlhf.scoring import ParityMonitor, logprob_scorer


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """GRPO settings (TRL ``GRPOConfig`` defaults unless said).

    Attributes:
        num_generations: completions per prompt (a group).
        max_tokens: completion length limit (TRL's ``max_completion_length``).
        temperature: sampling temperature (1: the policy's own distribution).
        beta: weight of the k3 KL to the reference (0: no reference model).
        clip_eps: PPO clip range (0.2); ``clip_eps_high`` clips the top apart (DAPO).
        loss_type: ``grpo``, ``dapo`` (TRL's default) or ``dr_grpo``.
        scale_rewards: divide group-centred rewards by the group's std.
        parity_interval: rescore and compare log-probs every this many iterations
            (`rlhf.scoring.ParityMonitor`; between checks the sampler's stand in).
        tis_tolerance: when sampler and trainer log-probs differ by more than this,
            weight tokens by truncated importance ratios (capped at ``tis_cap``).
        offload_optimizer: the optimizer state waits in host memory (`rlhf.layout`)
            while the rollout is generated, and comes back for the update.
        seed: seeds the sampler's keys (iteration ``i`` uses ``seed + i``).
    """

    num_generations: int = 8
    max_tokens: int = 256
    temperature: float = 1.0
    beta: float = 0.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: bool = True
    parity_interval: int = 1
    tis_tolerance: float = 1e-3
    tis_cap: float = 2.0
    offload_optimizer: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.parity_interval < 1:
            raise ConfigError(f"GRPOConfig.parity_interval={self.parity_interval}: must be >= 1.")
        if self.num_generations < 2:
            raise ConfigError(
                f"GRPOConfig.num_generations={self.num_generations}: must be >= 2 (advantages "
                "are relative to the group)."
            )
        if self.loss_type not in L.LOSS_AGGREGATIONS:
            raise ConfigError(
                f"GRPOConfig.loss_type={self.loss_type!r}: use one of {list(L.LOSS_AGGREGATIONS)}."
            )
        if self.beta < 0 or self.max_tokens < 1 or self.temperature <= 0:
            raise ConfigError(
                "GRPOConfig: beta must be >= 0, max_tokens >= 1 and temperature > 0 (got "
                f"{self.beta}, {self.max_tokens}, {self.temperature})."
            )


class GRPOTrainer:
    """Holds the actor's state (and the reference's when ``beta > 0``) between iterations."""

    def __init__(
        self,
        engine: Engine,
        state: TrainState,
        sampler: Sampler,
        rewards: Any,
        config: GRPOConfig,
    ):
        self.engine, self.state, self.sampler, self.config = engine, state, sampler, config
        self.rewards = as_weighted(rewards)
        # The train step donates the state, so the reference is its own copy; a LoRA
        # actor's is its base (adapters off), which the frozen base keeps bit-identical.
        self.shared_base = lora.has_adapters(state.params)
        copy = config.beta and not self.shared_base
        self.reference = copy_role(state) if copy else None
        self._ref_score = lora.reference_scorer(engine) if self.shared_base else None
        self.iteration = 0
        self.parity = ParityMonitor(config.parity_interval, config.tis_tolerance, config.tis_cap)
        self._score = logprob_scorer(engine)
        self._train = engine.train_step(self._loss)
        sampler.load(engine.bind(state))

    def roles(self) -> dict[str, TrainState]:
        """The states a checkpoint holds (`rlhf.save_trainer`)."""
        return {"actor": self.state} | (
            {"reference": self.reference} if self.reference is not None else {}
        )

    def role_engines(self) -> dict[str, Engine]:
        """The engine of each role (one for all): its plan goes into the checkpoints."""
        return {"actor": self.engine, "reference": self.engine}

    def set_roles(self, roles: dict[str, TrainState]) -> None:
        self.state, self.reference = roles["actor"], roles.get("reference")
        self.sampler.load(self.engine.bind(self.state))

    def _loss(self, model, batch, rng):
        del rng
        c = self.config
        mask = batch["mask"]
        logp, entropy = logprobs_and_entropy(model, batch["tokens"])
        per_token = L.grpo_token_loss(
            logp,
            batch["old_logp"],
            batch["ref_logp"] if c.beta else None,
            batch["advantages"],
            beta=c.beta,
            clip_eps=c.clip_eps,
            clip_eps_high=c.clip_eps_high,
        )
        loss = L.aggregate_loss(
            per_token * batch["is_weight"], mask, c.loss_type, max_length=c.max_tokens
        )
        _, clipped = L.policy_token_loss(
            logp, batch["old_logp"], batch["advantages"][:, None], c.clip_eps, c.clip_eps_high
        )
        stats = {
            "clip_frac": L.masked_mean(clipped.astype(jnp.float32), mask),
            "entropy": L.masked_mean(entropy, mask),
        }
        if c.beta:  # KL per sequence to the reference (k3), the quantity beta penalises
            kl = L.kl_estimate(logp, batch["ref_logp"], "k3")
            stats["kl"] = jnp.mean(L.masked_sum(kl, mask, axis=1))
        return loss, stats

    def step(self, prompts: Sequence[Sequence[int]]) -> dict[str, float]:
        """One rollout + update on ``prompts``; returns the iteration's metrics."""
        c = self.config
        group = [p for p in prompts for _ in range(c.num_generations)]
        if c.offload_optimizer:
            self.state = self.state.replace(opt_state=offload(self.state.opt_state))
        rollout = self.sampler.generate(
            group, max_tokens=c.max_tokens, temperature=c.temperature, seed=c.seed + self.iteration
        )
        if c.offload_optimizer:
            self.state = self.state.replace(opt_state=onload(self.state.opt_state))
        start = time.perf_counter()
        old, is_weight, check = self.parity.old_logprobs(
            self.iteration, rollout, lambda: self._score(self.state, rollout.tokens)
        )
        if not c.beta:
            ref = old
        elif self.shared_base:
            ref = self._ref_score(self.state, rollout.tokens)
        else:
            ref = self._score(self.reference, rollout.tokens)
        scores = score_rollout(self.rewards, rollout)
        adv = np.asarray(
            L.group_advantages(jnp.asarray(scores), c.num_generations, scale=c.scale_rewards)
        )
        batch = {
            "tokens": rollout.tokens,
            "mask": rollout.mask,
            "old_logp": old,
            "ref_logp": ref,
            "advantages": adv.astype(np.float32),
            "is_weight": is_weight,
        }
        self.state, metrics = self._train(self.state, batch)
        self.sampler.load(self.engine.bind(self.state))
        train_s = time.perf_counter() - start
        self.iteration += 1
        out = {k: float(v) for k, v in metrics.items()}
        out |= check | {
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()),
            "completion_length": float(rollout.mask.sum(1).mean()),
            "rollout_tokens_per_s": rollout.completion_tokens / rollout.generate_seconds,
            "generate_s": rollout.generate_seconds,
            "train_s": train_s,
        }
        return out
