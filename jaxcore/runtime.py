"""Process-level runtime settings that must be in place before a process starts.

Two things cannot be changed from inside a running JAX process:

- **glibc malloc tunables.** XLA's CPU runtime allocates and frees large buffers every
  step; by default glibc hands them back to the kernel and faults them in again (about
  1.5 million minor page faults per step for a d=512, 8-layer decoder). Keeping them
  (``mmap_max=0``, a huge ``trim_threshold``) and using huge pages made that step 1.36x
  faster (PERF-NOTES.md, "Page faults"). glibc reads ``GLIBC_TUNABLES`` only at start-up,
  so launchers put it in their children's environment and scripts re-exec themselves.
- **The number of fake CPU devices** (``--xla_force_host_platform_device_count``), read by
  XLA when the CPU backend starts.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

# sysexits.h EX_TEMPFAIL ("temporary failure; the user is invited to retry"): distinct
# from 143 (killed by SIGTERM without saving) and from errors, so a scheduler or wrapper
# script can requeue the job when it sees it.
PREEMPTION_EXIT_CODE = 75
MALLOC_TUNABLES = (
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
)
_REEXEC_MARK = "JAXCORE_MALLOC_REEXEC"
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S+")


def with_malloc_tuning(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Set ``GLIBC_TUNABLES`` in ``env`` unless the user already chose a value."""
    env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return env


def with_cpu_devices(env: MutableMapping[str, str], count: int) -> MutableMapping[str, str]:
    """Make a child see ``count`` CPU devices, replacing any device count it inherited."""
    flags = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    return env


def ensure_malloc_tuning(environ: Mapping[str, str] | None = None) -> None:
    """Re-exec the running ``__main__`` script with the malloc tunables if they are missing.

    Call it first thing in a benchmark or demo script. It does nothing when
    ``GLIBC_TUNABLES`` is already set (by the user, ``make`` or ``jaxcore launch``), when
    not on Linux, or when Python was started without a script file (a notebook, ``-c``).
    """
    environ = os.environ if environ is None else environ
    if "GLIBC_TUNABLES" in environ or not sys.platform.startswith("linux"):
        return
    if environ.get(_REEXEC_MARK):  # glibc ignored the variable; do not loop
        log.warning("GLIBC_TUNABLES was set but is missing after re-exec; running untuned.")
        return
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if not script or not os.path.exists(script):
        log.info("no script to re-exec; set GLIBC_TUNABLES=%s before starting", MALLOC_TUNABLES)
        return
    env = with_malloc_tuning(dict(environ))
    env[_REEXEC_MARK] = "1"
    spec = getattr(main, "__spec__", None)
    # `python -m pkg.mod` must come back as `-m pkg.mod` so relative imports still work.
    argv = (
        [sys.executable, "-m", spec.name, *sys.argv[1:]]
        if spec is not None and spec.name
        else [sys.executable, script, *sys.argv[1:]]
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def port_unavailable(port: int) -> str | None:
    """Why a coordinator could not listen on ``port`` here (``None``: it can).

    Binds every interface, as JAX's service listens on ``[::]:port``; ``SO_REUSEADDR``
    as gRPC sets it, so a port in TIME_WAIT from an earlier run counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OverflowError:  # bind() says it so, not as an OSError
            return f"port {port} is outside 0..65535"
        except OSError as e:
            return f"port {port} is in use ({e.strerror})"
    return None


def nvidia_gpu_count() -> int:
    """How many GPUs ``nvidia-smi -L`` lists here (0 without the driver or its tool): what
    `jaxcore launch --platform gpu` and the experiment executors decide GPU or CPU by."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
