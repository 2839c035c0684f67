"""The input side driven as a user (stop 45): positions saved by another loader, raw
ArrayRecord records, a loader left open at exit, and resume at any stop point."""

import subprocess
import sys
import textwrap

import grain
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcore.errors import ConfigError
from jaxcore.input import InputConfig, Loader

DOCS = [np.arange(1, 1 + n, dtype=np.int32) for n in (3, 5, 30, 2, 7, 9, 4)]


def _grain_iterator_state():
    it = iter(grain.MapDataset.source(DOCS).to_iter_dataset())
    next(it)
    return it.get_state()


@pytest.mark.parametrize(
    "state",
    [
        _grain_iterator_state(),  # a checkpoint written with a Grain iterator
        {"epoch": 0, "batch": 3, "rng": [1, 2]},  # a torchbridge.TorchLoader position
        b'{"next_index": 1}',  # Grain DataLoader iterators give bytes
        None,
    ],
    ids=["grain-iterator", "torchloader", "bytes", "none"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["random-access", "stream"])
def test_a_position_saved_by_another_loader_is_refused_naming_it(state, stream):
    # Before: "the saved input position is for a None source" or AttributeError: 'bytes'
    # object has no attribute 'get'.
    source = grain.MapDataset.source(DOCS).to_iter_dataset() if stream else DOCS
    loader = Loader(source, InputConfig(global_batch_size=2, seq_len=4))
    with pytest.raises(ConfigError, match=r"not a jaxcore\.Loader position") as err:
        loader.set_state(state)
    assert "None source" not in str(err.value)
    assert loader.step == 0
    loader.close()


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_raw_arrayrecord_records_name_the_decoding(mode):
    # Before: "input element of shape () and dtype |S12", with no way out.
    records = [np.arange(n, dtype="<u4").tobytes() for n in (3, 5, 9)]
    with pytest.raises(ConfigError, match=r"raw bytes .*open_dataset"):
        loader = Loader(records, InputConfig(global_batch_size=2, seq_len=4, mode=mode))
        next(loader)
    decoded = grain.MapDataset.source(records).map(lambda b: np.frombuffer(b, "<u4"))
    loader = Loader(decoded, InputConfig(global_batch_size=2, seq_len=4, mode=mode, shuffle=False))
    assert next(loader)["tokens"][0].tolist()[:3] == [0, 1, 2]


def test_a_loader_left_open_exits_without_a_traceback():
    # Before: a stream Loader that the script never closed (the README's
    # `for _, batch in zip(range(n), loader)`) printed "Exception ignored in
    # DatasetIterator.__del__ ... AttributeError" at interpreter exit; with worker_count,
    # a batch still held printed "SharedMemoryArray.__del__ ... AttributeError".
    script = textwrap.dedent(
        """
        import grain, numpy as np
        from jaxcore.input import InputConfig, Loader
        docs = [np.arange(1, 1 + n, dtype=np.int32) for n in (3, 5, 30, 2)]
        stream = Loader(grain.MapDataset.source(docs).to_iter_dataset(),
                        InputConfig(global_batch_size=2, seq_len=4))
        indexed = Loader(docs, InputConfig(global_batch_size=2, seq_len=4))
        for _, a, b in zip(range(2), stream, indexed):
            pass
        # Worker processes: the batch kept at exit was Grain's SharedMemoryArray, whose
        # __del__ ran after module teardown.
        workers = Loader(docs, InputConfig(global_batch_size=2, seq_len=4, worker_count=1))
        batch = next(workers)
        print(type(batch["tokens"]).__name__, "done")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ndarray done"
    assert "Exception ignored" not in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


def _batches(loader, n):
    return [{k: v.tolist() for k, v in next(loader).items()} for _ in range(n)]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    stop=st.integers(0, 12),
    mode=st.sampled_from(["pad", "pack"]),
    stream=st.booleans(),
    eos=st.sampled_from([None, 99]),
    seed=st.integers(0, 3),
)
def test_resume_at_any_stop_continues_the_uninterrupted_run(stop, mode, stream, eos, seed):
    """get_state() after `stop` batches, set_state() on a fresh loader: the next batches
    are the uninterrupted run's (random access across epoch ends; a repeating stream)."""
    cfg = InputConfig(global_batch_size=2, seq_len=5, mode=mode, seed=seed, eos_id=eos)

    def make():
        if stream:
            return Loader(grain.MapDataset.source(DOCS).repeat().to_iter_dataset(), cfg)
        return Loader(DOCS, cfg)

    whole = make()
    reference = _batches(whole, stop + 3)
    whole.close()
    first = make()
    assert _batches(first, stop) == reference[:stop]
    state = first.get_state()
    first.close()
    resumed = make()
    resumed.set_state(state)
    assert resumed.step == stop
    assert _batches(resumed, 3) == reference[stop:]
    resumed.close()


@pytest.mark.parametrize(
    "change", [{"global_batch_size": 4}, {"seq_len": 8}], ids=["batch", "seq_len"]
)
@pytest.mark.parametrize("stream", [False, True], ids=["random-access", "stream"])
def test_a_changed_batch_or_seq_len_on_resume_is_refused_naming_it(change, stream):
    def make(**kw):
        cfg = InputConfig(**{"global_batch_size": 2, "seq_len": 4, **kw})
        src = grain.MapDataset.source(DOCS).repeat().to_iter_dataset() if stream else DOCS
        return Loader(src, cfg)

    first = make()
    next(first)
    state = first.get_state()
    first.close()
    ((key, value),) = change.items()
    with pytest.raises(ConfigError, match=f"InputConfig.{key}={value} differs .* Resume with"):
        make(**change).set_state(state)
