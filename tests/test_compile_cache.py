"""The run's persistent compilation cache (tests/conftest.py): one folder for both
workers, entries that appear whole or not at all, and JAX's own fallback when a process
it does not patch (a test's child) left a truncated entry: a recompile, never a wrong
program."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import lru_cache

from tests.conftest import run_cache_dir
from tests.inference.helpers import count_compiles

pytestmark = pytest.mark.usefixtures("compile_cache")


def test_both_workers_share_one_folder_per_run_and_a_serial_run_has_its_own():
    run = Path("/tmp/pytest-of-u/pytest-7")
    gw0, gw1 = run_cache_dir(run / "popen-gw0", "gw0"), run_cache_dir(run / "popen-gw1", "gw1")
    assert gw0 == gw1 == run / "xla-cache"
    assert run_cache_dir(run, None) == run / "xla-cache"


def test_an_entry_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
    value = bytes(range(256)) * 64
    seen = []
    kind = type(cache.path)  # JAX's path class (etils' epath where installed)
    real_write = kind.write_bytes

    def crash_half_way(path, data):  # the writer dies in the middle of its write
        real_write(path, data[: len(data) // 2])
        seen.append(cache.get("k"))  # what another process would read meanwhile
        raise KeyboardInterrupt

    monkeypatch.setattr(kind, "write_bytes", crash_half_way)
    with pytest.raises(KeyboardInterrupt):
        cache.put("k", value)
    assert seen == [None]
    assert cache.get("k") is None  # a miss (recompile), not half an executable
    monkeypatch.undo()
    cache.put("k", value)
    assert cache.get("k") == value


def _entries(name: str) -> list[Path]:
    return sorted(Path(jax.config.jax_compilation_cache_dir).glob(f"jit_{name}-*-cache"))


def test_a_cache_hit_still_counts_as_a_compile():
    def hit_probe(x):
        return jnp.sin(x) * 3.0

    x = jnp.arange(5.0)
    expected = np.asarray(jax.jit(hit_probe)(x))
    assert len(_entries("hit_probe")) == 1
    jax.clear_caches()  # the next call looks the program up on disk
    with count_compiles() as compiles:
        np.testing.assert_array_equal(jax.jit(hit_probe)(x), expected)
    assert compiles.count == 1


def test_a_truncated_entry_is_recompiled_not_trusted():
    def truncation_probe(x):
        return jnp.cos(x) + 2.0

    x = jnp.arange(7.0)
    expected = np.asarray(jax.jit(truncation_probe)(x))
    (entry,) = _entries("truncation_probe")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])  # as a child killed mid-write leaves it
    jax.clear_caches()
    with pytest.warns(UserWarning, match="Error reading persistent compilation cache"):
        np.testing.assert_array_equal(jax.jit(truncation_probe)(x), expected)
