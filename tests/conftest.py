"""Test defaults: 8 fake CPU devices for every test, set before JAX is imported; one JAX
persistent compilation cache per test run, shared by both xdist workers."""

import os
import sys
import tempfile
from pathlib import Path

# LLVM at -O0 halves XLA's CPU compile time (measured: a ZeRO-3 tiny-model engine's
# prepare 4.7 s -> 1.4 s, first step 4.2 s -> 2.5 s); the tests run tiny programs, where
# compiling dominates. Child processes the tests start inherit both flags.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _cache_bytecode() -> None:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set (container images set it to keep pyc files
    out of site-packages), cache bytecode in one folder outside the tree instead: else every
    Python process the tests start compiles jax, flax and orbax from source again (the
    `import jax, jaxcore.checkpoint` of a subprocess: 4.6 -> 1.8 CPU-s). A user's own
    ``PYTHONPYCACHEPREFIX`` is kept. Child processes inherit the setting."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = str(Path(tempfile.gettempdir()) / f"jaxcore-tests-pycache-{os.getuid()}")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, prefix


_cache_bytecode()

import jax  # noqa: E402
import pytest  # noqa: E402
from jax._src import lru_cache  # noqa: E402


def pytest_configure(config):
    assert jax.device_count() == 8, (
        f"tests expect 8 CPU devices, got {jax.device_count()}: XLA_FLAGS was set too late"
    )


# ------------------------------------------------------------------ pytest-xdist
# `make test` runs two workers with `--dist loadfile`: each test file is one work unit, so
# its module fixtures (often a compiled model) are built once, not once per worker. The
# dashboard's files are one unit too: they share a session fixture. (`--dist loadgroup`
# cannot do this here: xdist 3.8 groups by rewriting `item._nodeid`, which pytest 9.2 no
# longer reads, so its `xdist_group` marks are silently ignored.)
SHARED_SESSION_DIRS = ("tests/jaxcore/ui/",)


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((d for d in SHARED_SESSION_DIRS if path.startswith(d)), path)


@pytest.hookimpl(optionalhook=True)  # `-p no:xdist` still runs
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None  # xdist's own scheduler for the other modes
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """`--dist loadfile`, with the folders of SHARED_SESSION_DIRS as one unit each."""

        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return FileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Under xdist, files with slow tests go first so the fast ones fill the run's tail
    (the scheduler hands out units in this order with `--no-loadscope-reorder`)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return  # a serial run keeps pytest's order
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_work_unit(item.nodeid), []).append(item)
    slow_first = sorted(
        units.values(), key=lambda u: not any(i.get_closest_marker("slow") for i in u)
    )
    items[:] = [item for unit in slow_first for item in unit]


# ------------------------------------------------------------------ compile cache
# JAX writes a cache entry with one `write_bytes` and no lock (jax 0.10.2 `lru_cache.py`:
# the file lock exists only with `jax_compilation_cache_max_size` set, whose eviction scan
# re-reads every entry's access time on each write: 0.58 s a write at 1,000 entries). So
# a worker could read the other's half-written entry. JAX does survive that (zlib rejects
# the truncated stream, JAX warns and compiles: tests/test_compile_cache.py), but under
# `warnings.simplefilter("error")` the warning would fail a test. Entries are written to
# a temporary name and renamed instead (atomic on POSIX), as Orbax finalizes a checkpoint.
def _atomic_put(self: lru_cache.LRUCache, key: str, value: bytes) -> None:
    """`LRUCache.put` for an unbounded cache, with the entry renamed into place."""
    if not key:
        raise ValueError("key cannot be empty")
    path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"
    if path.exists():
        return
    tmp = self.path / f".{key}.{os.getpid()}.tmp"
    tmp.write_bytes(value)
    os.replace(tmp, path)


def run_cache_dir(basetemp: Path, worker: str | None) -> Path:
    """The run's cache: under xdist the workers' base folders (`<run>/popen-gwN`) share
    their parent, a fresh folder per run that pytest prunes like any other."""
    return (basetemp.parent if worker else basetemp) / "xla-cache"


@pytest.fixture(scope="session", autouse=True)
def xla_cache_dir(tmp_path_factory) -> Path:
    """JAX's persistent compilation cache, on for every test of the run: a program the
    other worker (or an earlier file) compiled is read, not recompiled. Only compiles of
    1 s or more are written (JAX's default threshold; `compile_cache` lowers it). A hit
    still counts as a backend compile (`tests/inference/helpers.count_compiles`), and
    the key hashes the program, flags and devices, so no test's check loosens."""
    if jax.config.jax_compilation_cache_max_size != -1:
        pytest.exit("tests/conftest.py writes cache entries for an unbounded cache only")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    chosen = jax.config.jax_compilation_cache_dir  # the user's JAX_COMPILATION_CACHE_DIR
    cache = Path(chosen) if chosen else run_cache_dir(tmp_path_factory.getbasetemp(), worker)
    cache.mkdir(parents=True, exist_ok=True)
    before = lru_cache.LRUCache.put
    lru_cache.LRUCache.put = _atomic_put
    jax.config.update("jax_compilation_cache_dir", str(cache))
    yield cache
    lru_cache.LRUCache.put = before


CACHE_THRESHOLDS = (
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture(scope="module")
def compile_cache(xla_cache_dir) -> Path:
    """Every program this module compiles goes into the run's cache, however small: for
    modules that build one shape several times (a trial restarted, a run resumed)."""
    before = {k: getattr(jax.config, k) for k in CACHE_THRESHOLDS}
    for k in CACHE_THRESHOLDS:
        jax.config.update(k, 0)
    yield xla_cache_dir
    for k, v in before.items():
        jax.config.update(k, v)
