"""Ranks that outlive no launcher: a pipe whose far end closes when the launcher dies.

`jaxcore launch` and `notebook_launcher` start each rank in its own session, so that
stopping a rank stops what it started; the same isolation means a launcher killed with
SIGKILL (the OOM killer, a scheduler, a notebook's "Restart kernel") would leave its ranks
running for ever, holding their devices and ports. The launcher keeps the write end of a
pipe open and passes the read end to every rank (``$JAXCORE_LIFELINE``); the operating
system closes the write end whatever way the launcher ends, and a rank that sees the end
of the pipe stops its process group: SIGTERM (a preemption: a rank with a
`jaxcore.PreemptionWatch` saves), then SIGKILL after the grace. Unlike Linux's
``PR_SET_PDEATHSIG`` (which the experiment loop's trials use), it works on any POSIX
system and reaches a rank started through a shell.

`watch_lifeline` runs in `jaxcore.initialize`, so every rank that joins a run watches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

ENV_LIFELINE = "JAXCORE_LIFELINE"
"""``FD:INODE:GRACE_S``: the read end's number, its pipe's inode (so that an inherited
variable naming some other file is ignored) and the seconds between SIGTERM and SIGKILL."""


class Lifeline:
    """The launcher's side: a pipe held open for as long as the launcher lives."""

    def __init__(self, grace_s: float) -> None:
        self.read_fd, self._write_fd = os.pipe()
        inode = os.fstat(self.read_fd).st_ino
        self.env_value = f"{self.read_fd}:{inode}:{grace_s:g}"
        self._read_closed = self._write_closed = False

    def started(self) -> None:
        """Close the read end here once every rank holds its copy.

        Each end is closed once: its number may at once be reused by another file (in a
        notebook kernel, a ZeroMQ socket), which a second close would close from under its
        owner (libzmq then aborts the kernel).
        """
        if not self._read_closed:
            self._read_closed = True
            with contextlib.suppress(OSError):
                os.close(self.read_fd)

    def close(self) -> None:
        """Close both ends (the ranks are gone): the ranks' watchers would read the end."""
        self.started()
        if not self._write_closed:
            self._write_closed = True
            with contextlib.suppress(OSError):
                os.close(self._write_fd)


def watch_lifeline(environ: MutableMapping[str, str] | Mapping[str, str] | None = None) -> bool:
    """Stop this process's group when the launcher that started it ends; returns whether
    a watcher was started (False when not launched by jaxcore, or the variable is stale).

    The variable is removed from ``os.environ`` so that this rank's own subprocesses do
    not take it for theirs, and the fd is made non-inheritable for the same reason.
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_LIFELINE)
    if value is None:
        return False
    if env is os.environ:
        os.environ.pop(ENV_LIFELINE, None)
    try:
        fd_text, inode_text, grace_text = value.split(":")
        fd, inode, grace_s = int(fd_text), int(inode_text), float(grace_text)
        st = os.fstat(fd)
    except (ValueError, OSError):
        return False
    if not stat.S_ISFIFO(st.st_mode) or st.st_ino != inode:
        return False
    os.set_inheritable(fd, False)
    threading.Thread(
        target=_watch, args=(fd, grace_s), name="jaxcore-lifeline", daemon=True
    ).start()
    return True


def _watch(fd: int, grace_s: float) -> None:
    """Block until the launcher's end closes, then stop this process's group."""
    while True:
        try:
            if os.read(fd, 1) == b"":
                break
        except InterruptedError:
            continue
        except OSError:
            return  # the fd was closed here: nothing to watch
    msg = (
        f"jaxcore: the launcher of process {os.getpid()} is gone (killed); stopping this "
        f"rank and what it started (SIGTERM, SIGKILL after {grace_s:g} s)."
    )
    log.error(msg)
    with contextlib.suppress(OSError, ValueError):
        print(msg, file=sys.stderr, flush=True)
    group = os.getpgid(0)
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGTERM)
    time.sleep(grace_s)
    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
