"""Memory layouts. Colocated: roles idle in a phase wait in host memory; `build_roles`
places a run's roles as its config says (colocated, split sub-meshes, LoRA actor).

PPO holds four roles on one mesh; while the critic and the reference are not in use
(generation, the actor's update) their weights and optimizer state sit in host memory,
moved with JAX memory kinds (``Sharding.with_memory_kind``), shard by shard and with the
same sharding, so moving back needs no resharding. On CPU, jax 0.10.2 reports the kinds
``device``, ``pinned_host`` and ``unpinned_host`` and moves between them, so the layout is
exercised on CPU as on an accelerator (where it frees HBM). verl and OpenRLHF offload the
same way between phases (their ``param_offload`` / ``optimizer_offload``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxcore import Engine, TrainState

HOST = "pinned_host"
DEVICE = "device"


def to_memory(tree: Any, kind: str) -> Any:
    """``tree`` with every array moved to memory ``kind`` (same sharding otherwise)."""

    def move(x: Any) -> Any:
        if not isinstance(x, jax.Array) or x.sharding.memory_kind == kind:
            return x
        return jax.device_put(x, x.sharding.with_memory_kind(kind))

    return jax.tree.map(move, tree)


def offload(tree: Any) -> Any:
    """Move a role (weights, optimizer state) to host memory."""
    return to_memory(tree, HOST)


def onload(tree: Any) -> Any:
    """Bring a role back to device memory for its phase."""
    return to_memory(tree, DEVICE)


def copy_role(tree: Any) -> Any:
    """A copy of a role in new buffers, same shardings (a frozen reference: the train
    steps donate the state it was copied from).

    A device-to-device copy compiles nothing, where ``jax.tree.map(jnp.copy, tree)``
    compiles one program per distinct leaf shape and sharding (11 for a tiny PPO actor).
    With several processes ``device_put`` refuses shardings that span other processes'
    devices, so one program copies the whole tree there.
    """
    if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(tree)):
        return _copy_program(tree)

    def copy(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        return jax.device_put(x, x.sharding if x.committed else None, may_alias=False)

    return jax.tree.map(copy, tree)


def _copy_program(tree: Any) -> Any:
    """``tree`` copied by one jitted program, every array kept on its own sharding."""
    shardings = jax.tree.map(lambda x: x.sharding if isinstance(x, jax.Array) else None, tree)
    return jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=shardings)(tree)


def memory_kinds(tree: Any) -> set[str]:
    """The memory kinds a role's arrays live in (a test's and a user's check)."""
    leaves = jax.tree.leaves(tree)
    return {x.sharding.memory_kind for x in leaves if isinstance(x, jax.Array)}


@dataclasses.dataclass(frozen=True)
class Roles:
    """The placed roles of a PPO/GRPO run (`build_roles`).

    ``reference`` holds `rlhf.PPOTrainer`'s ``reference=`` / ``reference_engine=``
    keywords: empty for the colocated layout (a copy on the actor's mesh) and for a LoRA
    actor (its own base weights). ``reward_engine`` is where a reward model belongs.
    """

    actor: tuple[Engine, TrainState]
    critic: tuple[Engine, TrainState] | None
    sampler: Any
    reference: dict[str, Any]
    reward_engine: Engine


def build_roles(cfg: Any, optimizer: Callable[[float], Any]) -> Roles:
    """Place the actor (LoRA when ``cfg.lora``), the critic (PPO) and the reference of a
    `rlhf.RunConfig` on one mesh (``cfg.parallel``) or on the ``cfg.split`` sub-meshes;
    ``optimizer(lr)`` builds each trained role's optimizer."""
    from rlhf import lora
    from rlhf.models import lm_factory, scalar_head_factory
    from rlhf.rollout import Sampler
    from rlhf.split import SplitLayout

    t = cfg.train
    layout = SplitLayout(cfg.split, seed=t.seed) if cfg.split is not None else None

    def engine(role: str) -> Engine:
        return layout.engine(role) if layout else Engine(parallel=cfg.parallel, seed=t.seed)

    actor_engine = engine("actor")
    if cfg.lora is not None:
        factory, trainable = lora.lora_factory(cfg.model, cfg.lora), lora.trainable
    elif getattr(cfg, "model_hf", None) is not None:  # ``model: {hf: DIR}``: the actor's start
        from jaxcore import hf

        factory, trainable = hf.model_factory(cfg.model_hf, actor_engine), None
    else:
        factory, trainable = lm_factory(cfg.model), None
    actor = actor_engine.prepare(factory, optimizer(t.lr), seed=t.seed, trainable=trainable)
    sampler = Sampler(cfg.model, actor.params, cfg.serving)
    critic = None
    if cfg.stage == "ppo":
        critic_engine = engine("critic")
        head = scalar_head_factory(cfg.model)
        critic = (
            critic_engine,
            critic_engine.prepare(head, optimizer(t.critic_lr or t.lr), seed=t.seed + 1),
        )
    reference: dict[str, Any] = {}
    if layout is not None:
        layout.check_sampler(sampler)
        if cfg.lora is None:
            reference = {
                "reference": layout.reference_state(actor, lm_factory(cfg.model), t.seed),
                "reference_engine": layout.engine("reference"),
            }
    return Roles((actor_engine, actor), critic, sampler, reference, engine("reward"))
