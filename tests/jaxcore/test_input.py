"""The Grain loader: epochs, packing, resume, streaming, two processes, the stdlib source."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxcore as jc
from jaxcore.input import InputConfig, Loader, stdlib_source

from .procs.input_data import CONFIG, N_DOCS, documents

ROOT = Path(__file__).resolve().parents[2]


def _doc_ids(tokens) -> list[int]:
    return [int(row[0]) // 1000 for row in np.asarray(tokens)]


def test_pad_mode_sees_every_document_once_per_epoch_and_reshuffles():
    loader = Loader(documents(), CONFIG)
    per_epoch = N_DOCS // CONFIG.global_batch_size
    epochs = []
    for _ in range(2):
        ids = []
        for _ in range(per_epoch):
            batch = next(loader)
            ids += _doc_ids(batch["tokens"])
            lengths = batch["mask"].sum(1)
            assert np.array_equal(lengths, [min(1 + i % 6, 8) for i in _doc_ids(batch["tokens"])])
        epochs.append(ids)
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(N_DOCS))
    assert epochs[0] != epochs[1], "each epoch has its own order"


def test_pack_mode_covers_every_token_once_per_epoch():
    cfg = InputConfig(global_batch_size=2, seq_len=4, mode="pack", seed=3, eos_id=None)
    loader = Loader(documents(), cfg)
    total = sum(1 + i % 6 for i in range(N_DOCS))
    rows = loader.rows_per_epoch
    assert rows == total // 5
    seen = np.concatenate([next(loader)["tokens"].ravel() for _ in range(rows // 2)])
    every = np.concatenate([np.asarray(d) for d in documents()])
    assert len(set(seen.tolist())) == len(seen), "no token twice within an epoch"
    assert set(seen.tolist()) <= set(every.tolist())
    assert len(seen) >= total - 5 - 5


def test_resume_from_saved_position_continues_the_exact_sequence():
    cfg = InputConfig(global_batch_size=4, seq_len=16, seed=9)
    first = Loader(stdlib_source(max_files=10), cfg)
    for _ in range(5):
        next(first)
    position = json.loads(json.dumps(first.state_dict()))
    expected = [next(first) for _ in range(4)]
    second = Loader(stdlib_source(max_files=10), cfg)
    second.load_state_dict(position)
    for want in expected:
        got = next(second)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    first.close()
    second.close()
    with pytest.raises(jc.ConfigError, match="seed"):
        Loader(
            stdlib_source(max_files=10), InputConfig(global_batch_size=4, seq_len=16)
        ).load_state_dict(position)


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_streaming_source_resumes_from_grain_state(mode):
    cfg = InputConfig(global_batch_size=2, seq_len=5, mode=mode, eos_id=0)
    stream = lambda: documents().to_iter_dataset()
    first = Loader(stream(), cfg)
    next(first)
    position = json.loads(json.dumps(first.state_dict()))
    expected = [next(first) for _ in range(3)]
    second = Loader(stream(), cfg)
    second.load_state_dict(position)
    for want in expected:
        assert np.array_equal(next(second)["tokens"], want["tokens"])
    first.close()
    second.close()


def test_global_batches_are_sharded_arrays():
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=4, tensor=2))
    loader = Loader(documents(), CONFIG, engine.batch_sharding)
    batch = next(loader)
    assert batch["tokens"].shape == (8, 8) and batch["tokens"].sharding == engine.batch_sharding
    assert np.array_equal(np.asarray(batch["tokens"]), loader.local_batch(0)["tokens"])


def test_stdlib_source_is_deterministic_bytes():
    src = stdlib_source(max_files=5)
    again = stdlib_source(max_files=5)
    assert src.files == again.files == tuple(sorted(src.files))
    raw = (Path(src.root) / src.files[0]).read_bytes()
    assert bytes(src[0].astype(np.uint8)) == raw and src.lengths[0] == len(raw)


def test_config_errors_name_the_field():
    with pytest.raises(jc.ConfigError, match="mode"):
        InputConfig(global_batch_size=8, seq_len=8, mode="chunk")
    with pytest.raises(jc.ConfigError, match="global_batch_size"):
        InputConfig(global_batch_size=0, seq_len=8)
    with pytest.raises(jc.ConfigError, match="source"):
        Loader(object(), CONFIG)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(tmp_path, first, last):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    outs = [tmp_path / f"p{i}-{first}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.jaxcore.procs.input_worker",
                str(port),
                str(i),
                str(outs[i]),
                str(first),
                str(last),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-3000:]
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_split_each_epoch_and_resume_on_one(tmp_path):
    per_epoch = N_DOCS // CONFIG.global_batch_size  # 3 steps
    # Two processes read epoch 0 and the first step of epoch 1...
    p0, p1 = _two_processes(tmp_path, 0, per_epoch + 1)
    single = Loader(documents(), CONFIG)
    for step in range(per_epoch + 1):
        want = single.local_batch(step)["tokens"]
        assert np.array_equal(np.array(p0["global"][step]), want)
        assert np.array_equal(np.array(p1["global"][step]), want)
        assert np.array_equal(np.array(p0["local"][step]), want[:4])
        assert np.array_equal(np.array(p1["local"][step]), want[4:])
    local_ids = [_doc_ids(b) for p in (p0, p1) for b in p["local"][:per_epoch]]
    ids = [i for part in local_ids for i in part]
    assert sorted(ids) == list(range(N_DOCS)), "each document once per epoch over 2 processes"
    # ... and one process resumes at step 4 (a saved position) and finishes epoch 1.
    resumed = Loader(documents(), CONFIG)
    resumed.load_state_dict({**single.state_dict(), "step": per_epoch + 1})
    rest = [next(resumed)["tokens"] for _ in range(per_epoch - 1)]
    epoch1 = _doc_ids(np.array(p0["global"][per_epoch])) + [i for b in rest for i in _doc_ids(b)]
    assert sorted(epoch1) == list(range(N_DOCS))
