"""`notebook_launcher`: run a function as N processes of one JAX run, from a notebook.

A notebook kernel usually has JAX imported and its backend started before anyone thinks
of multiple processes, and a forked child would inherit that initialised runtime (and
its threads), which JAX does not support. So the children are *spawned*: fresh Python
interpreters (``python -m jaxcore.notebook``) that receive the function and its
arguments by value through ``cloudpickle`` (functions defined in the notebook's
``__main__`` are not importable by name), join the run through `jaxcore.initialize` like
any launched script, and write their results to files. The parent streams each child's
output into the cell, prefixed by rank, and returns process 0's result. Accelerate's
``notebook_launcher`` plays the same role for PyTorch (it forks on CPU; JAX cannot).
"""

from __future__ import annotations

import logging
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.launch import LaunchError, free_port, rank_envs, run_group

log = logging.getLogger(__name__)

KERNEL_GONE_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL for ranks whose kernel has ended."""


def notebook_launcher(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    num_processes: int = 2,
    devices_per_process: int | None = None,
    platform: str = "cpu",
    timeout_s: float | None = None,
    init_timeout_s: float = 120.0,
    return_all: bool = False,
) -> Any:
    """Call ``fn(*args)`` in ``num_processes`` spawned processes; return process 0's result.

    Each process calls `jaxcore.initialize` before ``fn``, so inside ``fn``
    ``jax.process_index()``, ``jax.devices()`` and the engine see the whole run. On CPU
    each process gets ``devices_per_process`` fake devices (default 1). `jax.Array`s in
    the result come back as NumPy (global ones whole, e.g. a train step's metrics). With
    ``return_all`` the list of every process's result is returned. Raises `LaunchError`
    naming the rank (with its traceback) when a process fails.
    """
    if num_processes < 1:
        raise ConfigError(f"notebook_launcher(num_processes={num_processes}): must be >= 1.")
    import cloudpickle  # a dependency of grain; imported here so `import jaxcore` never needs it

    with tempfile.TemporaryDirectory(prefix="jaxcore-nb-") as tmp:
        work = Path(tmp)
        payload = work / "payload.pkl"
        try:
            payload.write_bytes(cloudpickle.dumps((fn, tuple(args))))
        except Exception as e:
            raise ConfigError(
                f"notebook_launcher: could not pickle {getattr(fn, '__name__', fn)!r} and its "
                f"arguments for the child processes ({e}). Pass plain data as arguments."
            ) from e
        coordinator = f"127.0.0.1:{free_port()}"
        envs = rank_envs(
            num_processes,
            coordinator,
            devices_per_process=devices_per_process,
            platform=platform,
            init_timeout_s=init_timeout_s,
        )
        command = [sys.executable, "-u", "-m", "jaxcore.notebook", str(payload), str(work)]
        # Nothing forwards SIGTERM to notebook ranks; the grace only bounds how long they
        # may take to stop once the kernel is gone (restarted, killed): `jaxcore.lifeline`.
        result = run_group(
            [command] * num_processes,
            envs,
            out=sys.stdout,
            timeout_s=timeout_s,
            sigterm_grace_s=KERNEL_GONE_GRACE_S,
        )
        if result.returncode == 124 and result.failed_rank is None:
            raise LaunchError(f"notebook_launcher: timed out after {timeout_s} s.")
        if result.returncode:
            raise LaunchError(f"notebook_launcher: {result.describe_failure()}")
        results = [
            pickle.loads((work / f"result{rank}.pkl").read_bytes()) for rank in range(num_processes)
        ]
    return results if return_all else results[0]


def _child(payload: str, work: str) -> int:
    """Body of a spawned process: join the run, call the function, save its result."""
    from jaxcore.distributed import initialize

    initialize()
    import cloudpickle
    import jax

    fn, args = pickle.loads(Path(payload).read_bytes())
    try:
        value = _to_host(fn(*args))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    Path(work, f"result{jax.process_index()}.pkl").write_bytes(cloudpickle.dumps(value))
    return 0


def _to_host(value: Any) -> Any:
    """``value`` with its `jax.Array` leaves as NumPy, so the parent can unpickle them.

    A train step's metrics are global arrays that span every process, which cannot be
    pickled as they are: replicated ones are read from a local copy, sharded ones are
    gathered (a collective: every process returns the same structure, as `fn` runs the
    same code everywhere).
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    def leaf(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(leaf, value)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
