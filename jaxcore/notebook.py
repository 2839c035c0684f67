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

import contextlib
import json
import logging
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from jaxcore.errors import ConfigError
from jaxcore.launch import LaunchError, check_platform, free_port, rank_envs, run_group

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
    if devices_per_process is not None and devices_per_process < 1:
        # 0 used to mean the default (one device), -1 a crash in every rank's XLA client.
        raise ConfigError(
            f"notebook_launcher(devices_per_process={devices_per_process}): must be >= 1 "
            "(or None: one device per process)."
        )
    for name, seconds in (("timeout_s", timeout_s), ("init_timeout_s", init_timeout_s)):
        if seconds is not None and seconds <= 0:
            raise ConfigError(f"notebook_launcher({name}={seconds}): must be > 0 seconds.")
    if not isinstance(args, (tuple, list)):
        # `args=(20)` is the int 20, and `args=("data.txt")` a string that would be spread
        # into one argument per character; accelerate's notebook_launcher takes a tuple too.
        raise ConfigError(
            f"notebook_launcher(args={args!r}): args is the tuple of fn's positional "
            f"arguments; for one argument write args=({args!r},), with the comma."
        )
    import cloudpickle  # a dependency of grain; imported here so `import jaxcore` never needs it

    with tempfile.TemporaryDirectory(prefix="jaxcore-nb-") as tmp:
        work = Path(tmp)
        payload = work / "payload.pkl"
        try:
            payload.write_bytes(cloudpickle.dumps((fn, tuple(args))))
        except Exception as e:
            raise ConfigError(_cannot_send(fn, args, e)) from e
        # A forked process would inherit the kernel's `sys.path` (a folder the notebook
        # appended, e.g. on Google Drive); a spawned one must be told it.
        (work / "sys_path.json").write_text(json.dumps([p for p in sys.path if p]))
        check_platform(platform)
        coordinator = f"127.0.0.1:{free_port()}"
        envs = rank_envs(
            num_processes,
            coordinator,
            devices_per_process=devices_per_process,
            platform=platform,
            init_timeout_s=init_timeout_s,
        )
        command = [
            sys.executable,
            "-u",
            "-m",
            "jaxcore.notebook",
            str(payload),
            str(work),
            "all" if return_all else "first",
        ]
        # Nothing forwards SIGTERM to notebook ranks; the grace only bounds how long they
        # may take to stop once the kernel is gone (restarted, killed): `jaxcore.lifeline`.
        out = _CellOutput(sys.stdout)
        try:
            result = run_group(
                [command] * num_processes,
                envs,
                out=out,
                timeout_s=timeout_s,
                sigterm_grace_s=KERNEL_GONE_GRACE_S,
            )
        finally:
            out.close()
        if result.returncode == 124 and result.failed_rank is None:
            raise LaunchError(f"notebook_launcher: timed out after {timeout_s} s.")
        if result.returncode:
            rank = result.failed_rank
            said = (
                [x for x in result.tails[rank] if x.startswith(_MESSAGE)]
                if rank is not None
                else []
            )
            if said:  # the rank explained itself in one line: no traceback to show
                raise LaunchError(said[-1])
            raise LaunchError(f"notebook_launcher: {result.describe_failure()}")
        wanted = range(num_processes) if return_all else range(1)
        results = [pickle.loads((work / f"result{rank}.pkl").read_bytes()) for rank in wanted]
    return results if return_all else results[0]


_MESSAGE = "notebook_launcher: "
"""How a rank's one-line explanation starts (the parent raises it as it is)."""

_CHILD_FAILED = 1


class _CellOutput:
    """The ranks' lines, written to the cell in batches by one thread that never ends.

    A notebook's ``sys.stdout`` sends one message to the front end per flush; 10,000
    lines flushed one by one take minutes to reach the cell (and hold up the ranks, whose
    pipes fill meanwhile). Lines are gathered and flushed every ``interval_s`` instead,
    so output still appears while the ranks run. One writing thread serves every call
    for the life of the kernel (ipykernel opens a socket for each thread that writes to
    the cell, so a writer per call would leave a socket per call).
    """

    _lock = threading.Lock()  # guards _pending and the start of the thread
    _write_lock = threading.Lock()  # keeps the writes in order
    _pending: list[tuple[TextIO, str]] = []  # noqa: RUF012 (shared by every call)
    _thread: threading.Thread | None = None

    def __init__(self, out: TextIO, interval_s: float = 0.1) -> None:
        self._out = out
        cls = type(self)
        with cls._lock:
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(
                    target=cls._pump, args=(interval_s,), name="jaxcore-nb-out", daemon=True
                )
                cls._thread.start()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending.append((self._out, text))
        return len(text)

    def flush(self) -> None:  # the pump flushes; `_stream` calls this after every line
        pass

    @classmethod
    def _pump(cls, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            cls._drain()

    @classmethod
    def _drain(cls) -> None:
        with cls._write_lock:
            with cls._lock:
                pending, cls._pending = cls._pending, []
            by_out: dict[int, tuple[TextIO, list[str]]] = {}
            for out, text in pending:
                by_out.setdefault(id(out), (out, []))[1].append(text)
            for out, texts in by_out.values():
                with contextlib.suppress(OSError, ValueError):
                    out.write("".join(texts))
                    out.flush()

    def close(self) -> None:
        """Write what is left (from the caller's thread, which outlives the call)."""
        self._drain()


def _cannot_send(fn: Callable[..., Any], args: Sequence[Any], error: Exception) -> str:
    """Which argument, closure variable or global of ``fn`` cannot be pickled, and the fix."""
    import cloudpickle

    def fails(value: Any) -> bool:
        try:
            cloudpickle.dumps(value)
        except Exception:
            return True
        return False

    name = getattr(fn, "__qualname__", None) or repr(fn)
    culprit = f"the function {name!r}"
    bad_args = [i for i, a in enumerate(args) if fails(a)]
    if bad_args:
        culprit = f"argument {bad_args[0]} ({type(args[bad_args[0]]).__name__})"
    elif (code := getattr(fn, "__code__", None)) is not None:
        cells = dict(
            zip(code.co_freevars, [c.cell_contents for c in fn.__closure__ or ()], strict=False)
        )
        globals_ = getattr(fn, "__globals__", {})
        used = {n: globals_[n] for n in _names(code) if n in globals_}
        for kind, names in (("variable", cells), ("global", used)):
            bad = [n for n, v in names.items() if fails(v)]
            if bad:
                culprit = f"{kind} {bad[0]!r} ({type(names[bad[0]]).__name__}) used by {name!r}"
                break
    return (
        f"{_MESSAGE}cannot send {culprit} to the child processes ({error}). The function and "
        "its arguments are pickled (cloudpickle) for the new processes: create such objects "
        "(locks, open files, clients, generators) inside the function, or pass what they "
        "are made from (a path, a seed) as plain data."
    )


def _names(code: Any) -> list[str]:
    """The global names a code object and the functions nested in it use."""
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names += _names(const)
    return names


def _child(payload: str, work: str, which: str = "first") -> int:
    """Body of a spawned process: join the run, call the function, save its result.

    After a failure the process ends with ``os._exit``: a normal exit would run
    `jax.distributed.shutdown`, a barrier the other ranks (blocked in a collective that
    waits for this one) never reach, and the cell would hang instead of failing.
    """
    from jaxcore.distributed import initialize

    with contextlib.suppress(OSError, ValueError):
        for p in json.loads(Path(work, "sys_path.json").read_text()):
            if p not in sys.path:
                sys.path.append(p)
    initialize()
    import cloudpickle
    import jax

    rank = jax.process_index()
    try:
        fn, args = pickle.loads(Path(payload).read_bytes())
    except Exception as e:
        _fail(
            f"{_MESSAGE}process {rank} could not load the function ({type(e).__name__}: {e}). "
            "Everything it uses must be importable in a fresh Python process: define the "
            "function in a module on sys.path, or make that module importable there."
        )
    try:
        value = _to_host(fn(*args))
    except BaseException:
        traceback.print_exc()
        _fail(None)
    if rank == 0 or which == "all":
        try:
            data = cloudpickle.dumps(value)
        except Exception as e:
            _fail(
                f"{_MESSAGE}the result of process {rank} cannot be sent back "
                f"({type(e).__name__}: {e}). Return plain data (numbers, arrays, dicts) "
                "instead of objects such as generators, locks or open files."
            )
        tmp = Path(work, f".result{rank}.pkl")
        tmp.write_bytes(data)
        tmp.replace(Path(work, f"result{rank}.pkl"))
    return 0


def _fail(message: str | None) -> NoReturn:
    if message:
        print(message, flush=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(_CHILD_FAILED)


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
    sys.exit(_child(*sys.argv[1:4]))
