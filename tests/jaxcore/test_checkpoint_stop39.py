"""Off-path checkpoint faults (stop 39): a damaged newest step in a directory where it
cannot be moved aside, and the on-disk state a SIGKILL leaves during a retention delete.

Faults are injected at exact places (the quarantine's move raising EROFS; Orbax's
deleter stopping after a seeded number of files), never by timing.
"""

import errno
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer, CheckpointError
from jaxcore.checkpointing import writer_lock
from jaxcore.models import lm_loss

from .helpers import factory, host, make_batch
from .test_checkpoint_faults import (  # the same state, writes and resumes
    TX,
    _biggest_data_file,
    _bumped,
    _equal,
    _resume,
    _write,
)


@pytest.fixture(scope="module")
def trained():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(factory, TX)
    state, _ = engine.train_step(lm_loss)(state, make_batch(8, 0))
    return engine, state


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _entries(directory):
    return sorted(p.name for p in directory.iterdir() if p.name != writer_lock.LOCK_FILE)


def test_a_damaged_step_that_cannot_be_moved_is_a_checkpoint_error(tmp_path, trained, monkeypatch):
    """A read-only mount (or a directory the run may not write): the damaged newest step
    cannot go to damaged/. The user gets a CheckpointError naming the step, the damage
    and the fix -- not a raw OSError traceback, and not a silent resume from an older
    step that the next start would repeat."""
    _write(tmp_path, trained, [2, 4])
    victim = _biggest_data_file(tmp_path / "4")
    _flip(victim)

    def read_only(src, dst, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    monkeypatch.setattr(shutil, "move", read_only)
    with pytest.raises(CheckpointError) as info:
        _resume(tmp_path)
    message = str(info.value)
    assert f"checkpoint {tmp_path / '4'} (step 4) is damaged: {victim}" in message
    assert "fails its CRC32 check" in message
    assert "could not be moved" in message and "Read-only file system" in message
    assert f"{tmp_path / '2'}" in message  # the intact step the user can fall back to
    assert _entries(tmp_path) == ["2", "4", "damaged"]  # 4 stayed where it was
    assert not any((tmp_path / "damaged").iterdir())


# Saves steps 1 and 2 with keep_last=1; Orbax deletes step 1 after finalizing step 2, and
# this process SIGKILLs itself after deleting `after` files of step 1: the
# state a kill -9 during a retention delete leaves (Orbax deletes in place, file by file:
# `shutil.rmtree`, or its parallel deleter on machines with 4+ cores).
_KILLED_DELETE = """
import os, signal, sys
sys.path.insert(0, os.environ["JAXCORE_ROOT"])
import jax, jax.numpy as jnp, optax
import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from jaxcore.models import lm_loss
from tests.jaxcore.helpers import factory, make_batch
from tests.jaxcore.test_checkpoint_stop39 import _bumped

directory, after = sys.argv[1], int(sys.argv[2])
engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
state = engine.prepare(factory, optax.adamw(1e-3))
state, _ = engine.train_step(lm_loss)(state, make_batch(8, 0))
unlink, doomed, count = os.unlink, os.path.join(directory, "1") + os.sep, [0]

def where(path, dir_fd):  # shutil.rmtree unlinks names relative to a directory's fd
    if dir_fd is None:
        return str(path)
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), str(path))

def counted(path, *a, **k):
    if where(path, k.get("dir_fd")).startswith(doomed):
        if count[0] == after:
            print("KILLED", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        count[0] += 1
    return unlink(path, *a, **k)

os.unlink = counted
config = CheckpointConfig(directory=directory, async_save=True, keep_last=1)
with Checkpointer(config, engine=engine) as ckpt:
    for step in (1, 2):
        ckpt.save(_bumped(state, step), force=True)
        ckpt.wait()
print("NOT KILLED", flush=True)
"""


@pytest.mark.parametrize("after", [0, 3, 7])
def test_sigkill_during_a_retention_delete_resumes_from_the_newest_step(tmp_path, trained, after):
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "JAXCORE_ROOT": str(root), "PYTHONPATH": str(root)}
    directory = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_DELETE, str(directory), str(after)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9 and "KILLED" in proc.stdout, proc.stderr[-3000:]
    assert (directory / "1").is_dir()  # a husk: some of its files are gone
    ckpt, restored = _resume(directory)
    assert ckpt.resumed_step == 2
    assert _equal(restored.params, _bumped(trained[1], 2).params)
    assert _equal(restored.opt_state, trained[1].opt_state)
    # The next run's save removes the husk along with the step it supersedes.
    _write(directory, trained, [3], keep_last=1)
    assert _entries(directory) == ["3"]


# Two processes (4 devices each) save steps 2 and 4; step 4 is then damaged and the
# quarantine's move refused on process 0 (the only one that moves). Each rank prints the
# error it got: every rank must get the CheckpointError, none a raw OSError, none a wait
# at a barrier the failed rank never reaches.
_TWO_RANKS = """
import errno, os, shutil, sys
sys.path.insert(0, os.environ["JAXCORE_ROOT"])
import jaxcore as jc
jc.initialize()
import jax, jax.numpy as jnp, optax
from jax.experimental import multihost_utils
from jaxcore.checkpoint import CheckpointConfig, Checkpointer
from tests.jaxcore.helpers import factory
from tests.jaxcore.test_checkpoint_stop39 import _biggest_data_file, _flip

directory, rank = sys.argv[1], jax.process_index()
engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
state = engine.prepare(factory, optax.adamw(1e-3))
with Checkpointer(CheckpointConfig(directory=directory, async_save=False), engine=engine) as c:
    for step in (2, 4):
        c.save(state.replace(step=jax.device_put(jnp.int32(step), state.step.sharding)), force=True)
if rank == 0:
    import pathlib
    _flip(_biggest_data_file(pathlib.Path(directory) / "4"))

    def read_only(src, dst, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    shutil.move = read_only
multihost_utils.sync_global_devices("damaged")
try:
    with Checkpointer(CheckpointConfig(directory=directory)) as c:
        c.restore_or_init(engine, factory, optax.adamw(1e-3))
    print(f"RANK {rank} RESTORED", flush=True)
except Exception as e:
    print(f"RANK {rank} {type(e).__name__}: {e}".replace(chr(10), " "), flush=True)
"""


def test_an_unmovable_damaged_step_raises_on_every_rank(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    env.update(
        JAXCORE_ROOT=str(root),
        PYTHONPATH=str(root),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_backend_optimization_level=0",
    )
    script = tmp_path / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    launch = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--devices-per-process", "4"]
    try:  # ~6 s when every rank raises; a rank left waiting at a barrier never ends
        proc = subprocess.run(
            [*launch, "--grace", "2", str(script), str(tmp_path / "run")],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a rank hung after the failed quarantine: {e.stdout}{e.stderr}"[-4000:])
    for rank in (0, 1):
        assert (
            f"RANK {rank} CheckpointError: checkpoint {tmp_path / 'run' / '4'} (step 4)" in out
        ), out[-4000:]
    assert "could not be moved" in out and "Read-only file system" in out
    assert (tmp_path / "run" / "4").is_dir() and (tmp_path / "run" / "2").is_dir()


def _raw(state):
    return host(state.replace(rng=jax.random.key_data(state.rng)))


def test_zero1_checkpoint_restores_under_zero3_on_another_mesh(tmp_path):
    """Written under ZeRO-1 (parameters replicated, optimizer state sharded over fsdp=8),
    restored under ZeRO-3 on tensor=2 x fsdp=4: every leaf equal, laid out the new way."""
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=1)
    state = engine.prepare(factory, TX)
    state, _ = engine.train_step(lm_loss)(state, make_batch(8, 0))
    with Checkpointer(CheckpointConfig(directory=tmp_path), engine=engine) as ckpt:
        ckpt.save(state, force=True)
    zero3 = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2), zero=3)
    with Checkpointer(CheckpointConfig(directory=tmp_path)) as ckpt:
        restored, _ = ckpt.restore_or_init(zero3, factory, TX)
    assert ckpt.resumed_step == 1
    assert _equal(_raw(restored), _raw(state))
    target = zero3.last_plan.abstract()
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        assert got.sharding == want.sharding
    assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(restored.params))
