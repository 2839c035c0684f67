"""Cluster detection and `jax.distributed.initialize`, so one script runs anywhere.

`initialize()` is the first line of a training script. It works out whether this process
is one of several and, if so, where the coordinator is, from (first match wins, field by
field):

1. explicit arguments;
2. ``JAXCORE_COORDINATOR`` / ``JAXCORE_NUM_PROCESSES`` / ``JAXCORE_PROCESS_ID`` (what
   ``jaxcore launch`` and ``notebook_launcher`` set);
3. torchrun-style ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` / ``RANK``;
4. what JAX detects itself: Cloud TPU pods, Slurm, Open MPI, GKE;
5. otherwise a single process, and `initialize` does nothing.

It never hangs silently. JAX's own client aborts the process (a C++ ``CHECK``, no Python
exception) when the coordinator does not answer, so a non-zero rank first waits for the
coordinator's TCP port itself and raises `CoordinatorTimeoutError` naming the address;
process 0 (which waits for the others inside JAX) gets a watchdog that names the address
and exits with an error when the timeout passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import jax

from jaxcore.errors import ConfigError, JaxcoreError
from jaxcore.lifeline import watch_lifeline
from jaxcore.runtime import PREEMPTION_EXIT_CODE, port_unavailable

log = logging.getLogger(__name__)

ENV_COORDINATOR = "JAXCORE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXCORE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXCORE_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "JAXCORE_LOCAL_DEVICE_IDS"
ENV_TIMEOUT = "JAXCORE_INIT_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0


class CoordinatorTimeoutError(JaxcoreError):
    """The coordinator (or the other processes) did not show up within the timeout."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """What `detect` resolved: the arguments `jax.distributed.initialize` will get.

    Attributes:
        coordinator_address: ``host:port`` of process 0's coordinator (``None``: single
            process, or left for JAX's own detection to fill in).
        num_processes: number of processes in the run (``None``: JAX will detect it).
        process_id: this process's rank (``None``: JAX will detect it).
        local_device_ids: devices this process may use (``None``: all it sees).
        source: where the settings came from: ``arguments``, ``JAXCORE_*``, ``torchrun``,
            ``jax:<cluster>`` (slurm, ompi, tpu, gcetpu, gketpu, ...) or ``single process``.
        cluster_detection_method: passed to JAX when its detection is used.
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    source: str = "single process"
    cluster_detection_method: str | None = None

    @property
    def multi_process(self) -> bool:
        """Whether `jax.distributed.initialize` is needed (more than one process)."""
        if self.source.startswith("jax:"):
            return self.num_processes is None or self.num_processes > 1
        return (self.num_processes or 1) > 1


def _int(value: str | int | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: must be an integer.") from None


def _from_jaxcore_env(env: Mapping[str, str]) -> dict:
    ids = env.get(ENV_LOCAL_DEVICE_IDS)
    return {
        "coordinator_address": env.get(ENV_COORDINATOR) or None,
        "num_processes": _int(env.get(ENV_NUM_PROCESSES), ENV_NUM_PROCESSES),
        "process_id": _int(env.get(ENV_PROCESS_ID), ENV_PROCESS_ID),
        "local_device_ids": (
            tuple(_int(i, ENV_LOCAL_DEVICE_IDS) for i in ids.split(",")) if ids else None
        ),
    }


def _from_torchrun_env(env: Mapping[str, str]) -> dict:
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    return {
        "coordinator_address": f"{addr}:{port}" if addr and port else None,
        "num_processes": _int(env.get("WORLD_SIZE"), "WORLD_SIZE"),
        "process_id": _int(env.get("RANK"), "RANK"),
    }


def _from_jax_detection(method: str | None) -> tuple[str, dict] | None:
    """Ask JAX's own cluster environments (Slurm, Open MPI, Cloud TPU, GKE) what they see.

    Only the cheap fields are read here (the coordinator address of a TPU pod may need a
    metadata-server query, which JAX does itself inside ``initialize``).
    """
    try:
        from jax._src import clusters  # JAX's detection registry; private, hence the guard
    except ImportError:  # pragma: no cover - depends on the JAX version
        return None
    for env in clusters.ClusterEnv._cluster_types:
        if method is not None and env.name != method:
            continue
        if method is None and env.opt_in_only_method:
            continue
        try:
            if not env.is_env_present():
                continue
        except Exception:  # a broken probe must not stop a single-process run
            log.debug("cluster probe %s failed", env.name, exc_info=True)
            continue
        found: dict = {}
        if env.name in ("slurm", "ompi"):
            try:
                found = {
                    "num_processes": env.get_process_count(),
                    "process_id": env.get_process_id(),
                }
            except Exception:
                log.debug("could not read process count from %s", env.name, exc_info=True)
        return f"jax:{env.name or env.__name__}", found
    return None


def detect(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
    cluster_detection_method: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClusterSettings:
    """Resolve the cluster settings without starting anything (see the module docstring)."""
    env = os.environ if environ is None else environ
    fields = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
        "local_device_ids": tuple(local_device_ids) if local_device_ids is not None else None,
    }
    sources = []
    if any(v is not None for v in fields.values()):
        sources.append("arguments")
    layers = [("JAXCORE_*", _from_jaxcore_env(env)), ("torchrun", _from_torchrun_env(env))]
    if cluster_detection_method is not None or not any(
        v is not None for _, layer in layers for v in layer.values()
    ):
        found = _from_jax_detection(cluster_detection_method)
        if found is not None:
            layers.append(found)
            sources.append(found[0])
    origin = {key: "arguments" for key, value in fields.items() if value is not None}
    for name, layer in layers:
        used = False
        for key, value in layer.items():
            if fields[key] is None and value is not None:
                fields[key] = value
                origin[key] = name
                used = True
        if used and name not in sources:
            sources.append(name)
    source = "+".join(sources) if sources else "single process"
    settings = ClusterSettings(
        **fields, source=source, cluster_detection_method=cluster_detection_method
    )
    _validate(settings, origin)
    return settings


# How each field is spelled where it came from, for error messages.
_SPELLING = {
    "arguments": {
        "num_processes": "num_processes",
        "process_id": "process_id",
        "coordinator_address": "coordinator_address",
    },
    "JAXCORE_*": {
        "num_processes": ENV_NUM_PROCESSES,
        "process_id": ENV_PROCESS_ID,
        "coordinator_address": ENV_COORDINATOR,
    },
    "torchrun": {
        "num_processes": "WORLD_SIZE",
        "process_id": "RANK",
        "coordinator_address": "MASTER_ADDR:MASTER_PORT",
    },
}


def _validate(s: ClusterSettings, origin: Mapping[str, str] | None = None) -> None:
    if any(part.startswith("jax:") for part in s.source.split("+")):
        return
    origin = origin or {}

    def spelled(field: str, where: str | None = None) -> str:
        return _SPELLING.get(where or origin.get(field, ""), _SPELLING["arguments"])[field]

    if s.num_processes is not None and s.num_processes < 1:
        raise ConfigError(
            f"initialize: {spelled('num_processes')}={s.num_processes}: the number of "
            "processes must be >= 1."
        )
    if s.num_processes is None:
        # A rank (or, by hand, a coordinator) without the count used to run as a single
        # process: one rank of a hand-wired run training alone. torchrun's MASTER_ADDR and
        # MASTER_PORT alone stay a single process (some containers preset them).
        named = [
            f
            for f in ("process_id", "coordinator_address")
            if getattr(s, f) is not None
            and (f == "process_id" or origin.get(f) in ("arguments", "JAXCORE_*"))
        ]
        if named:
            field, where = named[0], origin.get(named[0])
            raise ConfigError(
                f"initialize: {spelled(field)}={getattr(s, field)!r} is set (from {where}) "
                "but the number of processes is not, so this process cannot tell which run "
                f"it belongs to. Set {spelled('num_processes', where)} too (`jaxcore "
                "launch` sets all three), or unset it for a single process."
            )
    if s.process_id is not None and not 0 <= s.process_id < (s.num_processes or 1):
        raise ConfigError(
            f"initialize: process_id={s.process_id} is outside 0..{(s.num_processes or 1) - 1} "
            f"(num_processes={s.num_processes}, from {s.source})."
        )
    if not s.multi_process:
        return
    missing = [
        name
        for name, value, env in (
            ("coordinator_address", s.coordinator_address, ENV_COORDINATOR),
            ("process_id", s.process_id, ENV_PROCESS_ID),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            f"initialize: {s.num_processes} processes were requested (from {s.source}) but "
            f"{', '.join(missing)} is not set. Pass it, or set JAXCORE_COORDINATOR=host:port "
            "and JAXCORE_PROCESS_ID (torchrun: MASTER_ADDR, MASTER_PORT and RANK)."
        )
    _split_address(s.coordinator_address)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"coordinator_address={address!r}: expected 'host:port', e.g. '10.0.0.2:8476'."
        )
    if not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"coordinator_address={address!r}: port {int(port)} is outside 1..65535, e.g. "
            "'10.0.0.2:8476'."
        )
    return host.strip("[]"), int(port)


def wait_for_coordinator(address: str, timeout_s: float, *, what: str = "") -> None:
    """Poll ``address``'s TCP port until it accepts a connection; raise on timeout."""
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout_s
    last_error: OSError | None = None
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as e:
            last_error = e
        if time.monotonic() >= deadline:
            raise CoordinatorTimeoutError(
                f"{what}waited {timeout_s:.0f} s for the coordinator at {address} and it never "
                f"came up (last error: {last_error}). Check that process 0 is running and that "
                f"{address} is reachable from this host, or raise the timeout "
                f"({ENV_TIMEOUT} / initialize(timeout_s=...))."
            )
        time.sleep(0.25)


def is_initialized() -> bool:
    """Whether `jax.distributed.initialize` has already run in this process."""
    return bool(jax.distributed.is_initialized())


def _watchdog(settings: ClusterSettings, timeout_s: float) -> threading.Timer:
    def fire() -> None:
        msg = (
            f"jaxcore.initialize: process {settings.process_id} timed out after "
            f"{timeout_s:.0f} s waiting for all {settings.num_processes} processes to join the "
            f"coordinator at {settings.coordinator_address} ({settings.source}). Some process "
            "did not start or cannot reach that address; see the other processes' logs."
        )
        log.error(msg)
        print(msg, file=sys.stderr, flush=True)
        # JAX's client would abort (SIGABRT and a C++ stack) a moment later; exit cleanly.
        os._exit(1)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    return timer


class _RankExit(SystemExit):
    """What `sys.exit` raises in a process of a multi-process run.

    Python does not pass a `SystemExit` to ``sys.excepthook``, and an ``atexit`` function
    cannot see the exit status, so `sys.exit(5)` would wait in JAX's shutdown barrier like
    an uncaught exception did (`_exit_on_uncaught_error`). The exception is freed when it
    is done with: either by the program that caught it (a frame of it is running then) or,
    when it ends the program, by the interpreter after every frame has returned and before
    the ``atexit`` functions. In that second case a non-zero status ends the process at once.
    """

    def __del__(self) -> None:
        # A clean end, or a preempted one (every process saved the same step and exits
        # 75 with the others): JAX's barrier is right, and so are the atexit functions
        # (an unclosed Checkpointer's last save, a TraceWindow's trace).
        if self.code in (None, 0, PREEMPTION_EXIT_CODE):
            return
        if sys._getframe(0).f_back is not None:  # caught (or dropped) by the program
            return
        if threading.current_thread() is not threading.main_thread():  # a thread ended
            return
        code = self.code
        if not isinstance(code, int):  # Python prints a message status after this runs
            with contextlib.suppress(OSError, ValueError):
                print(code, file=sys.stderr)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        logging.shutdown()
        os._exit(code)


def _rank_exit(status: Any = None, /) -> NoReturn:
    """`sys.exit` in a process of a multi-process run: raises `_RankExit`."""
    raise _RankExit(status)


def _exit_on_uncaught_error() -> None:
    """An uncaught exception, or `sys.exit` with a failure status, ends this process at
    once (after the traceback; finally-blocks and with-blocks, a `Checkpointer`'s, have
    run by then).

    A normal exit runs `jax.distributed.shutdown` (atexit), a barrier that the other
    processes, blocked in a collective that waits for this one, never reach: the failing
    process would hang until their collective timed out (30 s for gloo, longer on GPUs),
    and the launcher would blame whichever rank timed out first, with its code.
    `sys.exit(0)` (or no status) and `sys.exit(75)` (preempted: every process saved and
    exits) still wait there: the others may just be slower. Like an uncaught exception, a
    failure status skips the atexit functions too: close a `Checkpointer` (or use it as
    a with-block) before exiting with one.
    """
    sys.exit = _rank_exit
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        previous(kind, error, tb)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        logging.shutdown()
        if issubclass(kind, KeyboardInterrupt):  # died of SIGINT, as Python itself reports
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(1)

    sys.excepthook = hook


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
    cluster_detection_method: str | None = None,
    timeout_s: float | None = None,
) -> ClusterSettings:
    """Join the multi-process run this process belongs to; a no-op for a single process.

    Call it before any other JAX work. Returns the resolved `ClusterSettings`. Raises
    `CoordinatorTimeoutError` (naming the address) when the coordinator does not come up
    within ``timeout_s`` (default ``$JAXCORE_INIT_TIMEOUT`` or 300 s).
    """
    # A rank of `jaxcore launch` / `notebook_launcher` stops when its launcher is killed.
    watch_lifeline()
    settings = detect(
        coordinator_address,
        num_processes,
        process_id,
        local_device_ids=local_device_ids,
        cluster_detection_method=cluster_detection_method,
    )
    if timeout_s is None:
        timeout_s = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
    if timeout_s <= 0:
        raise ConfigError(f"initialize(timeout_s={timeout_s}): must be positive.")
    if is_initialized():
        log.info("jax.distributed is already initialized; process %d", jax.process_index())
        return settings
    if not settings.multi_process:
        log.info("single process (%s): jax.distributed not needed", settings.source)
        return settings
    # CPU processes talk through gloo; it only affects the CPU client, so it is safe on GPU.
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    log.info(
        "initializing jax.distributed from %s: coordinator %s, process %s of %s",
        settings.source,
        settings.coordinator_address or "(detected by JAX)",
        settings.process_id if settings.process_id is not None else "?",
        settings.num_processes or "?",
    )
    if settings.process_id == 0 and settings.coordinator_address:
        # Process 0 starts the coordinator service. On a taken port, gRPC either raises a
        # bare "Failed to start RPC server" or crashes the process (SIGSEGV, seen with
        # jaxlib 0.6): check the port first and say what is wrong.
        port = settings.coordinator_address.rpartition(":")[2]
        why = port_unavailable(int(port)) if port.isdigit() else None
        if why:
            raise ConfigError(
                f"jaxcore.initialize: process 0 cannot start the coordinator at "
                f"{settings.coordinator_address} ({settings.source}): {why}; another program "
                "or run holds the port. Stop it, or choose another port (`jaxcore launch` "
                "picks a free one when --port is left out)."
            )
    start = time.monotonic()
    if settings.process_id not in (None, 0) and settings.coordinator_address:
        wait_for_coordinator(
            settings.coordinator_address,
            timeout_s,
            what=f"jaxcore.initialize: process {settings.process_id} of "
            f"{settings.num_processes} ({settings.source}) ",
        )
    remaining = max(1.0, timeout_s - (time.monotonic() - start))
    timer = _watchdog(settings, remaining)
    timer.start()
    try:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator_address,
            num_processes=settings.num_processes,
            process_id=settings.process_id,
            local_device_ids=(
                list(settings.local_device_ids) if settings.local_device_ids else None
            ),
            cluster_detection_method=settings.cluster_detection_method,
            # JAX's own deadline comes a little after ours, so the clear message wins.
            initialization_timeout=int(remaining) + 5,
        )
    except RuntimeError as e:
        if "before" in str(e) and "initialize" in str(e):
            raise ConfigError(
                "jaxcore.initialize() must run before any JAX computation or device query "
                f"in this process (JAX said: {e}). Move it to the top of the script."
            ) from e
        raise
    finally:
        timer.cancel()
    _exit_on_uncaught_error()
    log.info(
        "jax.distributed ready in %.1f s: process %d of %d, %d local / %d global devices",
        time.monotonic() - start,
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return settings
