"""Memory layouts for PPO: split (each role on its own sub-mesh) against colocated on the
same seed, and the colocated actor's optimizer state in host memory while it generates."""

import types

import jax
import numpy as np
import pytest

import jaxcore as jc
from inference import ServingConfig
from rlhf.layout import DEVICE, HOST, copy_role, memory_kinds
from rlhf.models import lm_factory, scalar_head_factory
from rlhf.ppo import PPOConfig, PPOTrainer
from rlhf.rollout import Sampler
from rlhf.split import SplitConfig, SplitLayout, device_ids, reshard

from ..inference.helpers import count_compiles
from .helpers import CFG, adam, count_good, engine, prompts

ITERATIONS = 2
SERVING = ServingConfig(slots=8, max_len=16)  # one device: device 0, the actor's first
TIMINGS = {"generate_s", "train_s", "rollout_tokens_per_s"}


def ppo(actor_engine, critic_engine, config, layout=None):
    """A PPO trainer; with ``layout`` the reference lives on the layout's reference mesh."""
    state = actor_engine.prepare(lm_factory(CFG), adam(5e-3), seed=0)
    values = critic_engine.prepare(scalar_head_factory(CFG), adam(3e-3), seed=1)
    extra = {}
    if layout is not None:
        extra = {
            "reference": layout.reference_state(state, lm_factory(CFG)),
            "reference_engine": layout.engine("reference"),
        }
    sampler = Sampler(CFG, state.params, SERVING)
    trainer = PPOTrainer(
        (actor_engine, state), (critic_engine, values), sampler, count_good, config, **extra
    )
    return trainer, sampler


@pytest.fixture(scope="module")
def colocated():
    """Colocated, every phase's memory kinds of the actor's optimizer state recorded."""
    config = PPOConfig(max_tokens=8, ppo_epochs=2, offload_optimizer=True, offload_idle=True)
    trainer, sampler = ppo(engine(), engine(), config)
    kinds = {"generate": [], "update": [], "idle_roles": []}
    generate, actor_step = sampler.generate, trainer._actor_step

    def recording_generate(*args, **kwargs):
        kinds["generate"].append(memory_kinds(trainer.actor.opt_state))
        kinds["idle_roles"].append(memory_kinds((trainer.critic, trainer.reference)))
        return generate(*args, **kwargs)

    def recording_step(state, batch):
        kinds["update"].append(memory_kinds(state.opt_state))
        return actor_step(state, batch)

    sampler.generate, trainer._actor_step = recording_generate, recording_step
    history = [trainer.step(prompts(i, 8)) for i in range(ITERATIONS)]
    return trainer, history, kinds


@pytest.fixture(scope="module")
def split():
    layout = SplitLayout(SplitConfig(actor=4, critic=2, reference=2))
    config = PPOConfig(max_tokens=8, ppo_epochs=2)
    trainer, sampler = ppo(layout.engine("actor"), layout.engine("critic"), config, layout)
    layout.check_sampler(sampler)
    history = [trainer.step(prompts(i, 8)) for i in range(ITERATIONS)]
    return layout, trainer, history


def test_actor_optimizer_waits_in_host_memory_while_generating(colocated):
    trainer, _, kinds = colocated
    assert kinds["generate"] == [{HOST}] * ITERATIONS
    assert kinds["update"] == [{DEVICE}] * (ITERATIONS * 2)  # ppo_epochs x minibatches
    assert kinds["idle_roles"] == [{HOST}] * ITERATIONS  # offload_idle: critic, reference
    assert memory_kinds(trainer.actor.opt_state) == {DEVICE}  # ready for the next update


def test_split_places_each_role_on_its_own_devices(split):
    layout, trainer, _ = split
    placed = {
        "actor": device_ids(trainer.actor),
        "critic": device_ids(trainer.critic),
        "reference": device_ids(trainer.reference),
        "reward": {d.id for d in layout.engine("reward").mesh.devices.flat},
    }
    assert placed == {
        "actor": {0, 1, 2, 3},
        "critic": {4, 5},
        "reference": {6, 7},
        "reward": {6, 7},
    }
    # The reference arrived by resharding: each of its devices holds a shard, not the whole.
    wq = trainer.reference.params["wq"]
    assert {s.data.shape for s in wq.addressable_shards} == {(2, 16, 4, 8)} and wq.shape[1] == 32
    assert not memory_kinds(trainer.reference.opt_state)  # planned with no optimizer arrays


def test_split_metrics_equal_the_colocated_layouts(colocated, split):
    _, colo, _ = colocated
    _, _, spl = split
    assert any(m["reward_mean"] > 0 for m in colo)  # the rewards, not only the KL, compared
    for a, b in zip(colo, spl, strict=True):
        assert set(a) == set(b)
        for key in sorted(set(a) - TIMINGS):
            assert np.isclose(a[key], b[key], rtol=1e-4, atol=1e-5), (key, a[key], b[key])
    print(
        [
            {k: (a[k], b[k]) for k in ("reward_mean", "kl", "value_loss")}
            for a, b in zip(colo, spl, strict=True)
        ]
    )


def test_split_errors_name_the_fix():
    with pytest.raises(jc.ConfigError, match=r"need 16 devices .* but 8 exist"):
        SplitConfig(actor=8, critic=4, reference=4).assign()
    with pytest.raises(jc.ConfigError, match=r"split\.critic"):
        SplitConfig(critic=0)
    layout = SplitLayout(SplitConfig(actor=2, critic=2, reference=2))
    wide = types.SimpleNamespace(
        llm=types.SimpleNamespace(engine=types.SimpleNamespace(mesh=layout.engine("critic").mesh))
    )
    with pytest.raises(jc.ConfigError, match="outside the actor's"):
        layout.check_sampler(wide)
    with pytest.raises(jc.ConfigError, match="use one of"):
        layout.engine("value")


def test_reshard_never_round_trips_through_the_host(monkeypatch):
    """Fault injection: reading an array's host value raises. A plain device_put from
    fsdp=4 to fsdp=2 on other devices needs it (jax's slow path gathers on the host);
    reshard does not, across meshes and within one."""
    from jax._src.array import ArrayImpl

    P, NS = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
    value = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    four = jc.build_mesh(jc.ParallelConfig(fsdp=4), jax.devices()[:4])
    two = jc.build_mesh(jc.ParallelConfig(fsdp=2), jax.devices()[6:8])
    x = jax.device_put(value, NS(four, P("fsdp", None)))
    y = jax.device_put(
        value, NS(jc.build_mesh(jc.ParallelConfig(fsdp=4, tensor=2)), P("fsdp", "tensor"))
    )
    other = jc.build_mesh(jc.ParallelConfig(data=4, fsdp=1, tensor=2))

    def no_host_copy(self):
        raise AssertionError("gathered on the host")

    with monkeypatch.context() as patch:
        patch.setattr(ArrayImpl, "_value", property(no_host_copy))
        with pytest.raises(AssertionError, match="gathered on the host"):
            jax.device_put(x, NS(two, P("fsdp", None)))
        moved = reshard(x, NS(two, P("fsdp", None)))
        replicated = reshard(x, NS(two, P()))
        regrouped = reshard(y, NS(other, P(None, "tensor")))
    assert device_ids(moved) == {6, 7} and {s.data.shape for s in moved.addressable_shards} == {
        (4, 8)
    }
    for out in (moved, replicated, regrouped):
        np.testing.assert_array_equal(np.asarray(out), value)


def test_copy_role_is_new_buffers_in_the_same_layout_and_compiles_nothing():
    """The frozen reference: a trainer's scorer serves actor and reference alike only if
    the copy keeps every leaf's sharding and committedness; a donated original must
    leave it intact."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("fsdp",))
    row, whole = NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P())
    role = {
        "w": jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4), row),
        "b": jax.device_put(np.ones(3, np.float32), whole),
        "parked": jax.device_put(np.ones(8, np.float32), row.with_memory_kind(HOST)),
        "step": jax.numpy.int32(3),  # uncommitted, as a fresh scalar
        "name": "actor",
    }
    with count_compiles() as compiles:
        copy = copy_role(role)
    assert compiles.count == 0
    assert copy["name"] == "actor"
    for key in ("w", "b", "parked", "step"):
        a, c = role[key], copy[key]
        assert (c.sharding, c.committed) == (a.sharding, a.committed), key
        ptr = [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]
        assert all(s.data.unsafe_buffer_pointer() not in ptr for s in c.addressable_shards), key
    want = {k: np.asarray(role[k]) for k in ("w", "b", "parked", "step")}
    jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)(
        {k: role[k] for k in ("w", "b")}
    )
    assert role["w"].is_deleted() and not copy["w"].is_deleted()
    for key, value in want.items():
        np.testing.assert_array_equal(np.asarray(copy[key]), value)
