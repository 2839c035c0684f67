"""Checkpoint contents, retention, resharding restores, portable weights.

Damage, verification and restore failures: test_checkpoint_faults.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors import safe_open

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from jaxcore.checkpointing import portable
from jaxcore.models import lm_loss
from jaxcore.precision import LossScaleState

from .helpers import factory, host, make_batch

FSDP8 = jc.ParallelConfig(fsdp=8)
TX = optax.adamw(1e-3)


def _equal_trees(a, b) -> bool:
    a, b = host(a), host(b)
    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.fixture(scope="module")
def trained():
    """A state after 3 fsdp=8 steps, its saved copy on the host, and a checkpoint of it."""
    engine = jc.Engine(parallel=FSDP8)
    state = engine.prepare(factory, TX)
    step = engine.train_step(lm_loss)
    for i in range(3):
        state, _ = step(state, make_batch(8, i))
    return engine, step, state


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    engine, _, state = trained
    directory = tmp_path_factory.mktemp("ckpt")
    with Checkpointer(CheckpointConfig(directory=directory, async_save=True), engine=engine) as c:
        c.save(state, force=True)
    return directory, state


def _fresh(directory, **kw):
    return Checkpointer(CheckpointConfig(directory=directory, **kw))


def test_state_round_trips_exactly_with_typed_key_and_optax_types(saved):
    directory, state = saved
    engine = jc.Engine(parallel=FSDP8)
    with _fresh(directory) as ckpt:
        restored, _ = ckpt.restore_or_init(engine, factory, TX)
    assert ckpt.resumed_step == 3
    assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(restored.rng), jax.random.key_data(state.rng))
    assert [type(s) for s in restored.opt_state] == [type(s) for s in state.opt_state]
    assert _equal_trees(restored.replace(rng=None), state.replace(rng=None))
    record = json.loads((directory / "3" / "meta" / "metadata").read_text())
    assert record["mesh"]["fsdp"] == 8 and record["versions"]["jax"] == jax.__version__
    assert record["logical_axes"]["embed"] is not None


@pytest.mark.parametrize(
    "parallel",
    [jc.ParallelConfig(fsdp=4, tensor=2), jc.ParallelConfig(data=8, fsdp=1), "one-device"],
    ids=["fsdp4-tensor2", "data8", "one-device"],
)
def test_restore_onto_another_layout_and_continue(saved, trained, parallel):
    directory, state = saved
    _, fsdp_step, _ = trained
    if parallel == "one-device":
        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    else:
        engine = jc.Engine(parallel=parallel)
    with _fresh(directory) as ckpt:
        restored, _ = ckpt.restore_or_init(engine, factory, TX)
    assert _equal_trees(restored.params, state.params)
    for leaf, want in zip(
        jax.tree.leaves(restored.params),
        jax.tree.leaves(engine.state_shardings.params),
        strict=True,
    ):
        assert leaf.sharding == want
    # Training continues: one more step agrees with the fsdp=8 run's next step.
    batch = make_batch(8, 99)
    _, m = engine.train_step(lm_loss)(restored, batch)
    with _fresh(directory) as reference:
        again, _ = reference.restore_or_init(jc.Engine(parallel=FSDP8), factory, TX)
    _, m_ref = fsdp_step(again, batch)
    np.testing.assert_allclose(float(m["loss"]), float(m_ref["loss"]), rtol=1e-5)


def test_fp16_loss_scale_round_trips(tmp_path, trained):
    _, _, state = trained
    scale = LossScaleState.create(jc.LossScaleConfig()).replace(scale=jnp.float32(1024.0))
    state = state.replace(loss_scale=jax.device_put(scale))
    with _fresh(tmp_path, async_save=False) as ckpt:
        ckpt.save(state, force=True)
    with _fresh(tmp_path) as ckpt:
        restored, _ = ckpt.restore_or_init(jc.Engine(parallel=FSDP8, precision="fp16"), factory, TX)
    assert float(restored.loss_scale.scale) == 1024.0
    assert _equal_trees(restored.replace(rng=None), state.replace(rng=None))


def _save_steps(directory, trained, steps, metrics=None, **cfg):
    engine, _, state = trained
    with Checkpointer(CheckpointConfig(directory=directory, **cfg), engine=engine) as ckpt:
        for s in steps:
            m = None if metrics is None else {"loss": metrics[s]}
            ckpt.save(state.replace(step=jnp.int32(s)), metrics=m)
    return ckpt


def test_interval_and_retention_policies(tmp_path, trained):
    ckpt = _save_steps(tmp_path / "a", trained, range(1, 10), save_every_steps=3, keep_last=5)
    assert ckpt.all_steps() == [3, 6, 9]
    losses = {s: v for s, v in zip(range(1, 7), [5.0, 1.0, 4.0, 3.0, 6.0, 7.0], strict=True)}
    ckpt = _save_steps(
        tmp_path / "b",
        trained,
        range(1, 7),
        losses,
        save_every_steps=1,
        keep_last=2,
        keep_best=1,
        best_metric="loss",
    )
    assert ckpt.all_steps() == [2, 5, 6]  # the best (loss 1.0) and the last two


def test_different_model_is_a_config_error_not_damage(saved):
    directory, _ = saved
    from jaxcore.models import Transformer, TransformerConfig

    other = TransformerConfig.tiny(max_seq_len=64, d_model=32)
    with _fresh(directory) as ckpt, pytest.raises(jc.ConfigError, match="saved as"):
        ckpt.restore_or_init(
            jc.Engine(parallel=FSDP8), lambda rngs: Transformer(other, rngs=rngs), TX
        )
    assert (directory / "3").is_dir(), "a mismatch must not quarantine a good checkpoint"


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(jc.ConfigError, match="keep_best"):
        CheckpointConfig(directory=tmp_path, keep_best=2)
    with pytest.raises(jc.ConfigError, match="save_every_steps"):
        CheckpointConfig(directory=tmp_path, save_every_steps=0)
    with pytest.raises(jc.ConfigError, match="verify"):
        CheckpointConfig(directory=tmp_path, verify="md5")


def test_safetensors_export_and_import_round_trip(saved, tmp_path):
    directory, state = saved
    path = portable.export_checkpoint(directory / "3", tmp_path / "w.safetensors")
    info = portable.read_info(path)
    assert info["step"] == 3
    assert info["tensors"]["wq"]["logical_axes"] is not None
    assert info["tensors"]["wq"]["dtype"] == "float32"
    with safe_open(str(path), framework="numpy") as f:
        assert set(f.keys()) == set(portable._flat(state.params))
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2))
    # A fresh run on another mesh (abstract prepare: the shardings without an init).
    with Checkpointer(CheckpointConfig(directory=tmp_path / "new")) as fresh:
        fresh.abstract_state(engine, factory, TX)
    params = portable.load_params(path, engine)
    assert _equal_trees(params, state.params)
    for leaf, want in zip(
        jax.tree.leaves(params), jax.tree.leaves(engine.state_shardings.params), strict=True
    ):
        assert leaf.sharding == want
    with pytest.raises(jc.ConfigError, match="missing"):
        portable.save_params({"embed": state.params["embed"]}, tmp_path / "part.safetensors")
        portable.load_params(tmp_path / "part.safetensors", engine)


def test_a_plain_save_records_the_plan_and_restores_onto_it(tmp_path, trained):
    from jaxcore.checkpointing import record as rec

    engine, _, state = trained
    plan = engine.last_plan
    with Checkpointer(CheckpointConfig(directory=tmp_path, async_save=False), plan=plan) as c:
        c.save(state, force=True)
        record = c.read_record(3)
    assert record["mesh"] == dict(plan.mesh.shape)
    assert record["engine"] == rec.jsonable(plan.config)
    assert record["logical_axes"]["embed"] is not None
    with _fresh(tmp_path) as ckpt:
        restored, _ = ckpt.restore_or_init(plan)
    assert ckpt.plan is plan and ckpt.resumed_step == 3
    assert _equal_trees(restored.params, state.params)


@pytest.mark.parametrize("async_save", [False, True])
def test_ctrl_c_during_a_save_completes_the_step_then_interrupts(
    trained, tmp_path, monkeypatch, async_save
):
    """Stop 43: Ctrl-C inside a save left the step half-written and Orbax's threads on a
    closed event loop ("Event loop is closed" tracebacks at exit). The interrupt is held
    until the save has started for real, then raised from `Checkpointer.save`."""
    import signal

    from jaxcore.checkpointing import record

    engine, _, state = trained
    build = record.build

    def interrupted_build(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C, mid-save
        return build(*args, **kwargs)

    monkeypatch.setattr(record, "build", interrupted_build)
    before = signal.getsignal(signal.SIGINT)
    cfg = CheckpointConfig(directory=tmp_path, async_save=async_save)
    with Checkpointer(cfg, engine=engine) as c:
        with pytest.raises(KeyboardInterrupt):
            c.save(state, force=True)
        assert signal.getsignal(signal.SIGINT) is before
    with _fresh(tmp_path) as c:
        assert c.latest_step() == 3
        restored, _ = c.restore_or_init(jc.Engine(parallel=FSDP8), factory, TX)
    assert _equal_trees(restored.params, state.params)
