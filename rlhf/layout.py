"""The colocated memory layout: roles idle in a phase wait in host memory.

PPO holds four roles on one mesh; while the critic and the reference are not in use
(generation, the actor's update) their weights and optimizer state sit in host memory,
moved with JAX memory kinds (``Sharding.with_memory_kind``), shard by shard and with the
same sharding, so moving back needs no resharding. On CPU, jax 0.10.2 reports the kinds
``device``, ``pinned_host`` and ``unpinned_host`` and moves between them, so the layout is
exercised on CPU as on an accelerator (where it frees HBM). verl and OpenRLHF offload the
same way between phases (their ``param_offload`` / ``optimizer_offload``).
"""

from __future__ import annotations

from typing import Any

import jax

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


def memory_kinds(tree: Any) -> set[str]:
    """The memory kinds a role's arrays live in (a test's and a user's check)."""
    leaves = jax.tree.leaves(tree)
    return {x.sharding.memory_kind for x in leaves if isinstance(x, jax.Array)}
