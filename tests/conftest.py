"""Test defaults: 8 fake CPU devices for every test, set before JAX is imported."""

import os

# LLVM at -O0 halves XLA's CPU compile time (measured: a ZeRO-3 tiny-model engine's
# prepare 4.7 s -> 1.4 s, first step 4.2 s -> 2.5 s); the tests run tiny programs, where
# compiling dominates. Child processes the tests start inherit both flags.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest


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
