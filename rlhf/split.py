"""The split memory layout: each PPO role on its own sub-mesh of the devices.

Where the colocated layout (`rlhf.layout`) runs the roles in turn on one mesh and parks
the idle ones in host memory, the split layout gives the actor, the critic and the
reference (with the reward model beside it) disjoint device sets, each an ``fsdp`` mesh
of its own, as verl's and OpenRLHF's per-role placement groups do. The device order is
actor, critic, reference: the sampler's serving mesh takes the first devices, so it sits
on the actor's sub-mesh (the actor hands it weights every iteration).

Arrays cross sub-meshes by resharding (`reshard`), device to device. A plain
``jax.device_put`` to a sharding whose slices no source shard holds (fsdp=4 -> fsdp=2)
fetches the whole array to the host first (jax's ``shard_sharded_device_array_slow_path``
falls back to ``x._value``); `reshard` first regroups the shards on the source devices,
with a jitted identity (device collectives), into the target's slices, and then copies
each slice to its device. Rollouts and the per-token arrays between roles are small host
arrays that each role's engine shards onto its own mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding

from jaxcore import ConfigError, Engine, ParallelConfig, TrainState

ROLES = ("actor", "critic", "reference")
# The reward model shares the reference's devices, with an engine (and plan) of its own.
ROLE_DEVICES = {
    "actor": "actor",
    "critic": "critic",
    "reference": "reference",
    "reward": "reference",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """Devices per role: ``actor``, ``critic`` and ``reference`` (the reward model runs
    on the reference's). Each role's sub-mesh is ``fsdp`` over its devices."""

    actor: int = 4
    critic: int = 2
    reference: int = 2

    def __post_init__(self) -> None:
        for role in ROLES:
            n = getattr(self, role)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(f"split.{role}={n!r}: give each role an integer >= 1 devices.")

    @property
    def total(self) -> int:
        return self.actor + self.critic + self.reference

    def assign(self, devices: Sequence[jax.Device] | None = None) -> dict[str, tuple]:
        """``{role: devices}``: consecutive, disjoint slices in the order actor, critic,
        reference; raises `ConfigError` when the roles need more devices than exist."""
        devices = list(jax.devices() if devices is None else devices)
        if self.total > len(devices):
            raise ConfigError(
                f"split: the roles need {self.total} devices (actor {self.actor} + critic "
                f"{self.critic} + reference {self.reference}) but {len(devices)} exist; lower "
                "the counts so they sum to at most the device count, or drop the split "
                "section for the colocated layout (ppo.offload_idle)."
            )
        out, start = {}, 0
        for role in ROLES:
            n = getattr(self, role)
            out[role] = tuple(devices[start : start + n])
            start += n
        return out


@functools.lru_cache(maxsize=256)
def _identity(sharding: NamedSharding) -> Any:
    return jax.jit(lambda x: x, out_shardings=sharding)


def _slices(sharding: Any, shape: tuple[int, ...]) -> set[tuple]:
    return {
        tuple((s.start, s.stop, s.step) for s in index)
        for index in sharding.devices_indices_map(shape).values()
    }


def _staging(x: jax.Array, target: NamedSharding) -> NamedSharding | None:
    """A sharding on ``x``'s own devices that holds the target's slices (each on
    ``n_source / n_target`` devices), or None when the device counts do not divide or
    the target is one device (staging would put the whole array on every source device;
    a one-device target holds it whole anyway)."""
    source = x.sharding
    if not isinstance(source, NamedSharding):
        return None
    devices, n_target = list(source.mesh.devices.flat), target.mesh.size
    if n_target == 1 or len(devices) % n_target:
        return None
    grid = np.asarray(devices).reshape(*target.mesh.devices.shape, len(devices) // n_target)
    names = (*target.mesh.axis_names, "copies")
    mesh = Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))
    return NamedSharding(mesh, target.spec, memory_kind=source.memory_kind)


def _reshard_leaf(x: Any, target: Any) -> Any:
    if not isinstance(x, jax.Array) or not isinstance(target, NamedSharding):
        return jax.device_put(x, target)
    if x.sharding == target:
        return x
    if x.sharding.device_set == target.device_set:  # one mesh: XLA collectives
        return _identity(target)(x)
    if not _slices(target, x.shape) <= _slices(x.sharding, x.shape):
        staging = _staging(x, target)
        if staging is not None:
            x = _identity(staging)(x)
    # Now every target slice is some source shard: device-to-device copies. (Without a
    # staging layout, e.g. a target with more devices than the source or one device,
    # jax goes through the host.)
    return jax.device_put(x, target)


def reshard(tree: Any, shardings: Any) -> Any:
    """``tree`` moved onto ``shardings`` (possibly another mesh), device to device."""
    return jax.tree.map(_reshard_leaf, tree, shardings)


def device_ids(tree: Any) -> set[int]:
    """The ids of every device holding part of ``tree`` (a placement check)."""
    return {d.id for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) for d in x.devices()}


class SplitLayout:
    """One `jaxcore.Engine` per role, each on its own devices (`SplitConfig.assign`).

    ``engine_fields`` (``zero``, ``precision``, ``seed``...) go to every engine.
    """

    def __init__(
        self,
        config: SplitConfig,
        devices: Sequence[jax.Device] | None = None,
        **engine_fields: Any,
    ):
        self.config = config
        self.devices = config.assign(devices)
        self.engines = {
            role: Engine(
                parallel=ParallelConfig(fsdp=len(self.devices[home])),
                devices=self.devices[home],
                **engine_fields,
            )
            for role, home in ROLE_DEVICES.items()
        }

    def engine(self, role: str) -> Engine:
        """The engine of ``role`` (``actor``, ``critic``, ``reference`` or ``reward``)."""
        if role not in self.engines:
            raise ConfigError(f"SplitLayout.engine({role!r}): use one of {list(self.engines)}.")
        return self.engines[role]

    def reference_state(self, actor: TrainState, factory: Any, seed: int = 0) -> TrainState:
        """A frozen reference on the reference sub-mesh holding ``actor``'s weights.

        Planned with no optimizer state (``optax.set_to_zero``); the weights are the
        actor's, resharded across meshes. The reference engine's scorers (built after
        this call) use this plan.
        """
        plan = self.engines["reference"].plan(factory, optax.set_to_zero())
        shell = plan.init(seed)
        return shell.replace(params=reshard(actor.params, plan.state_shardings.params))

    def check_sampler(self, sampler: Any) -> None:
        """Raise `ConfigError` unless the sampler's serving mesh lies on the actor's devices."""
        serving = {d.id for d in sampler.llm.engine.mesh.devices.flat}
        actor = {d.id for d in self.devices["actor"]}
        if not serving <= actor:
            raise ConfigError(
                f"split: the sampler serves on devices {sorted(serving)}, outside the actor's "
                f"{sorted(actor)}; give serving.parallel at most {len(actor)} devices."
            )
