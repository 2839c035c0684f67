"""Bad batches, bad loss functions and a reused donated state: typed errors, never a crash.

Each mistake runs in its own process (tests/jaxcore/scripts/bad_batch.py): the process
must exit with status 1 (an uncaught Python exception) and print the typed error with
what was wrong and how to fix it; a segfault would show as a negative status.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxcore as jc
from jaxcore.batch_checks import BatchChecker, BatchContract

SCRIPT = Path(__file__).parent / "scripts" / "bad_batch.py"

CASES = {
    "float_tokens": ("BatchError", ["batch[tokens]", "float32", "astype(np.int32)"]),
    "3d_tokens": ("BatchError", ["batch[tokens]", "(4, 17, 1)", "2-d"]),
    "bare_array": ("BatchError", ["bare ndarray", "{'tokens': tokens}"]),
    "id_past_vocab": ("BatchError", ["batch[tokens]", "to 256", "[0, 256)", "check_batches"]),
    "negative_id": ("BatchError", ["from -1", "[0, 256)"]),
    "too_long": ("BatchError", ["66 tokens", "max_seq_len is 64", "65"]),
    "id_past_vocab_on_device": ("BatchError", ["from 256 to 256", "[0, 256)"]),
    "loss_bare_scalar": ("ConfigError", ["a bare array of shape ()", "def loss_fn"]),
    "loss_not_scalar": ("ConfigError", ["loss of shape (4, 16)", "scalar", "def loss_fn"]),
    "loss_aux_not_dict": ("ConfigError", ["not a dict", "(loss, aux)", "def loss_fn"]),
    "donated_train": ("StateError", ["donated", "state, metrics = step(state, batch)"]),
    "donated_eval": ("StateError", ["donated", "the state the step returned"]),
}


@pytest.fixture(scope="module")
def child_env(tmp_path_factory):
    """The cases build the same plan: the first process compiles it, the rest read JAX's
    persistent cache (every entry kept, however quick its compile)."""
    return {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("xla-cache")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(CASES))
def test_mistake_ends_in_a_typed_error(case, child_env):
    error, words = CASES[case]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), case],
        capture_output=True,
        text=True,
        timeout=900,
        env=child_env,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    last = proc.stderr.strip().splitlines()
    message = "\n".join(line for line in last if line.strip())
    assert f"jaxcore.errors.{error}" in message, message[-3000:]
    tail = message[message.rindex(f"jaxcore.errors.{error}") :]
    for w in words:
        assert w in tail, (w, tail)


def _checker(**kw) -> BatchChecker:
    base = dict(ways=1, per_shard=1, per_shard_what="grad_accum", token_keys=("tokens",))
    return BatchChecker(BatchContract(**{**base, **kw}))


def test_structure_checks_run_once_per_structure(monkeypatch):
    checker = _checker(vocab_size=10)
    calls = []
    original = checker._check_shapes
    monkeypatch.setattr(
        checker, "_check_shapes", lambda b, local: (calls.append(1), original(b, local))
    )
    good = {"tokens": np.ones((2, 5), np.int32)}
    for _ in range(3):
        checker.check(good)
    checker.check({"tokens": np.ones((2, 6), np.int32)})
    assert len(calls) == 2
    # Host batches are range-checked every time, even with a known structure.
    with pytest.raises(jc.BatchError, match="from 1 to 10"):
        checker.check({"tokens": np.full((2, 5), 10, np.int32) - np.eye(2, 5, dtype=np.int32) * 9})


def test_check_batches_off_skips_token_checks():
    checker = _checker(token_keys=(), vocab_size=None, check_values=False)
    checker.check({"tokens": np.full((2, 5), 1e9, np.float32)})


def test_a_process_local_batch_holds_one_block_of_the_rows():
    # 4 shards x 2 microbatches; the processes hold 2 blocks, so a local batch is half.
    checker = _checker(ways=4, per_shard=2, process_blocks=2)
    checker.check({"tokens": np.ones((4, 5), np.int32)}, local=True)
    with pytest.raises(jc.BatchError, match="multiple of 4"):
        checker.check({"tokens": np.ones((6, 5), np.int32)}, local=True)
    # One block (a pipeline spanning the processes): every process passes the whole batch.
    whole = _checker(ways=4, per_shard=2, process_blocks=1)
    with pytest.raises(jc.BatchError, match="multiple of 8"):
        whole.check({"tokens": np.ones((4, 5), np.int32)}, local=True)


def _two_processes(monkeypatch, peer_batch, peer_block=0):
    """Pretend to be process 0 of 2 whose peer (in block ``peer_block``) passed
    ``peer_batch``; returns the list of all-gathers made."""
    from jax.experimental import multihost_utils

    import jaxcore.batch_checks as bc

    calls = []
    peer = np.concatenate([[peer_block], bc.fingerprint(peer_batch)]).astype(np.int64)

    def allgather(mine):
        calls.append(1)
        return np.stack([mine, peer])

    monkeypatch.setattr(bc.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    return calls


def test_processes_that_share_rows_must_pass_the_same_data(monkeypatch):
    batch = {"tokens": np.arange(10, dtype=np.int32).reshape(2, 5)}
    calls = _two_processes(monkeypatch, {"tokens": batch["tokens"][::-1].copy()})
    checker = _checker(process_block=0, process_blocks=1)
    with pytest.raises(jc.BatchError, match=r"processes \[0, 1\] hold the same rows"):
        checker.check_processes_agree(batch)
    assert calls == [1]


def test_agreeing_processes_are_checked_once(monkeypatch):
    batch = {"tokens": np.arange(10, dtype=np.int32).reshape(2, 5)}
    calls = _two_processes(monkeypatch, {"tokens": batch["tokens"].copy()})
    checker = _checker(process_block=0, process_blocks=1)
    checker.check_processes_agree(batch)
    checker.check_processes_agree({"tokens": batch["tokens"] + 1})  # not checked again
    assert calls == [1]


def test_processes_in_different_blocks_may_pass_different_data(monkeypatch):
    batch = {"tokens": np.arange(10, dtype=np.int32).reshape(2, 5)}
    calls = _two_processes(monkeypatch, {"tokens": batch["tokens"] + 1}, peer_block=1)
    _checker(process_block=0, process_blocks=1).check_processes_agree(batch)
    # With as many blocks as processes, no process shares rows: nothing to gather.
    _checker(process_block=0, process_blocks=2).check_processes_agree(batch)
    assert calls == [1]


def test_engine_names_the_rows_this_process_passes():
    engine = jc.Engine(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=2)
    assert engine.process_batch_block == (0, 1)
    assert engine.local_rows(16) == (0, 16)
    with pytest.raises(jc.BatchError, match="multiple of the 4 shards"):
        engine.local_rows(6)


def test_global_arrays_count_by_shape_in_the_fingerprint():
    import jax
    import jax.numpy as jnp

    from jaxcore.batch_checks import fingerprint

    device = jnp.arange(10, dtype=jnp.int32).reshape(2, 5)
    assert isinstance(device, jax.Array)
    same_shape = {"tokens": device + 1}
    assert (fingerprint({"tokens": device}) == fingerprint(same_shape)).all()
    host = {"tokens": np.arange(10, dtype=np.int32).reshape(2, 5)}
    assert not (fingerprint(host) == fingerprint({"tokens": host["tokens"] + 1})).all()
