"""What a restore does when something is wrong: quarantine only on proof, raise otherwise.

Every fault is injected at an exact place (a file truncated, deleted or flipped; Orbax's
restore monkeypatched to raise; a read that fails), never by timing.
"""

import errno
import json
import pathlib
import resource
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import jaxcore as jc
from jaxcore.checkpoint import CheckpointConfig, Checkpointer, CheckpointError
from jaxcore.checkpointing import atomic, manifest, storage, writer_lock
from jaxcore.checkpointing.manifest import write_manifest
from jaxcore.models import lm_loss

from .helpers import factory, host, make_batch

TX = optax.adamw(1e-3)


@pytest.fixture(scope="module")
def trained():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    state = engine.prepare(factory, TX)
    state, _ = engine.train_step(lm_loss)(state, make_batch(8, 0))
    return engine, state


def _equal(a, b) -> bool:
    return all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(host(a)), jax.tree.leaves(host(b)), strict=True)
    )


def _bumped(state, step):
    return state.replace(
        step=jnp.int32(step), params=jax.tree.map(lambda x: x + float(step), state.params)
    )


def _write(directory, trained, steps, **cfg):
    engine, state = trained
    config = CheckpointConfig(directory=directory, async_save=False, **cfg)
    with Checkpointer(config, engine=engine) as c:
        for s in steps:
            c.save(_bumped(state, s), force=True)


def _resume(directory, **cfg):
    with Checkpointer(CheckpointConfig(directory=directory, **cfg)) as ckpt:
        state, _ = ckpt.restore_or_init(jc.Engine(parallel=jc.ParallelConfig(fsdp=8)), factory, TX)
    return ckpt, state


def _biggest_data_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    return max(files, key=lambda p: p.stat().st_size)


def _damage(path, how):
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    else:  # the same size, one byte different: only the CRC can tell
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))


def _entries(directory):
    """What a directory holds besides the writer lock of the runs that saved there."""
    return sorted(p.name for p in directory.iterdir() if p.name != writer_lock.LOCK_FILE)


def _make_legacy(step_dir):
    (step_dir / manifest.MANIFEST).unlink()


def test_every_step_commits_its_manifest_before_the_rename(tmp_path, trained, monkeypatch):
    seen = []

    def before_rename(tmp, step):
        # The manifest is inside the temporary directory, the final one does not exist.
        seen.append((step, (tmp / manifest.MANIFEST).exists(), (tmp_path / str(step)).exists()))

    monkeypatch.setattr(atomic, "before_rename", before_rename)
    engine, state = trained
    with Checkpointer(CheckpointConfig(directory=tmp_path), engine=engine) as ckpt:  # async
        ckpt.save(_bumped(state, 1), force=True)
        ckpt.save(_bumped(state, 2), force=True)
    assert seen == [(1, True, False), (2, True, False)]
    for step in (1, 2):
        root = tmp_path / str(step)
        listed = json.loads((root / manifest.MANIFEST).read_text())["files"]
        assert any(name.startswith("state/") for name in listed)
        assert any(name.startswith("meta/") for name in listed)
        assert manifest.check_files(root, "checksum") == (None, len(listed))


@pytest.mark.parametrize("legacy", [False, True], ids=["all-verified", "legacy-step-present"])
@pytest.mark.parametrize("how", ["truncate", "delete", "flip"])
def test_proven_damage_is_quarantined_once(tmp_path, trained, capfd, how, legacy):
    _write(tmp_path, trained, [2, 4])
    if legacy:
        _make_legacy(tmp_path / "2")
    victim = _biggest_data_file(tmp_path / "4")
    _damage(victim, how)
    if legacy:
        # Step 4 is proven damaged and moved; step 2 cannot be verified: refused, kept.
        with pytest.raises(CheckpointError, match=r"no manifest.*allow_unverified=True"):
            _resume(tmp_path)
        assert not (tmp_path / "4").exists() and (tmp_path / "2").is_dir()
        ckpt, restored = _resume(tmp_path, allow_unverified=True)
        expected = "(step 2, UNVERIFIED)"
    else:
        ckpt, restored = _resume(tmp_path)
        expected = "(step 2, verified)"
    err = capfd.readouterr().err
    assert f"checkpoint {tmp_path / '4'} is damaged: {victim}" in err
    assert f"resumed from checkpoint {tmp_path / '2'} {expected}" in err
    assert ckpt.resumed_step == 2
    assert _equal(restored.params, _bumped(trained[1], 2).params)
    assert [p.name.split("-")[0] for p in (tmp_path / "damaged").iterdir()] == ["4"]
    assert ckpt.all_steps() == [2]


@pytest.mark.parametrize("legacy", [False, True], ids=["all-verified", "legacy-step-present"])
def test_a_restore_exception_raises_and_moves_nothing(tmp_path, trained, monkeypatch, legacy):
    _write(tmp_path, trained, [2, 4])
    if legacy:
        _make_legacy(tmp_path / "2")

    def broken(self, step, *a, **k):  # what a changed format or a typo surfaces as
        raise ValueError(f"unexpected key in {tmp_path / str(step) / 'state' / '_METADATA'}")

    monkeypatch.setattr(ocp.CheckpointManager, "restore", broken)
    with pytest.raises(CheckpointError) as info:
        _resume(tmp_path, allow_unverified=legacy)
    message = str(info.value)
    assert f"{tmp_path / '4'} (step 4)" in message
    assert f"failed at {tmp_path / '4' / 'state' / '_METADATA'}" in message
    assert "ValueError: unexpected key" in message and "nothing was moved" in message
    assert _entries(tmp_path) == ["2", "4"]


def test_unreadable_files_raise_instead_of_quarantining(tmp_path, trained, monkeypatch):
    _write(tmp_path, trained, [2])

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(manifest, "crc32", denied)
    with pytest.raises(CheckpointError, match=r"could not read.*Permission denied"):
        _resume(tmp_path)
    assert _entries(tmp_path) == ["2"]


def test_two_damaged_steps_raise_after_one_quarantine(tmp_path, trained):
    _write(tmp_path, trained, [2, 4, 6])
    _damage(_biggest_data_file(tmp_path / "6"), "flip")
    _damage(_biggest_data_file(tmp_path / "4"), "truncate")
    with pytest.raises(CheckpointError, match=r"damaged too.*after step 6 was moved"):
        _resume(tmp_path)
    assert _entries(tmp_path) == ["2", "4", "damaged"]


def test_unreadable_manifest_is_damage(tmp_path, trained):
    _write(tmp_path, trained, [2, 4])
    (tmp_path / "4" / manifest.MANIFEST).write_text("{not json")
    ckpt, _ = _resume(tmp_path)
    assert ckpt.resumed_step == 2 and not (tmp_path / "4").exists()


def test_a_step_orbax_reports_unfinalized_is_quarantined(tmp_path, trained, monkeypatch):
    # What a bucket without the commit marker (commit_success.txt) looks like to Orbax.
    _write(tmp_path, trained, [2, 4])
    finalized = ocp.utils.is_checkpoint_finalized
    monkeypatch.setattr(
        ocp.utils, "is_checkpoint_finalized", lambda p: p.name != "4" and finalized(p)
    )
    ckpt, restored = _resume(tmp_path)
    assert ckpt.resumed_step == 2
    assert _equal(restored.params, _bumped(trained[1], 2).params)
    assert [p.name.split("-")[0] for p in (tmp_path / "damaged").iterdir()] == ["4"]


def test_restore_of_a_damaged_step_raises_and_keeps_it(tmp_path, trained):
    _write(tmp_path, trained, [2])
    _damage(_biggest_data_file(tmp_path / "2"), "flip")
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    with Checkpointer(CheckpointConfig(directory=tmp_path)) as ckpt:
        target = ckpt.abstract_state(engine, factory, TX)
        with pytest.raises(CheckpointError, match="fails its CRC32 check"):
            ckpt.restore(2, target)
    assert (tmp_path / "2").is_dir()


def test_a_loader_that_cannot_resume_fails_at_construction(tmp_path):
    class Batches:
        def __iter__(self):
            return iter([])

    with pytest.raises(jc.ConfigError, match=r"Batches cannot be checkpointed.*get_state"):
        Checkpointer(CheckpointConfig(directory=tmp_path), loader=Batches())
    assert not _entries(tmp_path)


def test_a_full_disk_while_finalizing_names_the_lost_step(tmp_path, trained, monkeypatch):
    """ENOSPC in the async finalize of step 2 (the manifest write): the error reaches the
    next save as a CheckpointError naming step 2, the intact step 1 and the fix; a rerun
    resumes from step 1. Before, Orbax's raw OSError came out of an unrelated save."""

    def full_disk(root, step):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(root / "x"))
        write_manifest(root, step)

    monkeypatch.setattr(atomic, "write_manifest", full_disk)
    engine, state = trained
    with (
        pytest.raises(CheckpointError) as raised,
        Checkpointer(CheckpointConfig(directory=tmp_path), engine=engine) as ckpt,
    ):
        for s in (1, 2, 3):
            ckpt.save(_bumped(state, s), force=True)
        ckpt.wait()
    msg = str(raised.value)
    assert "step 2" in msg and "no space left on device" in msg, msg
    assert "[1] are intact" in msg and "resumes from step 1" in msg, msg
    assert "CheckpointConfig.directory" in msg
    monkeypatch.undo()
    ckpt, restored = _resume(tmp_path)
    assert ckpt.resumed_step == 1
    assert _equal(restored.params, _bumped(state, 1).params)


def test_a_file_size_limit_the_kernel_enforces_is_a_storage_error(tmp_path, trained):
    """A real refusal from the kernel through TensorStore (EFBIG under a file-size limit:
    no root needed, unlike a small tmpfs), synchronous save."""
    engine, state = trained
    config = CheckpointConfig(directory=tmp_path, async_save=False)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill
    try:
        with Checkpointer(config, engine=engine) as ckpt:
            ckpt.save(_bumped(state, 1), force=True)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limit[1]))
            with pytest.raises(CheckpointError, match=r"step 2 .*file too large") as raised:
                ckpt.save(_bumped(state, 2), force=True)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert "[1] are intact" in str(raised.value)
    assert _resume(tmp_path)[0].resumed_step == 1


def test_errors_that_are_not_the_storage_propagate_unchanged():
    assert storage.storage_failure(ValueError("a bug")) is None
    wrapped = ValueError(
        "RESOURCE_EXHAUSTED: Error writing ... at local file "
        '"/r/7.orbax-checkpoint-tmp/state/d/1": No space left on device '
        "[os_error_code='28']"
    )
    assert storage.storage_failure(wrapped) == "no space left on device"
    assert storage.failed_step(wrapped) == 7
    chained = RuntimeError("save failed")
    chained.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert storage.storage_failure(chained) == "the filesystem is read-only"


HOLDER = """
import sys
sys.path.insert(0, {root!r})
import jax.numpy as jnp, optax
import jaxcore as jc
from tests.jaxcore.helpers import factory
engine = jc.Engine()
state = engine.prepare(factory, optax.sgd(0.1))
with jc.Checkpointer(jc.CheckpointConfig(directory={directory!r}, async_save=False)) as c:
    c.save(state.replace(step=jnp.int32(1)), force=True)
    print("SAVED", flush=True)
    sys.stdin.readline()  # hold the directory until told to go
"""


def test_a_second_run_saving_into_the_same_directory_is_refused(tmp_path, trained):
    """Two runs on one directory used to interleave their steps (and one died on Orbax's
    FileNotFoundError when both wrote step 1). While another process holds the directory
    the first save raises naming it; once that process is gone, saving works."""
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[2])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=root, directory=str(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "SAVED"
        engine, state = trained
        with Checkpointer(CheckpointConfig(directory=tmp_path), engine=engine) as ckpt:
            assert ckpt.latest_step() == 1  # reading is not writing: never refused
            with pytest.raises(CheckpointError, match=rf"another run \(pid {holder.pid} on"):
                ckpt.save(_bumped(state, 2), force=True)
    finally:
        holder.communicate("go\n", timeout=60)
    with Checkpointer(CheckpointConfig(directory=tmp_path), engine=engine) as ckpt:
        ckpt.save(_bumped(state, 2), force=True)
    assert _resume(tmp_path)[0].resumed_step == 2
