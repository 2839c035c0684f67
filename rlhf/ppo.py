"""PPO with four roles: actor (trained), critic (a value head, trained), reference
(frozen copy of the initial actor, or a LoRA actor's own base weights with adapters off)
and reward (Python functions and/or a reward model).

One iteration, as TRL's ``PPOTrainer``: roll out with the sampler; score the rollout with
the actor (old log-probs), the reference and the critic; per-token rewards are the
sequence score on the last token minus ``kl_coef`` times the KL estimate; GAE gives
advantages (whitened) and returns; then ``ppo_epochs`` passes of clipped policy and value
updates over minibatches; the KL controller updates from the measured KL.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore import ConfigError, Engine, TrainState
from rlhf import lora
from rlhf import losses as L
from rlhf.kl import AdaptiveKLController, FixedKLController
from rlhf.layout import copy_role, offload, onload
from rlhf.models import logprobs_and_entropy
from rlhf.rewards import as_weighted, score_rollout
from rlhf.rollout import Sampler
from rlhf.scoring import ParityMonitor, logprob_scorer, value_scorer


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """PPO settings (TRL ``PPOConfig`` defaults unless said).

    Attributes:
        max_tokens: completion length limit (TRL's ``response_length``).
        temperature: sampling temperature.
        ppo_epochs: passes over each rollout (4).
        num_minibatches: minibatches per pass (1).
        kl_coef: the KL penalty coefficient (0.05), or its initial value when adaptive.
        kl_target: when set, Ziegler et al.'s adaptive controller with this target KL
            (nats per sequence) and ``kl_horizon``; ``None`` keeps ``kl_coef`` fixed.
        kl_estimator: ``k1`` (TRL's default) or ``k3``.
        gamma, lam: GAE discount and lambda (1.0, 0.95).
        clip_eps: policy ratio clip range (0.2); ``dual_clip``: Ye et al.'s bound (> 1).
        value_clip: critic clip range around the rollout's values (0.2).
        whiten_rewards: whiten per-token rewards (without shifting the mean) before GAE.
        reward_clip: clamp sequence scores to ``[-reward_clip, reward_clip]``.
        eos_id: end-of-sequence token: completions are cut after it.
        missing_eos_penalty: subtracted from the score of completions without EOS.
        parity_interval: compare the sampler's and the trainer's log-probs every this many
            iterations (`rlhf.scoring.ParityMonitor`; between checks the sampler's stand in).
        tis_tolerance, tis_cap: truncated importance sampling when the sampler's and the
            trainer's log-probs differ by more than the tolerance.
        offload_idle: the colocated layout: the critic and the reference wait in host
            memory (`rlhf.layout`) outside the phases that use them.
        offload_optimizer: the actor's optimizer state waits in host memory while the
            rollout is generated, and comes back for the update.
        seed: seeds rollouts and minibatch shuffling.
    """

    max_tokens: int = 53
    temperature: float = 1.0
    ppo_epochs: int = 4
    num_minibatches: int = 1
    kl_coef: float = 0.05
    kl_target: float | None = None
    kl_horizon: int = 10_000
    kl_estimator: str = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    clip_eps: float = 0.2
    dual_clip: float | None = None
    value_clip: float | None = 0.2
    whiten_rewards: bool = False
    reward_clip: float | None = None
    eos_id: int | None = None
    missing_eos_penalty: float | None = None
    parity_interval: int = 1
    tis_tolerance: float = 1e-3
    tis_cap: float = 2.0
    offload_idle: bool = False
    offload_optimizer: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.parity_interval < 1:
            raise ConfigError(f"PPOConfig.parity_interval={self.parity_interval}: must be >= 1.")
        if self.kl_estimator not in L.KL_ESTIMATORS:
            raise ConfigError(
                f"PPOConfig.kl_estimator={self.kl_estimator!r}: use one of {list(L.KL_ESTIMATORS)}."
            )
        if self.ppo_epochs < 1 or self.num_minibatches < 1 or self.max_tokens < 1:
            raise ConfigError(
                "PPOConfig: ppo_epochs, num_minibatches and max_tokens must be >= 1 (got "
                f"{self.ppo_epochs}, {self.num_minibatches}, {self.max_tokens})."
            )
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ConfigError(f"PPOConfig: gamma={self.gamma}, lam={self.lam} must be in [0, 1].")
        self._check_kl_coef()

    def _check_kl_coef(self) -> None:
        """A negative coefficient rewards drifting from the reference; the adaptive
        controller multiplies it, so from 0 it would stay 0 (no penalty) for good."""
        if self.kl_coef < 0:
            raise ConfigError(
                f"PPOConfig.kl_coef={self.kl_coef}: must be >= 0 (TRL's default is 0.05; 0 "
                "turns the KL penalty off): a negative one rewards moving away from the "
                "reference model."
            )
        if self.kl_target is not None and self.kl_coef == 0:
            raise ConfigError(
                f"PPOConfig.kl_coef=0 with kl_target={self.kl_target}: the adaptive "
                "controller scales the coefficient, so it would stay 0. Start it above 0 "
                "(e.g. 0.2, Ziegler et al.'s), or drop kl_target for no KL penalty."
            )

    def controller(self) -> FixedKLController | AdaptiveKLController:
        if self.kl_target is None:
            return FixedKLController(self.kl_coef)
        return AdaptiveKLController(self.kl_coef, self.kl_target, self.kl_horizon)


class PPOTrainer:
    """The four roles and the controller, carried between iterations.

    ``reference``: by default a copy of the initial actor on the actor's engine; the
    split layout passes one on its own sub-mesh with that mesh's ``reference_engine``
    (`rlhf.split.SplitLayout.reference_state`). A LoRA actor (`rlhf.lora`) has no
    reference state at all: its base weights, scored with adapters off, are the reference.
    """

    def __init__(
        self,
        actor: tuple[Engine, TrainState],
        critic: tuple[Engine, TrainState],
        sampler: Sampler,
        rewards: Any,
        config: PPOConfig,
        *,
        reference: TrainState | None = None,
        reference_engine: Engine | None = None,
    ):
        (self.actor_engine, self.actor), (self.critic_engine, self.critic) = actor, critic
        self.reference_engine = reference_engine or self.actor_engine
        self.sampler, self.config = sampler, config
        self.rewards = as_weighted(rewards)
        self.shared_base = lora.has_adapters(self.actor.params)
        if self.shared_base and (reference is not None or reference_engine is not None):
            raise ConfigError(
                "PPOTrainer: a LoRA actor's reference is its own base weights with adapters "
                "off; drop reference= and reference_engine=."
            )
        if reference_engine is not None and reference is None:
            raise ConfigError(
                "PPOTrainer: reference_engine= needs reference= (a state on that engine), "
                "e.g. SplitLayout.reference_state(actor_state, factory)."
            )
        self._logp = logprob_scorer(self.actor_engine)
        if self.shared_base:
            self.reference = None
            self._ref_logp = lora.reference_scorer(self.actor_engine)
        else:
            # A separate copy: the actor's train step donates its state.
            self.reference = copy_role(self.actor) if reference is None else reference
            # On the actor's engine the reference has the actor's layout: the actor's
            # scorer serves both (one program to compile, not two identical ones).
            colocated = reference_engine is None
            self._ref_logp = self._logp if colocated else logprob_scorer(reference_engine)
        self.kl_ctl = config.controller()
        self.parity = ParityMonitor(config.parity_interval, config.tis_tolerance, config.tis_cap)
        self._park()
        self.iteration = 0
        self._values = value_scorer(self.critic_engine)
        self._actor_step = self.actor_engine.train_step(self._policy_loss)
        self._critic_step = self.critic_engine.train_step(self._value_loss)
        # One program for every iteration: the adaptive KL coefficient is an argument, not
        # a constant traced into it (as a Python float it recompiled on each update).
        self._advantages_fn = jax.jit(self._advantages)
        sampler.load(self.actor_engine.bind(self.actor))

    def _park(self) -> None:
        """Colocated layout: the critic and the reference go to host memory when idle."""
        if self.config.offload_idle:
            self.critic, self.reference = offload(self.critic), offload(self.reference)

    def roles(self) -> dict[str, TrainState]:
        """The states a checkpoint holds (`rlhf.save_trainer`), in device memory."""
        roles = {"actor": self.actor, "critic": onload(self.critic)}
        if self.reference is not None:
            roles["reference"] = onload(self.reference)
        return roles

    def role_engines(self) -> dict[str, Engine]:
        """The engine of each role: its plan goes into the role's checkpoints."""
        return {
            "actor": self.actor_engine,
            "critic": self.critic_engine,
            "reference": self.reference_engine,
        }

    def set_roles(self, roles: dict[str, TrainState]) -> None:
        self.actor, self.critic = roles["actor"], roles["critic"]
        self.reference = roles.get("reference")
        self._park()
        self.sampler.load(self.actor_engine.bind(self.actor))

    def _policy_loss(self, model, batch, rng):
        del rng
        c = self.config
        logp, entropy = logprobs_and_entropy(model, batch["tokens"])
        mask = batch["mask"]
        # Truncated IS weights scale the advantages (constant per token).
        adv = batch["advantages"] * batch["is_weight"]
        loss, stats = L.policy_loss(
            logp, batch["old_logp"], adv, mask, clip_eps=c.clip_eps, dual_clip=c.dual_clip
        )
        return loss, {**stats, "entropy": L.masked_mean(entropy, mask)}

    def _value_loss(self, model, batch, rng):
        del rng
        values = model.values(batch["tokens"][:, :-1])
        loss, frac = L.value_loss(
            values,
            batch["old_values"],
            batch["returns"],
            batch["mask"],
            clip=self.config.value_clip,
        )
        return loss, {"value_clip_frac": frac}

    def _advantages(self, scores, old, ref, values, mask, kl_coef):
        c = self.config
        kl = L.kl_estimate(old, ref, c.kl_estimator) * mask
        rewards = L.ppo_rewards(scores, kl, mask, kl_coef)
        if c.whiten_rewards:
            rewards = L.masked_whiten(rewards, mask, shift_mean=False)
        adv, returns = L.gae(rewards, values, mask, c.gamma, c.lam)
        return L.masked_whiten(adv, mask), returns, jnp.sum(kl, axis=1)

    def step(self, prompts: Sequence[Sequence[int]]) -> dict[str, float]:
        """One rollout and ``ppo_epochs`` of updates; returns the iteration's metrics."""
        c = self.config
        if c.offload_optimizer:  # Adam's moments are idle while the sampler runs
            self.actor = self.actor.replace(opt_state=offload(self.actor.opt_state))
        rollout = self.sampler.generate(
            prompts,
            max_tokens=c.max_tokens,
            temperature=c.temperature,
            seed=c.seed + self.iteration,
        )
        if c.offload_optimizer:
            self.actor = self.actor.replace(opt_state=onload(self.actor.opt_state))
        start = time.perf_counter()
        mask = rollout.mask
        old, is_weight, check = self.parity.old_logprobs(
            self.iteration, rollout, lambda: self._logp(self.actor, rollout.tokens)
        )
        if self.shared_base:
            ref = self._ref_logp(self.actor, rollout.tokens)
        else:
            ref = self._ref_logp(onload(self.reference), rollout.tokens)  # a transient copy
        self.critic = onload(self.critic)
        values = self._values(self.critic, rollout.tokens) * mask
        raw = score_rollout(self.rewards, rollout)
        scores = L.missing_eos_penalty(
            jnp.asarray(raw), jnp.asarray(rollout.has_eos), c.missing_eos_penalty
        )
        scores = L.clip_rewards(scores, c.reward_clip)
        adv, returns, seq_kl = (
            np.asarray(x)
            for x in self._advantages_fn(
                scores,
                jnp.asarray(old),
                jnp.asarray(ref),
                jnp.asarray(values),
                jnp.asarray(mask),
                np.float32(self.kl_ctl.value),
            )
        )
        data = {
            "tokens": rollout.tokens,
            "mask": mask,
            "old_logp": old,
            "advantages": adv,
            "is_weight": is_weight,
            "old_values": values,
            "returns": returns,
        }
        n = len(rollout.tokens)
        if n % c.num_minibatches:
            raise ConfigError(
                f"PPO: {n} rollouts do not split into num_minibatches={c.num_minibatches}."
            )
        order = np.random.default_rng((c.seed, self.iteration))
        sums: dict[str, float] = {}
        for _ in range(c.ppo_epochs):
            for idx in np.array_split(order.permutation(n), c.num_minibatches):
                mb = {k: v[idx] for k, v in data.items()}
                self.actor, pm = self._actor_step(self.actor, mb)
                self.critic, vm = self._critic_step(self.critic, mb)
                for k, v in {**pm, **{"value_" + k: v for k, v in vm.items()}}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        steps = c.ppo_epochs * c.num_minibatches
        self._park()
        self.sampler.load(self.actor_engine.bind(self.actor))
        mean_kl = float(seq_kl.mean())
        kl_coef = self.kl_ctl.value
        self.kl_ctl.update(mean_kl, n)
        self.iteration += 1
        metrics = {k: v / steps for k, v in sums.items()}
        return (
            metrics
            | check
            | {
                "kl": mean_kl,
                "kl_coef": kl_coef,
                "reward_mean": float(raw.mean()),
                "reward_std": float(raw.std()),
                "completion_length": float(mask.sum(1).mean()),
                "rollout_tokens_per_s": rollout.completion_tokens / rollout.generate_seconds,
                "generate_s": rollout.generate_seconds,
                "train_s": time.perf_counter() - start,
            }
        )
