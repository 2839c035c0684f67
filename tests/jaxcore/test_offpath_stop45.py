"""Stop 45: lines a user saw twice, and a positional config of the wrong kind.

Importing Orbax gives the root logger absl's stderr handler, so a checkpoint notice that
was both logged as a warning and printed by process 0 reached the terminal twice.
"""

import logging
import sys

import optax
import pytest

import jaxcore as jc
from jaxcore.models import lm_loss

from .helpers import factory, make_batch


@pytest.fixture(scope="module")
def prepared():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    return engine, engine.prepare(factory, optax.sgd(1e-2))


@pytest.fixture
def root_stderr_handler():
    """The handler absl installs on the root logger when Orbax is imported."""
    handler = logging.StreamHandler(sys.stderr)
    logging.root.addHandler(handler)
    yield
    logging.root.removeHandler(handler)


def test_a_checkpoint_notice_reaches_the_terminal_once(
    tmp_path, prepared, capfd, root_stderr_handler
):
    engine, state = prepared
    config = jc.CheckpointConfig(directory=tmp_path, save_every_steps=1, async_save=False)
    with jc.Checkpointer(config, engine=engine) as ckpt:
        ckpt.save(state, step=5)
    capfd.readouterr()
    with jc.Checkpointer(config, engine=engine) as ckpt:
        ckpt.save(state, step=2)  # behind the newest step: one warning
    err = capfd.readouterr().err
    assert err.count("behind the newest checkpoint") == 1, err
    assert "[jaxcore.checkpoint] this run is at step 2" in err


def test_without_announce_the_notice_is_still_logged_as_a_warning(tmp_path, prepared, caplog):
    engine, state = prepared
    config = jc.CheckpointConfig(
        directory=tmp_path, save_every_steps=1, async_save=False, announce=False
    )
    with jc.Checkpointer(config, engine=engine) as ckpt:
        ckpt.save(state, step=5)
    with caplog.at_level(logging.WARNING), jc.Checkpointer(config, engine=engine) as ckpt:
        ckpt.save(state, step=2)
    assert [r.levelno for r in caplog.records if "behind the newest" in r.message] == [
        logging.WARNING
    ]


def test_a_parallel_config_given_as_the_engine_config_names_parallel():
    # It was an AttributeError from inside the mesh builder ("'ParallelConfig' object has
    # no attribute 'parallel'"), which says nothing about where it goes.
    with pytest.raises(jc.ConfigError, match=r"goes in parallel=, e\.g\. jc\.Engine\(parallel="):
        jc.Engine(jc.ParallelConfig(fsdp=-1))
    with pytest.raises(jc.ConfigError, match=r"expected a jaxcore\.EngineConfig .* got dict"):
        jc.Engine({"zero": 3})


@pytest.mark.parametrize(
    ("command", "fix"),
    [
        ("ui", "pip install 'jaxcore[ui,experiments]'"),
        ("serve", "pip install 'jaxcore[serve]'"),
        ("rlhf", "pip install fastapi"),  # no extra of its own: the package that is missing
    ],
)
def test_a_subcommand_without_its_extra_names_the_extra_it_needs(monkeypatch, capsys, command, fix):
    # Every command used to suggest pip install 'jaxcore[data]'.
    from jaxcore import cli

    def missing(name):
        raise ModuleNotFoundError("No module named 'fastapi'", name="fastapi")

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    assert cli.main([command]) == 2
    assert f"Install it: {fix}." in capsys.readouterr().err


def test_a_state_of_another_plan_names_the_plan_not_a_pytree_prefix(prepared):
    # An AdamW plan's step given the SGD plan's state: JAX's "pytree structure error ...
    # pjit in_shardings[0].opt_state" said nothing about plans.
    engine, state = prepared
    step = engine.plan(factory, optax.adamw(1e-3)).train_step(lm_loss)
    with pytest.raises(jc.StateError, match="not of the plan the step was built from"):
        step(state, make_batch(8, 0))
