"""A researcher's own data and runs off the tested path: Grain worker processes in a plain
script, and a second Checkpointer on a directory a live run is saving to."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys

import grain
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.checkpointing import writer_lock

from .helpers import factory

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = pathlib.Path(__file__).parent / "scripts"


def _script(name: str, *args: str) -> subprocess.Popen:
    """A helper script in a fresh interpreter (absl's flags unparsed, as in any script)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPTS / name), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"the script ended: {proc.stderr.read()[-3000:]}")
    return line.strip()


def _temporaries(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if "orbax-checkpoint-tmp" in p.name)


def test_a_second_checkpointer_leaves_a_live_runs_save_alone(tmp_path):
    """Building a Checkpointer (to read, export, or a second run) on a directory used to
    delete every temporary step in it, the save a live run was writing included: that
    run lost the step with FileNotFoundError on .../2.orbax-checkpoint-tmp. Leftovers of
    a killed save are now removed by the next run's first save, under the writer lock."""
    directory = tmp_path / "run dir ✓"  # a space and non-ASCII in the path
    writer = _script("writer_stop37.py", str(directory))
    try:
        assert _line(writer) == "BLOCKED 2"
        assert _temporaries(directory) == ["2.orbax-checkpoint-tmp"]
        with jc.Checkpointer(jc.CheckpointConfig(directory=directory)) as reader:
            assert reader.latest_step() == 1
        assert _temporaries(directory) == ["2.orbax-checkpoint-tmp"]
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert _line(writer) == "BLOCKED 3"  # step 2 finalized, step 3 mid-save
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=60)
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert (directory / "2" / "jaxcore_manifest.json").is_file()
    assert _temporaries(directory) == ["3.orbax-checkpoint-tmp"]  # the killed save's
    engine = jc.Engine()
    with jc.Checkpointer(jc.CheckpointConfig(directory=directory), engine=engine) as ckpt:
        state, _ = ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
        assert ckpt.resumed_step == 2
        assert _temporaries(directory) == ["3.orbax-checkpoint-tmp"]  # not ours to judge yet
        ckpt.save(state.replace(step=jnp.int32(3)), force=True)
        ckpt.wait()
        assert _temporaries(directory) == []
        assert ckpt.all_steps() == [1, 2, 3]
    assert not writer_lock._held


def test_loader_worker_processes_run_in_a_plain_script():
    """InputConfig(worker_count=2) raised absl's UnparsedFlagAccessError ("Trying to access
    flag --grain_enable_multiprocess_worker_profiling before flags were parsed") in any
    program not started by absl.app.run. Over a random-access source the batches equal
    those of worker_count=0; a stream is read in per-worker shares, so its position resumes
    exactly with the same workers and is refused, naming the count, with others (Grain's
    TypeError/KeyError before)."""
    proc = _script("loader_workers_stop37.py")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    random_access, stream = result["random_access"], result["stream"]
    assert random_access["with_workers"] == random_access["without"]
    assert random_access["without_workers"] == "resumed"  # the step is the whole position
    assert stream["resumed"] == stream["with_workers"][3:]
    refused = stream["without_workers"]
    assert "worker_count=0 differs from the checkpoint's 2" in refused, refused
    assert "Resume with worker_count=2" in refused


def test_a_stream_position_from_other_workers_is_refused_at_restore():
    """A stream's position from worker_count=0 loaded into a loader with 2 workers was
    accepted, then failed at the first batch inside Grain (KeyError: 'exhausted'; the other
    way round, TypeError: _CtsState.__init__() got an unexpected keyword argument). It is
    refused when loaded, before any worker starts, naming the count to resume with."""
    docs = [np.arange(i, i + 9, dtype=np.int32) for i in range(12)]

    def loader(workers: int) -> jc.Loader:
        config = jc.InputConfig(global_batch_size=2, seq_len=8, worker_count=workers)
        return jc.Loader(grain.MapDataset.source(docs).to_iter_dataset(), config)

    first = loader(0)
    next(first)
    position = first.get_state()
    first.close()
    with pytest.raises(jc.ConfigError, match=r"worker_count=2 differs from the checkpoint's 0"):
        loader(2).set_state(position)


def test_a_full_disk_in_a_with_block_ends_with_the_checkpoint_error(tmp_path, monkeypatch):
    """Every write under step 2 fails with ENOSPC. The save raised CheckpointError, then
    the `with` block's close raised Orbax's queued metadata write as a raw "OSError: [Errno
    28] No space left on device: .../2.orbax-checkpoint-tmp/meta.orbax-checkpoint-tmp/
    metadata" over it. Now the CheckpointError is what comes out, and step 1 restores."""
    from etils import epath

    write_text = epath.Path.write_text

    def full_disk(path, *args, **kwargs):
        if "2.orbax-checkpoint-tmp" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_text(path, *args, **kwargs)

    engine = jc.Engine()
    state = engine.prepare(factory, optax.sgd(0.1))
    monkeypatch.setattr(epath.Path, "write_text", full_disk)
    with (
        pytest.raises(jc.CheckpointError) as raised,
        jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path), engine=engine) as ckpt,
    ):
        for step in (1, 2, 3):
            ckpt.save(state.replace(step=jnp.int32(step)), force=True)
    message = str(raised.value)
    assert "step 2" in message and "no space left on device" in message, message
    assert "a rerun resumes from step 1" in message
    monkeypatch.undo()
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path)) as ckpt:
        ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
        assert ckpt.resumed_step == 1
    assert not writer_lock._held


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some text", "more text"], tokenizers.trainers.BpeTrainer())
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_a_path_given_as_the_texts_is_refused_not_split_into_characters(tokenizer_file):
    """TextSource("data.jsonl", tok) used to give 10 one-character documents, silently."""
    for texts in ("data.jsonl", pathlib.Path("data.jsonl"), b"some text"):
        with pytest.raises(jc.ConfigError, match=r"not a sequence of documents.*JSONL"):
            jc.TextSource(texts, tokenizer_file)


def test_a_stream_of_texts_is_refused_with_the_streaming_way(tmp_path, tokenizer_file):
    """A Parquet read by Grain's ParquetIterDataset (or a generator) raised a bare
    "TypeError: object of type 'ParquetIterDataset' has no len()"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["some text", "more text"]}), tmp_path / "t.parquet")
    stream = grain.experimental.ParquetIterDataset(str(tmp_path / "t.parquet"))
    for texts in (stream, (t for t in ["some text"])):
        with pytest.raises(jc.ConfigError, match=r"must be random access.*grain.IterDataset"):
            jc.TextSource(texts, tokenizer_file)


def test_records_with_another_text_column_name_it_and_load_with_field(tokenizer_file):
    """A Parquet/JSONL whose column is "content": the error names the element and keys and
    says how to name the field (before: no way but rebuilding the records)."""
    rows = [{"id": 1, "content": "some text"}, {"id": 2, "content": "more text"}]
    with pytest.raises(jc.ConfigError, match=r"element 0 .*'text'.*field='content'"):
        jc.TextSource(rows, tokenizer_file)
    source = jc.TextSource(rows, tokenizer_file, field="content")
    assert list(source[1]) == list(jc.TextSource(["more text"], tokenizer_file)[0])
    rows.append({"id": 3})  # one line without the field: named, by its index
    with pytest.raises(jc.ConfigError, match=r"element 2 is a dict with keys \['id'\]"):
        jc.TextSource(rows, tokenizer_file, field="content")


class _NumpyPosition:
    """A researcher's loader whose position holds a NumPy integer."""

    def __init__(self, step_indexed: bool):
        self.step_indexed = step_indexed
        self.index = np.int64(3)

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state: dict) -> None:
        self.index = state["index"]


@pytest.mark.parametrize("step_indexed", [True, False])
def test_a_position_that_is_not_json_fails_the_save_that_got_it(tmp_path, step_indexed):
    """Before: with step_indexed the async save of step 1 returned True, the step was lost
    in Orbax's thread and the next save raised a bare "TypeError: Object of type int64 is
    not JSON serializable"; per process, that TypeError came from the first save."""
    engine = jc.Engine()
    state = engine.prepare(factory, optax.sgd(0.1))
    loader = _NumpyPosition(step_indexed)
    with jc.Checkpointer(jc.CheckpointConfig(directory=tmp_path), engine=engine) as ckpt:
        with pytest.raises(jc.ConfigError, match=r"_NumpyPosition.get_state\(\) .*not JSON"):
            ckpt.save(state.replace(step=jnp.int32(1)), loader, force=True)
        assert ckpt.all_steps() == []
